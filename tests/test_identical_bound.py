"""The state-path bound (solvers/identical_bound.py) never exceeds what a schedule achieves.

Checked against the brute-force optimum of tests/test_solver_bruteforce.py on tiny identical instances (evictions,
chunked prefill, blocks and Rmax among them), against every registered scheduler on random identical workloads
(hypothesis, through `LowerBounder`), and where it applies.
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
from solvers.identical_bound import applicable, state_path_latency_bound
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


def test_applies_only_to_identical_requests_arriving_together():
    cm, limits = COSTS["linear"], Limits(C=8, M=8)
    assert applicable([Request(0, 0, 2, 2), Request(1, 0, 2, 2)], limits, cm) is None
    assert applicable([Request(0, 0, 2, 2), Request(1, 0, 2, 3)], limits, cm) is not None
    assert applicable([Request(0, 0, 2, 2), Request(1, 0.1, 2, 2)], limits, cm) is not None
    assert applicable([Request(0, 0, 2, 2), Request(1, 0, 2, 2)], limits, cm, hidden_cache=True) is not None
    assert applicable([Request(i, 0, 2, 2) for i in range(17)], limits, cm) is not None


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
    lb = LowerBounder(requests, limits, COST).of(LATENCY)
    assert lb.set_by["latency"] == "state path"
    others = {k: v for k, v in lb.parts.items() if k.endswith("_sum_s") and k != "state_path_sum_s"}
    assert all(v < lb.value_s for v in others.values())
    assert lb.value_s <= LATENCY.value(simulate(requests, "sarathi", limits, COST)) * (1 + TOL)
