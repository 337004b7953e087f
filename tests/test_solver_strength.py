"""Strengthening the MILP (symmetry breaking for identical requests, perspective-form batch times, the slot
bound's token-count steps) changes how fast it solves, never its optimum: checked against the independent
brute-force enumerator of tests/test_solver_bruteforce.py and against the unstrengthened model."""

from __future__ import annotations

import math
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.costmodel import AffinePiece, CostTerm
from infermax.limits import Limits
from infermax.replay import replay
from infermax.request import Request
from infermax.schedule import Schedule, ScheduledBatch
from solvers import Objective, SolveOptions, optimize, slot_bound
from solvers.assign import label_identical, set_from_schedule, violations
from solvers.formulation import Formulation, Strengthening, identical_classes
from tests.test_solver_bruteforce import FITTED_PIECEWISE, LINEAR, ToyStepped, brute_force

VARIANTS = [Strengthening("none", cuts=False), Strengthening("finish", cuts=False), Strengthening("finish", cuts=True),
            Strengthening("full", cuts=True)]
IDS = [f"{s.symmetry}{'+cuts' if s.cuts else ''}" for s in VARIANTS]
SLOTS = 5
STEPPED = ToyStepped()

TWIN_CASES = {
    # three identical requests competing for KV: labels are interchangeable, the order of service is not
    "triplets": ([Request(0, 0, 1, 2), Request(1, 0, 1, 2), Request(2, 0, 1, 2)], Limits(C=8, M=4)),
    # two classes of two, interleaved ids, at most 3 tokens a batch
    "two-classes": ([Request(0, 0, 1, 1), Request(1, 0, 2, 1), Request(2, 0, 1, 1), Request(3, 0, 2, 1)],
                    Limits(C=3, M=8)),
    # same I, O but a later arrival: not identical to the first two, which are
    "online-twins": ([Request(0, 0.0, 1, 2), Request(1, 0.0, 1, 2), Request(2, 0.003, 1, 2)], Limits(C=8, M=4)),
    # identical requests that must chunk their prompts (C = 2)
    "chunked-twins": ([Request(0, 0, 3, 1), Request(1, 0, 3, 1)], Limits(C=2, M=8)),
}


@lru_cache(maxsize=None)
def _brute(case: str, cost, objective: Objective) -> float:
    requests, limits = TWIN_CASES[case]
    return brute_force(requests, limits, cost, objective, SLOTS)


def _optimum(requests, limits, cost, objective, strengthening, slots=SLOTS):
    res = optimize(requests, limits, cost, objective, slots=slots, options=SolveOptions(mip_gap=0),
                   strengthening=strengthening)
    assert res.status in ("optimal", "infeasible")
    return res.value_s if res.status == "optimal" else math.inf


@pytest.mark.parametrize("strengthening", VARIANTS, ids=IDS)
@pytest.mark.parametrize("cost", [LINEAR, FITTED_PIECEWISE, STEPPED], ids=lambda c: c.name)
@pytest.mark.parametrize("case", list(TWIN_CASES))
def test_identical_requests_optimum_equals_brute_force(case, cost, strengthening):
    requests, limits = TWIN_CASES[case]
    expected = _brute(case, cost, Objective(makespan=1))
    assert _optimum(requests, limits, cost, Objective(makespan=1), strengthening) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("objective", [Objective(latency=1), Objective(ttft=1)], ids=str)
@pytest.mark.parametrize("case", ["triplets", "online-twins"])
def test_identical_requests_other_objectives_equal_brute_force(case, objective):
    requests, limits = TWIN_CASES[case]
    expected = _brute(case, LINEAR, objective)
    got = _optimum(requests, limits, LINEAR, objective, Strengthening("full", cuts=True))
    assert got == pytest.approx(expected, rel=1e-6)


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.sampled_from([(1, 1), (1, 2), (2, 1)]), min_size=2, max_size=3),
       late=st.lists(st.booleans(), min_size=3, max_size=3), M=st.sampled_from([3, 4, 8]),
       stepped=st.booleans())
def test_random_instances_strengthened_optimum_equals_brute_force(lengths, late, M, stepped):
    """Small random instances, drawn from few (I, O) pairs so that identical requests are common."""
    requests = [Request(i, 0.003 * late[i], I, O) for i, (I, O) in enumerate(lengths)]
    limits = Limits(C=8, M=M)
    if max(r.prompt_tokens + r.output_tokens - 1 for r in requests) > M:
        return
    cost = ToyStepped() if stepped else LINEAR
    expected = brute_force(requests, limits, cost, Objective(makespan=1), 4)
    for strengthening in (VARIANTS[0], VARIANTS[-1]):
        assert _optimum(requests, limits, cost, Objective(makespan=1), strengthening, slots=4) == \
            pytest.approx(expected, rel=1e-6)


