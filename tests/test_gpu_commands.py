"""GPU commands on a machine without a GPU (or without PyTorch) stop at once with a clear message (issue 18:
`infermax profile` and `gpu-replay` used to fall back to the CPU silently and run a full-size model for minutes)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from infermax.cli import app
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed

runner = CliRunner()


@pytest.fixture
def schedule_file(tmp_path):
    result = simulate(fixed(8, 2, 2), "vllm", Limits(C=64, M=64))
    return result.schedule.save(tmp_path / "schedule.json")


def commands(tmp_path, schedule_file):
    """The two GPU commands at full size, as the README shows them, without ``--device``."""
    return {"profile": ["profile", "--model", "llama-3-8b", "--out", str(tmp_path / "p"), "--no-progress"],
            "gpu-replay": ["gpu-replay", str(schedule_file), "--model", "llama-2-7b", "--no-progress"]}


@pytest.mark.parametrize("name", ["profile", "gpu-replay"])
def test_no_gpu_means_an_error_naming_device_cpu(name, tmp_path, schedule_file, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine's view, whatever it has
    result = runner.invoke(app, commands(tmp_path, schedule_file)[name])
    assert result.exit_code == 2, result.output
    assert "no CUDA GPU" in result.output and "--device cpu" in result.output
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("name", ["profile", "gpu-replay"])
def test_no_pytorch_means_an_error_naming_the_install(name, tmp_path, schedule_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ModuleNotFoundError
    for module in [m for m in sys.modules if m.startswith("infermax.profiling")]:
        monkeypatch.delitem(sys.modules, module)
    result = runner.invoke(app, commands(tmp_path, schedule_file)[name] + ["--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert "PyTorch is not installed" in result.output and "infermax[gpu]" in result.output


@pytest.mark.parametrize("name", ["profile", "gpu-replay"])
def test_an_output_folder_that_cannot_be_one_is_refused_before_the_run(name, tmp_path, schedule_file):
    """A file where the output folder (or, for `profile`, its tp<N> folder) would go: refused at once with exit
    code 2 (found by probing, 2026-12-02: `profile --out /dev/null` profiled, then ended in a NotADirectoryError
    traceback, and `gpu-replay --out FILE` would fail only after executing the whole schedule)."""
    blocker = tmp_path / "taken"
    blocker.write_text("")
    if name == "profile":  # (tiny: were the check to go, the test would fail in seconds, not profile for minutes)
        args = ["profile", "--out", str(blocker / "model"), "--tiny", "--grid", "tiny", "--no-progress"]
    else:
        args = commands(tmp_path, schedule_file)[name] + ["--tiny", "--out", str(blocker)]
    result = runner.invoke(app, args + ["--device", "cpu"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.replace("│", " ").split())  # (typer's error box wraps a long path anywhere)
    assert "exists and is not a directory" in message and ("--out" in message or "'--out'" in message)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "tp1").write_text("")  # profile's own tp<N> folder taken by a file
    result = runner.invoke(app, ["profile", "--out", str(tmp_path / "p"), "--tiny", "--grid", "tiny", "--device", "cpu",
                                 "--no-progress"])
    assert result.exit_code == 2 and "tp1 exists and is not a directory" in result.output
