"""EcoServe at production scale: wall time per simulated batch, new vs an old checkout, with Sarathi as
the yardstick (issue 17).

Runs ``python -m infermax simulate`` as a subprocess (start-up included) for each scheduler and
workload, alternating the trees (A B A B ...) so that machine drift hits both alike; prints wall seconds,
batches, microseconds per batch and, per scheduler, the ratio of microseconds per batch to Sarathi's
on the same tree and workload.

    python benchmarks/ecoserve_scale.py --new . --old /path/to/fc1abe4-worktree \
        --workloads long,code,conv --timeout 900

A run that exceeds ``--timeout`` is reported as not finished.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time

WORKLOADS = {
    "long": "--input-dist lognormal:2500:0.3:4000 --output-dist lognormal:200:1.0:3900 --arrival poisson --rate 2 "
            "--B 2000 --seed 0",
    "code": "--trace azure-code",
    "conv": "--trace azure-conv",
    "long400": "--input-dist lognormal:2500:0.3:4000 --output-dist lognormal:200:1.0:3900 --arrival poisson "
               "--rate 2 --B 400 --seed 0",
    "code2000": "--trace azure-code --trace-limit 2000",
    "conv1000": "--trace azure-conv --trace-limit 1000",
}
SCHEDULERS = ["sarathi", "ecoserve-d", "ecoserve-sd", "ecoserve-sdo", "ecoserve", "ecoserve-oracle"]


def run(tree: str, scheduler: str, workload: str, timeout_s: float) -> tuple[float, int | None]:
    """(wall seconds, batches); batches None when the run did not finish in time."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    cmd = ["python", "-m", "infermax", "simulate", "-s", scheduler, *WORKLOADS[workload].split()]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, None
    wall = time.perf_counter() - t0
    m = re.search(r"num_batches\D*([\d,]+)", out.stdout)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"{scheduler} on {workload} in {tree} failed: {out.stderr[-2000:]}")
    return wall, int(m.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", default=".")
    ap.add_argument("--old", default=None)
    ap.add_argument("--workloads", default="long400,code2000,conv1000")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args()
    trees = [("new", a.new)] + ([("old", a.old)] if a.old else [])
    print("tree workload scheduler wall_s batches us_per_batch per_batch_vs_sarathi")
    for w in a.workloads.split(","):
        sarathi_us: dict[str, float] = {}
        for s in a.schedulers.split(","):
            for label, tree in trees:
                wall, batches = run(tree, s, w, a.timeout)
                if batches is None:
                    print(f"{label} {w} {s} >{a.timeout:.0f} not-finished - -", flush=True)
                    continue
                us = 1e6 * wall / batches
                if s == "sarathi":
                    sarathi_us[label] = us
                ratio = f"{us / sarathi_us[label]:.2f}" if label in sarathi_us else "-"
                print(f"{label} {w} {s} {wall:.1f} {batches} {us:.0f} {ratio}", flush=True)


if __name__ == "__main__":
    main()
