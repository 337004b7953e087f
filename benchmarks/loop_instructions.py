"""Instructions per simulated batch of a whole `simulate()` loop, counted by valgrind's callgrind: a measure that a
shared, noisy machine does not move, for comparing two trees on one scheduler and workload.

    python benchmarks/loop_instructions.py bros azure-code 0 --C 8192 --old /tmp/old_worktree

Each tree runs `trace_prefix_speed.py`'s workload (its first N requests, 0: all; its limits, C = --C) under
valgrind with the instrumentation off, simulates the first 50 requests once (imports and first-use caches), then
turns the instrumentation on (``callgrind_control``) for one whole `simulate()` call and off after it. Prints the
instructions per batch per tree and, with ``--old``, old / new. The count covers the engine, the replayer and the
scheduler alike; which function takes them is for a sampling profiler to say (py-spy). Valgrind runs the whole
process about 50x slower: the full azure-code trace under BROS takes about 5 minutes per tree. PYTHONHASHSEED is
fixed so both trees hash alike.

Measured with it on 2026-12-02 (`benchmarks/engine_scale_results.md`, thirtieth session): BROS on azure-code,
431,473 instructions per batch at ffeae4b, 411,345 at f6590dc; Sarathi on azure-conv (C = 14,088), 172,346 and 173,028.
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
    from trace_prefix_speed import workload

    requests, limits, swap = workload(a.workload, a.n, a.C)
    cost = load_cost_model()
    simulate(requests[:50], a.scheduler, limits, cost, swap_cost=swap)
    toggle = ["callgrind_control", "-i", "on", str(os.getpid())]
    subprocess.run(toggle, capture_output=True, check=True)
    result = simulate(requests, a.scheduler, limits, cost, swap_cost=swap)
    subprocess.run(toggle[:2] + ["off", toggle[3]], capture_output=True, check=True)
    print(f"batches {len(result.schedule.batches)}", file=sys.stderr)


def count(tree: Path, a: argparse.Namespace) -> tuple[float, str]:
    """Instructions per batch of ``tree``, and the unit ("batch over N batches")."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={Path(tmp) / 'cg.out'}",
               sys.executable, __file__, "--child", "--C", str(a.C), a.scheduler, a.workload, str(a.n)]
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
        try:
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree, timeout=a.timeout_s)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{tree}: the valgrind run took more than --timeout-s {a.timeout_s:g} s (stopped)") from None
        collected, batches = re.search(r"Collected : (\d+)", run.stderr), re.search(r"batches (\d+)", run.stderr)
        if run.returncode != 0 or collected is None or batches is None:
            raise SystemExit(f"{tree}: valgrind run failed:\n{run.stderr[-2000:]}")
        n = int(batches.group(1))
        return int(collected.group(1)) / n, f"batch over {n:,} batches"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scheduler")
    ap.add_argument("workload", help="azure-conv, azure-code or long-prompt (trace_prefix_speed.py's)")
    ap.add_argument("n", type=int, help="first N requests (0: all)")
    ap.add_argument("--C", type=int, default=4096)
    add_tree_arguments(ap, 1800.0, "per tree: a valgrind run still going after this long is stopped")
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    compare_trees(a, count)


if __name__ == "__main__":
    main()
