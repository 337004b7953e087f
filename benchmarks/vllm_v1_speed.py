"""Engine speed of ``vllm-v1`` on the Azure conversation trace, interleaved: against ``sarathi``, or with
prefix caching on against off.

Run: ``python benchmarks/vllm_v1_speed.py [--repeats 3] [--limit N] [--prefix-caching | --caching-on-off]``.

- Default: each repeat runs ``vllm-v1`` and ``sarathi`` in one process, alternating, under the default
  limits, and reports each run's CPU time and simulated batches per CPU second, and the median ratio
  vllm-v1 / sarathi of batches per second. ``--prefix-caching`` runs vllm-v1 with caching (block 16).
- ``--caching-on-off``: each repeat runs ``vllm-v1`` with caching off and on (block 16 for both),
  alternating which goes first, and reports the median CPU ratio on / off, overall and per simulated
  batch. The trace's requests carry no ``content``, so every prompt is its own and the hits are
  preempted requests resuming on their own cached prefix.

The trace runs with its own arrival times.
"""

from __future__ import annotations

import argparse
import statistics
import time

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace, with_arrivals


def run(trace, name: str, limits: Limits, cost) -> tuple[float, int]:
    """One simulation: (CPU seconds, batches); prints one line."""
    start = time.process_time()
    res = simulate(trace, name, limits, cost)
    cpu = time.process_time() - start
    s = res.summary
    n = s["num_batches"]
    print(f"{name:8s} caching={'on ' if limits.prefix_caching else 'off'} requests={len(trace)} batches={n} "
          f"cpu_s={cpu:.2f} batches/s={n / cpu:.0f} evictions={s['evictions']} makespan_s={s['makespan_s']:.1f}"
          + (f" hit_tokens={s['prefix_hit_tokens']}" if limits.prefix_caching else ""), flush=True)
    return cpu, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="first N trace requests (default: all 19,366)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prefix-caching", action="store_true", help="vllm-v1 with caching (sarathi without)")
    mode.add_argument("--caching-on-off", action="store_true", help="vllm-v1 with caching on vs off")
    args = parser.parse_args()
    cost = load_cost_model()
    trace = with_arrivals(load_trace("azure-conv", limit=args.limit), "trace")
    if args.caching_on_off:
        cases = {"on": ("vllm-v1", Limits(block_size=16, prefix_caching=True)),
                 "off": ("vllm-v1", Limits(block_size=16))}
    else:
        cases = {"vllm-v1": ("vllm-v1", Limits(block_size=16, prefix_caching=True) if args.prefix_caching else Limits()),
                 "sarathi": ("sarathi", Limits())}
    (a, b) = cases
    results: dict[str, list[tuple[float, int]]] = {a: [], b: []}
    for k in range(args.repeats):
        for key in ((a, b) if k % 2 == 0 else (b, a)):
            results[key].append(run(trace, *cases[key], cost))
    pairs = list(zip(results[a], results[b]))
    ratio_cpu = statistics.median(x[0] / y[0] for x, y in pairs)
    ratio_rate = statistics.median((x[1] / x[0]) / (y[1] / y[0]) for x, y in pairs)
    print(f"median ratios {a} / {b}: CPU {ratio_cpu:.2f}, batches per CPU second {ratio_rate:.2f}")


if __name__ == "__main__":
    main()
