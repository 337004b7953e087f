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


@pytest.mark.parametrize("kernel", ["sdpa", "varlen"])
def test_gpu_check_smoke_profiles_fits_replays_and_scores(tmp_path, kernel):
    res = _run("gpu_check.sh", tmp_path, SMOKE="1", MODELS="llama-3-8b", WORKLOADS="fixed", DECODE_KERNEL=kernel)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "FAILED" not in out
    for case in ("optimize-I64-O4-B8", "sarathi-fixed", "vllm-fixed"):
        assert f"replayed llama-3-8b {case}" in out
    for family in ("linear", "piecewise"):  # the table: both fits scored for each replay
        assert f"| llama-3-8b | vllm | fixed | {family} |" in out
    assert not (ROOT / "runs" / "gpu_check" / "cpu").exists()  # SMOKE writes nothing into the repository
    # the kernel reaches the profile and every replay, and names their folders
    suffix = "-varlen" if kernel == "varlen" else ""
    (profile_json,) = tmp_path.glob(f"*/cpu{suffix}/llama-3-8b/tp1/profile.json")
    assert json.loads(profile_json.read_text())["decode_kernel"] == kernel
    summaries = list(profile_json.parents[3].glob("runs/llama-3-8b/*/replay/summary.json"))
    assert len(summaries) == 3 and all(json.loads(p.read_text())["decode_kernel"] == kernel for p in summaries)


def test_gpu_check_refuses_an_unknown_decode_kernel(tmp_path):
    res = _run("gpu_check.sh", tmp_path, SMOKE="1", DECODE_KERNEL="paged")
    assert res.returncode == 2 and "DECODE_KERNEL must be sdpa or varlen, got 'paged'" in res.stderr


def test_gpu_session_refuses_an_unknown_pass_before_any_step(tmp_path):
    res = _run("gpu_session.sh", tmp_path, SMOKE="1", OUT=str(tmp_path), PASSES="eager:60 graph")
    assert res.returncode == 2 and "unknown pass 'graph' (eager, graphs or graphs-replay)" in res.stderr
    assert not (tmp_path / "steps.log").exists()
