"""Engine speed of ``vllm-v1`` against ``sarathi`` on the Azure conversation trace, interleaved.

Run: ``python benchmarks/vllm_v1_speed.py [--repeats 3] [--limit N] [--prefix-caching]``. Each repeat
runs both schedulers in one process, alternating, under the default limits (``--block-size 16`` when
caching, which needs whole blocks to share), and reports each run's CPU time and simulated batches per
CPU second, and the median ratio vllm-v1 / sarathi of batches per second.
"""

from __future__ import annotations

import argparse
import statistics
import time

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="first N trace requests (default: all 19,366)")
    parser.add_argument("--prefix-caching", action="store_true", help="vllm-v1 with caching (sarathi without)")
    args = parser.parse_args()
    cost = load_cost_model()
    trace = load_trace("azure-conv", limit=args.limit)
    rates: dict[str, list[float]] = {"vllm-v1": [], "sarathi": []}
    for _ in range(args.repeats):
        for name in rates:
            caching = args.prefix_caching and name == "vllm-v1"
            limits = Limits(block_size=16, prefix_caching=True) if caching else Limits()
            start = time.process_time()
            res = simulate(trace, name, limits, cost)
            cpu = time.process_time() - start
            n = res.summary["num_batches"]
            rates[name].append(n / cpu)
            print(f"{name:8s} requests={len(trace)} batches={n} cpu_s={cpu:.2f} batches/s={n / cpu:.0f} "
                  f"evictions={res.summary['evictions']}", flush=True)
    ratio = statistics.median(a / b for a, b in zip(rates["vllm-v1"], rates["sarathi"]))
    print(f"median batches/s ratio vllm-v1 / sarathi: {ratio:.2f}")


if __name__ == "__main__":
    main()
