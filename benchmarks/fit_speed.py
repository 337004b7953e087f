"""`infermax fit` of a bundled profile, this tree against an old checkout, in interleaved whole processes.

Fits the bundled A100 Llama-2-7B TP1 profile (its `measurements.csv`; ``--profile GPU/MODEL/TP`` for another) with
each tree's `python -m infermax fit ... --out TMP`, alternating old and new ``--pairs`` times, and prints one JSON
line per run (tree, wall and CPU seconds of the child process) and a summary with the pair-by-pair ratios old ÷ new.
It checks that both trees wrote byte-identical model files (`infermax_linear.json`, `infermax_piecewise.json`) and
stops with an error otherwise. Writes nothing but temporary folders.

    python benchmarks/fit_speed.py --old /tmp/old-checkout [--pairs 3]

``--old``: a checkout of the commit to compare with (for example ``git worktree add /tmp/old-checkout COMMIT``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from startup import timed_python  # (this folder is on sys.path when the script runs)

HERE = Path(__file__).resolve().parent.parent
MODEL_FILES = ("infermax_linear.json", "infermax_piecewise.json")


def _fit(tree: Path, profile: Path, out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one `infermax fit` child process run from ``tree``."""
    return timed_python(tree, ["-m", "infermax", "fit", str(profile), "--out", str(out)], dict(os.environ), tree)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, type=Path, help="a checkout of the old commit")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--profile", default="a100/llama-2-7b/1", help="GPU/MODEL/TP of a bundled profile")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from infermax.costmodel import profile_folder

    gpu, model, tp = a.profile.split("/")
    profile = profile_folder(gpu, model, int(tp))
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            runs = {}
            for name, tree in (("old", a.old.resolve()), ("new", HERE)):
                out = Path(tmp) / f"{name}{i}"
                wall, cpu = _fit(tree, profile, out)
                runs[name] = (wall, cpu, out)
                print(json.dumps({"pair": i, "tree": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}))
            for f in MODEL_FILES:
                if (runs["old"][2] / f).read_bytes() != (runs["new"][2] / f).read_bytes():
                    raise SystemExit(f"{f} differs between the trees")
            ratios.append(runs["old"][1] / runs["new"][1])
    print(json.dumps({"profile": a.profile, "pairs": a.pairs, "identical_models": True,
                      "cpu_ratio_old_over_new": [round(r, 2) for r in ratios],
                      "median_ratio": round(statistics.median(ratios), 2)}))


if __name__ == "__main__":
    main()
