"""Simulated batches per second and wall time of the engine on large workloads.

Run: ``python benchmarks/engine_throughput.py`` (add ``--quick`` for a 2,000-request trace slice).
Workloads: B=1024, I=O=1024 offline, and the full Azure conversation trace (19,366 requests,
own arrival times), each for vLLM and Sarathi on the default A100/Llama-2-7B cost model.
vLLM does not chunk prefills, so on the trace it runs with C = 16384 (the longest prompt plus
its output must fit one batch, as vLLM requires max_num_batched_tokens >= max_model_len).
"""

from __future__ import annotations

import argparse
import platform
import time

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed, load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="use the first 2,000 trace requests")
    args = parser.parse_args()
    cost = load_cost_model()
    trace = load_trace("azure-conv", limit=2000 if args.quick else None)
    cases = [
        ("B=1024 I=O=1024", fixed(1024, 1024, 1024), {"vllm": Limits(), "sarathi": Limits()}),
        (f"azure-conv ({len(trace)} req)", trace, {"vllm": Limits(C=16384), "sarathi": Limits()}),
    ]
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}")
    print(f"{'workload':28s} {'scheduler':10s} {'batches':>9s} {'wall_s':>8s} {'batches/s':>10s} {'sim makespan_s':>15s}")
    for label, requests, per_scheduler in cases:
        for name, limits in per_scheduler.items():
            start = time.perf_counter()
            result = simulate(requests, name, limits, cost)
            wall = time.perf_counter() - start
            n = result.summary["num_batches"]
            print(f"{label:28s} {name:10s} {n:9d} {wall:8.2f} {n / wall:10.0f} {result.summary['makespan_s']:15.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
