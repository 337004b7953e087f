"""The online (arrival-time) numbers of the queued-completions bound and of first-token-first in SRPT order.

On the Azure slice of the optimality study (the first 2,000 azure-conv requests with their arrival times, the
paper's linear model, C = 4,096, M = 100K):

1. the mean-latency bound with the order statistics alone and with the queued-completions bound, for the
   per-request work on the coarse grid only and on fine grids of step 1/8 … 1/64 (`solvers/queue_bound.py`;
   no time budget, so every grid point is solved), and the mean-TTFT bound;
2. mean TTFT of first-token-first, started prompts first against SRPT order, for several prefill budgets P.

Prints a markdown table; writes nothing.

    python benchmarks/online_bounds.py [--limit 2000]
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
from solvers.queue_bound import fine_classes  # noqa: E402
from solvers.search_policies import FirstTokenScheduler  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=2000, help="first requests of azure-conv (default 2000)")
    args = ap.parse_args()
    reqs = load_trace("azure-conv", limit=args.limit)
    cost = load_cost_model(kind="linear")
    limits = Limits(C=4096, M=100_000)
    n = len(reqs)

    print("| bound | mean latency (s) | wall s |\n|---|---:|---:|")
    for label, ratio, budget in [("coarse grid only", 1 + 1 / 64, 0.0)] + [
            (f"fine grid, step 1/{k}", 1 + 1 / k, 1e9) for k in (8, 16, 32, 64)]:
        lower_bound.fine_classes = lambda p, o, r=ratio: fine_classes(p, o, r)
        t = time.perf_counter()
        lb = lower_bound.LowerBounder(reqs, limits, cost, queue_budget_s=budget).latency_sum_s()
        wall = time.perf_counter() - t
        if label == "coarse grid only":
            print(f"| order statistics alone | {lb.parts['order_statistic_sum_s'] / n:.3f} | |")
        print(f"| queued, {label} | {lb.value_s / n:.3f} | {wall:.1f} |")
    lower_bound.fine_classes = fine_classes
    ttft = lower_bound.LowerBounder(reqs, limits, cost, queue_budget_s=1e9).mean_ttft_s()
    print(f"\nmean-TTFT bound: {ttft.value_s:.4f} s (order statistics alone "
          f"{ttft.parts['order_statistic_sum_s'] / n:.4f} s)\n")

    print("| first-token-first | P | mean TTFT (s) |\n|---|---:|---:|")
    for srpt in (False, True):
        for P in (None, 2048, 1024, 512, 256, 128):
            lim = limits if P is None else replace(limits, P=P)
            res = simulate(reqs, FirstTokenScheduler(lim, hybrid=True, srpt=srpt), lim, cost)
            print(f"| {'SRPT order' if srpt else 'started first'} | {P or 'C'} | {res.summary['mean_ttft_s']:.4f} |")


if __name__ == "__main__":
    main()
