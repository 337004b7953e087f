"""Time the paper's Fig. 5 grid (3 schedulers x 11 I x 11 O, B = 1024) before and after the engine work.

Run: ``python benchmarks/fig5_grid.py`` (about 5 minutes on 2 cores; ``--quick`` times O <= 256 only).

Two worker processes simulate the same points one after the other, point by point, so both see the
same machine load: one imports InferMax from a git revision before the speed-up (``--before``,
extracted with ``git archive``), the other from this working tree; a third variant runs this tree
with the decode fast-forward off (``fast_forward=False``). Every point's summary must be identical
in all three (the benchmark fails otherwise); it reports total simulation time per variant and the
ratios, measured in this one run. Points are timed single-threaded (sweeps run one per core).
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = [2**k for k in range(11)]
SCHEDULERS = ("sarathi", "sarathi-pc", "vllm")

WORKER = r"""
import json, sys, time
from infermax.config import RunConfig
from infermax.engine import simulate
for line in sys.stdin:
    point = json.loads(line)
    config = RunConfig.from_dict(point["config"])
    requests, limits, cost = config.requests(), config.limits(), config.cost()
    kwargs = {} if point["fast_forward"] is None else {"fast_forward": point["fast_forward"]}
    start = time.perf_counter()
    summary = simulate(requests, config.scheduler, limits, cost, **kwargs).summary
    wall = time.perf_counter() - start
    print(json.dumps({"wall_s": wall, "summary": summary}), flush=True)
"""


class Worker:
    """A long-lived process importing InferMax from ``root``."""

    def __init__(self, root: Path, fast_forward: bool | None):
        self.fast_forward = fast_forward
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=root, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, config: dict) -> dict:
        self.proc.stdin.write(json.dumps({"config": config, "fast_forward": self.fast_forward}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def extract(rev: str, into: Path) -> Path:
    """The ``infermax`` package (and profiles) at git revision ``rev``, unpacked under ``into``."""
    data = subprocess.run(["git", "archive", rev, "infermax", "profiles"], cwd=ROOT, check=True,
                          capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(data)).extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="1e714c2", help="git revision of the engine before the speed-up")
    parser.add_argument("--quick", action="store_true", help="only O <= 256")
    args = parser.parse_args()
    outputs = [o for o in GRID if not args.quick or o <= 256]
    points = [{"scheduler": s, "I": i, "O": o, "B": 1024, "C": 4096, "M": 100_000, "cost_model": "linear"}
              for s in SCHEDULERS for o in outputs for i in GRID]
    with tempfile.TemporaryDirectory() as tmp:
        variants = {
            f"before ({args.before})": Worker(extract(args.before, Path(tmp)), None),
            "after, fast-forward off": Worker(ROOT, False),
            "after": Worker(ROOT, True),
        }
        totals = dict.fromkeys(variants, 0.0)
        for k, config in enumerate(points):
            results = {name: w.run(config) for name, w in variants.items()}
            summaries = [json.dumps(r["summary"], sort_keys=True) for r in results.values()]
            if len(set(summaries)) != 1:
                raise SystemExit(f"summaries differ at {config}: {summaries}")
            for name, r in results.items():
                totals[name] += r["wall_s"]
            print(f"\r{k + 1}/{len(points)} points", end="", file=sys.stderr, flush=True)
        for w in variants.values():
            w.close()
    print(file=sys.stderr)
    print(f"python {platform.python_version()} on {platform.machine()}; {len(points)} points "
          f"({len(SCHEDULERS)} schedulers x {len(GRID)} I x {len(outputs)} O, B=1024), one core each, "
          f"summaries identical in every variant")
    base = totals[f"before ({args.before})"]
    print(f"{'variant':32s} {'total simulate s':>17s} {'speed-up':>9s}")
    for name, total in totals.items():
        print(f"{name:32s} {total:17.1f} {base / total:8.2f}x")


if __name__ == "__main__":
    main()
