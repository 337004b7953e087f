"""The lower bound's release grid with and without pruning, side by side in one run.

For the sums of latencies and of first-token times (`LowerBounder.latency_sum_s`, `mean_ttft_s`), the order-statistic
ingredient solves a busy-time LP at each rank-grid point of each of 24 release times. `_release_grid_values` solves
only the points that can raise a completion's bound; this script times that against solving every point (the
grid as it was before, patched in for the "whole" runs), alternating the two, and checks that the bounds agree.

    python benchmarks/release_grid_pruning.py                          # azure-conv, first 300 and 2,000 requests
    python benchmarks/release_grid_pruning.py --limits 300 --repeats 3 --linear

Prints a markdown table (LPs solved, seconds, bound) and the time ratios; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.workload import load_trace, with_arrivals  # noqa: E402
from solvers.lower_bound import LowerBounder  # noqa: E402


def _run(requests, limits, cost, objective: str, whole: bool) -> tuple[float, int, float]:
    """(bound, LPs of the release grid, seconds) of one fresh bounder."""
    patch = (mock.patch.object(LowerBounder, "_release_grid_values", LowerBounder.release_grid_values_unpruned)
             if whole else nullcontext())
    with patch:
        start = time.perf_counter()
        bounder = LowerBounder(requests, limits, cost)
        bound = bounder.latency_sum_s() if objective == "latency" else bounder.mean_ttft_s()
        return bound.value_s, bound.parts["lp_grid_points"], time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", type=int, nargs="+", default=[300, 2000], help="first N azure-conv requests")
    ap.add_argument("--objectives", nargs="+", default=["latency", "ttft"], choices=["latency", "ttft"])
    ap.add_argument("--repeats", type=int, default=1, help="pruned/whole pairs per row (alternating)")
    ap.add_argument("--C", type=int, default=4096)
    ap.add_argument("--M", type=int, default=100_000)
    ap.add_argument("--linear", action="store_true", help="the paper's linear model (default: the fitted default)")
    a = ap.parse_args()
    cost = load_cost_model(kind="linear") if a.linear else load_cost_model()
    limits = Limits(C=a.C, M=a.M)
    print(f"cost model {getattr(cost, 'name', type(cost).__name__)}, {limits}\n")
    print("| requests | objective | LPs pruned | LPs whole | s pruned | s whole | whole ÷ pruned | bound pruned | "
          "bound whole |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.limits:
        requests = with_arrivals(load_trace("azure-conv", limit=n), "trace")
        for objective in a.objectives:
            pruned, whole = [], []
            for _ in range(a.repeats):
                pruned.append(_run(requests, limits, cost, objective, whole=False))
                whole.append(_run(requests, limits, cost, objective, whole=True))
            ratios = [w[2] / p[2] for p, w in zip(pruned, whole)]
            (bp, lp_p, _), (bw, lp_w, _) = pruned[0], whole[0]
            if not np.isclose(bp, bw, rtol=1e-9, atol=0.0):
                raise SystemExit(f"bounds differ at {n} requests, {objective}: {bp} pruned, {bw} whole")
            print(f"| {n} | {objective} | {lp_p} | {lp_w} | {statistics.median(p[2] for p in pruned):.1f} | "
                  f"{statistics.median(w[2] for w in whole):.1f} | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) | {bp:.6g} | {bw:.6g} |")


if __name__ == "__main__":
    main()
