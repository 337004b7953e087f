"""The README's examples run as written, so they cannot rot: its Python snippet, its first set-up
command, its cheap `infermax` commands (on small sizes), and the percentages its `better` lines promise."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infermax.cli import app

README = Path(__file__).resolve().parent.parent / "README.md"
CI_RUN = Path(__file__).resolve().parent.parent / ".ci" / "run"
SMALL_B = "16"
# Commands that need a GPU, a long grid, or write into the repository: not run here (each has its own tests).
NOT_CHEAP = ("profile", "gpu-replay", "sweep", "plot", "capacity", "optimize")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def commands(block: str) -> list[str]:
    """The command lines of a bash block: continuations joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def infermax_args(line: str) -> list[str]:
    """The arguments after ``infermax`` / ``python -m infermax`` in one command line ([] if none)."""
    words = shlex.split(line.split("&&")[-1])
    for i, w in enumerate(words):
        if w == "infermax" and (i == 0 or words[i - 1] == "-m"):
            return words[i + 1:]
    return []


def small(args: list[str]) -> list[str]:
    """``args`` with the workload shrunk: ``--B`` set to a few requests, a trace cut to a few rows."""
    args = list(args)
    if "--B" in args:
        args[args.index("--B") + 1] = SMALL_B
    elif args[0] == "simulate" and "--trace" in args:
        args += ["--trace-limit", SMALL_B]
    elif args[0] == "simulate":
        args += ["--B", SMALL_B]
    if args[0] == "simulate":
        args.append("--no-progress")
    return args


def invoke(args):
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_python_snippet_runs(tmp_path, monkeypatch):
    (snippet,) = blocks("python")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    assert scope["again"].summary == pytest.approx(scope["result"].summary)
    assert (tmp_path / "runs" / "x" / "schedule.json").is_file()


def test_setup_commands_are_what_ci_runs():
    """`.ci/run` runs the README's test command: the same steps, quiet, and a failed first step (the CPU-only
    PyTorch index unreachable) tolerated as the README's ``;`` tolerates it."""
    setup = commands(blocks("bash")[0])
    assert setup[0].startswith("pip install -e . && infermax simulate")
    ci = [ln.replace("pip install -q ", "pip install ").removesuffix(" || true")
          for ln in CI_RUN.read_text().splitlines() if ln.startswith("pip install")]
    assert ci == [step.strip() for step in setup[1].split(";")], (ci, setup[1])


def test_first_setup_simulate_runs_on_a_small_size():
    args = small(infermax_args(commands(blocks("bash")[0])[0]))
    res = invoke(args)
    assert res.exit_code == 0, res.output
    assert "makespan_s" in res.output


def using_it_commands() -> list[list[str]]:
    using = blocks("bash")[1]
    found = [infermax_args(line) for line in commands(using)]
    return [a for a in found if a and a[0] not in NOT_CHEAP]


def test_using_it_lists_cheap_commands():
    names = {a[0] for a in using_it_commands()}
    assert {"simulate", "validate", "costmodel", "better", "models", "schedulers"} <= names


def test_using_it_commands_run(tmp_path, monkeypatch):
    """Every cheap command of the "Using it" block, in order (``validate`` reads what ``simulate --out`` wrote;
    the length-only trace example reads a user's ``lengths.csv``, written here in Vidur's format)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lengths.csv").write_text("num_prefill_tokens,num_decode_tokens,pd_ratio\n16,4,4.0\n32,8,4.0\n")
    for args in using_it_commands():
        args = small(args) if args[0] == "simulate" else args
        res = invoke(args)
        assert res.exit_code == 0, (args, res.output)


def better_examples() -> list[tuple[list[str], str]]:
    """``(args, promise)`` of every README ``better`` line with a ``# yes: X% better`` / ``# no`` comment."""
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            m = re.search(r"#\s*(yes: [\d.]+% better|no)\b", line)
            args = infermax_args(line.split("#")[0])
            if m and args and args[0] == "better":
                found.append((args, m.group(1)))
    return found


def test_readme_has_better_examples():
    promises = [p for _, p in better_examples()]
    assert any(p.startswith("yes") for p in promises) and "no" in promises


@pytest.mark.parametrize("args,promise", better_examples(), ids=lambda v: v if isinstance(v, str) else " ".join(v[:3]))
def test_better_prints_what_the_readme_says(args, promise):
    res = invoke(args)
    assert res.exit_code == 0, res.output
    if promise == "no":
        assert re.search(r"^no\b", res.output, flags=re.M), res.output
    else:
        pct = promise.split()[1]
        assert re.search(rf"^yes: found a schedule {re.escape(pct)} better", res.output, flags=re.M), res.output
