"""Workloads with TBT / TPOT targets (every token's time kept), this tree against an old one, side by side.

A request with a TBT or TPOT target keeps every token's emission time. The engine's decode shortcuts (the replayer's
plain decoders and its lazy decode cohort) used to leave such requests out, so on a workload with targets every
decode was checked item by item, and where only some requests had targets they broke the cohort's matches as well.
This times that case.

Each (tree, scheduler, targets) runs in its own subprocess (``PYTHONPATH`` = the tree), old and new alternating, and
reports the CPU time of the ``simulate()`` call and sha256 prefixes of the Schedule JSON and the summary (with the
targets' P99 TBT and attainment), so the two trees' results can be checked equal in the same run:

    PYTHONPATH=. python benchmarks/token_times_speed.py --old /path/to/old/checkout \
        [--schedulers vllm,sarathi,roundrobin,ecoserve,aptserve-kv,bros] [--targets mixed,all,none] [--limit 6000]

Workload: the first ``--limit`` azure-conv requests with their arrival times; ``mixed``: TTFT 2 s and TBT 0.3 s
targets on two requests in three (ids not divisible by 3), ``all``: on every request, ``none``: no targets. Fitted
model, C = 14,088, M = 475,136, Rmax 512, block 1, the A100 swap link (`engine_scale.py`'s limits). One run per
cell; prints a markdown table, writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import hashlib, json, sys, time
from dataclasses import replace
from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace, with_arrivals
name, targets, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
reqs = with_arrivals(load_trace("azure-conv"), "trace")[:limit or None]
reqs = [replace(r, ttft_slo_s=2.0, tbt_slo_s=0.3) if targets == "all" or (targets == "mixed" and r.id % 3) else r
        for r in reqs]
cost, swap = load_cost_model(), SwapCost.for_system("a100", "llama-2-7b", 1)
limits = Limits(C=14088, M=475_136, Rmax=512)
simulate(reqs[:50], name, limits, cost, swap_cost=swap)  # modules a scheduler imports on first use, outside the timing
cpu = time.process_time()
result = simulate(reqs, name, limits, cost, swap_cost=swap)
cpu = time.process_time() - cpu
sha = lambda o: hashlib.sha256(json.dumps(o, sort_keys=True).encode()).hexdigest()[:16]
summary = {k: (None if isinstance(v, float) and v != v else v) for k, v in result.summary.items()}
print(json.dumps({"cpu_s": cpu, "batches": len(result.schedule.batches), "schedule": sha(result.schedule.to_json()),
                  "summary": sha(summary)}))
"""


def _run(tree: str, name: str, targets: str, limit: int) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-c", CHILD, name, targets, str(limit)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a checkout of the tree to compare with")
    ap.add_argument("--schedulers", default="vllm,sarathi,roundrobin,ecoserve,aptserve-kv,bros")
    ap.add_argument("--targets", default="mixed,all,none", help="comma-separated, of mixed, all, none")
    ap.add_argument("--limit", type=int, default=6000, help="first requests of azure-conv (0: all)")
    args = ap.parse_args()
    unknown = set(args.targets.split(",")) - {"mixed", "all", "none"}
    if unknown:
        ap.error(f"unknown --targets {', '.join(sorted(unknown))}; known: mixed, all, none")
    new = os.getcwd()
    print(f"azure-conv (first {args.limit or 'all'} requests), fitted model, C = 14,088, M = 475,136, Rmax 512; "
          f"old = {args.old}\n")
    print("| targets | scheduler | batches | old CPU s | new CPU s | old / new | identical schedule and summary |")
    print("|---|---|---:|---:|---:|---:|---|")
    for targets in args.targets.split(","):
        for name in args.schedulers.split(","):
            old_run, new_run = _run(args.old, name, targets, args.limit), _run(new, name, targets, args.limit)
            same = old_run["schedule"] == new_run["schedule"] and old_run["summary"] == new_run["summary"]
            print(f"| {targets} | {name} | {new_run['batches']:,} | {old_run['cpu_s']:.2f} | {new_run['cpu_s']:.2f} | "
                  f"{old_run['cpu_s'] / new_run['cpu_s']:.2f}x | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
