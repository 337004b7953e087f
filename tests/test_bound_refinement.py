"""Refining the state-path bound with the time a search left (`lower_bound.refine_bound`, `better`, `analyse`).

The first bound gives the state path (identical requests arriving together) its budget; where that stopped at cells
wider than one request, a caller whose search finished early goes on with narrower cells. These tests check that the
later call starts where the first stopped (and reuses its batch-shape table), that the raised bound weighs the
latency component as the objective does and stays below every schedule, and that `better` and `analyse` spend the
time only when no MILP runs and the answer is not settled."""

from __future__ import annotations

import pytest

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed
from solvers import Objective, identical_bound, lower_bound
from solvers.identical_bound import default_width, state_path_latency
from solvers.lower_bound import BoundReport, LatencyRefinement, lower_bound_report, refine_bound

COST = load_cost_model()
LATENCY = Objective(latency=1)
REQUESTS, LIMITS = fixed(32, 6, 20), Limits(C=256, M=4_000)  # 20 requests: cells of 3, then 2, then 1
SCHEDULERS = ("vllm", "sarathi", "sarathi-pc", "rank-i", "rank-o")


def _widths(monkeypatch) -> list[int]:
    """The cell widths the state path's MILPs are built with, from now on (recorded as they are solved)."""
    solved, milp = [], identical_bound._cell_milp_bound

    def recording(lattice, *args, **kwargs):
        first = lattice.cell[1]
        solved.append(first[1] - first[0] + 1)
        return milp(lattice, *args, **kwargs)

    monkeypatch.setattr(identical_bound, "_cell_milp_bound", recording)
    return solved


def _upper() -> float:
    return LATENCY.value(simulate(REQUESTS, "sarathi", LIMITS, COST))


def test_a_later_call_goes_on_with_narrower_cells_and_the_same_table(monkeypatch):
    upper = _upper()
    first = state_path_latency(REQUESTS, LIMITS, COST, upper, time_limit_s=60, cell_width=default_width(20))
    assert first.value_s is not None and first.width == 3 and first.times is not None and first.milp_s > 0
    solved = _widths(monkeypatch)
    monkeypatch.setattr(identical_bound, "shape_times", lambda *a, **k: pytest.fail("the table was rebuilt"))
    later = state_path_latency(REQUESTS, LIMITS, COST, upper, time_limit_s=60, start_width=2, times=first.times)
    assert solved == [2, 1] and later.width == 1
    monkeypatch.undo()
    direct = [state_path_latency(REQUESTS, LIMITS, COST, upper, time_limit_s=60, cell_width=w).value_s for w in (2, 1)]
    assert later.value_s == pytest.approx(max(direct), rel=1e-9)


def _first_report(monkeypatch, objective: Objective) -> BoundReport:
    """`lower_bound_report` with the state path stopped after its first (widest) cells."""
    monkeypatch.setattr(identical_bound, "REFINE_FACTOR", 1e9)
    report = lower_bound_report(REQUESTS, LIMITS, COST, objective)
    monkeypatch.setattr(identical_bound, "REFINE_FACTOR", 3.0)
    return report


def test_the_report_says_where_the_state_path_stopped(monkeypatch):
    report = _first_report(monkeypatch, LATENCY)
    assert report.refinable is not None and report.refinable.width == 2
    assert report.refinable.latency_lb_s == pytest.approx(report.value_s)
    ungrouped = lower_bound_report(fixed(32, 6, 8), LIMITS, COST, LATENCY)  # 8 requests: every state alone already
    assert ungrouped.refinable is None
    makespan_only = _first_report(monkeypatch, Objective(makespan=1))  # (no latency component to raise)
    assert makespan_only.refinable is None


def test_a_state_path_out_of_time_is_run_again_from_its_first_cells(monkeypatch):
    """B = 24 at I = 512, O = 128 gives no state path within 1.5 s (`test_identical_bound`'s starved case): the report
    offers it again from the widest cells, and with time it raises the bound, below every scheduler tried."""
    requests, limits = fixed(512, 128, 24), Limits(C=4096, M=100_000)
    monkeypatch.setattr(lower_bound, "STATE_PATH_TIME_LIMIT_S", 1.5)
    report = lower_bound_report(requests, limits, COST, LATENCY)
    assert "state path (no bound within its 1.5 s)" in report.method
    assert report.refinable is not None and report.refinable.width == default_width(24) and report.refinable.last_milp_s == 0
    solved = _widths(monkeypatch)
    refined = refine_bound(report, 120)
    assert solved[0] == default_width(24) and refined.value_s > report.value_s
    for name in SCHEDULERS:
        assert refined.value_s <= LATENCY.value(simulate(requests, name, limits, COST)) * (1 + 1e-9), name


def test_refinement_raises_the_latency_component_by_its_weight_and_stays_below_every_schedule(monkeypatch):
    objective = Objective(makespan=1, latency=2)
    report = _first_report(monkeypatch, objective)
    r = report.refinable
    refined = refine_bound(report, time_left_s=60)
    raised = state_path_latency(REQUESTS, LIMITS, COST, r.upper_s, time_limit_s=60, start_width=2, times=r.times)
    assert raised.value_s > r.latency_lb_s  # (this instance: the narrower cells give more)
    assert refined.value_s == pytest.approx(report.value_s + 2 * (raised.value_s - r.latency_lb_s), rel=1e-12)
    assert "raised after the search by the state path with cells of 1" in refined.method
    assert refined.refinable is None  # cells of one request: nothing narrower
    for name in SCHEDULERS:
        assert refined.value_s <= objective.value(simulate(REQUESTS, name, LIMITS, COST)) * (1 + 1e-9), name


