"""What one latency-bound ingredient (crowded service by default) adds to the lower bound, on online workloads.

For each workload: the sum-of-latencies bound's ingredients (`LowerBounder._completion_sum`, no time limit) as
mean latency per request, the bound without the ingredient (the largest of the others) and with it, and the time
it took. ``--ingredient work_in_progress`` does the same for "Work in progress". Workloads (C = 4,096, M = 100K
unless said):

- ``azure300``: the first 300 azure-conv requests with their arrival times, the default (piecewise) cost model;
- ``poisson``: 120 requests with I = 512, O = 256, Poisson arrivals at 6 per second (seed 1), default model;
- ``azure2000``: the optimality study's Azure slice (first 2,000 azure-conv requests), the paper's linear model;
- ``azure-full``: all 19,366 azure-conv requests, C = 8,192, M = 475,136, the paper's linear model (not by default).

Prints a markdown table; writes nothing.

    python benchmarks/crowded_service.py [--workloads azure300,poisson,azure2000] [--ingredient work_in_progress]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.workload import fixed, load_trace, with_arrivals  # noqa: E402
from solvers.lower_bound import LowerBounder  # noqa: E402


def _workload(name: str):
    if name == "azure300":
        return with_arrivals(load_trace("azure-conv"), "trace")[:300], load_cost_model()
    if name == "poisson":
        return with_arrivals(fixed(512, 256, 120), "poisson", rate_per_s=6.0, seed=1), load_cost_model()
    if name == "azure2000":
        return with_arrivals(load_trace("azure-conv"), "trace")[:2000], load_cost_model(kind="linear")
    if name == "azure-full":
        return with_arrivals(load_trace("azure-conv"), "trace"), load_cost_model(kind="linear")
    raise SystemExit(f"unknown workload {name!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="azure300,poisson,azure2000")
    ap.add_argument("--ingredient", default="crowded_service", help="a part of `_completion_sum` without _sum_s")
    args = ap.parse_args()
    print(f"| workload | requests | ingredient means (s) | without {args.ingredient} | with | bound time s |")
    print("|---|---:|---|---:|---:|---:|")
    for name in args.workloads.split(","):
        requests, cost = _workload(name)
        n = len(requests)
        t = time.perf_counter()
        limits = Limits(C=8192, M=475_136) if name == "azure-full" else Limits(C=4096, M=100_000)
        value, parts = LowerBounder(requests, limits, cost)._completion_sum(False, "latency")
        elapsed = time.perf_counter() - t
        sums = {k.removesuffix("_sum_s"): float(v) for k, v in parts.items() if k.endswith("_sum_s")}
        without = max(v for k, v in sums.items() if k != args.ingredient)
        shown = ", ".join(f"{k} {v / n:.3f}" for k, v in sums.items())
        print(f"| {name} | {n} | {shown} | {without / n:.3f} | {value / n:.3f} | {elapsed:.1f} |", flush=True)


if __name__ == "__main__":
    main()
