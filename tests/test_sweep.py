"""Sweeps: spec parsing, the results table, resuming after SIGKILL, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from infermax.cli import app
from infermax.config import RunConfig
from infermax.sweep import SpecError, load_spec, parse_spec, point_id, run_sweep
from infermax.sweep.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

SMALL = """
name = "small"
[base]
B = 6
O = 3
cost_model = "linear"
[axes]
scheduler = ["vllm", "sarathi"]
I = [4, 16, 64]
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_points_are_the_product_of_the_axes_in_order(tmp_path):
    spec = load_spec(write(tmp_path, SMALL))
    points = spec.points()
    assert [(p["scheduler"], p["I"]) for p in points] == [
        ("vllm", 4), ("vllm", 16), ("vllm", 64), ("sarathi", 4), ("sarathi", 16), ("sarathi", 64)]
    # Every point is a full configuration: base values, axis values, RunConfig defaults for the rest.
    assert all(p["B"] == 6 and p["O"] == 3 and p["C"] == 4096 and p["Rmax"] is None for p in points)
    assert set(points[0]) == set(RunConfig.field_names())
    assert spec.default_out_dir() == tmp_path / "results" / "small"


@pytest.mark.parametrize("text, message", [
    ("nme = 'x'", "unknown top-level key(s) nme; known: name, description, kind, base, axes, plot"),
    ("[base]\nbatch = 3", "unknown simulate field(s) in [base]: batch; known: scheduler,"),
    ("[axes]\nschedular = ['vllm']", "unknown simulate field(s) in [axes]: schedular"),
    ("kind = 'optimise'", "unknown point kind 'optimise'; known: simulate"),
    ("[base]\nI = 'big'", "base.I must be int, got 'big'"),
    ("[base]\nI = 2.5", "base.I must be int, got 2.5"),
    ("[base]\nscheduler = 3", "base.scheduler must be str, got 3"),
    ("[axes]\nI = 4", "axes.I must be a non-empty list of values, got 4"),
    ("[axes]\nI = []", "axes.I must be a non-empty list"),
    ("[axes]\nI = [1, 2, 1]", "axes.I lists a value twice"),
    ("[base]\nI = 1\n[axes]\nI = [2]", "field(s) I appear in both [base] and [axes]"),
    ("[axes]\nscheduler = ['vllm', 'fastest']", "point 1 (scheduler='fastest'): unknown scheduler 'fastest'"),
    ("[axes]\nP = [100, 8192]", "point 1 (P=8192): P (prefill tokens per batch) = 8192 must not exceed C = 4096"),
    ("[[plot]]\nkind = 'pie'", "plot 0: plot kind must be one of lines, heatmap, got 'pie'"),
    ("[[plot]]\nmetric = 'tps'", "plot 0: unknown lines plot key(s) metric"),
    ("[[plot]]\nmetrics = ['tps']\nx = 'I'", "plot 0: needs 'file'"),
    ("[[plot]]\nfile = '../../escape.png'", "plot 0: 'file' must be a relative path inside the sweep's figures folder"),
    ("[[plot]]\nfile = '/tmp/escape.png'", "plot 0: 'file' must be a relative path inside"),
    ("[[plot]]\nfile = 'sub/../../escape.png'", "plot 0: 'file' must be a relative path inside"),
    ("[[plot]]\nfile = 'fig.jpg'", "plot 0: 'file' 'fig.jpg': figure format must be one of .png, .svg, .pdf"),
    ("name = 'a/b'", "'name' must be a non-empty string without '/'"),
    # (2026-12-01, a fuzz of sweep specs: each of these was a traceback)
    ("[base]\nO = 1000000000000000000000000000000", "base.O = 1000000000000000000000000000000 is outside the 64-bit"),
    ("[[plot]]\nfile = 'f.png'", "plot 0: a lines plot needs 'metrics'"),
    ("[[plot]]\nkind = 'heatmap'\nfile = 'f.png'", "plot 0: a heatmap plot needs 'metric'"),
    ("[[plot]]\nfile = 'f.png'\nmetrics = ['tps']\nx = {}", "plot 0: 'x' must be a string (a column name), got {}"),
    ("[[plot]]\nfile = 'f.png'\nmetrics = ['tps']\nhue = [1]", "plot 0: 'hue' must be a string"),
    ("[[plot]]\nfile = 'f.png'\nmetrics = ['tps', true]", "plot 0: 'metrics' must be a non-empty list of column"),
    ("[[plot]]\nfile = 'f.png'\nmetrics = 'tps'", "plot 0: 'metrics' must be a non-empty list of column"),
    ("[[plot]]\nfile = 'f.png'\nmetrics = ['tps']\nwhere = 3", "plot 0: 'where' must be a table"),
    ("[[plot]]\nkind = 'heatmap'\nfile = 'f.png'\nmetric = 'tps'\nannotate = 1", "'annotate' must be true or"),
])
def test_bad_specs_name_the_problem(tmp_path, text, message):
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    assert str(info.value).startswith(str(tmp_path / "spec.toml") + ": ")
    assert message in str(info.value)


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(write(tmp_path, "[base\nI = 1"))
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "absent.toml")


