"""The state-path bound (solvers/identical_bound.py) never exceeds what a schedule achieves.

Checked against the brute-force optimum of tests/test_solver_bruteforce.py on tiny identical instances (evictions,
chunked prefill, blocks and Rmax among them), against every registered scheduler on random identical workloads
(hypothesis, through `LowerBounder`), and where it applies; its batch-shape table against enumerating every shape's
recomputation count, and its grouped states (cells, above 16 requests) against brute force, the ungrouped MILP and
every registered scheduler.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from infermax.schedulers import available
from infermax.workload import fixed
from solvers import Objective
from solvers.identical_bound import (FEATURE_COLUMNS, applicable, cells, default_width, shape_times,
                                     state_path_latency_bound)
from infermax.costmodel.base import terms_time_table
from solvers.lower_bound import LowerBounder
from tests.test_solver_bruteforce import COSTS, SLOTS, brute_force

TOL = 1e-9
LATENCY = Objective(latency=1)
IDENTICAL = {
    # two requests that cannot both hold their peak KV: the brute force finds that evicting one pays
    "evict-pays": ([Request(i, 0, 1, 3) for i in range(2)], Limits(C=8, M=3)),
    "three": ([Request(i, 0, 1, 2) for i in range(3)], Limits(C=8, M=6)),
    "chunk": ([Request(i, 0, 3, 2) for i in range(2)], Limits(C=2, M=8)),
    "blocks": ([Request(i, 0, 2, 2) for i in range(2)], Limits(C=8, M=6, block_size=2)),
    "rmax": ([Request(i, 0, 1, 3) for i in range(3)], Limits(C=8, M=12, Rmax=2)),
    "one-token": ([Request(i, 0.5, 2, 1) for i in range(3)], Limits(C=4, M=8)),
}


@pytest.mark.parametrize("case", list(IDENTICAL))
@pytest.mark.parametrize("cost", list(COSTS))
def test_below_brute_force(case, cost):
    requests, limits = IDENTICAL[case]
    cm = COSTS[cost]
    best = brute_force(requests, limits, cm, LATENCY, SLOTS)
    upper = 10 * best  # some schedule's value, well above the optimum: the result is capped by it, not by `best`
    if applicable(requests, limits, cm) is not None:
        assert state_path_latency_bound(requests, limits, cm, upper) is None
        return
    lb = state_path_latency_bound(requests, limits, cm, upper)
    assert lb is not None and 0 < lb <= best * (1 + TOL), f"bound {lb} above the brute-force optimum {best}"
    if len(requests) >= 3:  # (at B = 2 cells of 2 are the states themselves)
        grouped = state_path_latency_bound(requests, limits, cm, upper, cell_width=2)  # 1..B − 1 in one cell at B = 3
        assert grouped is not None and 0 < grouped <= best * (1 + TOL), f"grouped bound {grouped} above {best}"


def test_applies_only_to_identical_requests_arriving_together():
    cm, limits = COSTS["linear"], Limits(C=8, M=8)
    assert applicable([Request(0, 0, 2, 2), Request(1, 0, 2, 2)], limits, cm) is None
    assert applicable([Request(0, 0, 2, 2), Request(1, 0, 2, 3)], limits, cm) is not None
    assert applicable([Request(0, 0, 2, 2), Request(1, 0.1, 2, 2)], limits, cm) is not None
    assert applicable([Request(0, 0, 2, 2), Request(1, 0, 2, 2)], limits, cm, hidden_cache=True) is not None
    assert applicable([Request(i, 0, 2, 2) for i in range(64)], limits, cm) is None
    assert applicable([Request(i, 0, 2, 2) for i in range(65)], limits, cm) is not None


def test_refuses_a_shape_table_too_large_before_building_it():
    """B = 64 at C = 8,192 would fill 34.6 M entries (~26 s here): refused with its size, before anything is built;
    and the table stops at its deadline."""
    requests = fixed(512, 8, 64)
    reason = applicable(requests, Limits(C=8192, M=100_000), COSTS["linear"])
    assert reason is not None and f"{65 ** 2 * 8193:,} entries" in reason  # (B + 1)² × (C + 1) prompt-token values
    assert state_path_latency_bound(requests, Limits(C=8192, M=100_000), COSTS["linear"], 1e9) is None
    assert applicable(requests, Limits(C=4096, M=100_000), COSTS["linear"]) is None
    assert shape_times(512, 64, Limits(C=4096, M=100_000), COSTS["linear"], deadline=0.0) is None


SWAP = SwapCost(per_token_s=0.002, fixed_s=0.001)
SCHEDULERS = [n for n in available() if n != "bros-strict"]
COST = load_cost_model()  # the default (fitted piecewise: token steps, capped reads)


@st.composite
def identical_workloads(draw):
    n, I, O = draw(st.integers(1, 6)), draw(st.integers(1, 48)), draw(st.integers(1, 12))
    arrival = draw(st.sampled_from([0.0, 0.25]))
    requests = [Request(i, arrival, I, O) for i in range(n)]
    block = draw(st.sampled_from([1, 1, 4, 16]))
    peak = -(-(I + O - 1) // block) * block
    C = draw(st.integers(I + O, 128))
    P = draw(st.one_of(st.none(), st.integers(I + O, C)))
    M = draw(st.integers(peak, 3 * peak * n))
    Rmax = draw(st.one_of(st.none(), st.integers(1, 4)))
    return requests, Limits(C=C, P=P, M=M, Rmax=Rmax, block_size=block)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(identical_workloads(), st.sampled_from(SCHEDULERS), st.sampled_from(["auto", "linear"]))
def test_bound_below_every_scheduler(case, scheduler, kind):
    requests, limits = case
    cm = COST if kind == "auto" else COSTS["linear"]
    result = simulate(requests, scheduler, limits, cm, swap_cost=SWAP)  # BROS and EcoServe may swap
    hidden = bool(result.batches["hidden_seqs"].sum())
    bounder = LowerBounder(requests, result.schedule.limits, cm, hidden_cache=hidden)
    lb, got = bounder.of(LATENCY).value_s, LATENCY.value(result)
    assert lb <= got * (1 + TOL) + 1e-12, f"bound {lb} > {scheduler}'s {got}"
    if not hidden:
        direct = state_path_latency_bound(requests, result.schedule.limits, cm, 10 * got)
        assert direct is None or direct <= got * (1 + TOL) + 1e-12


def test_lifts_the_latency_bound_of_a_fixed_grid_point():
    """I = 512, O = 128, B = 4 under the default model: the other ingredients leave the prompts' cost to ride on
    decode batches, which needs decoders already prefilled; the state path sets the bound, still below Sarathi."""
    requests, limits = fixed(512, 128, 4), Limits(C=4096, M=100_000)
    bounder = LowerBounder(requests, limits, COST)
    lb = bounder.of(LATENCY)
    assert lb.set_by["latency"] == "state path"
    parts = bounder.latency_sum_s().parts  # (every ingredient's value; `of` keeps the winner's)
    others = {k: v for k, v in parts.items() if k.endswith("_sum_s") and k != "state_path_sum_s"}
    assert len(others) >= 4 and all(v < lb.value_s for v in others.values())
    assert lb.value_s <= LATENCY.value(simulate(requests, "sarathi", limits, COST)) * (1 + TOL)


def test_a_state_path_out_of_time_is_named_and_one_in_time_is_not():
    """A state path that gives no bound within its budget is reported as cut for time, with that budget (more time
    would give one); one that finishes, or one that does not apply, is not."""
    limits = Limits(C=4096, M=100_000)
    starved = LowerBounder(fixed(512, 128, 24), limits, COST, state_path_budget_s=1.5).of(LATENCY)
    assert "state path (no bound within its 1.5 s)" in starved.parts["cut_by_deadline"]
    assert "state_path_sum_s" not in starved.parts
    finished = LowerBounder(fixed(512, 128, 8), limits, COST).of(LATENCY)
    assert finished.set_by["latency"] == "state path" and "cut_by_deadline" not in finished.parts
    mixed = [Request(0, 0.0, 512, 128), Request(1, 0.0, 256, 64)]  # not identical: the state path does not apply
    assert "cut_by_deadline" not in LowerBounder(mixed, limits, COST, state_path_budget_s=1.5).of(LATENCY).parts


@pytest.mark.parametrize("B", [4, 8])
def test_a_floor_stops_the_milps_that_cannot_beat_it_and_changes_no_other_value(B):
    """Given a bound it must beat (``floor_s``), the state path returns the same value when the floor is below it
    and nothing when the floor is above it (its MILPs stop at their first solution under the floor)."""
    requests, limits = fixed(512, 128, B), Limits(C=4096, M=100_000)
    value = state_path_latency_bound(requests, limits, COST, 1e4)
    assert state_path_latency_bound(requests, limits, COST, 1e4, floor_s=0.5 * value) == value
    assert state_path_latency_bound(requests, limits, COST, 1e4, floor_s=2.0 * value) is None


def test_no_narrower_cells_after_a_milp_stopped_at_the_floor(monkeypatch):
    """B = 20 (cells of 3, then 2, then 1 while time is left): with a schedule's own sum of latencies as the floor,
    which no bound exceeds, the first MILP stops at it and nothing narrower is solved."""
    from solvers import identical_bound

    requests, limits = fixed(512, 128, 20), Limits(C=4096, M=100_000)
    floor = LATENCY.value(simulate(requests, "sarathi", limits, COST))
    solved, milp = [], identical_bound._cell_milp_bound
    monkeypatch.setattr(identical_bound, "_cell_milp_bound", lambda *a, **k: solved.append(a[0]) or milp(*a, **k))
    assert state_path_latency_bound(requests, limits, COST, 2 * floor, time_limit_s=60, floor_s=floor) is None
    assert len(solved) == 1


def test_the_bounder_gives_the_state_path_the_other_ingredients_best_as_its_floor(monkeypatch):
    from solvers import identical_bound

    floors, path = [], identical_bound.state_path_latency

    def recording(*args, floor_s=None, **kwargs):
        floors.append(floor_s)
        return path(*args, floor_s=floor_s, **kwargs)

    monkeypatch.setattr(identical_bound, "state_path_latency", recording)
    parts = LowerBounder(fixed(512, 128, 4), Limits(C=4096, M=100_000), COST).latency_sum_s().parts
    others = [v for k, v in parts.items() if k.endswith("_sum_s") and k != "state_path_sum_s"]
    assert len(floors) == 1 and len(others) >= 4 and floors[0] == pytest.approx(max(others), rel=1e-12)


def test_a_stop_at_the_floor_is_not_reported_as_out_of_time(monkeypatch):
    """The state path that stops at its floor (the other ingredients' best, which no grouping could beat) lost
    nothing for want of time: it is not listed among the ingredients cut by the deadline, however late it stopped
    (the slack that tells a timed-out MILP widened to cover every stop)."""
    from solvers import lower_bound

    monkeypatch.setattr(lower_bound, "STATE_PATH_STOP_SLACK_S", 1e9)
    requests, limits = fixed(512, 128, 4), Limits(C=4096, M=100_000)
    floor = 2 * LATENCY.value(simulate(requests, "sarathi", limits, COST))
    bounder = LowerBounder(requests, limits, COST)
    assert bounder._state_path_latency_s(floor_s=floor) is None
    assert not bounder.cut_by_deadline
    assert bounder._state_path_latency_s(floor_s=None) is not None  # (without the floor it gives its bound)


def _enumerated_shape_times(I, B, limits, cost_model):
    """The first version's table: every number r of recomputation chunks among the d later-token items priced as a
    batch (one token each at context 0, plus I tokens at the least token slope), every chunk count k."""
    import numpy as np

    from solvers.identical_bound import _least_token_slope

    terms = tuple(cost_model.milp_terms())
    slope = _least_token_slope(terms)
    P = min(limits.C, limits.prefill_budget)
    q = np.arange(0, min(B * I, limits.C) + 1)
    out = {}
    for d in range(B + 1):
        best = np.full((B + 1, len(q)), np.inf)
        for k in range(B + 1):
            qk = q[(q >= k) & (q <= k * I)] if k else q[:1]
            for r in range(d + 1):
                qq = qk[(qk + r <= P) & (qk + d <= limits.C) & (qk + d > 0)]
                if not len(qq):
                    continue
                base, extra = (qq // k, qq % k) if k else (qq * 0, qq * 0)
                sq = ((k - extra) * base ** 2 + extra * (base + 1) ** 2 if k else qq * 0) + r
                n, dec = len(qq), d - r
                feats = {f: np.zeros(n) for f in FEATURE_COLUMNS}
                feats.update(n_tokens=(qq + d) * 1.0, prefill_tokens=(qq + r) * 1.0, prefill_sq_tokens=sq * 1.0,
                             n_prefill_seqs=np.full(n, k + r * 1.0), n_decode_seqs=np.full(n, dec * 1.0),
                             decode_kv_tokens=np.full(n, dec * (I + 1.0)), decode_kv_max=np.full(n, I + 1.0 if dec else 0.0))
                np.minimum.at(best[k], qq, terms_time_table(terms, feats) + r * I * slope)
        out[d] = np.minimum.accumulate(best, axis=0)
    return out


@pytest.mark.parametrize("kind", ["auto", *COSTS])
@pytest.mark.parametrize("I,B,limits", [(8, 6, Limits(C=64, M=1000)), (24, 5, Limits(C=48, P=32, M=1000)),
                                        (3, 7, Limits(C=16, M=100))])
def test_shape_table_below_every_recomputation_count(kind, I, B, limits):
    """The table prices a batch with recomputation chunks by the batch without them plus a least growth per chunk;
    that must stay at or below pricing every count of them outright, and be finite wherever that is."""
    import numpy as np

    cm = COST if kind == "auto" else COSTS[kind]
    if applicable(fixed(I, 2, B), limits, cm) is not None:
        pytest.skip("a model the bound does not take")
    fast, exact = shape_times(I, B, limits, cm), _enumerated_shape_times(I, B, limits, cm)
    for d in exact:
        finite = np.isfinite(exact[d])
        assert np.isfinite(fast[d][finite]).all(), f"d={d}: the table rules out a shape a batch can have"
        assert (fast[d][finite] <= exact[d][finite] * (1 + 1e-12)).all(), f"d={d}: above the enumeration"


def test_cells():
    assert cells(8) == [(i, i) for i in range(9)]
    assert cells(40) == [(0, 0)] + [(a, a + 4) for a in range(1, 36, 5)] + [(36, 39), (40, 40)]
    assert cells(5, 3) == [(0, 0), (1, 3), (4, 4), (5, 5)]


@pytest.mark.parametrize("I,O,B", [(64, 8, 10), (16, 24, 12)])
def test_grouped_states_relax_the_ungrouped_milp(I, O, B):
    """Every path and batch mix of the ungrouped MILP maps to one of the grouped MILP that costs no more, so grouping
    can only lower the bound."""
    requests, limits = fixed(I, O, B), Limits(C=512, M=20_000)
    upper = LATENCY.value(simulate(requests, "sarathi", limits, COST))
    fine = state_path_latency_bound(requests, limits, COST, upper, time_limit_s=60)
    assert fine is not None and fine < upper
    for width in (2, 3, 5):
        grouped = state_path_latency_bound(requests, limits, COST, upper, time_limit_s=60, cell_width=width)
        assert grouped is not None and grouped <= fine * (1 + 1e-6), f"cells of {width}: {grouped} > {fine}"


@pytest.mark.parametrize("I,O,B,limits", [(32, 6, 20, Limits(C=256, M=4_000)), (200, 3, 24, Limits(C=1024, M=50_000)),
                                          (8, 12, 40, Limits(C=128, M=1_000, Rmax=16))])
def test_grouped_bound_below_every_scheduler(I, O, B, limits):
    """Above 16 requests, with the first cells (3 and 5 wide here) and one narrower: below every registered
    scheduler's sum of latencies."""
    requests = fixed(I, O, B)
    results = {n: simulate(requests, n, limits, COST, swap_cost=SWAP) for n in SCHEDULERS}
    plain = {n: LATENCY.value(r) for n, r in results.items() if not r.batches["hidden_seqs"].sum()}
    for width, limit_s in ((default_width(B), 60), (default_width(B) - 1, 8)):  # (a dual bound at 8 s is one too)
        lb = state_path_latency_bound(requests, limits, COST, max(plain.values()), time_limit_s=limit_s,
                                      cell_width=width)
        assert lb is not None and lb > 0
        for name, got in plain.items():
            assert lb <= got * (1 + TOL), f"cells of {width}: bound {lb} > {name}'s {got}"


def test_narrower_cells_while_time_is_left():
    """The default grouping starts wide and refines while time is left; the result is the largest bound found, so
    never below the first cells' alone."""
    requests, limits = fixed(32, 6, 20), Limits(C=256, M=4_000)
    upper = LATENCY.value(simulate(requests, "sarathi", limits, COST))
    first = state_path_latency_bound(requests, limits, COST, upper, time_limit_s=60, cell_width=default_width(20))
    refined = state_path_latency_bound(requests, limits, COST, upper, time_limit_s=8)
    assert first is not None and refined is not None and first * (1 - 1e-9) <= refined <= upper
