"""Whole-process time of a tiny ``infermax simulate`` (start-up dominated): this tree vs an old checkout.

    git worktree add /tmp/infermax-old fc1abe4
    python benchmarks/startup.py --old /tmp/infermax-old [--runs 15]

Each side runs ``python -m infermax simulate --I 1 --O 1 --B 1`` in a fresh process with its tree on
``PYTHONPATH``, from a neutral working directory (``-m`` puts the working directory first on the path,
so running from inside a checkout would import that checkout). The sides alternate (old, new, old,
new, ...) after one unmeasured warm-up each, and the ratio old/new is taken pair by pair, so a machine
whose speed drifts moves both sides of a pair alike; the medians are printed. Wall time is a monotonic
clock around the child; CPU time is the child's user + system time (``getrusage``).

Byte code: by default both sides keep compiled byte code in a temporary cache directory
(``PYTHONPYCACHEPREFIX``), as an installed package would; ``--no-bytecode-cache`` compiles every module
from source on every run instead (slower for both sides, a smaller ratio).

Measured (issue 17, 2-core machine shared with other jobs, load average 5.5-6; against ``fc1abe4``):
``--runs 15``: old/new wall 4.76x (pairs 3.79-6.69x), CPU 4.66x (3.83-6.61x), 0.46 against 2.14 CPU s;
``--runs 10 --no-bytecode-cache``: wall 5.62x (3.69-8.21x), CPU 5.50x (4.14-7.08x). The table is in the
README ("Benchmarks").
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["-m", "infermax", "simulate", "--I", "1", "--O", "1", "--B", "1", "--no-progress"]


def run_once(tree: Path, env: dict, cwd: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole ``simulate`` process on ``tree``."""
    return timed_python(tree, COMMAND, env, cwd)


def timed_python(tree: Path, args: list[str], env: dict, cwd: str | Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``python ARGS`` child process with ``tree`` on its PYTHONPATH, run from
    ``cwd`` (`python -m` puts the working folder before PYTHONPATH); its error output on a failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], env={**env, "PYTHONPATH": str(tree)}, cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="Checkout of the baseline commit (e.g. fc1abe4).")
    parser.add_argument("--new", type=Path, default=ROOT, help="Tree to measure (default: this checkout).")
    parser.add_argument("--runs", type=int, default=15, help="Measured runs per side.")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="Compile every module on every run.")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for name, tree in trees.items():
        if not (tree / "infermax" / "__init__.py").is_file():
            parser.error(f"--{name} {tree}: not an InferMax checkout")

    with tempfile.TemporaryDirectory() as cwd, tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            env.pop("PYTHONPYCACHEPREFIX", None)
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = cache
        for tree in trees.values():  # warm-up: fills the byte-code cache and the OS file cache
            run_once(tree, env, cwd)
        samples = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():
                samples[name].append(run_once(tree, env, cwd))

    print(f"python -m infermax {' '.join(COMMAND[2:])}; {args.runs} runs per side, interleaved; "
          f"byte-code cache {'off' if args.no_bytecode_cache else 'on'}")
    print(f"{'':18}{'wall s (median)':>18}{'cpu s (median)':>18}")
    for name, tree in trees.items():
        walls, cpus = zip(*samples[name])
        print(f"{name + ' (' + tree.name + ')':18}{statistics.median(walls):18.3f}{statistics.median(cpus):18.3f}")
    for k, label in ((0, "wall"), (1, "cpu")):
        ratios = [o[k] / n[k] for o, n in zip(samples["old"], samples["new"])]
        print(f"old/new {label}: median {statistics.median(ratios):.2f}x "
              f"(pairs: min {min(ratios):.2f}x, max {max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
