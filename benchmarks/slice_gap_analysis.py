"""Where the optimality study's Azure slice loses its mean-latency gap (docs/design.md, "Crowded service", the
paragraph after it). Prints ten measurements; nothing here is a bound or enters one:

1. Per rank k, the k-th finish of the best schedule found (work-ranked, Rmax 64) against the queued bound's E_k
   (SRPT on one machine of rate 1): where along the ranks the gap lay before "Work in progress" (104%).
2. The schedule side: work-ranked eviction-free and with evictions over Rmax and P, and admission in bursts (a
   low-water mark on the running requests; defined here, not kept in the search), each replayed by the engine.
3. V(τ) = ∫_τ^e ds / p_max[b, s] (`progress_bound.IdlePrice`, the busy period [b, e) holding τ) over the
   preemptive-SPT schedule of the works with the intercept shared by KV: a lower bound on how much a unit of unused
   intercept at τ adds to the sum of mean busy times (docs/design.md, "Work in progress", (ii)).
4. A first, token-shared version of that trade-off, sized optimistically (not a bound: V with the window [τ, s]
   instead of [b, s], taken at each request's earliest finish, and each decode item picking its own batch of T
   tokens, paying φ·(T − 1)·c_tok of crowding and a0·(1 − T/C)·V/T of unused intercept, φ its share of its
   request's work done before): 14.04 s, which is why the bound gives the KV share to generating items instead.
5. Preemption by swapping (`SwapPreemptiveSRPT`, defined here, not in the search): every batch ranks every arrived
   unfinished request by its remaining work and runs them in that order, swapping the lowest-ranked KV holders out to
   host memory when M or Rmax is short; the swap link is the default A100's, and a batch lasts max(compute, swap
   time) as the replayer charges it.
6. The best schedule's latency split as the work-in-progress bound splits it (its step (i)): mean busy time M_r of
   the request's pieces (each item's intercept-free cost, plus a0·KV/M on the item generating a token, at the batch's
   midpoint) and C_r − M_r, against preemptive SPT's mean busy times of the same works.
7. Per-request rate caps on that one machine (a piece of an item cannot take more than its share of a batch that
   lasts at least a0 + its own cost; about 0.1 of the machine for a decode): greedy least-remaining-work-first at
   each request's cap, fluid in 5 ms steps (an estimate: greedy is not proven optimal with caps and releases); and
   the same with every batch assumed to last 20 or 38 ms, as a scale for what a bound coupling batch size with mean
   busy times could add at most.
8. The best schedule over time, in 40 s windows of batch starts: batches, busy time, mean batch length, running
   requests, prefill tokens per batch, and the intercept's share of the busy time; requests in the system.
9. Two more schedule-side tries (2026-11-28), each replayed by the engine: two decode lanes (`TwoLane`: the k running
   requests with the least remaining work decode in every batch, the others in every m-th only, so that the first
   finish sooner at the others' expense), and hill climbing over the per-request keys of work-ranked Rmax 64 (a random
   few percent of the keys scaled by exp(σ·z), kept when the mean latency falls; seed 0, ``--key-search-s`` seconds).
10. Work-ranked Rmax 64 with other keys and prefill budgets (2026-11-28, fifth session), each replayed by the engine:
   the work plus λ·a0 per output token (each token needs a batch of its own, at least an intercept long), plus
   λ·Rmax·a0·(KV area)/M (a request's share of the memory its batches hold, scaled to a full batch), the prompt's
   work plus λ times the decodes' (λ ≠ 1 weights one phase more), and prefill budgets P below C.

11. The work-in-progress bound's classes against completion counts (2026-11-30): in its best mix (θ, V_cap) each
   request picks its cheapest finish class on its own, and 1,125 pick the first (finish by T_1 = 60.8 s), while the
   per-rank bounds (the queued bound's E_k, and the sorted arrival + time alone) allow at most 183 finishes by then.
   A valid tightening: no schedule has more than #{k: E_k ≤ T} finishes by T, so the minimum over class choices can
   be taken over those that respect every such cap (an assignment LP with nested caps, solved by HiGHS; a class no
   cheaper than a later one is left out, since a later class uses fewer caps). Printed: each class's cumulative
   choices against its cap, and the bound with and without the caps over a θ grid at each V_cap. Measured: the
   same bound to three decimals (17.201 s) with the caps. The excess is mostly ties: a class before a request's own
   earliest finish costs it the same floor (max(lower_r, T_{k-1}) = lower_r) and, in the first 11 of the 24 classes
   (where V(T_k) ≥ V_cap), the same crowding, so the first such class is picked; the caps move those requests to
   classes that cost the same. Not built.

    PYTHONPATH=. python benchmarks/slice_gap_analysis.py            # ~5 min on the 2-core machine
    PYTHONPATH=. python benchmarks/slice_gap_analysis.py --caps-only   # item 11 alone, ~15 s

The slice, limits and model are the optimality study's (first 2,000 azure-conv requests, C = 4,096, M = 100K, the
paper's linear model).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

import numpy as np

from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.schedule import ScheduledBatch
from infermax.schedulers.base import Scheduler
from infermax.workload import load_trace
from solvers.busy_time_bound import item_marginal_s, spt_mean_busy_times
from solvers.lower_bound import LowerBounder
from solvers.progress_bound import IdlePrice, spt_pieces
from solvers.search import _algorithm1_policy
from solvers.search_policies import WorkRankedScheduler, marginal_work_s

LIMITS = Limits(C=4096, M=100_000)


class BurstAdmission(WorkRankedScheduler):
    """Work-ranked, admitting only while filling: filling starts when at most ``low`` requests run and stops once a
    batch reaches ``Rmax`` running requests (so prefills meet fewer running decodes)."""

    def __init__(self, limits, policy, work_s, low: int):
        super().__init__(limits, policy, work_s, name=f"burst low={low}")
        self.low, self.filling = low, True

    def _groups(self):
        if not self.filling and len(self.running) <= self.low:
            self.filling = True
        if self.filling:
            return super()._groups()
        ranked = sorted(self.running, key=self._rank_key())
        return [(ranked, False)], ranked

    def next_batch(self, now_s):
        batch = super().next_batch(now_s)
        admitted = sum(1 for rid, _ in batch.items if self._by_id[rid].m == 0)
        if self.filling and self.waiting and len(self.running) + admitted >= (self.limits.Rmax or 1 << 60):
            self.filling = False
        return batch


class SwapPreemptiveSRPT(Scheduler):
    """Least remaining work first over every arrived request, preempting by swapping KV to host memory.

    Each batch walks the arrived unfinished requests by remaining work (``remaining_s``: the prefill left at a
    per-token cost and the decodes left at a cost affine in the KV they read, a ranking key, not a bound) and takes
    each that fits within ``rmax`` requests, C tokens (a prefill takes what is left of C) and M (its cached tokens
    plus this batch's), swapping in any of its KV in host memory. The GPU holders not taken stay while M and Rmax
    allow, in rank order; the rest are swapped out whole."""

    name = "swap-preemptive-srpt"

    def __init__(self, limits: Limits, prefill_per_token_s: float, decode_s: tuple[float, float], rmax: int):
        super().__init__(limits)
        self.prefill_per_token_s, (self.decode_s, self.decode_per_kv_s) = prefill_per_token_s, decode_s
        self.rmax = rmax
        self.active: dict = {}

    def add_arrivals(self, arrived) -> None:
        for s in arrived:
            self.active[s.id] = s

    def remaining_s(self, s) -> float:
        prefill_left = s.input_tokens - s.m
        decodes_left = s.req.output_tokens - s.generated - (prefill_left > 0)
        kv = s.m + prefill_left
        return (prefill_left * self.prefill_per_token_s
                + decodes_left * (self.decode_s + self.decode_per_kv_s * (kv + decodes_left / 2)))

    def next_batch(self, now_s: float) -> ScheduledBatch:
        lim = self.limits
        ranked = sorted(self.active.values(), key=lambda s: (self.remaining_s(s), s.req.arrival_s, s.id))
        tokens_left, kv, items, taken, swap_in = lim.C, 0, [], set(), []
        for s in ranked:
            if len(taken) == self.rmax or tokens_left == 0:
                break
            prefill_left = s.input_tokens - s.m
            c = min(prefill_left, tokens_left) if prefill_left > 0 else 1
            if kv + s.m + c > lim.M:
                continue
            kv, tokens_left = kv + s.m + c, tokens_left - c
            items.append((s.id, c))
            taken.add(s.id)
            if s.cpu_tokens:
                swap_in.append((s.id, s.cpu_tokens))
        holders, swap_out = len(taken), []
        for s in ranked:
            gpu = s.m - s.cpu_tokens
            if s.id in taken or gpu == 0:
                continue
            if kv + gpu <= lim.M and holders < self.rmax:
                kv, holders = kv + gpu, holders + 1
            else:
                swap_out.append((s.id, gpu))
        return ScheduledBatch(items=items, swap_out=sorted(swap_out), swap_in=swap_in)

    def batch_done(self, batch: ScheduledBatch, finished) -> None:
        for s in finished:
            del self.active[s.id]


class TwoLane(Scheduler):
    """Eviction-free, requests admitted least own work first (``work_s``) while their peaks ``I + O − 1`` fit M and
    fewer than ``rmax`` run; prefill chunks (least work first) fill the token budget after the decodes. Decodes: the
    ``k`` running requests with the least remaining work (the key of `SwapPreemptiveSRPT`) in every batch, the others
    in every ``m``-th batch only (every batch when ``m`` is 1)."""

    name = "two-lane"

    def __init__(self, limits: Limits, work_s: dict, decode_s: tuple[float, float], k: int, m: int, rmax: int):
        super().__init__(limits)
        self.work_s, (self.decode_s, self.decode_per_kv_s) = work_s, decode_s
        self.k, self.m, self.rmax = k, m, rmax
        self.waiting, self.running, self.reserved_tokens, self.batches = [], {}, 0, 0

    def add_arrivals(self, arrived) -> None:
        self.waiting.extend(arrived)

    def remaining_s(self, s) -> float:
        left = s.req.output_tokens - s.generated
        return left * (self.decode_s + self.decode_per_kv_s * (s.m + left / 2))

    def next_batch(self, now_s: float) -> ScheduledBatch:
        self.batches += 1
        decoding = sorted((s for s in self.running.values() if s.m >= s.input_tokens),
                          key=lambda s: (self.remaining_s(s), s.id))
        lane = decoding if self.batches % self.m == 0 else decoding[:self.k]
        items = [(s.id, 1) for s in lane]
        budget = self.limits.C - len(items)
        for s in sorted((s for s in self.running.values() if s.m < s.input_tokens), key=lambda s: self.work_s[s.id]):
            if budget > 0:
                c = min(s.input_tokens - s.m, budget)
                items.append((s.id, c))
                budget -= c
        self.waiting.sort(key=lambda s: (self.work_s[s.id], s.id))
        kept = []
        for s in self.waiting:
            peak = s.input_tokens + s.req.output_tokens - 1
            if budget > 0 and len(self.running) < self.rmax and self.reserved_tokens + peak <= self.limits.M:
                self.running[s.id], self.reserved_tokens = s, self.reserved_tokens + peak
                c = min(s.input_tokens, budget)
                items.append((s.id, c))
                budget -= c
            else:
                kept.append(s)
        self.waiting = kept
        if not items:  # nothing to prefill and the slow lane is off this batch: decode everyone
            items = [(s.id, 1) for s in decoding]
        return ScheduledBatch(items=items)

    def batch_done(self, batch: ScheduledBatch, finished) -> None:
        for s in finished:
            del self.running[s.id]
            self.reserved_tokens -= s.input_tokens + s.req.output_tokens - 1


def _v_window(tau: float, segments: np.ndarray) -> float:
    """Item 4's optimistic V: ∫_τ ds / p_max[τ, s] over the SPT pieces after τ (p_max over [τ, s], not [b, s])."""
    s = segments[segments[:, 1] > tau]
    if not len(s):
        return 0.0
    return float(((s[:, 1] - np.maximum(s[:, 0], tau)) / np.maximum.accumulate(s[:, 2])).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--key-search-s", type=float, default=60.0, help="item 9's hill-climbing budget (seconds)")
    ap.add_argument("--caps-only", action="store_true", help="item 11 alone")
    args = ap.parse_args()
    cost = load_cost_model(kind="linear")
    reqs = load_trace("azure-conv", limit=2000)
    if args.caps_only:
        class_caps(LowerBounder(reqs, LIMITS, cost))
        return
    work = marginal_work_s(reqs, cost, LIMITS)
    ef, evicting = _algorithm1_policy("rank-i-ef"), _algorithm1_policy("rank-i")

    def mean_latency(sched, lim) -> float:
        return float(simulate(reqs, sched, lim, cost).summary["mean_latency_s"])

    best_lim = replace(LIMITS, Rmax=64)
    best_run = simulate(reqs, WorkRankedScheduler(best_lim, ef, work), best_lim, cost)
    bounder = LowerBounder(reqs, LIMITS, cost)
    queued = np.sort(bounder._queued_finish_times(bounder.full, False))
    finish = np.sort(best_run.requests["finish_s"].to_numpy())
    arrivals = bounder.arrivals
    print(f"1. work-ranked Rmax 64: mean latency {(finish.sum() - arrivals.sum()) / len(reqs):.2f} s; "
          f"queued bound alone {(queued.sum() - arrivals.sum()) / len(reqs):.2f} s")
    for k in (100, 500, 1000, 1500, 1800, 1900, 1999):
        print(f"   rank {k + 1:5d}: finish {finish[k]:7.2f} s, E_k {queued[k]:7.2f} s, "
              f"difference {finish[k] - queued[k]:6.2f} s")

    print("2. schedules (mean latency, s)")
    t = time.perf_counter()
    for label, pol in (("eviction-free", ef), ("evicting", evicting)):
        for rmax in (48, 64, 80, None):
            row = []
            for P in (None, 512, 2048):
                lim = replace(LIMITS, Rmax=rmax, P=P)
                row.append(f"P={P}: {mean_latency(WorkRankedScheduler(lim, pol, work), lim):.2f}")
            print(f"   work-ranked {label:13s} Rmax={rmax}: " + ", ".join(row))
    for rmax, lows in ((64, (32, 48, 56, 60, 62)), (68, (56, 60, 62))):
        lim = replace(LIMITS, Rmax=rmax)
        print(f"   bursts Rmax={rmax}: " + ", ".join(
            f"low={low}: {mean_latency(BurstAdmission(lim, ef, work, low), lim):.2f}" for low in lows))
    print(f"   ({time.perf_counter() - t:.0f} s)")

    a0, _, _ = bounder._additive_splits()[0]
    prompt = np.array([r.prompt_tokens for r in reqs], dtype=float)
    output = np.array([r.output_tokens for r in reqs], dtype=float)
    kv_area = prompt * output + output * (output - 1) / 2  # KV tokens read over the decodes, roughly
    works = np.array([work[r.id] for r in reqs]) + a0 * kv_area / LIMITS.M
    segments = spt_pieces(arrivals, works)
    print(f"3. SPT over KV-shared works ends at {segments[-1, 1]:.1f} s")
    price = IdlePrice(segments)
    for tau in (10, 50, 100, 200, 300, 400, 450):
        print(f"   V({tau:3d} s) = {float(price.at(tau)[0]):6.1f}")

    c_tok = min(c for t in cost.milp_terms() for p in t.pieces for f, c in p.coef_s.items() if f == "n_tokens")
    marginal = np.array([work[r.id] for r in reqs])
    token_works = marginal + a0 * (prompt + output - 1) / LIMITS.C
    token_segments = spt_pieces(arrivals, token_works)
    mean_busy = float((spt_mean_busy_times(arrivals, token_works) - arrivals).mean())
    solo = bounder._solo_s(False)
    extra = 0.0
    for r in range(len(reqs)):
        v = _v_window(arrivals[r] + solo[r], token_segments)
        g = np.arange(1, int(output[r]))
        if not len(g) or v <= 0:
            continue
        done_first = 0.45 * marginal[r]  # about the prompt's share of the request's own work
        phi = (done_first + g * (token_works[r] - done_first) / output[r]) / token_works[r]
        best = np.full(len(g), np.inf)
        t_star = np.sqrt(a0 * v / (phi * c_tok))
        for t in (np.floor(t_star), np.ceil(t_star)):
            t = np.clip(t, 1, LIMITS.C)
            best = np.minimum(best, phi * (t - 1) * c_tok + a0 * (1 - t / LIMITS.C) * v / t)
        extra += float(best.sum())
    chain = float((output * (a0 + c_tok) / 2).mean())
    print(f"4. token shares: SPT mean busy {mean_busy:.2f} s + chain {chain:.2f} s + crowding and unused intercept "
          f"{extra / len(reqs):.2f} s = {mean_busy + chain + extra / len(reqs):.2f} s (optimistic size, not a bound)")

    _, _, marginal = bounder._additive_splits()[0]
    swap_preemption(reqs, cost, marginal)
    work_of = busy_time_split(best_run, reqs, arrivals, a0, marginal)
    rate_capped_spt(reqs, arrivals, a0, marginal, work_of)
    over_time(best_run, a0)
    d0, d1 = (float(x) for x in item_marginal_s(marginal, decode_read=np.array([0.0, 1.0])))
    lanes_and_keys(reqs, cost, work, (d0, d1 - d0), best_lim, args.key_search_s)
    other_keys(reqs, cost, work, a0, marginal, best_lim)
    class_caps(bounder)


def _capped_choice_sum(theta: float, table, none, tables, which, caps) -> float:
    """Σ_r C_r's mix at ``theta`` (as `progress_sum`) with each request's class chosen under the completion caps:
    at most ``caps[k]`` requests of the main busy period finish by threshold k (an LP; its value is a lower bound on
    the integer choice's)."""
    import scipy.sparse as sparse
    from scipy.optimize import linprog

    main = tables.in_main
    late = theta * none[which] + (1 - theta) * tables.late
    by_class = theta * table[which] + (1 - theta) * tables.floors
    rows, count = np.unique(np.column_stack([by_class[main], late[main]]), axis=0, return_counts=True)
    later = np.minimum.accumulate(rows[:, ::-1], axis=1)[:, ::-1]
    keep = np.ones(rows.shape, bool)
    keep[:, :-1] = rows[:, :-1] < later[:, 1:]  # a class no cheaper than a later one uses more caps for nothing
    row, k = np.nonzero(keep)
    n_classes = rows.shape[1] - 1
    assign = sparse.csr_matrix((np.ones(len(row)), (row, np.arange(len(row)))), shape=(len(rows), len(row)))
    prefix = sparse.csr_matrix(k[None, :] <= np.arange(n_classes)[:, None], dtype=float)
    res = linprog(rows[row, k], A_ub=prefix, b_ub=caps[:n_classes].astype(float), A_eq=assign,
                  b_eq=count.astype(float), bounds=(0, None), method="highs")
    return theta * tables.constant + float(late[~main].sum()) + float(res.fun)


def class_caps(bounder) -> None:
    """Item 11 (module docstring)."""
    from solvers.progress_bound import THETAS, progress_tables

    arrays, arrivals, n = bounder.full, bounder.arrivals, len(bounder.arrivals)
    solo = bounder._solo_s(False)
    per_rank = np.maximum(np.sort(arrivals + solo), bounder._queued_finish_times(arrays, False))
    print("11. work-in-progress classes under completion caps (mean latency, s)")
    best = None
    for split in bounder._additive_splits():
        terms, which = bounder._progress_inputs(arrays, split)
        tables = progress_tables(arrivals, arrivals + solo, terms, which, split[0])
        caps = np.searchsorted(per_rank, tables.thresholds, side="right")  # finishes possible by each threshold
        for c, (table, none) in enumerate(zip(tables.classes, tables.none)):
            free, capped = [], []
            for theta in np.unique(np.concatenate([THETAS[::10], THETAS[85:100]])):  # (the best mixes lie near 0.93)
                options = theta * none[which] + (1 - theta) * tables.late
                by_class = theta * table[which] + (1 - theta) * tables.floors
                cheapest = by_class.argmin(axis=1)
                picks = tables.in_main & (by_class[np.arange(n), cheapest] < options)
                options[picks] = by_class[np.arange(n), cheapest][picks]
                value = theta * tables.constant + float(options.sum())
                free.append(value)
                capped.append(_capped_choice_sum(theta, table, none, tables, which, caps))
                if best is None or value > best[0]:
                    best = (value, theta, np.where(picks, cheapest, -1), caps, tables.thresholds)
            print(f"   a0 {split[0] * 1e3:.2f} ms, V_cap #{c}: best over θ without caps "
                  f"{(max(free) - arrivals.sum()) / n:.3f}, with caps {(max(capped) - arrivals.sum()) / n:.3f}")
    value, theta, picks, caps, thresholds = best
    print(f"   the best mix without caps (θ = {theta:.2f}, {(value - arrivals.sum()) / n:.2f} s): finishes chosen "
          f"by each threshold against the most possible")
    for k in range(0, len(thresholds), 3):
        print(f"   by {thresholds[k]:6.1f} s: {int(((picks >= 0) & (picks <= k)).sum()):5d} chosen, at most {int(caps[k])}")


def over_time(best, a0: float, window_s: float = 40.0) -> None:
    """Item 8: the best schedule (work-ranked, Rmax 64) per window of batch starts."""
    b, q = best.batches, best.requests
    print(f"8. the best schedule over time ({window_s:.0f} s windows of batch starts; in system: arrived, unfinished "
          "at the window's start)")
    for lo in np.arange(0.0, float(b["end_s"].max()), window_s):
        w = b[(b["start_s"] >= lo) & (b["start_s"] < lo + window_s)]
        if not len(w):
            continue
        in_system = int(((q["arrival_s"] <= lo) & (q["finish_s"] > lo)).sum())
        print(f"   {lo:4.0f}-{lo + window_s:4.0f} s: {len(w):5d} batches, busy {w['duration_s'].sum():5.1f} s, "
              f"mean {1e3 * w['duration_s'].mean():5.1f} ms, running {w['running'].mean():5.1f}, prefill tokens "
              f"{w['prefill_tokens'].mean():5.0f}, intercept share {len(w) * a0 / w['duration_s'].sum():5.1%}, "
              f"in system {in_system}")


def lanes_and_keys(reqs, cost, work: dict, decode_s: tuple[float, float], lim: Limits, budget_s: float) -> None:
    """Item 9: `TwoLane` over (k, m), and hill climbing over work-ranked Rmax 64's per-request keys."""
    row = []
    for k, m in ((0, 1), (16, 2), (32, 2), (48, 2), (32, 3)):
        s = simulate(reqs, TwoLane(LIMITS, work, decode_s, k, m, 64), LIMITS, cost).summary
        row.append(f"k={k} m={m}: {s['mean_latency_s']:.2f}")
    print("9. two decode lanes, Rmax 64, mean latency (s): " + ", ".join(row))
    policy = _algorithm1_policy("rank-i-ef")

    def mean_latency(keys: dict) -> float:
        return float(simulate(reqs, WorkRankedScheduler(lim, policy, keys), lim, cost).summary["mean_latency_s"])

    rng, ids = random.Random(0), sorted(work)
    best_keys = dict(work)
    start = best = mean_latency(best_keys)
    tries, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < budget_s:
        tries += 1
        sigma, share = rng.choice((0.05, 0.1, 0.3)), rng.choice((0.01, 0.05, 0.2))
        keys = dict(best_keys)
        for rid in rng.sample(ids, int(share * len(ids))):
            keys[rid] *= float(np.exp(sigma * rng.gauss(0.0, 1.0)))
        value = mean_latency(keys)
        if value < best:
            best, best_keys = value, keys
    print(f"   key hill climbing, {tries} tries in {budget_s:.0f} s: {start:.3f} -> {best:.3f} s "
          f"({1 - best / start:.2%} lower)")


def other_keys(reqs, cost, work: dict, a0: float, marginal, lim: Limits) -> None:
    """Item 10: work-ranked (eviction-free, ``lim``'s Rmax) under other ranking keys and smaller prefill budgets."""
    policy = _algorithm1_policy("rank-i-ef")

    def mean_latency(keys: dict, limits: Limits = lim) -> float:
        return float(simulate(reqs, WorkRankedScheduler(limits, policy, keys), limits, cost).summary["mean_latency_s"])

    prefill = {r.id: float(item_marginal_s(marginal, chunk=np.array([r.prompt_tokens]), context=np.array([0]))[0])
               for r in reqs}
    area = {r.id: r.output_tokens * r.prompt_tokens + r.output_tokens * (r.output_tokens - 1) / 2 for r in reqs}
    keys = {
        "per token": lambda lam: {r.id: work[r.id] + lam * a0 * r.output_tokens for r in reqs},
        "KV area": lambda lam: {r.id: work[r.id] + lam * lim.Rmax * a0 * area[r.id] / lim.M for r in reqs},
        "decodes weighted": lambda lam: {r.id: prefill[r.id] + lam * (work[r.id] - prefill[r.id]) for r in reqs},
    }
    print(f"10. work-ranked Rmax {lim.Rmax}, mean latency (s): keys as they are {mean_latency(work):.2f}")
    for label, lams in (("per token", (0.25, 1.0, 4.0)), ("KV area", (0.25, 1.0, 4.0)),
                        ("decodes weighted", (0.5, 0.75, 1.5))):
        print(f"   {label}: " + ", ".join(f"λ={lam:g}: {mean_latency(keys[label](lam)):.2f}" for lam in lams))
    print("   prefill budget: " + ", ".join(f"P={P}: {mean_latency(work, replace(lim, P=P)):.2f}"
                                           for P in (128, 256, 384, 1024)))


def swap_preemption(reqs, cost, marginal) -> None:
    """Item 5: `SwapPreemptiveSRPT` at several Rmax, its key's costs from the split's marginal terms."""
    prefill_per_token = float(item_marginal_s(marginal, chunk=np.array([1024.0]), context=np.zeros(1))[0]) / 1024
    d0, d1 = (float(x) for x in item_marginal_s(marginal, decode_read=np.array([0.0, 1.0])))
    swap = SwapCost.for_system("a100", "llama-2-7b", 1)
    row = []
    for rmax in (32, 48, 64, 80, 128):
        s = simulate(reqs, SwapPreemptiveSRPT(LIMITS, prefill_per_token, (d0, d1 - d0), rmax), LIMITS, cost,
                     swap_cost=swap).summary
        row.append(f"Rmax={rmax}: {s['mean_latency_s']:.2f} ({s['swapped_out_tokens'] / 1e3:.0f}K swapped out)")
    print("5. preemption by swapping, mean latency (s): " + ", ".join(row))


def _layout_works(best, reqs, a0: float, marginal) -> tuple[np.ndarray, np.ndarray]:
    """Per request, the work of its pieces in the work-in-progress layout and their work-weighted mean time (batch
    midpoints): (works, mean busy times)."""
    prompt = np.array([r.prompt_tokens for r in reqs])
    mids = ((best.batches["start_s"] + best.batches["end_s"]) / 2).to_numpy()
    m = np.zeros(len(reqs), dtype=np.int64)
    rows = []  # (request, batch, tokens, cached before, in prefill, generates) per item
    for j, batch in enumerate(best.schedule.batches):  # eviction-free: every item extends its request's cache
        for rid, c in batch.items:
            prefill = m[rid] < prompt[rid]
            rows.append((rid, j, c, m[rid], prefill, not prefill or m[rid] + c == prompt[rid]))
            m[rid] += c
    rid, j, c, before, prefill, generates = (np.array(col) for col in zip(*rows))
    c, before = c.astype(float), before.astype(float)
    piece = np.where(prefill, item_marginal_s(marginal, chunk=c, context=before),
                     item_marginal_s(marginal, decode_read=before + 1))
    piece += np.where(generates, a0 * (before + c) / LIMITS.M, 0.0)
    work = np.bincount(rid, weights=piece, minlength=len(reqs))
    weighted = np.bincount(rid, weights=piece * mids[j], minlength=len(reqs))
    return work, weighted / work


def busy_time_split(best, reqs, arrivals, a0: float, marginal) -> np.ndarray:
    """Item 6; returns the layout's works for item 7."""
    work, mean_busy = _layout_works(best, reqs, a0, marginal)
    finish = best.requests.sort_values("id")["finish_s"].to_numpy()
    spt = spt_mean_busy_times(arrivals, work)
    print(f"6. best schedule: mean (M - a) {np.mean(mean_busy - arrivals):.2f} s against preemptive SPT's "
          f"{np.mean(spt - arrivals):.2f} s on the same works ({work.sum():.1f} s in all); mean (C - M) "
          f"{np.mean(finish - mean_busy):.2f} s")
    return work


def _capped_greedy_mean_busy(arrivals, prefill, decode, cap, step_s: float) -> np.ndarray:
    """Mean busy times of greedy least-remaining-work-first on one machine of rate 1, fluid in ``step_s`` steps,
    each request's ``prefill`` work at the full rate and then its ``decode`` work at most at rate ``cap``."""
    prefill_left, decode_left = prefill.copy(), decode.copy()
    weighted, t = np.zeros(len(arrivals)), 0.0
    while (prefill_left + decode_left).sum() > 1e-12:
        idx = np.flatnonzero((arrivals <= t) & (prefill_left + decode_left > 1e-12))
        if not len(idx):
            t = max(t + step_s, float(arrivals[arrivals > t].min(initial=t + step_s)))
            continue
        idx = idx[np.argsort(prefill_left[idx] + decode_left[idx], kind="stable")]
        want = np.minimum(np.where(prefill_left[idx] > 1e-12, 1.0, cap[idx]) * step_s,
                          prefill_left[idx] + decode_left[idx])
        give = np.clip(step_s - (np.cumsum(want) - want), 0.0, want)
        from_prefill = np.minimum(give, prefill_left[idx])
        prefill_left[idx] -= from_prefill
        decode_left[idx] -= give - from_prefill
        weighted[idx] += give * (t + step_s / 2)
        t += step_s
    return weighted / (prefill + decode)


def rate_capped_spt(reqs, arrivals, a0: float, marginal, work: np.ndarray, step_s: float = 0.005) -> None:
    """Item 7: greedy least-remaining-work-first with per-request rate caps. The caps from the intercept alone (a
    decode piece's share of a batch of a0 + its own cost), and, for scale, from batches of a given length (20 and
    38 ms, about the best schedule's mean): what coupling batch sizes with mean busy times could add at most."""
    prompt = np.array([r.prompt_tokens for r in reqs], dtype=float)
    output = np.array([r.output_tokens for r in reqs], dtype=float)
    kv_mid = prompt + output / 2
    decode_item = item_marginal_s(marginal, decode_read=kv_mid)
    piece = decode_item + a0 * kv_mid / LIMITS.M
    decode_work = (output - 1) * piece
    prefill, decode = np.maximum(work - decode_work, 0.0), np.minimum(decode_work, work)
    cap = piece / (a0 + decode_item)
    busy = _capped_greedy_mean_busy(arrivals, prefill, decode, cap, step_s)
    row = [f"intercept alone (mean cap {cap.mean():.3f}): {np.mean(busy - arrivals):.2f} s"]
    for batch_s in (0.020, 0.038):
        busy = _capped_greedy_mean_busy(arrivals, prefill, decode, np.minimum(piece / batch_s, 1.0), step_s)
        row.append(f"batches of {batch_s * 1e3:.0f} ms: {np.mean(busy - arrivals):.2f} s")
    print("7. rate-capped greedy, mean (M - a) (estimates, not bounds): " + "; ".join(row))

if __name__ == "__main__":
    main()
