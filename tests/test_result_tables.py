"""The result's tables, built from plain rows on first access, and a simulate that never imports pandas.

Hand-worked with batch time = 1 + n_tokens seconds (conftest.AffineCost).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import BATCH_COLUMNS
from infermax.request import Request

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "numpy", "scipy", "sklearn", "matplotlib", "pyarrow")


def test_two_requests_tables_and_summary(affine):
    # vLLM, M=100. r0 (I=2, O=2) arrives at 0, r1 (I=2, O=2) at 1. b0 [0, 3]: r0's prompt (2 tokens); b1 [3, 6]:
    # r1's prompt (prefill first, no hybrid: r0 waits); b2 [6, 9]: both decode their last token.
    reqs = [Request(0, 0.0, 2, 2, ttft_slo_s=2.0, tbt_slo_s=5.0, request_class="rt"),
            Request(1, 1.0, 2, 2, ttft_slo_s=6.0, tpot_slo_s=4.0)]
    res = simulate(reqs, "vllm", Limits(M=100), affine)
    nan = math.nan
    requests = pd.DataFrame({
        "id": [0, 1], "request_class": ["rt", None], "arrival_s": [0.0, 1.0], "prompt_tokens": [2, 2],
        "output_tokens": [2, 2], "first_token_s": [3.0, 6.0], "finish_s": [9.0, 9.0], "ttft_s": [3.0, 5.0],
        "tpot_s": [6.0, 3.0], "latency_s": [9.0, 8.0], "generated_tokens": [2, 2], "evictions": [0, 0],
        "refilled_tokens": [0, 0], "swapped_out_tokens": [0, 0], "swapped_in_tokens": [0, 0],
        # SLO columns: one gap between tokens each (6 s, 3 s). r0 misses its 2 s TTFT and 5 s TBT targets; r1 meets
        # its 6 s TTFT and 4 s TPOT targets (its one gap, 3 s, is within 4 s).
        "ttft_slo_s": [2.0, 6.0], "tbt_slo_s": [5.0, nan], "tpot_slo_s": [nan, 4.0], "p99_tbt_s": [6.0, 3.0],
        "ttft_ok": [False, True], "tbt_ok": [False, True], "tpot_ok": [True, True], "slo_met": [False, True],
        "tpot_gap_ok_share": [nan, 1.0],
    })
    pd.testing.assert_frame_equal(res.requests, requests)
    # KV after each batch: 2 (r0's prompt), 4 (both prompts), 0 (both finished); during b2 each decode adds 1.
    batches = pd.DataFrame([
        (0, 0.0, 3.0, 3.0, 1, 1, 0, 2, 0, 1, 0, 2, 2, 1, 1, 0, 3.0, 0, 0),
        (1, 3.0, 3.0, 6.0, 1, 1, 0, 2, 0, 1, 0, 4, 4, 2, 2, 0, 3.0, 0, 0),
        (2, 6.0, 3.0, 9.0, 2, 0, 2, 0, 2, 2, 0, 6, 0, 2, 0, 0, 3.0, 0, 0),
    ], columns=list(BATCH_COLUMNS))
    pd.testing.assert_frame_equal(res.batches, batches)
    assert res.requests is res.requests  # built once
    s = res.summary
    assert (s["num_requests"], s["num_batches"], s["makespan_s"], s["generated_tokens"], s["tps"]) == (2, 3, 9.0, 4, 4 / 9)
    assert (s["mean_ttft_s"], s["p50_ttft_s"], s["mean_tpot_s"], s["mean_latency_s"]) == (4.0, 4.0, 4.5, 8.5)
    assert s["p90_ttft_s"] == pytest.approx(4.8) and s["p99_latency_s"] == pytest.approx(8.99)
    assert (s["mean_batch_size"], s["mean_running"]) == (4 / 3, 1.0)
    assert (s["mean_kv_util"], s["peak_kv_util"], s["hidden_item_share"]) == (2 / 100, 6 / 100, 0.0)
    assert (s["slo_attainment"], s["ttft_attainment"], s["tbt_attainment"], s["tpot_attainment"]) == (0.5, 0.5, 0.5, 1.0)


def test_tables_without_classes_or_targets(affine):
    res = simulate([Request(0, 0.0, 3, 1), Request(1, 0.0, 1, 3)], "sarathi", Limits(M=100), affine)
    # b0 [0, 5]: both prompts (4 tokens); b1 [5, 7], b2 [7, 9]: r1's two decodes. r0 (O=1) has no TPOT.
    assert list(res.requests.columns) == ["id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s",
                                          "finish_s", "ttft_s", "tpot_s", "latency_s", "generated_tokens", "evictions",
                                          "refilled_tokens", "swapped_out_tokens", "swapped_in_tokens"]
    assert res.requests["finish_s"].tolist() == [5.0, 9.0] and math.isnan(res.requests["tpot_s"][0])
    assert res.batches["end_s"].tolist() == [5.0, 7.0, 9.0]
    assert res.summary["mean_tpot_s"] == 2.0 and res.summary["p99_tpot_s"] == 2.0  # NaN left out
    assert "slo_attainment" not in res.summary


def _modules_after(args: list[str]) -> dict:
    """Run ``python -m infermax ARGS`` in a fresh interpreter; the heavy libraries it imported and its output."""
    code = ("import runpy, sys, json, io, contextlib\n"
            f"sys.argv = ['infermax'] + {args!r}\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n"
            "        runpy.run_module('infermax', run_name='__main__')\n"
            "    except SystemExit as exc:\n"
            "        assert not exc.code, exc.code\n"
            f"print(json.dumps({{'loaded': sorted(m for m in {HEAVY!r} if m in sys.modules), 'out': out.getvalue()}}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ["simulate", "--I", "1", "--O", "1", "--B", "1", "--no-progress"],
    ["simulate", "--I", "64", "--O", "8", "--B", "20", "--scheduler", "sarathi", "--json"],
    ["simulate", "--trace", "azure-conv", "--trace-limit", "50", "--no-progress"],
])
def test_simulate_imports_no_table_or_array_library(args):
    found = _modules_after(args)
    assert found["loaded"] == []
    assert "num_requests" in found["out"]


def test_out_still_writes_tables(tmp_path):
    found = _modules_after(["simulate", "--I", "4", "--O", "2", "--B", "3", "--no-progress", "--out", str(tmp_path)])
    assert "pandas" in found["loaded"]  # asked for: Parquet tables
    assert pd.read_parquet(tmp_path / "requests.parquet")["generated_tokens"].tolist() == [2, 2, 2]