def test_none_and_number_coercions():
    spec = parse_spec({"axes": {"Rmax": [32, "none"], "rate": [2]}, "base": {"arrival": "poisson"}})
    assert [p["Rmax"] for p in spec.points()] == [32, None] and spec.points()[0]["rate"] == 2.0
    assert isinstance(spec.points()[0]["rate"], float)  # 2 and 2.0 are one point, not two
    with pytest.raises(SpecError, match="base.I must be int, got 'none'"):
        parse_spec({"base": {"I": "none"}})


def test_table_has_one_row_per_point_with_configuration_and_metrics(tmp_path):
    spec = load_spec(write(tmp_path, SMALL))
    report = run_sweep(spec, tmp_path / "out", jobs=1)
    table = pd.read_parquet(report.table)
    assert (report.points, report.cached, report.computed, report.errors) == (6, 0, 6, 0)
    assert list(table.columns[:1 + len(RunConfig.field_names())]) == ["point_id", *RunConfig.field_names()]
    assert list(zip(table.scheduler, table.I)) == [(p["scheduler"], p["I"]) for p in spec.points()]
    assert (table.status == "ok").all() and table.error.isna().all()
    # Counts derivable by hand: 6 requests x 3 tokens each; no evictions at M = 100K.
    assert (table.num_requests == 6).all() and (table.generated_tokens == 18).all() and (table.evictions == 0).all()
    assert list(table.limit_P) == [4096, 4096, 4096, 512, 512, 512]
    # Each row's metrics are exactly those of simulating its configuration directly.
    row = table.iloc[4]
    direct = RunConfig(scheduler="sarathi", I=16, O=3, B=6, cost_model="linear").simulate().summary
    assert {k: row[k] for k in direct} == direct
    assert row.point_id == point_id("simulate", spec.points()[4])


def test_a_results_row_runs_again_under_its_own_point_id(tmp_path):
    """Found by probing the Python API (2026-12-02): a row of a results table handed back to `run_point` ended in
    "Object of type int64 is not JSON serializable" (parquet gives numpy numbers), and an unset float field held as
    NaN would be taken as given. Now a configuration's numpy scalars are read as Python values and NaN as unset."""
    from infermax.sweep import run_point

    spec = load_spec(write(tmp_path, SMALL))
    table = pd.read_parquet(run_sweep(spec, tmp_path / "out", jobs=1).table)
    table["rate"] = table["rate"].astype(float)  # (how a float column holds an unset value: NaN)
    row = table.iloc[4]
    config = {name: row[name] for name in RunConfig.field_names()}
    assert type(config["I"]).__module__ == "numpy" and config["rate"] != config["rate"]
    again = run_point("simulate", config)
    assert again["id"] == row.point_id and again["result"]["status"] == "ok"
    assert again["result"]["tps"] == row.tps and again["config"]["rate"] is None and type(again["config"]["I"]) is int
    json.dumps(again)  # plain data
    assert RunConfig.from_dict(config) == RunConfig.from_dict(spec.points()[4])


