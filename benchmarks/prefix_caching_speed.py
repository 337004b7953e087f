"""Engine speed with prefix caching on vs off: ``vllm-v1`` on the Azure conversation trace, interleaved.

Run: ``python benchmarks/prefix_caching_speed.py [--repeats 3] [--limit N] [--scheduler vllm-v1]``. Each
repeat simulates the trace (its own arrival times, default limits, block size 16 for both) once with
caching off and once on, alternating which goes first, in one process, and prints each run's CPU time,
batches and batches per CPU second; then the median ratio of CPU time (on ÷ off) and of CPU time per
simulated batch. The trace's requests carry no ``content``, so every prompt is its own and the hits
are preempted requests resuming on their own cached prefix.
"""

from __future__ import annotations

import argparse
import statistics
import time

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace, with_arrivals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="first N trace requests (default: all 19,366)")
    parser.add_argument("--scheduler", default="vllm-v1", help="a scheduler that supports prefix caching")
    args = parser.parse_args()
    cost = load_cost_model()
    trace = with_arrivals(load_trace("azure-conv", limit=args.limit), "trace")
    cpu: dict[bool, list[float]] = {False: [], True: []}
    per_batch: dict[bool, list[float]] = {False: [], True: []}
    for k in range(args.repeats):
        for caching in ((False, True) if k % 2 == 0 else (True, False)):
            start = time.process_time()
            res = simulate(trace, args.scheduler, Limits(block_size=16, prefix_caching=caching), cost)
            used = time.process_time() - start
            n = res.summary["num_batches"]
            cpu[caching].append(used)
            per_batch[caching].append(used / n)
            print(f"caching={'on ' if caching else 'off'} requests={len(trace)} batches={n} cpu_s={used:.2f} "
                  f"batches/s={n / used:.0f} evictions={res.summary['evictions']} makespan_s={res.summary['makespan_s']:.1f}"
                  + (f" hit_tokens={res.summary['prefix_hit_tokens']}" if caching else ""), flush=True)
    ratio = statistics.median(a / b for a, b in zip(cpu[True], cpu[False]))
    ratio_batch = statistics.median(a / b for a, b in zip(per_batch[True], per_batch[False]))
    print(f"median CPU ratio on / off: {ratio:.2f}; per simulated batch: {ratio_batch:.2f}")


if __name__ == "__main__":
    main()
