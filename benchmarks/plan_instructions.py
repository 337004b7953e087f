"""Instructions per Apt-Serve plan, counted by valgrind's callgrind: a measure that a shared, noisy machine does not
move, for comparing two trees on one kind of iteration.

    python benchmarks/plan_instructions.py --old /tmp/old_worktree --kind DE aptserve-kv azure-conv 8000 --at 15000

Each tree runs `trace_prefix_speed.py`'s workload (its first N requests, its limits, C = --C) up to the first batch
at or after batch --at whose plan is of --kind (``P``: prefills only, nothing preempted; ``DE``: decodes only, some
preempted), plans it three times uninstrumented and --plans times with callgrind's instrumentation on (toggled by
``callgrind_control``), and reports the instructions per plan, then the ratio old / new. The plans repeat one
state, so the count is of the planning code alone; which share of a whole run such plans are is for a sampling
profiler to say (py-spy, or `batch_kind_costs.py`). Needs valgrind (callgrind_control on the PATH); PYTHONHASHSEED is
fixed so both trees hash alike. About a minute per tree (valgrind runs the whole process, uninstrumented up to the
chosen batch, about 5x slower).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from callgrind_trees import add_tree_arguments, compare_trees

HERE = Path(__file__).resolve().parent


def child(a: argparse.Namespace) -> None:
    """Inside valgrind, under the tree on ``PYTHONPATH``."""
    sys.path.insert(0, str(HERE))
    from infermax.costmodel import load_cost_model
    from infermax.engine import simulate
    from infermax.schedulers import aptserve
    from trace_prefix_speed import workload

    requests, limits, swap = workload(a.workload, a.n, a.C)
    plan, seen = aptserve.AptServeScheduler.next_batch, [0]

    class Done(Exception):
        pass

    def of_kind(batch) -> bool:
        if a.kind == "P":
            return not batch.evict and all(c > 1 for _, c in batch.items)
        return bool(batch.evict) and all(c == 1 for _, c in batch.items)

    def counted(self, now_s):
        seen[0] += 1
        batch = plan(self, now_s)
        if seen[0] >= a.at and of_kind(batch):
            for _ in range(3):
                plan(self, now_s)
            toggle = ["callgrind_control", "-i", "on", str(os.getpid())]
            subprocess.run(toggle, capture_output=True, check=True)
            for _ in range(a.plans):
                plan(self, now_s)
            subprocess.run(toggle[:2] + ["off", toggle[3]], capture_output=True, check=True)
            print(f"batch {seen[0]}: {len(batch.items)} items, {len(batch.evict)} preempted", file=sys.stderr)
            raise Done
        return batch

    aptserve.AptServeScheduler.next_batch = counted
    try:
        simulate(requests, a.scheduler, limits, load_cost_model(), swap_cost=swap)
    except Done:
        return
    raise SystemExit(f"no {a.kind} plan at or after batch {a.at}")


def count(tree: Path, a: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
               __file__, "--child", "--kind", a.kind, "--at", str(a.at), "--plans", str(a.plans), "--C", str(a.C),
               a.scheduler, a.workload, str(a.n)]
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
        try:
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree, timeout=a.timeout_s)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{tree}: the valgrind run took more than --timeout-s {a.timeout_s:g} s (stopped)") from None
        found = re.search(r"Collected : (\d+)", run.stderr)
        if run.returncode != 0 or found is None:
            raise SystemExit(f"{tree}: valgrind run failed:\n{run.stderr[-2000:]}")
        return int(found.group(1)) / a.plans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scheduler", help="an Apt-Serve variant (aptserve, aptserve-kv, ...)")
    ap.add_argument("workload", help="azure-conv, azure-code or long-prompt (trace_prefix_speed.py's)")
    ap.add_argument("n", type=int, help="first N requests (0: all)")
    ap.add_argument("--C", type=int, default=14088)
    ap.add_argument("--kind", choices=("P", "DE"), default="P")
    ap.add_argument("--at", type=int, default=15000, help="the first batch index to consider")
    ap.add_argument("--plans", type=int, default=100)
    add_tree_arguments(ap, 900.0, "per tree: a valgrind run still going after this long is stopped (about a minute is "
                                  "usual)")
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    compare_trees(a, lambda tree, a: (count(tree, a), f"{a.kind} plan"))


if __name__ == "__main__":
    main()
