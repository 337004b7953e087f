"""Resuming from a results table (committed results are not recomputed or rewritten), file modes from the
umask, and error points kept on resume unless ``--retry-errors`` (issue 18)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from infermax.cli import app
from infermax.sweep import load_spec, run_sweep
from test_sweep import SMALL as SWEEP_SMALL  # the same six points

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

SMALL = SWEEP_SMALL + """[[plot]]
kind = "lines"
file = "tps.png"
metrics = ["tps"]
x = "I"
hue = "scheduler"
"""


def spec_file(tmp_path: Path, text: str = SMALL) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(text)
    return path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` except the point files and the lock: its bytes and mtime."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file() and "points" not in p.parts and p.name != ".lock"}


def test_a_table_without_point_files_resumes_and_is_not_rewritten(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    first = run_sweep(spec, tmp_path / "out", jobs=1)
    assert (first.computed, first.table_written) == (6, True)
    shutil.rmtree(tmp_path / "out" / "points")  # as in a clone: the table is in git, the point files are not
    before = snapshot(tmp_path / "out")
    again = run_sweep(spec, tmp_path / "out", jobs=1)
    assert (again.cached, again.computed, again.table_written) == (6, 0, False)
    assert snapshot(tmp_path / "out") == before


def test_table_rows_from_other_inputs_are_refused(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    run_sweep(spec, tmp_path / "out", jobs=1)
    shutil.rmtree(tmp_path / "out" / "points")
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    table["inputs"] = "cost-model:0000000000000000"  # e.g. computed before a refit
    table.to_parquet(tmp_path / "out" / "results.parquet", index=False)
    with pytest.raises(ValueError, match="6 finished point.*other inputs"):
        run_sweep(spec, tmp_path / "out", jobs=1)


def test_a_partly_new_spec_computes_only_the_new_points_and_keeps_the_old_rows(tmp_path):
    run_sweep(load_spec(spec_file(tmp_path)), tmp_path / "out", jobs=1)
    shutil.rmtree(tmp_path / "out" / "points")
    old = pd.read_parquet(tmp_path / "out" / "results.parquet")
    bigger = load_spec(spec_file(tmp_path, SMALL.replace("I = [4, 16, 64]", "I = [4, 16, 64, 32]")))
    report = run_sweep(bigger, tmp_path / "out", jobs=1)
    assert (report.cached, report.computed, report.table_written) == (6, 2, True)
    new = pd.read_parquet(report.table).set_index("point_id")
    pd.testing.assert_frame_equal(new.loc[old["point_id"]].reset_index(), old, check_dtype=False)


def test_results_files_get_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        report = run_sweep(load_spec(spec_file(tmp_path)), tmp_path / "out", jobs=1)
    finally:
        os.umask(old)
    files = [report.table, *(tmp_path / "out" / "points").glob("*.json")]
    assert len(files) == 7
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o644}


def test_readme_sweep_of_committed_results_recomputes_and_rewrites_nothing(tmp_path):
    """`infermax sweep experiments/fig9.toml` as the README shows it, on a copy of the committed spec and results."""
    shutil.copy(ROOT / "experiments" / "fig9.toml", tmp_path / "fig9.toml")
    shutil.copytree(ROOT / "experiments" / "results" / "fig9", tmp_path / "results" / "fig9",
                    ignore=shutil.ignore_patterns("points", ".lock"))
    before = snapshot(tmp_path / "results" / "fig9")
    result = runner.invoke(app, ["sweep", str(tmp_path / "fig9.toml"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "330 points (330 already done, 0 computed" in result.output
    assert snapshot(tmp_path / "results" / "fig9") == before


RETRY = """
name = "retry"
[base]
B = 4
O = 2
cost_model = "linear"
[axes]
scheduler = ["vllm"]
trace = ["{trace}"]
"""


def test_error_points_are_kept_on_resume_and_recomputed_with_retry_errors(tmp_path):
    trace = tmp_path / "trace.csv"
    spec = load_spec(spec_file(tmp_path, RETRY.format(trace=trace)))
    first = run_sweep(spec, tmp_path / "out", jobs=1)
    assert first.errors == 1  # the trace file is not there yet
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,8,2\n0.5,16,3\n")
    kept = run_sweep(spec, tmp_path / "out", jobs=1)
    assert (kept.cached, kept.computed, kept.errors) == (1, 0, 1)
    result = runner.invoke(app, ["sweep", str(tmp_path / "small.toml"), "--out", str(tmp_path / "out"),
                                 "--retry-errors", "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "1 points (0 already done, 1 computed, 0 errors)" in result.output
    assert pd.read_parquet(tmp_path / "out" / "results.parquet")["status"].tolist() == ["ok"]
