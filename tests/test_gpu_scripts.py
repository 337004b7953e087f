"""The scripts that spend a GPU session's scarce device time (benchmarks/gpu_check.sh, gpu_session.sh), run here on
a CPU in their SMOKE mode, so that a broken step shows up in CI rather than on the GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `python` is this interpreter
    # (TMPDIR: SMOKE's `mktemp -d` folder lands in the test's own tmp_path, which pytest cleans up)
    full = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "INFERMAX_PROFILES": str(tmp_path),
            "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / script)], cwd=tmp_path, env=full, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("kernel, prefill_kernel", [("sdpa", "sdpa"), ("varlen", "varlen")])
def test_gpu_check_smoke_profiles_fits_replays_and_scores(tmp_path, kernel, prefill_kernel):
    res = _run("gpu_check.sh", tmp_path, SMOKE="1", MODELS="llama-3-8b", WORKLOADS="fixed", DECODE_KERNEL=kernel,
               PREFILL_KERNEL=prefill_kernel)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "FAILED" not in out
    for case in ("optimize-I64-O4-B8", "sarathi-fixed", "vllm-fixed"):
        assert f"replayed llama-3-8b {case}" in out
    for family in ("linear", "piecewise"):  # the table: both fits scored for each replay
        assert f"| llama-3-8b | vllm | fixed | {family} |" in out
    assert not (ROOT / "runs" / "gpu_check" / "cpu").exists()  # SMOKE writes nothing into the repository
    # the kernels reach the profile and every replay, and name their folders
    suffix = ("-varlen" if kernel == "varlen" else "") + ("-pvarlen" if prefill_kernel == "varlen" else "")
    (profile_json,) = tmp_path.glob(f"*/cpu{suffix}/llama-3-8b/tp1/profile.json")
    doc = json.loads(profile_json.read_text())
    assert (doc["decode_kernel"], doc["prefill_kernel"]) == (kernel, prefill_kernel)
    summaries = [json.loads(p.read_text()) for p in profile_json.parents[3].glob("runs/llama-3-8b/*/replay/summary.json")]
    assert len(summaries) == 3
    assert all((s["decode_kernel"], s["prefill_kernel"]) == (kernel, prefill_kernel) for s in summaries)


@pytest.mark.parametrize("phase", ["DECODE", "PREFILL"])
def test_gpu_check_refuses_an_unknown_kernel(tmp_path, phase):
    res = _run("gpu_check.sh", tmp_path, SMOKE="1", **{f"{phase}_KERNEL": "paged"})
    assert res.returncode == 2 and f"{phase}_KERNEL must be sdpa or varlen, got 'paged'" in res.stderr


def test_gpu_session_refuses_an_unknown_pass_before_any_step(tmp_path):
    res = _run("gpu_session.sh", tmp_path, SMOKE="1", OUT=str(tmp_path), PASSES="eager:60 graph")
    assert res.returncode == 2 and "unknown pass 'graph' (eager, graphs or graphs-replay)" in res.stderr
    assert not (tmp_path / "steps.log").exists()


def _benchmark_module(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_batch_trace_helpers():
    trace = _benchmark_module("gpu_batch_trace")
    assert trace.busy_us([(0, 4), (2, 6), (10, 11), (10.5, 10.7)]) == 7.0  # overlaps counted once, gaps not at all
    assert trace.busy_us([]) == 0.0
    assert trace.kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert trace.kernel_kind("flash_fwd_splitkv_kernel") == "attention"
    assert trace.kernel_kind("void at::native::index_elementwise_kernel") == "gather/copy"
    assert trace.kernel_kind("void at::native::vectorized_elementwise_kernel<4, silu>") == "other"


def test_batch_trace_cpu_smoke_picks_and_writes_each_kind(tmp_path):
    # The tiny model on a CPU, eager forwards traced with CPU activity: the earliest batch of each kind is picked,
    # timed and traced, and both tables are written.
    from infermax.limits import Limits
    from infermax.request import Request
    from infermax.schedule import Schedule, ScheduledBatch as B

    reqs = [Request(0, 0.0, 300, 4), Request(1, 0.0, 3, 6), Request(2, 0.0, 20, 6), Request(3, 0.0, 10, 2),
            Request(4, 0.0, 12, 2)]
    sched = Schedule(reqs, Limits(C=512, M=1024), [B([(0, 300)]), B([(3, 10), (4, 12)]), B([(0, 1), (1, 3), (2, 20)]),
                                                   B([(0, 1), (1, 1), (2, 1)]), B([(1, 1), (2, 1)])])
    path = sched.save(tmp_path / "s.json")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_batch_trace.py"), str(path), "--model",
                          "llama-3-8b", "--tiny", "--device", "cpu", "--dtype", "fp32", "--reps", "2", "--out",
                          str(tmp_path / "trace")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    import pandas as pd

    batches = pd.read_csv(tmp_path / "trace" / "batches.csv")
    # prefill-only 0, the most prompts 1 (two), mixed 2, most decodes 3 (three, in three groups: 301, 21 and 4 keys),
    # fewest decodes 4
    assert dict(zip(batches.batch, batches.pick)) == {0: "prefill", 1: "most prompts", 2: "mixed",
                                                      3: "most decodes, most decode groups", 4: "fewest decodes"}
    assert (batches.measured_ms > 0).all() and (batches.kernels > 0).all()
    assert (batches.span_ms >= batches.idle_in_span_ms).all()
    kernels = pd.read_csv(tmp_path / "trace" / "kernels.csv")
    assert set(kernels.batch) == {0, 1, 2, 3, 4} and (kernels.dur_us >= 0).all()


def test_gpu_session_traces_the_named_case_with_its_replays_fit(tmp_path):
    # TRACE_CASE after the passes: the newest replay of that case is traced with the fit and decode kernel it was
    # replayed with, and the tables land where they are packed. (TAIL_S=25: the session's pytest step, which this
    # test does not check, gets 5 s.)
    prof, out = tmp_path / "prof", tmp_path / "out"
    out.mkdir()
    res = _run("gpu_session.sh", tmp_path, SMOKE="1", OUT=str(out), PASSES="eager", MODELS="llama-3-8b",
               WORKLOADS="fixed", SMOKE_PROFILES=str(prof), TRACE_CASE="llama-3-8b/vllm-fixed", TAIL_S="25",
               DECODE_KERNEL="varlen", PREFILL_KERNEL="varlen")
    steps = (out / "steps.log").read_text()
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert "trace: " + str(prof / "runs" / "llama-3-8b" / "vllm-fixed") in steps
    assert "decode kernel varlen, prefill kernel varlen" in steps
    assert "trace rc 0" in steps, (out / "trace.log").read_text()[-3000:]
    import pandas as pd

    batches = pd.read_csv(prof / "trace" / "batches.csv")
    assert len(batches) > 0 and (batches.measured_ms > 0).all()


def test_residual_split_by_decode_groups_recovers_a_known_cost_per_group():
    # Residuals made as 0.8 ms + 1.2 ms per extra group + 0.01 ms per decode: the least squares gives those back,
    # and the table counts the decode batches per group count (prefill-only batches, 0 groups, left out).
    import numpy as np
    import pandas as pd

    padding = _benchmark_module("gpu_replay_padding")
    rng = np.random.default_rng(7)
    groups = rng.integers(0, 6, 300)
    decodes = np.where(groups > 0, rng.integers(1, 65, 300), 0)
    d = pd.DataFrame({"run": "r", "model": "m", "groups": groups, "n_decode_seqs": decodes, "signed_pct": -5.0,
                      "residual_ms": 0.8 + 1.2 * (groups - 1) + 0.01 * decodes})
    table, fit = padding.by_groups(d)
    assert fit["b: per extra group (ms)"].item() == pytest.approx(1.2)
    assert fit["a (ms)"].item() == pytest.approx(0.8) and fit["c: per decode (ms)"].item() == pytest.approx(0.01)
    assert dict(zip(table.groups, table.batches)) == {k: int((groups == k).sum()) for k in range(1, 6)}


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_varlen_check_passes_on_the_cpu_stand_in_and_fails_cleanly_without_cuda(tmp_path, phase):
    # gpu_session.sh runs it before a DECODE_KERNEL=varlen (PREFILL_KERNEL=varlen) pass and falls back to sdpa on a
    # non-zero exit.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "benchmarks" / "gpu_varlen_check.py")
    ok = subprocess.run([sys.executable, script, "--device", "cpu", "--phase", phase], env=env, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and f"varlen {phase} attention (CPU stand-in) matches the SDPA calls" in ok.stdout, (
        ok.stdout + ok.stderr)
    import torch

    if not torch.cuda.is_available():
        bad = subprocess.run([sys.executable, script, "--phase", phase], env=env, capture_output=True, text=True,
                             timeout=120)
        assert bad.returncode == 1 and bad.stdout.startswith(f"varlen {phase} attention does not work here: ")
        assert "Traceback" not in bad.stdout + bad.stderr
