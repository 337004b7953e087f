"""The command line as a user meets it (issues 17 and 18): what a command imports, errors that name the
option typed, help grouped into panels, tables readable at 80 columns, Ctrl-C in a sweep, workloads
that cannot fit in memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infermax import workload
from infermax.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

# Modules a plain `simulate` must not pay for: fitting, plotting, MILP and GPU/cluster stacks.
HEAVY = ("scipy", "sklearn", "matplotlib", "pulp", "highspy", "torch", "ray")


def run_cli(*args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    """``python -m infermax ARGS`` in a fresh process (this tree first on the path, a neutral directory)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "infermax", *args], capture_output=True, text=True, env=env,
                          cwd=Path(os.sep), timeout=300)


def test_simulate_imports_no_heavy_module():
    """The whole `infermax simulate` process, run as the console script runs it, then its sys.modules."""
    script = ("import runpy, sys, json\n"
              "sys.argv = ['infermax', 'simulate', '--I', '1', '--O', '1', '--B', '1', '--json']\n"
              "try:\n    runpy.run_module('infermax', run_name='__main__')\n"
              "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
              f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(os.sep),
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    summary, imported = done.stdout.strip().splitlines()
    assert json.loads(summary)["generated_tokens"] == 1
    assert json.loads(imported) == []


@pytest.mark.parametrize("args, message", [
    (["simulate", "-s", "sarath"], "--scheduler: unknown scheduler 'sarath'; did you mean sarathi"),
    (["simulate", "-s", "vlm"], "did you mean vllm"),
    (["better", "-s", "sarath"], "did you mean sarathi"),
    (["optimize", "--threads", "0"], "--threads must be an integer >= 1, got 0"),
    (["capacity", "--seeds", "0"], "--seeds must be an integer >= 1, got 0"),
    (["simulate", "--input-dist", "lognormal:abc", "--output-dist", "const:4"], "--input-dist: bad length"),
    (["validate", "x.json", "--cost-model-file", "/missing.json"], "--cost-model-file /missing.json: no such file"),
    (["costmodel", "show", "--cost-model-file", "/missing.json"], "--cost-model-file /missing.json: no such file"),
])
def test_errors_name_the_option_on_one_line(args, message):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert res.output.count("\n") == 1 and "Traceback" not in res.output


@pytest.mark.parametrize("args, message", [
    # a ':word:' the user typed prints as typed (rich turned ':100:' into an emoji)
    (["simulate", "--input-dist", "uniform:100:10", "--output-dist", "const:4"], "'uniform:100:10'"),
    (["simulate", "--arrival", "gamma", "--rate", "4", "--cv", "1e-200"], "cv = 1e-200 is too extreme"),
    (["simulate", "--arrival", "gamma", "--rate", "4", "--cv", "1e200"], "cv = 1e+200 is too extreme"),
    (["simulate", "--arrival", "poisson", "--rate", "1e-320"], "arrival times overflow"),
    (["simulate", "--block-size", "99999999999", "--M", "99999999999"], "block_size = 99999999999 is above"),
    (["optimize", "--time-limit", "nan"], "--time-limit must be a finite number > 0"),
    (["better", "--time-limit", "inf"], "--time-limit must be a finite number > 0"),
    (["simulate", "--input-dist", "uniform:1e30:1e31", "--output-dist", "const:4"], "lengths above 2,147,483,647"),
    # an infinite lognormal draw is clipped like any long one (it was cast to -2^63 with a numpy warning)
    (["simulate", "--B", "50", "--input-dist", "lognormal:512:1e6", "--output-dist", "const:4"], "I=2147483647"),
])
def test_extreme_numbers_are_refused_on_one_line(args, message):
    """Found by a random campaign of the command line (2026-11-28): each of these was a traceback (or, for NaN, an
    accepted time limit)."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("command", [["simulate"], ["optimize", "--time-limit", "5"], ["better", "--time-limit", "5"]])
def test_an_output_directory_that_cannot_be_made_is_refused_before_any_work(tmp_path, command):
    """``--out`` naming an existing file used to end in a FileExistsError traceback, after the whole solve."""
    afile = tmp_path / "afile"
    afile.write_text("")
    res = runner.invoke(app, [*command, "--I", "4", "--O", "2", "--B", "2", "--out", str(afile)])
    assert res.exit_code == 2 and "--out" in res.output and "cannot create directory" in res.output, res.output
    made = tmp_path / "new" / "dir"
    res = runner.invoke(app, ["simulate", "--I", "4", "--O", "2", "--B", "2", "--out", str(made)])
    assert res.exit_code == 0 and (made / "summary.json").exists(), res.output


def test_a_failing_bound_lp_leaves_the_trivial_bound(monkeypatch):
    """HiGHS failing on an LP (seen at O = 10^8) gives the trivial bound with the reason, not a traceback."""
    from infermax.costmodel import load_cost_model
    from infermax.limits import Limits
    from infermax.workload import fixed
    from solvers import Objective
    from solvers import lower_bound as lb

    def fail(*args, **kwargs):
        raise RuntimeError("lower-bound LP failed: (HiGHS Status 4: Solve error)")

    monkeypatch.setattr(lb.LowerBounder, "of", fail)
    report = lb.lower_bound_report(fixed(4, 2, 2), Limits(), load_cost_model(), Objective(makespan=1))
    assert report.value_s == 0.0 and "HiGHS Status 4" in report.method


def test_a_distribution_alone_is_still_an_error_after_it_parses():
    res = runner.invoke(app, ["simulate", "--input-dist", "const:4"])
    assert res.exit_code == 2 and "--input-dist and --output-dist go together" in res.output


def test_sweep_interrupted_tells_how_to_resume(tmp_path, monkeypatch):
    import infermax.sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(infermax.sweep, "run_sweep", interrupted)
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "s"\n[base]\nB = 2\n[axes]\nI = [4, 8]\n')
    res = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "out")])
    assert res.exit_code == 130
    assert "interrupted; rerun the same command to resume" in res.output


def test_a_workload_larger_than_memory_is_refused_before_allocating():
    res = runner.invoke(app, ["simulate", "--B", "10000000000"])
    assert res.exit_code == 2, res.output
    assert "B (--B) = 10,000,000,000 requests need about" in res.output and "physical memory" in res.output


def test_memory_check_compares_the_estimate_with_physical_memory(monkeypatch):
    monkeypatch.setattr(workload, "physical_memory_bytes", lambda: 100 * workload.BYTES_PER_REQUEST)
    workload.check_fits_in_memory(100)
    with pytest.raises(ValueError, match="101 requests need about .* GiB of physical memory"):
        workload.fixed(1, 1, 101)
    with pytest.raises(ValueError, match="num_requests = 101"):
        workload.sampled(101, "const:1", "const:1")


def test_a_run_with_more_batches_than_memory_holds_is_refused_before_it_starts(monkeypatch):
    """Every batch is kept (the Schedule, the batch table), and a request's tokens come from distinct batches: a
    100,000,000-token output needed ~75 GiB and ran until memory was gone. The engine refuses it up front."""
    from infermax.engine import simulate
    from infermax.request import Request

    monkeypatch.setattr(workload, "physical_memory_bytes", lambda: 1_000_000)
    with pytest.raises(ValueError, match="at least 2,000 batches .* GiB to simulate"):
        simulate([Request(0, 0.0, 1, 2000)], "vllm")
    assert simulate([Request(0, 0.0, 1, 500)], "vllm").summary["num_batches"] == 500  # 0.4 MB: runs


def test_simulate_help_groups_options_into_panels_and_flags_are_plain():
    out = run_cli("simulate", "--help", columns=100).stdout
    for panel in ("Cost model", "Workload", "Arrivals", "Limits", "Latency targets", "Output"):
        assert f"─ {panel} ─" in out, panel
    flags = [line for line in out.splitlines() if "--no-progress" in line or "--json" in line]
    assert flags and not any("<bool>" in line for line in flags)
    assert "<int>" in out  # value options keep their type


@pytest.mark.parametrize("args", [
    ["costmodel", "show"],
    ["costmodel", "show", "--cost-model", "linear"],
    ["costmodel", "show", "--gpu", "h100", "--model", "llama-2-70b", "--tp", "4"],
    ["models"],
    ["schedulers"],
])
def test_tables_are_whole_at_80_columns(args):
    done = run_cli(*args, columns=80)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


@pytest.mark.parametrize("name", ["[/x]", "[red]"])
def test_paths_and_names_print_as_typed(tmp_path, name):
    """What a user typed is not rich markup: an output folder '…/[/x]' stopped `simulate` with rich's MarkupError
    after the run, '…/[red]' printed as '…/', and a sweep named 'a[red]b' as 'ab'."""
    out = tmp_path / name
    res = runner.invoke(app, ["simulate", "--I", "1", "--O", "1", "--B", "1", "--out", str(out)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert f"results written to {out}" in res.output
    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = "a{name.replace("/", "")}b"\n[base]\nB = 2\nI = 4\nO = 2\n[axes]\nscheduler = ["vllm"]\n')
    swept = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "sweep"), "--no-plots"],
                          env={"COLUMNS": "250"})
    assert swept.exit_code == 0, swept.output
    assert f"a{name.replace('/', '')}b: 1 points" in swept.output


def test_progress_lines_are_not_wrapped():
    """`better`'s progress lines reach a log whole: a candidate's error of more than 80 characters (vllm-ef cannot
    chunk a 5,000-token prompt) was broken over three lines at rich's default width. (Such candidates are no longer
    run; the line that says so is as long.)"""
    res = runner.invoke(app, ["better", "-s", "sarathi", "--I", "5000", "--O", "2", "--B", "2", "--time-limit", "6"])
    assert res.exit_code in (0, 1), res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("  not run: "))
    assert len(line) > 80 and line.endswith("request 0's 5000-token prompt"), line


def test_help_prints_each_paragraph_of_a_command_docstring_on_one_line():
    """Typer keeps the line breaks of a docstring's later paragraphs; wrapped at the source's width they printed
    ragged lines in --help (`sweep`: "… so the committed" / "results under experiments/results/ …")."""
    import inspect

    groups = [([], app)] + [([g.name], g.typer_instance) for g in app.registered_groups]
    commands = [(path + [c.name or c.callback.__name__.replace("_", "-")], c.callback)
                for path, typer_app in groups for c in typer_app.registered_commands]
    assert len(commands) > 10
    for path, callback in commands:
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "1000"}).output
        lines = [" ".join(line.split()) for line in out.splitlines()]
        for paragraph in inspect.cleandoc(callback.__doc__).split("\n\n"):
            text = " ".join(paragraph.split())
            assert any(text in line for line in lines), (path, text)


@pytest.mark.parametrize("family, place", [("linear", "per_token"), ("piecewise", "intercept")])
def test_batch_times_that_overflow_are_refused(tmp_path, family, place):
    """A hand-edited cost model with a coefficient of 1e308 s is finite, so it loads; its batch times (or their sum,
    the clock) overflow to infinity, and `simulate` and `validate` printed null metrics with exit code 0 (found by a
    fuzz of cost-model files, 2026-12-01). Now both stop at the first batch that ends past the largest float. A model
    one hundred times its real size still runs: only an overflow is refused."""
    import math

    from infermax.costmodel import profile_folder

    doc = json.loads((profile_folder("a100", "llama-2-7b", 1) / f"infermax_{family}.json").read_text())
    if family == "linear":
        doc["per_layer_ms"]["non_attention"]["per_token"] = 1e308
    else:
        doc["terms"][0]["pieces"][0]["intercept_s"] = 1e308
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    args = ["--I", "16", "--O", "4", "--B", "4", "--json", "--no-progress"]
    res = runner.invoke(app, ["simulate", *args, "--cost-model-file", str(bad)])
    assert res.exit_code == 2 and "ends past the largest float" in res.output and "Traceback" not in res.output
    out = tmp_path / "run"
    assert runner.invoke(app, ["simulate", *args, "--out", str(out)]).exit_code == 0
    res = runner.invoke(app, ["validate", str(out / "schedule.json"), "--json", "--cost-model-file", str(bad)])
    assert res.exit_code == 2 and "ends past the largest float" in res.output and "Traceback" not in res.output
    if family == "linear":
        doc["per_layer_ms"]["non_attention"]["per_token"] *= 1e-308 * 100 * 0.002  # about 100x the fitted value
    else:
        doc["terms"][0]["pieces"][0]["intercept_s"] = 100 * 0.00914
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc))
    res = runner.invoke(app, ["simulate", *args, "--cost-model-file", str(big)])
    assert res.exit_code == 0 and math.isfinite(json.loads(res.output)["makespan_s"]), res.output