def test_rejected_configurations_become_error_rows(tmp_path):
    # I + O - 1 = 101 KV tokens never fit M = 100: that point is an error row, the others run.
    spec = parse_spec({"base": {"B": 4, "O": 2, "M": 100, "cost_model": "linear"}, "axes": {"I": [10, 100]}})
    report = run_sweep(spec, tmp_path, jobs=1)
    table = pd.read_parquet(report.table)
    assert report.errors == 1 and list(table.status) == ["ok", "error"]
    assert "needs 101 KV tokens" in table.error[1] and pd.isna(table.tps[1]) and table.tps[0] > 0


def test_rerun_computes_nothing_and_parallel_equals_serial(tmp_path):
    spec = load_spec(write(tmp_path, SMALL))
    serial = run_sweep(spec, tmp_path / "serial", jobs=1)
    parallel = run_sweep(spec, tmp_path / "parallel", jobs=2)
    pd.testing.assert_frame_equal(pd.read_parquet(serial.table), pd.read_parquet(parallel.table))
    again = run_sweep(spec, tmp_path / "parallel", jobs=2)
    assert (again.cached, again.computed) == (6, 0)
    pd.testing.assert_frame_equal(pd.read_parquet(serial.table), pd.read_parquet(again.table))


def test_a_changed_spec_reuses_the_points_it_shares(tmp_path):
    run_sweep(load_spec(write(tmp_path, SMALL)), tmp_path / "out", jobs=1)
    bigger = load_spec(write(tmp_path, SMALL.replace("I = [4, 16, 64]", "I = [4, 16, 64, 128]"), "bigger.toml"))
    report = run_sweep(bigger, tmp_path / "out", jobs=1)
    assert (report.points, report.cached, report.computed) == (8, 6, 2)
    assert len(pd.read_parquet(report.table)) == 8


def test_resuming_over_a_refitted_cost_model_is_refused(tmp_path):
    from infermax.costmodel import load_cost_model

    model_file = tmp_path / "model.json"
    load_cost_model(kind="linear").save(model_file)
    spec = load_spec(write(tmp_path, SMALL.replace('cost_model = "linear"', f'costmodel_path = "{model_file}"')))
    run_sweep(spec, tmp_path / "out", jobs=1)
    assert run_sweep(spec, tmp_path / "out", jobs=1).computed == 0  # same file: resumes
    doc = json.loads(model_file.read_text())
    doc["per_layer_ms"]["non_attention"]["per_token"] *= 1.5
    model_file.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="6 finished point.*other inputs"):
        run_sweep(spec, tmp_path / "out", jobs=1)
    assert run_sweep(spec, tmp_path / "fresh", jobs=1).computed == 6


def test_a_damaged_point_file_is_recomputed_and_stale_temp_files_removed(tmp_path):
    spec = load_spec(write(tmp_path, SMALL))
    report = run_sweep(spec, tmp_path / "out", jobs=1)
    points = tmp_path / "out" / "points"
    victim = points / f"{point_id('simulate', spec.points()[0])}.json"
    victim.write_text(victim.read_text()[:40])  # as if written without the atomic rename
    (points / ".leftover.json.tmp").write_text("{")
    again = run_sweep(spec, tmp_path / "out", jobs=1)
    assert (again.cached, again.computed) == (5, 1)
    assert not list(points.glob(".*.tmp"))
    pd.testing.assert_frame_equal(pd.read_parquet(report.table), pd.read_parquet(again.table))


def test_one_sweep_per_results_directory(tmp_path):
    spec = load_spec(write(tmp_path, SMALL))
    with ResultStore(tmp_path / "out"):
        with pytest.raises(RuntimeError, match="in use by another running sweep"):
            run_sweep(spec, tmp_path / "out", jobs=1)


KILL_SPEC = """
name = "kill"
[base]
scheduler = "sarathi"
I = 64
B = 300
M = 5000
cost_model = "linear"
[axes]
O = [{outputs}]
"""


