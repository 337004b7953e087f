"""Mean busy times (solvers/busy_time_bound.py; docs/design.md, "Mean busy times"): preemptive SPT against a
time-indexed LP, the per-request chain by hand, and the bound against brute-force optima (tests/test_lower_bound.py
checks it on every brute-force case and every registered scheduler too)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from conftest import AffineCost
from infermax.limits import Limits
from infermax.request import Request
from solvers.busy_time_bound import spt_mean_busy_times
from solvers.lower_bound import LowerBounder
from solvers.policy import Policies


def test_spt_by_hand():
    assert spt_mean_busy_times(np.array([0.0, 0.0]), np.array([1.0, 2.0])) == pytest.approx([0.5, 2.0])
    # B arrives at 1 with less work than A has in all: it preempts A (A: [0, 1] and [2, 5]; B: [1, 2])
    assert spt_mean_busy_times(np.array([0.0, 1.0]), np.array([4.0, 1.0])) == pytest.approx([(0.5 + 3 * 3.5) / 4, 1.5])
    # SPT compares whole works, not what is left: A has 1 left at time 3 but B (work 2) still goes first
    assert spt_mean_busy_times(np.array([0.0, 3.0]), np.array([4.0, 2.0])) == pytest.approx([(3 * 1.5 + 5.5) / 4, 4.0])
    # no work: the release time; idle until a release
    assert spt_mean_busy_times(np.array([2.0, 5.0]), np.array([0.0, 1.0])) == pytest.approx([2.0, 5.5])
    with pytest.raises(ValueError):
        spt_mean_busy_times(np.array([0.0]), np.array([-1.0]))


def _least_mean_busy_sum(release: list[int], work: list[int]) -> float:
    """min Σ_j M_j over schedules that run, in each unit slot t, x_jt of job j spread evenly over the slot
    (Σ_j x_jt <= 1, nothing before the release): a time-indexed LP, solved by HiGHS."""
    n, horizon = len(work), max(release) + sum(work)
    cost = np.array([(t + 0.5) / work[j] for j in range(n) for t in range(horizon)])
    a_ub = np.zeros((horizon, n * horizon))
    for t in range(horizon):
        a_ub[t, t::horizon] = 1.0
    a_eq = np.zeros((n, n * horizon))
    for j in range(n):
        a_eq[j, j * horizon:(j + 1) * horizon] = 1.0
    bounds = [(0.0, 0.0 if t < release[j] else 1.0) for j in range(n) for t in range(horizon)]
    res = linprog(cost, A_ub=a_ub, b_ub=np.ones(horizon), A_eq=a_eq, b_eq=np.array(work, float), bounds=bounds,
                  method="highs")
    assert res.status == 0
    return float(res.fun)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=5))
def test_spt_reaches_the_least_total_mean_busy_time(jobs):
    """With integer data SPT switches jobs only at whole slots, so it is one of the LP's schedules: it must reach
    the LP's optimum (Goemans 1997), not only stay above it."""
    release, work = [r for r, _ in jobs], [w for _, w in jobs]
    spt = float(spt_mean_busy_times(np.array(release, float), np.array(work, float)).sum())
    assert spt == pytest.approx(_least_mean_busy_sum(release, work), abs=1e-7)


def test_one_request_chain_by_hand():
    """Affine batches (1 + tokens), one request I = 1, O = 3, C = M = 8: a0 = 1 and every item's marginal cost is
    its token count. Kept work with the KV share of the intercept (λ_kv = 1): first token 1 + 1/8, phases
    g = 2, 3 (one decode each, cheaper than a refill of 2 or 3 tokens) 1 + 2/8 and 1 + 3/8, so K = 3.75; each
    phase lasts at least 2 and its generating batch at least 2, so the pieces wait (first token) 2 + 2, (g = 2)
    1 + 2, (g = 3) 1 for the last token: G = (1.125·4 + 1.25·3 + 1.375·1) / 3.75. Alone, M >= K / 2. The token
    share (λ_tok = 1) gives K = 3.375, G = 9 / 3.375, less; the optimum is 6 (three batches of 2)."""
    lb = LowerBounder([Request(0, 0.0, 1, 3)], Limits(C=8, M=8), AffineCost()).latency_sum_s()
    assert lb.parts["mean_busy_sum_s"] == pytest.approx(3.75 / 2 + (1.125 * 4 + 1.25 * 3 + 1.375) / 3.75, rel=1e-5)
    assert lb.value_s <= 6.0


def test_eviction_free_keeps_the_decodes_only():
    """When a prompt is cheap to recompute, a phase may be a refill instead of a decode, and the bound keeps the
    cheaper; with evictions forbidden it keeps the decode. Decodes here read the KV at a high price."""
    from infermax.costmodel import AffinePiece, CostTerm

    class ReadHeavy:
        name = "read-heavy"

        def milp_terms(self):
            return (CostTerm("all", "n_tokens", (AffinePiece(1.0, {"n_tokens": 0.1}),)),
                    CostTerm("reads", "n_decode_seqs", (AffinePiece(0.0, {"decode_kv_tokens": 1.0}),)))

    reqs = [Request(0, 0.0, 2, 4), Request(1, 0.5, 2, 4)]
    limits = Limits(C=16, M=16)
    free = LowerBounder(reqs, limits, ReadHeavy()).latency_sum_s().parts["mean_busy_sum_s"]
    eviction_free = LowerBounder(reqs, limits, ReadHeavy(), Policies(eviction_free=True)).latency_sum_s()
    assert eviction_free.parts["mean_busy_sum_s"] > free
