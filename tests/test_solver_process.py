"""The MILP backends' forked solver process (`solvers.backends.solve`): a solver that overruns its time limit is
stopped with its process group, its progress and errors come back, and a normal solve gives what an in-process
solve gives."""

from __future__ import annotations

import importlib
import math
import multiprocessing as mp
import os
import subprocess
import tempfile
import time

import pulp
import pytest

from solvers import backends
from solvers.backends import (Progress, SolveOptions, SolveOutcome, SolverFailed, SolverUnavailable, cbc_command,
                              solve)

pytestmark = pytest.mark.skipif(not backends._can_fork(), reason="solvers run in-process on this platform")


def _knapsack() -> tuple[pulp.LpProblem, list[pulp.LpVariable]]:
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize)
    xs = [prob.add_variable(f"x{i}", 0, 1, cat=pulp.LpInteger) for i in range(12)]
    weights = [7, 3, 9, 4, 6, 5, 8, 2, 7, 3, 6, 4]
    prob += pulp.lpSum((w + i % 3) * x for i, (w, x) in enumerate(zip(weights, xs)))
    prob += pulp.lpSum(w * x for w, x in zip(weights, xs)) <= 23
    return prob, xs


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_a_solve_in_its_process_gives_the_in_process_result(backend):
    if backend == "cbc" and not cbc_command().available():
        pytest.skip("no CBC binary")
    prob, xs = _knapsack()
    here = solve(prob, SolveOptions(backend))  # no time limit: solved in this process
    values_here = [x.varValue for x in xs]
    for x in xs:
        x.varValue = None
    there = solve(prob, SolveOptions(backend, time_limit_s=10))
    assert (there.status, there.has_solution, there.incumbent, there.bound) == \
        (here.status, here.has_solution, here.incumbent, here.bound) == ("optimal", True, here.incumbent, here.incumbent)
    assert [x.varValue for x in xs] == values_here
    assert sum(values_here) > 0
    assert not mp.active_children()


def _hanging(progress_bound: float, pid_file: str | None = None, scratch_file: str | None = None):
    def run(prob, options, warm):
        options.on_progress(Progress(0.1, 10.0, progress_bound - 1.0))
        options.on_progress(Progress(0.2, 10.0, progress_bound))
        if scratch_file:  # a temporary file, as PuLP's CBC writes its model and solution
            path = os.path.join(tempfile.gettempdir(), "model.mps")
            with open(path, "w") as f:
                f.write("NAME x")
            with open(scratch_file, "w") as f:
                f.write(path)
        if pid_file:  # a grandchild, as PuLP's CBC binary is
            proc = subprocess.Popen(["sleep", "60"])
            with open(pid_file, "w") as f:
                f.write(str(proc.pid))
        time.sleep(60)
        return SolveOutcome("highs", "optimal", True, 1.0, 1.0, 60.0)  # what a solve not stopped would report
    return run


def test_a_solver_past_its_limit_is_stopped_with_its_bound_and_progress(monkeypatch):
    monkeypatch.setattr(backends, "_solve_highs", _hanging(7.5))
    seen = []
    prob, _ = _knapsack()
    out = solve(prob, SolveOptions(time_limit_s=0.2, stop_after_s=1.5, on_progress=seen.append))
    assert (out.status, out.has_solution, out.incumbent, out.bound) == ("time_limit", False, math.inf, 7.5)
    assert [p.bound for p in seen] == [6.5, 7.5] == [p.bound for p in out.progress]
    assert "its process was stopped" in out.notes[0]
    assert not mp.active_children()


def test_a_stopped_solve_keeps_the_warm_start(monkeypatch):
    monkeypatch.setattr(backends, "_solve_highs", _hanging(2.0))
    prob, xs = _knapsack()
    start = [1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]  # weight 16 of 23
    for x, value in zip(xs, start):
        x.varValue = value
    out = solve(prob, SolveOptions(time_limit_s=0.2, stop_after_s=1.5), warm=True)
    assert (out.status, out.has_solution, out.bound) == ("time_limit", True, 2.0)
    assert out.incumbent == sum((w + i % 3) * v for i, (w, v) in enumerate(zip([7, 3, 9, 4, 6, 5, 8, 2, 7, 3, 6, 4], start)))
    assert [x.varValue for x in xs] == start
    assert "warm start as its incumbent" in out.notes[0]


def _solving_then_hanging():
    """The real HiGHS backend, whose process then never returns: what it found came back only as it found it."""
    real = backends._solve_highs

    def run(prob, options, warm):
        real(prob, options, warm)
        time.sleep(60)
    return run


def _knapsack_optimum() -> tuple[float, list[float]]:
    """The optimum's objective in PuLP's terms (the knapsack's value; HiGHS's own, negated, is what a finished
    solve reports) and its values."""
    prob, xs = _knapsack()
    assert solve(prob, SolveOptions()).status == "optimal"  # in this process
    return prob.objective.value(), [x.varValue for x in xs]


@pytest.mark.parametrize("start", [None, [1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]])
def test_a_stopped_solve_keeps_the_incumbent_highs_found(monkeypatch, start):
    """HiGHS sends each improving incumbent as it finds it, so a solve stopped after it found the optimum returns
    the optimum, with or without a (worse) warm start; the knapsack maximises, so better means larger."""
    best, values = _knapsack_optimum()
    monkeypatch.setattr(backends, "_solve_highs", _solving_then_hanging())
    prob, xs = _knapsack()
    if start is not None:
        for x, value in zip(xs, start):
            x.varValue = value
        assert prob.objective.value() < best
    out = solve(prob, SolveOptions(time_limit_s=0.5, stop_after_s=4.0), warm=start is not None)
    assert (out.status, out.has_solution, out.incumbent) == ("time_limit", True, best)
    assert [x.varValue for x in xs] == values
    assert "its last incumbent" in out.notes[0]