def test_resume_after_sigkill_keeps_every_finished_point(tmp_path):
    outputs = list(range(280, 312, 2))  # 16 points of about 0.3 s each
    spec_path = write(tmp_path, KILL_SPEC.format(outputs=", ".join(map(str, outputs))))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "infermax", "sweep", str(spec_path), "--out", str(out), "--jobs", "2",
               "--no-progress"]
    proc = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    points = out / "points"
    deadline = time.monotonic() + 120
    while len(list(points.glob("*.json"))) < 3:
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in points.glob("*.json")}
    assert 3 <= len(finished) < len(outputs), "kill the sweep mid-run"
    for content in finished.values():
        json.loads(content[1])  # every point file left behind is whole
    # The pool workers exit with the killed sweep instead of lingering.
    deadline = time.monotonic() + 30
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "orphaned sweep workers are still running"
        time.sleep(0.1)

    resumed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(outputs)} points ({len(finished)} already done, {len(outputs) - len(finished)} computed, 0 errors)" \
        in resumed.stdout
    for name, (mtime, content) in finished.items():  # not rewritten, so not recomputed
        assert ((points / name).stat().st_mtime_ns, (points / name).read_bytes()) == (mtime, content)
    table = pd.read_parquet(out / "results.parquet")
    assert list(table.O) == outputs and (table.status == "ok").all()
    fresh = run_sweep(load_spec(spec_path), tmp_path / "fresh", jobs=2)
    pd.testing.assert_frame_equal(table, pd.read_parquet(fresh.table))


def test_cli_dry_run_and_errors(tmp_path):
    spec = write(tmp_path, SMALL)
    result = runner.invoke(app, ["sweep", str(spec), "--dry-run"])
    assert result.exit_code == 0 and "small: 6 simulate points over scheduler (2) x I (3)" in result.output
    bad = write(tmp_path, "[base]\nbatch = 3", "bad.toml")
    result = runner.invoke(app, ["sweep", str(bad)])
    assert result.exit_code == 2 and "unknown simulate field(s) in [base]: batch" in result.output
    result = runner.invoke(app, ["sweep", str(spec), "--backend", "slurm", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "unknown backend 'slurm'" in result.output


def test_backend_options_are_checked_before_any_point_or_store(tmp_path, monkeypatch):
    """--address with the local backend (and the ray backend without Ray) are refused before the results store is
    opened and the progress bar drawn (2026-12-02: both came after the bar's "0/N points" line)."""
    spec = load_spec(write(tmp_path, SMALL))
    with pytest.raises(ValueError, match="--address applies to the ray backend only"):
        run_sweep(spec, tmp_path / "local", address="10.0.0.1:6379")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails, whether or not it is installed
    with pytest.raises(ValueError, match="the ray backend needs Ray"):
        run_sweep(spec, tmp_path / "ray", backend="ray")
    assert not (tmp_path / "local").exists() and not (tmp_path / "ray").exists()


def test_cli_runs_and_draws_the_specs_figures(tmp_path):
    spec = write(tmp_path, SMALL + '\n[[plot]]\nkind = "lines"\nfile = "tps.svg"\nmetrics = ["tps"]\nx = "I"\ncol = "O"\n')
    result = runner.invoke(app, ["sweep", str(spec), "--no-progress", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "small: 6 points (0 already done, 6 computed, 0 errors)" in result.output
    figure = tmp_path / "results" / "small" / "figures" / "tps.svg"
    assert figure.read_text().lstrip().startswith("<?xml") and "<svg" in figure.read_text()


def test_a_plot_of_a_metric_no_point_has_fails_cleanly_after_storing_the_results(tmp_path):
    """A [[plot]] naming a column the table lacks was a traceback after the sweep; it is now an error naming the plot,
    and the results are stored (a rerun computes nothing)."""
    spec = write(tmp_path, SMALL + '\n[[plot]]\nkind = "lines"\nfile = "x.svg"\nmetrics = ["tps", "nosuch"]\nx = "I"\n')
    result = runner.invoke(app, ["sweep", str(spec), "--no-progress", "--jobs", "1"])
    assert result.exit_code == 2, result.output
    assert "plot 0 (x.svg): no column(s) nosuch in the table" in result.output and "Traceback" not in result.output
    assert (tmp_path / "results" / "small" / "results.parquet").is_file()
    again = runner.invoke(app, ["sweep", str(spec), "--no-progress", "--jobs", "1", "--no-plots"])
    assert again.exit_code == 0 and "6 already done, 0 computed" in again.output