def test_identical_classes():
    rs = [Request(0, 0, 4, 2), Request(1, 0, 4, 2), Request(2, 0, 4, 3), Request(3, 0, 4, 2),
          Request(4, 1.0, 4, 3), Request(5, 0, 4, 3, ttft_slo_s=1.0), Request(6, 0, 4, 3)]
    assert identical_classes(rs) == [[0, 1, 3], [2, 6]]


def test_warm_start_is_relabelled_into_the_symmetry_order():
    """Request 1 finishes first here, which the finish-order constraints forbid for identical 0 < 1; under
    swapped labels the same schedule satisfies them, and it replays to the same makespan."""
    requests, limits = [Request(0, 0, 1, 2), Request(1, 0, 1, 2)], Limits(C=8, M=8)
    schedule = Schedule(requests, limits, [ScheduledBatch([(1, 1)]), ScheduledBatch([(1, 1), (0, 1)]),
                                           ScheduledBatch([(0, 1)])])
    for symmetry in ("finish", "full"):
        form = Formulation(requests, limits, LINEAR, 3, Objective(makespan=1), strengthening=Strengthening(symmetry))
        set_from_schedule(form, schedule, LINEAR)
        assert any(v.startswith("sym_") for v in violations(form.prob))
        relabelled = label_identical(form, schedule)
        set_from_schedule(form, relabelled, LINEAR)
        assert violations(form.prob) == []
        assert replay(relabelled, LINEAR).summary["makespan_s"] == pytest.approx(replay(schedule, LINEAR).summary["makespan_s"])


def test_slot_bound_counts_token_steps_by_hand():
    """Batch = 1 + 0.1·n + 2·[n > 1]; two requests of I = 1, O = 2 need N = 4 tokens. h(n) = 0.1n + 2[n > 1] has
    the convex envelope through (1, 0.1) and (4, 2.4), so K batches take >= K·(1 + h̆(4/K)): 3.4, 3.73, 4.07, 4.4
    for K = 1..4. Budget 4.0: at most 2 batches (the bound without steps, (4.0 − 0.4)/1, allows 3); budget 4.2: 3."""
    terms = (CostTerm("base", "n_tokens", (AffinePiece(1.0, {"n_tokens": 0.1, "n_tokens_gt1": 2.0}),)),)
    r = [Request(0, 0, 1, 2), Request(1, 0, 1, 2)]
    assert slot_bound(r, terms, Objective(makespan=1), 4.0).slots == 2
    assert slot_bound(r, terms, Objective(makespan=1), 4.2).slots == 3


@settings(max_examples=300, deadline=None)
@given(tau0=st.floats(0.01, 2.0), alpha=st.floats(0.0, 0.5), tokens=st.integers(1, 400),
       steps=st.dictionaries(st.integers(1, 300), st.floats(0.0, 3.0), max_size=4), k=st.integers(1, 300),
       budget=st.floats(0.0, 400.0))
def test_slot_bound_search_matches_a_scan_of_every_count(tau0, alpha, tokens, steps, k, budget):
    """`_last_within` (bisection over the convex n·(tau0 + h̆(N/n))) finds what a scan of every n = 1..k finds:
    the largest n within the budget, or none."""
    from solvers.bounds import _last_within, token_hull

    hull = token_hull(alpha, steps, tokens)

    def g(n):
        return n * (tau0 + hull(tokens / n))

    fits = [n for n in range(1, k + 1) if g(n) <= budget]
    assert _last_within(g, k, budget) == (fits[-1] if fits else None)


def test_slot_bound_with_a_budget_of_billions_of_batches():
    """The sum-of-latencies budget of a long trace allows about a billion batches by the first test, and the
    token-count steps then cut that without enumerating the counts (a scan of every count ran out of memory on the
    whole Azure conversation trace). Batch >= 1 ms + 10 s·[n > 1], four prompts of 10^9 tokens (N = 4·10^9): h̆ is the
    chord from (1, 0) to (N, 10 s), so K batches take at least g(K) = K·1 ms + 10 s·(N − K)/(N − 1); the bound is the
    largest K with g(K) within the budget (and its 1e-9 relative slack), 999,992,500."""
    terms = (CostTerm("base", "n_tokens", (AffinePiece(0.001, {"n_tokens_gt1": 10.0}),)),)
    requests = [Request(i, 0.0, 10 ** 9, 1) for i in range(4)]
    n = 4 * 10 ** 9
    bound = slot_bound(requests, terms, Objective(latency=1), 1e6)
    assert "token-count steps" in bound.reason

    def g(k):
        return k * 0.001 + 10.0 * (n - k) / (n - 1)

    assert g(bound.slots) <= 1e6 * (1 + 1e-9) < g(bound.slots + 1)
    assert 10 ** 9 - 10 ** 4 < bound.slots < 10 ** 9
