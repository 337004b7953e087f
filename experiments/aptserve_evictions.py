"""Why Apt-Serve preempts so much on long prompts: the hidden-form cycle, measured.

    PYTHONPATH=. python experiments/aptserve_evictions.py [N]

Runs ``aptserve`` and ``aptserve-kv`` on the first N (default 300) requests of issue 17's long-prompt
workload (``sampled(2000, lognormal:2500:0.3:4000, lognormal:200:1.0:3900, seed 0)``, Poisson 2 req/s,
seed 0; default limits and cost model) and prints, for the hybrid run, what the greedy saw when it
gave a waiting request the hidden form and when it later preempted a hidden-form running request:
pending time ``p``, ``N = |W| + |R|`` and the KV size ``m``, against the threshold ``2·N·ρ·m`` above
which the hidden form is offered (``θ_hidden ≥ θ_KV``; specs §3.1); then the three variants again with
LongBench's SLOs attached.
"""

from __future__ import annotations

import statistics
import sys

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.schedulers import AptServeOptions, AptServeScheduler
from infermax.workload import sampled, with_arrivals, with_slo


class Recording(AptServeScheduler):
    """Apt-Serve, recording (p, N, m) at hidden admissions and at preemptions of hidden-form requests."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.admitted_hidden: list[tuple[float, int, int]] = []
        self.preempted_hidden: list[tuple[float, int, int, bool]] = []  # ..., selected in KV form
        self.prefills = self.refills = 0

    def next_batch(self, now_s: float):
        n = len(self.waiting) + len(self.running)
        batch = super().next_batch(now_s)
        for rid in batch.evict:
            s = self._by_id[rid]
            if s.hidden:
                self.preempted_hidden.append((self.pending_s(s, now_s), n, s.m + 1, True))
        for rid, c in batch.items:
            s = self._by_id[rid]
            if s.m == 0:
                self.prefills += 1
                self.refills += s.generated > 0
                if rid in batch.hidden:
                    self.admitted_hidden.append((self.pending_s(s, now_s), n, c))
        return batch


def quartiles(xs) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"median {statistics.median(xs):.3g} (p10 {q[0]:.3g}, p90 {q[-1]:.3g})"


def main() -> None:
    n_req = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    reqs = with_arrivals(sampled(2000, "lognormal:2500:0.3:4000", "lognormal:200:1.0:3900", seed=0), "poisson",
                         rate_per_s=2.0, seed=0)[:n_req]
    cost, limits = load_cost_model(), Limits()
    hybrid = Recording(limits, cost, AptServeOptions())
    for name, sched in (("aptserve", hybrid), ("aptserve-kv", AptServeScheduler(limits, cost, AptServeOptions(hybrid=False),
                                                                               name="aptserve-kv"))):
        s = simulate(reqs, sched, limits, cost).summary
        print(f"{name}: {n_req} requests, {s['num_batches']:,} batches, {s['evictions']:,} preemptions, "
              f"{s['refilled_tokens']:,} refilled tokens for {s['generated_tokens']:,} generated, makespan "
              f"{s['makespan_s']:,.0f} s, hidden share of items {s['hidden_item_share']:.3f}")
    rho = hybrid.rho
    print(f"rho = {rho:.3g} s per KV token; prefills {hybrid.prefills:,}, of which refills {hybrid.refills:,}, "
          f"in hidden form {len(hybrid.admitted_hidden):,}")
    for label, rows in (("hidden admission", hybrid.admitted_hidden), ("hidden preempted", hybrid.preempted_hidden)):
        if not rows:
            continue
        p, n, m = ([r[i] for r in rows] for i in range(3))
        above = sum(r[0] >= 2 * r[1] * rho * r[2] for r in rows) / len(rows)
        print(f"{label} ({len(rows):,}): p {quartiles(p)} s; N {quartiles(n)}; m {quartiles(m)}; "
              f"2·N·ρ·m {quartiles([2 * r[1] * rho * r[2] for r in rows])} s; share with p >= 2·N·ρ·m {above:.3f}")
    # The same requests with LongBench's SLOs (TTFT 4 s, P99 TBT 1 s): late requests are demoted.
    for name in ("aptserve", "aptserve-decay", "aptserve-kv"):
        s = simulate(with_slo(reqs, 4.0, 1.0), name, limits, cost).summary
        print(f"SLO 4 s / 1 s, {name}: {s['num_batches']:,} batches, {s['evictions']:,} preemptions, "
              f"{s['refilled_tokens']:,} refilled tokens, makespan {s['makespan_s']:,.0f} s, hidden share "
              f"{s['hidden_item_share']:.3f}")


if __name__ == "__main__":
    main()
