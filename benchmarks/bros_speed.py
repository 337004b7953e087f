"""BROS / round-robin simulation cost: CPU seconds per simulated batch, this tree vs an old tree (e.g. a
worktree of fc1abe4) and vs Sarathi on the same workload (issue 17's criterion: at most 3x Sarathi's).

    PYTHONPATH=. python benchmarks/bros_speed.py --old /work/wt/old [--timeout 900] [--workloads long60 code300]

Each run is a whole `python -m infermax simulate` process; CPU = the child's user + system seconds (the
machine is shared, so wall time is not comparable between runs; CPU time is). A run that exceeds the
timeout is reported as such, with the CPU it had used.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

LONG = ["--input-dist", "lognormal:2500:0.3:4000", "--output-dist", "lognormal:200:1.0:3900",
        "--arrival", "poisson", "--rate", "2", "--seed", "0"]
WORKLOADS = {
    "long60": LONG + ["--B", "60"],
    "long2000": LONG + ["--B", "2000"],
    "code300": ["--trace", "azure-code", "--trace-limit", "300", "--C", "16384"],
    "conv500": ["--trace", "azure-conv", "--trace-limit", "500", "--C", "16384"],
    "code": ["--trace", "azure-code", "--C", "16384"],
    "conv": ["--trace", "azure-conv", "--C", "16384"],
}


def run(tree: str, scheduler: str, args: list[str], timeout_s: float) -> dict:
    """One simulate process: its CPU seconds, batches and requests (None if it did not finish)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": tree}
    t = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "infermax", "simulate", "-s", scheduler, *args, "--no-progress",
                              "--json"], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
        summary = json.loads(out.stdout[out.stdout.index("{"):]) if out.returncode == 0 else {}
        status = "ok" if out.returncode == 0 else f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"
    except subprocess.TimeoutExpired:
        summary, status = {}, f"timeout {timeout_s:g}s"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"status": status, "cpu_s": cpu, "wall_s": time.perf_counter() - t,
            "batches": summary.get("num_batches"), "requests": summary.get("num_requests")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the old tree (a worktree of the baseline commit)")
    ap.add_argument("--new", default=".", help="this tree")
    ap.add_argument("--schedulers", nargs="+", default=["bros", "roundrobin"])
    ap.add_argument("--workloads", nargs="+", default=["long60", "code300", "conv500"], choices=sorted(WORKLOADS))
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args()
    new = os.path.abspath(a.new)
    for wl in a.workloads:
        base = run(new, "sarathi", WORKLOADS[wl], a.timeout)
        per_batch_base = base["cpu_s"] / base["batches"] if base["batches"] else None
        print(f"{wl}: sarathi {base}")
        for sched in a.schedulers:
            r_new, r_old = run(new, sched, WORKLOADS[wl], a.timeout), run(a.old, sched, WORKLOADS[wl], a.timeout)
            ratio_old = r_old["cpu_s"] / r_new["cpu_s"] if r_new["cpu_s"] else None
            vs_sarathi = (r_new["cpu_s"] / r_new["batches"] / per_batch_base
                          if r_new["batches"] and per_batch_base else None)
            print(f"  {sched}: new {r_new}\n  {sched}: old {r_old}\n  {sched}: old/new CPU {ratio_old}; "
                  f"new CPU per batch / sarathi's {vs_sarathi}")


if __name__ == "__main__":
    main()
