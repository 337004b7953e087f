"""The crowded-service bound on the sum of latencies (solvers/crowding_bound.py, docs/design.md "Crowded service"):
its per-window relaxation against brute force over the kept sets, the batch cap worked by hand, and the bound
against simulated schedules on online workloads, including one where it is the binding ingredient."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.costmodel import load_cost_model
from infermax.costmodel.base import AffinePiece, CostTerm
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed, with_arrivals
from online_workloads import loaded_online
from solvers.crowding_bound import _window_bound, batch_marginal_cap_s
from solvers.lower_bound import LowerBounder
from solvers.objective import Objective
from solvers.search import search

COST = load_cost_model()
LATENCY = Objective(latency=1)
TOL = 1e-9


def _brute_window(cost_out, own, q, w, a0, room, lam) -> float:
    """The exact minimum over kept sets S of Σ_{∉S} cost_out + Σ_S own + (1 − λ)·Q_S²/K(W_S), infeasible sets
    (W_S > room) excluded."""
    best = math.inf
    n = len(q)
    for keep in itertools.product((False, True), repeat=n):
        k = np.array(keep, bool)
        W = float(w[k].sum())
        if W > room:
            continue
        K = 1.0 + (room - W) / a0
        value = float(cost_out[~k].sum() + own[k].sum()) + (1 - lam) * float(q[k].sum()) ** 2 / K
        best = min(best, value)
    return best


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 7), st.integers(0, 10**6), st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.05, 20.0))
def test_window_relaxation_below_the_exact_minimum(n, seed, lam, room):
    rng = np.random.default_rng(seed)
    cost_out = rng.uniform(0.1, 5.0, n)
    own = rng.uniform(0.0, 3.0, n)
    q = rng.uniform(0.0, 2.0, n)
    w = rng.uniform(0.0, 4.0, n)
    a0 = float(rng.uniform(0.01, 1.0))
    got = _window_bound(cost_out, own, q, w, a0, room, lam)
    exact = _brute_window(cost_out, own, q, w, a0, room, lam)
    assert got <= exact * (1 + TOL) + TOL
    if lam == 1.0 and room >= w.sum():  # no crowding term and every set feasible: the separable minimum is exact
        assert got == pytest.approx(exact, rel=1e-12, abs=1e-12)


def test_batch_cap_by_hand():
    marginal = (CostTerm("t", "n_tokens", (AffinePiece(0.0, {"n_tokens": 1e-3, "decode_kv_tokens": 2e-6,
                                                               "prefill_sq_tokens": 1e-9}),)),)
    limits = Limits(C=8, P=4, M=100)
    # 8 tokens · 1e-3 + 100 KV reads · 2e-6 + (P = 4)² · 1e-9; hidden-form caches double the KV reads
    assert batch_marginal_cap_s(marginal, limits, max_context=50) == pytest.approx(8e-3 + 2e-4 + 16e-9)
    assert batch_marginal_cap_s(marginal, limits, 50, hidden=True) == pytest.approx(8e-3 + 4e-4 + 16e-9)
    unknown = (CostTerm("t", "n_tokens", (AffinePiece(0.0, {"mystery": 1.0}),)),)
    assert batch_marginal_cap_s(unknown, limits, 50) == math.inf


def test_binds_under_sustained_load_and_stays_below_every_schedule_found():
    # 120 requests (I = 512, O = 256) arriving at 6 per second: alone each takes ~2.6 s, but sustaining ~1,500 decode
    # tokens per second needs crowded batches. Without this ingredient the bound was the order statistics (313 s).
    reqs = with_arrivals(fixed(512, 256, 120), "poisson", rate_per_s=6.0, seed=1)
    limits = Limits(C=4096, M=100_000)
    value, parts = LowerBounder(reqs, limits, COST)._completion_sum(False, "latency")
    others = max(v for k, v in parts.items() if k.endswith("_sum_s") and k != "crowded_service_sum_s")
    assert parts["crowded_service_sum_s"] == value
    assert value > 1.1 * others
    for scheduler in ("vllm", "sarathi", "sarathi-pc-ef", "rank-i-ef", "vllm-v1"):
        assert value <= LATENCY.value(simulate(reqs, scheduler, limits, COST)) * (1 + TOL)
    found = search(reqs, limits, COST, LATENCY, time_limit_s=10)
    assert value <= found.value_s * (1 + TOL)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loaded_online(), st.sampled_from(["vllm", "sarathi", "sarathi-pc-ef", "rank-i-ef", "vllm-v1", "aptserve-kv",
                                         "ecoserve-d"]))
def test_crowded_service_below_schedules_on_loaded_online_workloads(case, scheduler):
    reqs, limits = case
    result = simulate(reqs, scheduler, limits, COST)
    bounder = LowerBounder(reqs, result.schedule.limits, COST)
    solo = bounder._solo_s(False)
    got = LATENCY.value(result)
    for split in bounder._additive_splits():
        crowded = bounder._crowded_service_sum(bounder.full, solo, split, floor=0.0)  # floor 0: the fine grid too
        if crowded is not None:
            assert crowded - float(bounder.arrivals.sum()) <= got * (1 + TOL), f"{scheduler}: {crowded} > {got}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loaded_online(), st.sampled_from(["vllm", "sarathi", "rank-i-ef", "vllm-v1", "aptserve-kv", "roundrobin"]),
       st.floats(0.3, 1.0), st.sampled_from([1.5, 2.0, 4.0, 50.0]), st.floats(0.0, 1.0))
def test_each_step_of_the_proof_on_simulated_schedules(case, scheduler, quantile, window_factor, offset_share):
    """The proof's inequalities checked on a real schedule, window by window, with the kept sets its latencies give:
    every batch holding a kept request starts in the window; ``(K − 1)·a0 + W − w_cap ≤ L``; the kept requests'
    latencies sum to at least ``Σ_j t_j·p_j`` (the durations of the batches each is in), and that to at least
    ``a0·Σ O + λ·W + (1 − λ)·Q²/K`` for λ = 0, ½, 1. The threshold is a quantile of the
    schedule's own latencies, so that most windows keep many requests."""
    reqs, limits = case
    result = simulate(reqs, scheduler, limits, COST)
    ell = float(np.quantile(result.requests["latency_s"], quantile))
    bounder = LowerBounder(reqs, result.schedule.limits, COST)
    batches = result.schedule.batches
    starts = result.batches["start_s"].to_numpy()
    durations = result.batches["duration_s"].to_numpy()
    holding: dict[int, list[int]] = {}
    for j, b in enumerate(batches):
        for rid, _ in b.items:
            holding.setdefault(rid, []).append(j)
    table = result.requests.set_index("id")
    L = ell * window_factor
    for split in bounder._additive_splits():
        a0 = split[0]
        work, root, w_cap = bounder._crowded_service_inputs(bounder.full, split)
        u = min(r.arrival_s for r in reqs) - offset_share * L
        while u <= max(r.arrival_s for r in reqs):
            kept = [k for k, r in enumerate(reqs) if u <= r.arrival_s and r.arrival_s + ell <= u + L
                    and table.loc[r.id, "latency_s"] <= ell]
            if kept:
                K = int(((starts >= u) & (starts < u + L)).sum())
                for k in kept:
                    assert all(u <= starts[j] < u + L for j in holding[reqs[k].id])
                W, Q = float(work[kept].sum()), float(root[kept].sum())
                assert (K - 1) * a0 + W - w_cap <= L * (1 + TOL) + TOL
                latency = float(sum(table.loc[reqs[k].id, "latency_s"] for k in kept))
                waited = float(sum(durations[j] for k in kept for j in holding[reqs[k].id]))  # Σ_j t_j·p_j
                assert latency * (1 + TOL) + TOL >= waited
                outputs = sum(reqs[k].output_tokens for k in kept)
                for lam in (0.0, 0.5, 1.0):
                    assert waited * (1 + TOL) + TOL >= a0 * outputs + lam * W + (1 - lam) * Q * Q / K
            u += L
