"""Ranking schedulers on a whole overloaded trace, this tree against an old one, side by side.

Each (tree, scheduler) runs in its own subprocess (``PYTHONPATH`` = the tree), old and new alternating, and reports the
CPU time of the ``simulate()`` call and sha256 prefixes of the Schedule JSON and the summary, so that the two trees'
results can be checked equal in the same run:

    PYTHONPATH=. python benchmarks/ranked_group_speed.py --old /path/to/old/checkout \
        [--schedulers rank-i-ef,rank-i,work-ranked]

Defaults: all 19,366 azure-conv requests with their arrival times, fitted model, C = 8,192, M = 121,752 (what
`--gpu-mem-util 0.9` gives): overloaded, with hundreds of requests waiting at every batch. ``work-ranked`` is the
schedule search's candidate (least own work first, rank-i-ef's rules). Prints a markdown table; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import hashlib, json, sys, time
from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace
name, C, M, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
reqs = load_trace("azure-conv", limit=limit or None)
cost, limits = load_cost_model(), Limits(C=C, M=M)
scheduler = name
if name == "work-ranked":
    from solvers import search
    from solvers.search_policies import marginal_work_s
    work = marginal_work_s(reqs, cost, limits)
    cand = search._work_ranked(limits, search._algorithm1_policy("rank-i-ef"), work, None)
    scheduler, limits = cand.build()
cpu = time.process_time()
result = simulate(reqs, scheduler, limits, cost)
cpu = time.process_time() - cpu
sha = lambda o: hashlib.sha256(json.dumps(o, sort_keys=True).encode()).hexdigest()[:16]
summary = {k: (None if isinstance(v, float) and v != v else v) for k, v in result.summary.items()}
print(json.dumps({"cpu_s": cpu, "batches": len(result.schedule.batches), "schedule": sha(result.schedule.to_json()),
                  "summary": sha(summary)}))
"""


def _run(tree: str, name: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-c", CHILD, name, str(args.C), str(args.M), str(args.limit)], env=env,
                         cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a checkout of the tree to compare with")
    ap.add_argument("--schedulers", default="rank-i-ef,rank-i,work-ranked")
    ap.add_argument("--limit", type=int, default=0, help="first requests of azure-conv (0: all)")
    ap.add_argument("--C", type=int, default=8192)
    ap.add_argument("--M", type=int, default=121_752)
    args = ap.parse_args()
    new = os.getcwd()
    print(f"azure-conv ({args.limit or 'all'} requests), C = {args.C}, M = {args.M}, fitted model; old = {args.old}\n")
    print("| scheduler | batches | old CPU s | new CPU s | old / new | identical schedule and summary |")
    print("|---|---:|---:|---:|---:|---|")
    for name in args.schedulers.split(","):
        old_run, new_run = _run(args.old, name, args), _run(new, name, args)
        same = old_run["schedule"] == new_run["schedule"] and old_run["summary"] == new_run["summary"]
        print(f"| {name} | {new_run['batches']:,} | {old_run['cpu_s']:.2f} | {new_run['cpu_s']:.2f} | "
              f"{old_run['cpu_s'] / new_run['cpu_s']:.2f}x | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
