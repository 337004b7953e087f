"""The online (arrival-time) numbers of the queued-completions bound and of first-token-first in SRPT order.

On the Azure slice of the optimality study (the first 2,000 azure-conv requests with their arrival times, the
paper's linear model, C = 4,096, M = 100K):

1. the mean-latency bound with the order statistics alone and with the queued-completions bound, for the
   per-request work on the coarse grid only and on fine grids of step 1/8 … 1/64 (`solvers/queue_bound.py`;
   no time budget, so every grid point is solved; mean busy times left out), then with every ingredient (mean
   busy times too, `solvers/busy_time_bound.py`), and the mean-TTFT bound;
2. mean TTFT of first-token-first, started prompts first against SRPT order, for several prefill budgets P.

and Sarathi's mean latency and TTFT for scale. Prints markdown tables; writes nothing.

    python benchmarks/online_bounds.py [--limit 2000] [--C 4096] [--M 100000] [--no-first-token]
    python benchmarks/online_bounds.py --limit 0 --C 8192 --M 475136 --no-first-token   # the full trace
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import solvers.lower_bound as lower_bound  # noqa: E402
from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.engine import simulate  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.workload import load_trace  # noqa: E402
from solvers.queue_bound import EXACT_CLASSES_MAX, fine_classes  # noqa: E402
from solvers.search_policies import FirstTokenScheduler  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=2000, help="first requests of azure-conv (default 2000; 0: all)")
    ap.add_argument("--C", type=int, default=4096)
    ap.add_argument("--M", type=int, default=100_000)
    ap.add_argument("--no-first-token", action="store_true", help="skip the first-token-first runs")
    args = ap.parse_args()
    reqs = load_trace("azure-conv", limit=args.limit or None)
    cost = load_cost_model(kind="linear")
    limits = Limits(C=args.C, M=args.M)
    n = len(reqs)
    sarathi = simulate(reqs, "sarathi", limits, cost).summary
    print(f"{n} requests, C = {args.C}, M = {args.M}; Sarathi: mean latency {sarathi['mean_latency_s']:.3f} s, "
          f"mean TTFT {sarathi['mean_ttft_s']:.4f} s\n")

    print("| bound | mean latency (s) | wall s |\n|---|---:|---:|")
    with_busy = lower_bound.LowerBounder._mean_busy_completion_sum  # the queued rows without mean busy times
    lower_bound.LowerBounder._mean_busy_completion_sum = lambda self, arrays, split: None
    for label, ratio, budget in [("coarse grid only", 1 + 1 / 64, 0.0)] + [
            (f"fine grid, step 1/{k}", 1 + 1 / k, 1e9) for k in (8, 16, 32, 64)]:
        lower_bound.fine_classes = lambda p, o, r=ratio: fine_classes(p, o, r, exact_up_to=0)
        t = time.perf_counter()
        lb = lower_bound.LowerBounder(reqs, limits, cost, queue_budget_s=budget).latency_sum_s()
        wall = time.perf_counter() - t
        if label == "coarse grid only":
            print(f"| order statistics alone | {lb.parts['order_statistic_sum_s'] / n:.3f} | |")
        print(f"| queued, {label} | {lb.value_s / n:.3f} | {wall:.1f} |")
    lower_bound.fine_classes = fine_classes
    t = time.perf_counter()
    lb = lower_bound.LowerBounder(reqs, limits, cost).latency_sum_s()
    print(f"| queued, default classes (each request's own (I, O) up to {EXACT_CLASSES_MAX:,} distinct, else step 1/64), "
          f"default budget ({lower_bound.QUEUE_TIME_LIMIT_S:.0f} s of LPs) | {lb.value_s / n:.3f} "
          f"| {time.perf_counter() - t:.1f} |")
    lower_bound.LowerBounder._mean_busy_completion_sum = with_busy
    t = time.perf_counter()
    lb = lower_bound.LowerBounder(reqs, limits, cost).latency_sum_s()
    print(f"| the same + mean busy times (every ingredient) | {lb.value_s / n:.3f} | {time.perf_counter() - t:.1f} |")
    t = time.perf_counter()
    ttft = lower_bound.LowerBounder(reqs, limits, cost).mean_ttft_s()
    print(f"\nmean-TTFT bound (default budget): {ttft.value_s:.4f} s (order statistics alone "
          f"{ttft.parts['order_statistic_sum_s'] / n:.4f} s), {time.perf_counter() - t:.1f} s\n")
    if args.no_first_token:
        return

    print("| first-token-first | P | mean TTFT (s) |\n|---|---:|---:|")
    for srpt in (False, True):
        for P in (None, 2048, 1024, 512, 256, 128):
            lim = limits if P is None else replace(limits, P=P)
            res = simulate(reqs, FirstTokenScheduler(lim, hybrid=True, srpt=srpt), lim, cost)
            print(f"| {'SRPT order' if srpt else 'started first'} | {P or 'C'} | {res.summary['mean_ttft_s']:.4f} |")


if __name__ == "__main__":
    main()
