"""What `plan_instructions.py` and `loop_instructions.py` share: the two trees to compare (``--old``, ``--new``), the
check that valgrind is there, and the report of instructions per unit with the old / new ratio."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent


def add_tree_arguments(ap: argparse.ArgumentParser, timeout_s: float, timeout_help: str) -> None:
    ap.add_argument("--old", type=Path, help="a checkout to compare with (e.g. a git worktree of the old commit)")
    ap.add_argument("--new", type=Path, default=HERE.parent, help="default: this checkout")
    ap.add_argument("--timeout-s", type=float, default=timeout_s, help=timeout_help)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def compare_trees(a: argparse.Namespace, count: Callable[[Path, argparse.Namespace], tuple[float, str]]) -> None:
    """Run ``count(tree, a)`` (instructions per unit, and the unit's words) on the old tree, if given, then the new
    one; print each and old / new."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is not installed; it counts the instructions")
    trees = ([("old", a.old)] if a.old else []) + [("new", a.new)]
    counts = {name: count(tree.resolve(), a) for name, tree in trees}
    for name, tree in trees:
        value, unit = counts[name]
        print(f"{name}: {value:,.0f} instructions per {unit} ({tree})")
    if "old" in counts:
        print(f"old / new: {counts['old'][0] / counts['new'][0]:.3f}")
