"""The work-in-progress bound on the sum of latencies (solvers/progress_bound.py, docs/design.md "Work in
progress"): the idle price against random schedules of one machine, each step of the proof on simulated schedules,
and the whole ingredient against simulated schedules and the search, including an overloaded trace where it binds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from infermax.workload import load_trace
from online_workloads import loaded_online
from solvers.busy_time_bound import phase_marginals, spt_mean_busy_times
from solvers.lower_bound import LowerBounder
from solvers.objective import Objective
from solvers.progress_bound import IdlePrice, PhaseValues, phase_values, progress_tables, spt_pieces
from solvers.search import search

COST = load_cost_model()
LATENCY = Objective(latency=1)
TOL = 1e-9
# some with eviction: M down to the largest request
LOADED = loaded_online(sizes=(8, 40), gaps=(0.003, 0.01, 0.04), min_output=1, m_factors=(1, 3, 12))


def _random_jobs(rng, n_max=8):
    n = int(rng.integers(1, n_max + 1))
    release = np.round(rng.uniform(0, 4, n), 1) if rng.random() < 0.7 else np.zeros(n)
    work = np.round(rng.uniform(0.05, 2.0, n), 2)
    return release, work


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6))
def test_spt_pieces_are_the_mean_busy_times_schedule(seed):
    release, work = _random_jobs(np.random.default_rng(seed))
    pieces = spt_pieces(release, work)
    assert (pieces[:, 1] >= pieces[:, 0]).all() and (pieces[1:, 0] >= pieces[:-1, 1] - 1e-12).all()
    assert float((pieces[:, 1] - pieces[:, 0]).sum()) == pytest.approx(float(work.sum()))
    # the pieces' moment is the work-weighted sum of spt_mean_busy_times
    moment = float(((pieces[:, 1] - pieces[:, 0]) * (pieces[:, 0] + pieces[:, 1]) / 2).sum())
    assert moment == pytest.approx(float((spt_mean_busy_times(release, work) * work).sum()))


def test_idle_price_by_hand():
    # jobs of work 1 and 2 released at 0, a job of work 1 at 5: SPT runs [0, 1] (w 1), [1, 3] (w 2), idle, [5, 6]
    price = IdlePrice(spt_pieces(np.array([0.0, 0.0, 5.0]), np.array([1.0, 2.0, 1.0])))
    # V(τ) = ∫_τ^3 dt / p_max[0, t]: p_max is 1 on [0, 1] and 2 after, so V(0.5) = 0.5 + 2/2, V(2) = 1/2
    assert price.at([0.5, 2.0, 4.0, 5.5, 7.0]) == pytest.approx([1.5, 0.5, 0.0, 0.5, 0.0])
    assert price.main_period(np.array([0.0, 0.0, 5.0])) == (0.0, 3.0)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6))
def test_priced_idle_below_every_schedule_of_one_machine(seed):
    """Σ_r M_r >= SPT + Σ idle·V for schedules that run the available jobs smallest work first (as SPT does) or in
    a random priority order, switch at random, and idle at random (each idle stretch cut at the SPT pieces' ends
    and priced at its end, where V is smallest within a busy period)."""
    rng = np.random.default_rng(seed)
    release, work = _random_jobs(rng)
    pieces = spt_pieces(release, work)
    price = IdlePrice(pieces)
    cuts = np.unique(np.concatenate([pieces[:, 0], pieces[:, 1]]))
    left, moment, priced, t = work.copy(), np.zeros(len(work)), 0.0, 0.0
    spt_like = rng.random() < 0.5  # smallest work first, as SPT: Σ M then exceeds SPT's by the idle's effect alone
    priority = np.argsort(work, kind="stable") if spt_like else rng.permutation(len(work))
    idle_share = rng.uniform(0, 0.6)
    while left.max() > 1e-12:
        ready = [j for j in priority if release[j] <= t + 1e-12 and left[j] > 1e-12]
        step = float(rng.uniform(0.01, 0.4))
        if not ready or rng.random() < idle_share:
            end = t + step if ready else max(t + step, min(release[j] for j in range(len(work)) if left[j] > 1e-12))
            for a, b in zip([t, *cuts[(cuts > t) & (cuts < end)]], [*cuts[(cuts > t) & (cuts < end)], end]):
                priced += (b - a) * float(price.at(b - 1e-12)[0] if b - a > 0 else 0.0)
            t = end
            continue
        j = ready[0] if spt_like or rng.random() < 0.7 else ready[int(rng.integers(len(ready)))]
        run = min(step, left[j])
        moment[j] += run * (t + run / 2)
        left[j] -= run
        t += run
    got = float((moment / work).sum())
    assert got >= float(spt_mean_busy_times(release, work).sum()) + priced - 1e-9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LOADED, st.sampled_from(["vllm", "sarathi", "sarathi-pc-ef", "rank-i-ef", "rank-o", "vllm-v1",
                                         "aptserve-kv", "ecoserve-d", "roundrobin"]))
def test_work_in_progress_below_schedules_on_loaded_online_workloads(case, scheduler):
    reqs, limits = case
    result = simulate(reqs, scheduler, limits, COST)
    bounder = LowerBounder(reqs, result.schedule.limits, COST)
    lower = bounder.arrivals + bounder._solo_s(False)
    finish_sum = LATENCY.value(result) + float(bounder.arrivals.sum())
    for split in bounder._additive_splits():
        value = bounder._work_in_progress_sum(bounder.full, split, lower)
        if value is not None:
            assert value <= finish_sum * (1 + TOL), f"{scheduler}: {value} > {finish_sum}"


def _kept_layout(reqs, result, split, M, kv_factor=1.0):
    """The proof's layout on an eviction-free schedule: per request its kept pieces (first-token work spread over its
    prefill items in proportion to their tokens, then one piece per later token in the batch generating it), in each
    batch's interval in item order, the rest of the batch idle at its end. Returns per request the kept work ``k``,
    the pieces ``(batch, start, length, marginal part)``, and per batch its idle length and generating items' KV
    over M."""
    a0, _, marginal = split
    bounder = LowerBounder(reqs, result.schedule.limits, COST)
    by_id = {r.id: r for r in reqs}
    starts = result.batches["start_s"].to_numpy()
    durations = result.batches["duration_s"].to_numpy()
    prefill_items = {r.id: [] for r in reqs}
    token_batch = {r.id: [] for r in reqs}  # batch of tokens 2..O
    done = {r.id: 0 for r in reqs}
    for j, b in enumerate(result.schedule.batches):
        for rid, c in b.items:
            r = by_id[rid]
            if done[rid] < r.prompt_tokens:
                prefill_items[rid].append((j, c))
                done[rid] += c
            else:
                token_batch[rid].append(j)
    pieces_in = {j: [] for j in range(len(durations))}
    work, share_in = {}, np.zeros(len(durations))
    for r in reqs:
        first = bounder._work_alone_s(r.prompt_tokens, 1, marginal)
        phase = phase_marginals(r.prompt_tokens, r.output_tokens, marginal, refills=False)[0] \
            if r.output_tokens > 1 else np.zeros(0)
        kv = (r.prompt_tokens + np.arange(1, max(r.output_tokens, 1))) * kv_factor / M
        total_tokens = sum(c for _, c in prefill_items[r.id])
        for j, c in prefill_items[r.id]:
            pieces_in[j].append((r.id, first * c / total_tokens, first * c / total_tokens))
        for g, j in enumerate(token_batch[r.id]):
            pieces_in[j].append((r.id, phase[g] + a0 * kv[g], phase[g]))
            share_in[j] += kv[g]
        work[r.id] = first + float((phase + a0 * kv).sum())
    layout = {r.id: [] for r in reqs}
    idle = np.zeros(len(durations))
    for j, items in pieces_in.items():
        t = starts[j]
        for rid, length, marginal_part in items:
            layout[rid].append((j, t, length, marginal_part))
            t += length
        idle[j] = starts[j] + durations[j] - t
    return work, layout, idle, share_in, starts, durations


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LOADED, st.sampled_from(["sarathi-pc-ef", "rank-i-ef", "vllm-ef", "sarathi-ef"]))
def test_each_step_of_the_proof_on_simulated_schedules(case, scheduler):
    """On an eviction-free schedule, with the layout of `_kept_layout`: the kept pieces fit their batches and the
    generating items' KV fits M (so the idle is at least a0·(1 − κ_j)); Σ M_r >= SPT + Σ_j idle_j·V̄_j, V̄_j the least
    V over j's idle;
    C_r − M_r >= Σ over the batches after r's first piece up to its last token of t_j·φ_r(j); and per batch
    t_j·Φ_j + idle_j·V̄_j >= a0·Φ_j + Σ_i [2·√(a0·V̄_j·μ_i·φ_i) − a0·V̄_j·κ_i]."""
    reqs, limits = case
    result = simulate(reqs, scheduler, limits, COST)
    lim = result.schedule.limits
    bounder = LowerBounder(reqs, lim, COST)
    finish = result.requests.set_index("id")["finish_s"]
    for split in bounder._additive_splits():
        a0, _, marginal = split
        work, layout, idle, share_in, starts, durations = _kept_layout(reqs, result, split, lim.M)
        ends = starts + durations
        assert (idle >= -1e-9).all() and (share_in <= 1 + 1e-12).all()
        assert (idle >= a0 * (1 - share_in) - 1e-9).all()
        ids = [r.id for r in reqs]
        release = np.array([r.arrival_s for r in reqs])
        k = np.array([work[i] for i in ids])
        mean_busy = np.array([sum(length * (s + length / 2) for _, s, length, _ in layout[i]) / work[i] for i in ids])
        price = IdlePrice(spt_pieces(release, k))
        v_end = np.array([price.least(end - max(w, 0.0), end) for end, w in zip(ends, idle)])  # least V over j's idle
        assert mean_busy.sum() >= float(spt_mean_busy_times(release, k).sum()) + float((idle * v_end).sum()) - 1e-9
        phi_in = {}  # (request, batch) -> fraction of its kept work before the batch
        Phi = np.zeros(len(durations))
        for i, m in zip(ids, mean_busy):
            pieces = layout[i]
            first_batch, last_batch = pieces[0][0], int(np.searchsorted(ends, finish[i] - 1e-12))
            before = np.zeros(len(durations) + 1)
            for j, _, length, _ in pieces:
                before[j + 1] += length
            phi = np.cumsum(before)[:-1] / work[i]
            span = np.arange(first_batch + 1, last_batch + 1)
            assert finish[i] - m >= float((durations[span] * phi[span]).sum()) - 1e-9
            Phi[span] += phi[span]
            for j, _, _, marginal_part in pieces:
                phi_in[(i, j)] = (phi[j], marginal_part)
        for j, b in enumerate(result.schedule.batches):
            v = v_end[j]
            members = [phi_in[(rid, j)] for rid, _ in b.items if (rid, j) in phi_in]
            crowd = 2 * np.sqrt(a0 * v) * sum(np.sqrt(phi * mu) for phi, mu in members)
            assert durations[j] * Phi[j] + idle[j] * v >= a0 * Phi[j] + crowd - a0 * v * share_in[j] - 1e-9


def test_binds_on_an_overloaded_trace_and_stays_below_schedules_and_the_search():
    # the first 150 azure-conv requests arriving 4x faster: the batches must be full to keep up, so every request
    # waits for many others' work; the mean busy times charge each only its own chain
    trace = load_trace("azure-conv", limit=150)
    reqs = [Request(r.id, r.arrival_s / 4, r.prompt_tokens, r.output_tokens) for r in trace]
    limits = Limits(C=4096, M=100_000)
    value, parts = LowerBounder(reqs, limits, COST)._completion_sum(False, "latency")
    assert parts["work_in_progress_sum_s"] == pytest.approx(value)
    assert value > 1.1 * parts["mean_busy_sum_s"]
    for scheduler in ("sarathi", "sarathi-pc-ef", "rank-i-ef", "vllm-v1"):
        assert value <= LATENCY.value(simulate(reqs, scheduler, limits, COST)) * (1 + TOL)
    found = search(reqs, limits, COST, LATENCY, time_limit_s=10)
    assert value <= found.value_s * (1 + TOL)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LOADED, st.sampled_from(["sarathi-pc-ef", "rank-i-ef", "vllm-ef", "sarathi-ef"]))
def test_the_classes_of_a_simulated_schedule(case, scheduler):
    """The facts the classes rely on, on an eviction-free schedule with each request in the class its finish gives:
    its finish is at least the class's floor; each of its batches ends in the main busy period, by T_k, where V is
    at least V(T_k); and each class's crowding sum is at most the proof's per-phase terms
    2·√(a0·V̄·ph_g·φ_g) − a0·V̄·(I + g − 1)/M summed at the V̄ = min(V(end of the batch), V_cap) of the batch that
    generates token g, recomputed here from the phases' costs, so that the first line of the bound holds for it."""
    reqs, limits = case
    result = simulate(reqs, scheduler, limits, COST)
    lim = result.schedule.limits
    bounder = LowerBounder(reqs, lim, COST)
    finish = result.requests.set_index("id")["finish_s"]
    ends = (result.batches["start_s"] + result.batches["duration_s"]).to_numpy()
    token_batch = {r.id: [] for r in reqs}
    done = {r.id: 0 for r in reqs}
    for j, b in enumerate(result.schedule.batches):
        for rid, c in b.items:
            if done[rid] >= next(r.prompt_tokens for r in reqs if r.id == rid):
                token_batch[rid].append(j)
            done[rid] += c
    lower = bounder.arrivals + bounder._solo_s(False)
    finish_sum = float(sum(finish[r.id] for r in reqs))
    for split in bounder._additive_splits():
        a0, _, marginal = split
        terms, which = bounder._progress_inputs(bounder.full, split)
        tables = progress_tables(bounder.arrivals, lower, terms, which, a0)
        if tables is None:
            continue
        b, e = tables.period
        for cap_index, v_cap in enumerate(tables.caps):
            first_line = tables.constant
            for n, r in enumerate(reqs):
                k = int(np.searchsorted(tables.thresholds, finish[r.id] - 1e-12)) if tables.in_main[n] else None
                if k is not None and k >= len(tables.thresholds):
                    k = None
                floor = tables.late[n] if k is None else tables.floors[n, k]
                assert floor <= finish[r.id] + 1e-9
                first = bounder._work_alone_s(r.prompt_tokens, 1, marginal)
                phase = phase_marginals(r.prompt_tokens, r.output_tokens, marginal, refills=True)[0] \
                    if r.output_tokens > 1 else np.zeros(0)
                kv = (r.prompt_tokens + np.arange(1, max(r.output_tokens, 1))) / lim.M
                pieces = phase + a0 * kv
                work = first + pieces.sum()
                phi = (first + np.concatenate([[0.0], np.cumsum(pieces)[:-1]])) / work
                exact = 0.0
                for g, j in enumerate(token_batch[r.id]):
                    v = float(tables.price.at(ends[j])[0])
                    if k is not None:
                        assert b <= ends[j] <= tables.thresholds[k] + 1e-9 and v >= tables.v_low[k] - 1e-9
                    v = min(v, v_cap)
                    exact += 2 * np.sqrt(a0 * v * phase[g] * phi[g]) - a0 * v * kv[g]
                implemented = tables.none[cap_index][which[n]] if k is None else tables.classes[cap_index][which[n], k]
                assert implemented <= exact + 1e-9
                first_line += exact
            assert first_line <= finish_sum * (1 + TOL) + 1e-9


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6), st.booleans())
def test_phase_values_below_every_realisation_of_a_phase(seed, refills):
    """`phase_values` against random realisations of one phase in batches whose V̄ lies in [v_low, v_cap]: a decode
    (one item, cost >= decode) or, with refills, chunks of a refill (costs summing to >= refill, the last >= the
    last chunk's cost) in batches of their own, each with φ >= φ_g, the KV share on the last only; the realised
    value is Σ_items 2·√(a0·V̄·μ·φ) − a0·V̄_last·share."""
    rng = np.random.default_rng(seed)
    a0, phi, share = rng.uniform(0.001, 0.01), rng.uniform(0, 1), rng.uniform(0, 0.2)
    decode, last_chunk = rng.uniform(1e-5, 1e-3), rng.uniform(1e-5, 2e-4)
    refill = last_chunk + rng.uniform(0, 2e-3)
    v_low, v_cap = sorted(rng.uniform(0, 1000, 2))
    v_low = 0.0 if rng.random() < 0.3 else v_low

    def pick(low, high):  # an end or a point between: the extremes are where a bound is tight
        return [low, high, rng.uniform(low, high)][int(rng.integers(3))]

    got = float(phase_values(a0, v_low, v_cap, np.array([phi]), np.array([decode]), np.array([share]),
                             np.array([refill]) if refills else None, np.array([last_chunk]) if refills else None)[0])
    for _ in range(50):
        v = pick(v_low, v_cap)
        realised = 2 * np.sqrt(a0 * v * decode * pick(1, 3) * phi * pick(1, 1.5)) - a0 * v * share
        assert got <= realised + 1e-12
        if refills:
            last = pick(last_chunk, refill)
            parts = rng.dirichlet(np.ones(int(rng.integers(1, 5)))) * (refill - last) * pick(1, 1.3)
            v_last = pick(v_low, v_cap)
            realised = 2 * np.sqrt(a0 * v_last * last * phi) - a0 * v_last * share + sum(
                2 * np.sqrt(a0 * pick(v_low, v_cap) * p * phi * pick(1, 1.5)) for p in parts)
            assert got <= realised + 1e-12


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.booleans())
def test_phase_values_reused_over_many_ends_equal_fresh_ones(seed, refills):
    """`PhaseValues` keeps the roots and the v_cap ends between calls (`progress_tables` asks many v_low per v_cap, and
    the caps in turn): each answer equals `phase_values` computed afresh, also when v_cap changes and comes back."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    a0, phi, share = rng.uniform(0.001, 0.01), rng.uniform(0, 1, n), rng.uniform(0, 0.2, n)
    decode = rng.uniform(1e-5, 1e-3, n)
    last_chunk = rng.uniform(1e-5, 2e-4, n) if refills else None
    refill = last_chunk + rng.uniform(0, 2e-3, n) if refills else None
    phases = PhaseValues(a0, phi, decode, share, refill, last_chunk)
    caps = rng.uniform(1, 1000, 3)
    for _ in range(20):
        v_cap = float(caps[int(rng.integers(3))])
        v_low = 0.0 if rng.random() < 0.3 else float(rng.uniform(0, v_cap))
        expected = phase_values(a0, v_low, v_cap, phi, decode, share, refill, last_chunk)
        assert np.array_equal(phases.at(v_low, v_cap), expected)