def test_nothing_is_solved_without_a_refinement_or_the_time_for_one(monkeypatch):
    report = _first_report(monkeypatch, LATENCY)
    monkeypatch.setattr(identical_bound, "state_path_latency", lambda *a, **k: pytest.fail("solved"))
    assert refine_bound(BoundReport(report.value_s, report.method), 1e6).value_s == report.value_s
    too_little = 0.5 * lower_bound.REFINE_TIME_FACTOR * report.refinable.last_milp_s
    assert refine_bound(report, min(too_little, 1.9)) is report


def test_narrower_cells_that_cannot_beat_the_bound_leave_it(monkeypatch):
    """With the component's bound as their floor the narrower MILPs stop at once; and a MILP stopped by its time limit
    may give a dual bound below the component's: either way the report keeps its value."""
    report = _first_report(monkeypatch, LATENCY)
    r = report.refinable
    beyond = LatencyRefinement(r.requests, r.limits, r.cost_model, r.hidden, r.upper_s, r.width, r.last_milp_s,
                               r.times, r.latency_weight, r.upper_s)  # a component no bound exceeds
    kept = refine_bound(BoundReport(report.value_s, report.method, beyond), 60)
    assert kept.value_s == report.value_s and kept.refinable is None
    monkeypatch.setattr(identical_bound, "state_path_latency",
                        lambda *a, **k: identical_bound.StatePathOutcome(0.5 * r.latency_lb_s, width=2, milp_s=1.0))
    weaker = refine_bound(report, 60)
    assert weaker.value_s == report.value_s and weaker.method == report.method


def _fake_refinement(monkeypatch, module, value_s: float) -> list:
    """``module.refine_bound`` replaced by one that records its calls and returns ``value_s`` with a marked method."""
    calls = []

    def fake(report, time_left_s, progress=None):
        calls.append((report, time_left_s))
        return BoundReport(value_s, report.method + "; refined (fake)")

    monkeypatch.setattr(module, "refine_bound", fake)
    return calls


def test_better_turns_unknown_into_no_when_the_refined_bound_clears_the_target(monkeypatch):
    """A target between the first bound and the one cells of 2 give, below what the search finds: unknown after the
    search, "no" once the time it left went to the bound."""
    from solvers import better as better_module

    first = _first_report(monkeypatch, LATENCY)
    r = first.refinable
    two = state_path_latency(REQUESTS, LIMITS, COST, r.upper_s, time_limit_s=60, cell_width=2, times=r.times).value_s
    own = LATENCY.value(simulate(REQUESTS, "vllm", LIMITS, COST))
    target = 0.5 * (first.value_s + two)
    assert target < min(LATENCY.value(simulate(REQUESTS, n, LIMITS, COST)) for n in SCHEDULERS)
    monkeypatch.setattr(identical_bound, "REFINE_FACTOR", 1e9)  # the bound at cells of 3, its refinement at 2
    answer = better_module.better(REQUESTS, LIMITS, COST, "vllm", margin=1 - target / own, objective=LATENCY,
                                  time_limit_s=60, memory_budget_bytes=1)  # (no MILP: unsettled after the search)
    assert answer.answer == "no" and answer.bound_s == pytest.approx(two, rel=1e-9)
    assert "raised after the search by the state path with cells of 2" in answer.methods["lower_bound_method"]
    assert answer.found_s is not None and answer.found_s > target


def test_better_does_not_refine_a_settled_answer_or_one_the_milp_decides(monkeypatch):
    from solvers import better as better_module

    monkeypatch.setattr(identical_bound, "REFINE_FACTOR", 1e9)
    calls = _fake_refinement(monkeypatch, better_module, 1e9)
    yes = better_module.better(REQUESTS, LIMITS, COST, "vllm", margin=0.01, objective=LATENCY, time_limit_s=60,
                               memory_budget_bytes=1)
    assert yes.answer == "yes" and not calls  # the search settled it: answered at once
    small = fixed(8, 2, 2)  # the MILP runs after the search: the time is its
    better_module.better(small, Limits(C=64, M=1_000), COST, "vllm", margin=0.5, objective=LATENCY, time_limit_s=30)
    assert not calls


def test_analyse_spends_what_the_search_left_on_the_bound(monkeypatch):
    from solvers import analyse as analyse_module

    first = _first_report(monkeypatch, LATENCY).value_s
    monkeypatch.setattr(identical_bound, "REFINE_FACTOR", 1e9)  # the bound stops at its widest cells, the refinement
    done = analyse_module.analyse(REQUESTS, LIMITS, COST, LATENCY, time_limit_s=60, memory_budget_bytes=1)  # at 2
    assert "raised after the search by the state path with cells of 2" in done.details["lower_bound_method"]
    assert first < done.bound_s <= done.incumbent_s * (1 + 1e-9)
    calls = _fake_refinement(monkeypatch, analyse_module, done.incumbent_s)
    faked = analyse_module.analyse(REQUESTS, LIMITS, COST, LATENCY, time_limit_s=60, memory_budget_bytes=1)
    assert len(calls) == 1 and faked.bound_s == done.incumbent_s and faked.status == "optimal"
    assert faked.details["lower_bound_method"].endswith("refined (fake)")
