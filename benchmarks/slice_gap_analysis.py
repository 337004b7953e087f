"""Where the optimality study's Azure slice loses its mean-latency gap (docs/design.md, "Crowded service", the
paragraph after it). Prints three measurements; nothing here is a bound or enters one:

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

    PYTHONPATH=. python benchmarks/slice_gap_analysis.py            # ~1 min on the 2-core machine

The slice, limits and model are the optimality study's (first 2,000 azure-conv requests, C = 4,096, M = 100K, the
paper's linear model).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace
from solvers.busy_time_bound import spt_mean_busy_times
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


def _v_window(tau: float, segments: np.ndarray) -> float:
    """Item 4's optimistic V: ∫_τ ds / p_max[τ, s] over the SPT pieces after τ (p_max over [τ, s], not [b, s])."""
    s = segments[segments[:, 1] > tau]
    if not len(s):
        return 0.0
    return float(((s[:, 1] - np.maximum(s[:, 0], tau)) / np.maximum.accumulate(s[:, 2])).sum())


def main() -> None:
    cost = load_cost_model(kind="linear")
    reqs = load_trace("azure-conv", limit=2000)
    work = marginal_work_s(reqs, cost, LIMITS)
    ef, evicting = _algorithm1_policy("rank-i-ef"), _algorithm1_policy("rank-i")

    def mean_latency(sched, lim) -> float:
        return float(simulate(reqs, sched, lim, cost).summary["mean_latency_s"])

    best_lim = replace(LIMITS, Rmax=64)
    best = simulate(reqs, WorkRankedScheduler(best_lim, ef, work), best_lim, cost)
    bounder = LowerBounder(reqs, LIMITS, cost)
    queued = np.sort(bounder._queued_finish_times(bounder.full, False))
    finish = np.sort(best.requests["finish_s"].to_numpy())
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


if __name__ == "__main__":
    main()