def test_a_stopped_solve_keeps_a_warm_start_better_than_what_highs_sent(monkeypatch):
    """The solver's incumbent replaces the warm start only when it is better in the model's sense (here an
    incumbent sent before the stop is worse than the start)."""
    def run(prob, options, warm):
        options.on_incumbent([0.0] * len(prob.variables()))  # the empty knapsack: objective 0
        time.sleep(60)
    monkeypatch.setattr(backends, "_solve_highs", run)
    prob, xs = _knapsack()
    start = [1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    for x, value in zip(xs, start):
        x.varValue = value
    out = solve(prob, SolveOptions(time_limit_s=0.2, stop_after_s=1.5), warm=True)
    assert out.has_solution and out.incumbent == prob.objective.value() > 0
    assert [x.varValue for x in xs] == start
    assert "warm start as its incumbent" in out.notes[0]


def test_the_default_stop_is_the_limit_plus_a_grace(monkeypatch):
    assert backends.stop_grace_s(10) == 5.0 and backends.stop_grace_s(600) == 30.0
    monkeypatch.setattr(backends, "stop_grace_s", lambda limit_s: 1.0)
    monkeypatch.setattr(backends, "_solve_highs", _hanging(3.0))
    prob, _ = _knapsack()
    out = solve(prob, SolveOptions(time_limit_s=0.2))
    assert out.status == "time_limit" and out.bound == 3.0


def test_stopping_the_solver_stops_the_processes_it_started(monkeypatch, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    monkeypatch.setattr(backends, "_solve_highs", _hanging(1.0, str(pid_file)))
    prob, _ = _knapsack()
    out = solve(prob, SolveOptions(time_limit_s=0.2, stop_after_s=2.0))
    assert out.status == "time_limit"
    pid = int(pid_file.read_text())
    for _ in range(50):  # reparented to init once its parent is gone, which reaps it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the solver's own child survived the stop")


def test_the_solvers_temporary_files_go_with_it(monkeypatch, tmp_path):
    where = tmp_path / "where"
    monkeypatch.setattr(backends, "_solve_highs", _hanging(1.0, scratch_file=str(where)))
    prob, _ = _knapsack()
    solve(prob, SolveOptions(time_limit_s=0.2, stop_after_s=1.5))
    written = where.read_text()
    assert os.path.basename(os.path.dirname(written)).startswith("infermax-solver-")
    assert not os.path.exists(os.path.dirname(written))


@pytest.mark.parametrize("raised, expected, words", [
    (SolverUnavailable("no licence"), SolverUnavailable, "no licence"),
    (SolverFailed("contradicted the warm start"), SolverFailed, "contradicted the warm start"),
    (ValueError("unknown option"), ValueError, "unknown option"),
    (MemoryError("std::bad_alloc"), SolverFailed, "MemoryError: std::bad_alloc"),
])
def test_the_solvers_errors_come_back(monkeypatch, raised, expected, words):
    def run(prob, options, warm):
        raise raised
    monkeypatch.setattr(backends, "_solve_highs", run)
    prob, _ = _knapsack()
    with pytest.raises(expected, match=words):
        solve(prob, SolveOptions(time_limit_s=5))


def test_a_solver_process_that_dies_is_a_failure(monkeypatch):
    monkeypatch.setattr(backends, "_solve_highs", lambda prob, options, warm: os._exit(3))
    prob, _ = _knapsack()
    with pytest.raises(SolverFailed, match="exit code 3"):
        solve(prob, SolveOptions(time_limit_s=5))


def test_optimize_keeps_its_deadline_when_the_solver_hangs(monkeypatch):
    """`optimize` places the stop of a solver that does not return at least 1 s (the polish's and the replay's
    reserve, beyond the build time) before the deadline, the solver's own limit before the stop, and answers
    with the warm start. (The placement is read from the options handed to `solve`, against the deadline's time
    left at that call; no duration is measured.)"""
    from infermax.costmodel import load_cost_model
    from infermax.engine import simulate
    from infermax.limits import Limits
    from infermax.workload import fixed
    optimize_module = importlib.import_module("solvers.optimize")  # (the package exports `optimize`, the function)
    from solvers.objective import Objective
    from solvers.scale import Deadline

    limits, cost = Limits(C=4096, M=8), load_cost_model(kind="linear")
    requests = fixed(4, 2, 4)
    warm = simulate(requests, "vllm", limits, cost).schedule
    monkeypatch.setattr(backends, "_solve_highs", _hanging(0.0))
    deadline = Deadline(6.0)
    handed = []

    def recording_solve(prob, options, warm=False):
        handed.append((options, deadline.left()))
        return solve(prob, options, warm)

    monkeypatch.setattr(optimize_module, "solve", recording_solve)
    res = optimize_module.optimize(requests, limits, cost, Objective(makespan=1), warm_start=warm, deadline=deadline)
    (options, left_s), = handed
    assert options.time_limit_s < options.stop_after_s <= left_s - 0.5
    assert res.solve.status == "time_limit" and "its process was stopped" in res.solve.notes[0]
    vllm_s = simulate(requests, "vllm", limits, cost).summary["makespan_s"]
    assert res.status == "feasible" and res.value_s == pytest.approx(vllm_s)
