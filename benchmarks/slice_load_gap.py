"""The Azure slice's certified mean-latency gap against its load (issue 21).

The optimality study's Azure point (`experiments/optimality_gap.py --grid azure`: the first 2,000 azure-conv requests
with their arrival times, C = 4,096, M = 100K, the paper's linear model) is overloaded: its intercept-free work alone
is about its 424 s of arrivals, and its certified mean-latency gap is the study's largest (59.3%). This runs the same
point with the arrival times stretched by ``--scales`` (1 = the trace's own; 2 = half the rate), each with the study's
ingredients: the registered schedulers it simulates, the lower bound (``LowerBounder``, no budget) and the schedule
search (``--search-limit`` seconds), and prints per scale the mean latencies, the bound and the certified gap, so
that the gap's dependence on load can be read. Writes nothing.

    python benchmarks/slice_load_gap.py [--scales 1,1.25,1.5,2] [--search-limit 60]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.engine import simulate  # noqa: E402
from infermax.workload import load_trace, with_arrivals  # noqa: E402
from optimality_gap import LIMITS  # noqa: E402  (the study's limits)
from solvers.lower_bound import LowerBounder  # noqa: E402
from solvers.objective import Objective  # noqa: E402
from solvers.search import search  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,1.25,1.5,2", help="arrival-time multipliers (comma-separated)")
    ap.add_argument("--limit", type=int, default=2000, help="first N azure-conv requests (the study's 2,000)")
    ap.add_argument("--search-limit", type=float, default=60.0, help="seconds of schedule search per scale")
    args = ap.parse_args()
    cost, objective = load_cost_model(kind="linear"), Objective(latency=1)
    base = load_trace("azure-conv", limit=args.limit)
    print("| arrival scale | arrival span s | sarathi-pc mean latency s | best found s (method) | lower bound s | "
          "certified gap | bound s | search s |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for scale in (float(x) for x in args.scales.split(",")):
        reqs = with_arrivals(base, "trace", time_scale=scale)
        n = len(reqs)
        registered = simulate(reqs, "sarathi-pc", LIMITS, cost).summary["mean_latency_s"]
        t = time.perf_counter()
        bound = LowerBounder(reqs, LIMITS, cost).of(objective).value_s / n
        bound_s = time.perf_counter() - t
        t = time.perf_counter()
        found = search(reqs, LIMITS, cost, objective, time_limit_s=args.search_limit)
        search_s = time.perf_counter() - t
        best = min(registered, found.value_s / n)
        span = max(r.arrival_s for r in reqs) - min(r.arrival_s for r in reqs)
        print(f"| {scale:g} | {span:.0f} | {registered:.2f} | {best:.2f} ({found.method}) | {bound:.2f} | "
              f"{best / bound - 1:.1%} | {bound_s:.1f} | {search_s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
