"""Mutated Schedule files through `infermax validate` (or mutated cost-model files through `simulate` and `optimize`,
``--target costmodel``), each in its own process, checked for what a user must never see: a traceback, an exit code
other than 0 (valid) / 1 (a rule broken: `ScheduleViolation`) / 2 (refused input), or a `simulate` summary with a
null metric. Prints one line per run (``ok``, exit code, run, the last line of stderr) and a ``PROBLEM`` line with
the error's tail for a flagged one, whose file is kept as ``bad<run>.json`` in the output folder.

    python benchmarks/schedule_fuzz.py --seed 3 --runs 150 --out /tmp/schedule_fuzz
    python benchmarks/schedule_fuzz.py --target costmodel --seed 3 --runs 100 --out /tmp/costmodel_fuzz

The base schedules are simulated first, one per kind of batch field: vLLM (items only), hybrid Apt-Serve under a
small M (evictions, hidden forms), BROS on the first 60 azure-conv requests at M = 6,000 (swaps out and in, start
times), vLLM V1 with prefix caching on a multi-turn workload (cache hits, request objects). A mutation replaces one to
three values at random places (top-level fields, limits, requests, four random batches and their fields, meta and
its config) by null, negative, fractional, huge, infinite or NaN numbers, strings, booleans, lists or objects,
deletes a key, or appends an element. On 2026-12-01 its first 920 runs found six tracebacks (a list for meta.config's
model, a number or a folder for its cost-model path, a malformed meta.swap_cost, JSON nested 5,000 deep); after the
fix (3ad5de4) they are refused with exit code 2. The cost-model target starts from the A100 Llama-2-7B linear and
piecewise fits; on 2026-12-01 it found a coefficient of 1e308 s accepted with null metrics (now refused: batch times
that overflow, 1a60680), and 260 runs after the fix flagged nothing. Writes only into ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import subprocess
import sys
from pathlib import Path

EXIT_CODES = (0, 1, 2)
VALUES = [None, -1, 0, 1.5, "x", True, [], {}, 1e308, float("nan"), float("inf"), -1e9, 10**30, [1], [[1, 2]], "0"]


def base_schedules(folder: Path) -> list[Path]:
    """Simulate the four base schedules into ``folder``; return their paths."""
    from infermax.costmodel import load_cost_model
    from infermax.costmodel.swap import SwapCost
    from infermax.engine import simulate
    from infermax.limits import Limits
    from infermax.workload import fixed, load_trace, with_arrivals

    cost = load_cost_model()
    swap = SwapCost.for_system("a100", "llama-2-7b", 1)
    runs = {
        "vllm": (fixed(64, 8, 6), "vllm", Limits(C=4096, M=700), {}),
        "aptserve": (fixed(600, 40, 12), "aptserve", Limits(C=4096, M=3000), {}),
        "bros": (with_arrivals(load_trace("azure-conv"), "trace")[:60], "bros", Limits(C=8192, M=6000), {}),
    }
    paths = []
    for name, (requests, scheduler, limits, extra) in runs.items():
        result = simulate(requests, scheduler, limits, cost, swap_cost=swap, **extra)
        path = folder / f"base-{name}.json"
        result.schedule.save(path)
        paths.append(path)
    cli = [sys.executable, "-c", "from infermax.cli import app; app()"]
    out = folder / "base-vllm-v1"
    subprocess.run(cli + ["simulate", "--workload", "multiturn", "--B", "20", "--prefix-caching", "--scheduler",
                          "vllm-v1", "--no-progress", "--out", str(out)], check=True, capture_output=True)
    paths.append(out / "schedule.json")
    return paths


def _places(rng: random.Random, obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _places(rng, v, prefix + (k,))
    elif isinstance(obj, list):
        for i in sorted(rng.sample(range(len(obj)), min(4, len(obj)))):
            yield from _places(rng, obj[i], prefix + (i,))


def mutate(rng: random.Random, doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    places = [p for p in _places(rng, doc) if p]
    for _ in range(rng.choice([1, 1, 2, 3])):
        parent = doc
        place = rng.choice(places)
        try:
            for key in place[:-1]:
                parent = parent[key]
            last, op = place[-1], rng.random()
            if op < 0.6:
                parent[last] = copy.deepcopy(rng.choice(VALUES))
            elif op < 0.8 and isinstance(parent, dict):
                del parent[last]
            elif isinstance(parent, list):
                parent.append(copy.deepcopy(rng.choice(VALUES)))
            else:
                parent["extra"] = 1
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed or replaced the path
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--out", type=Path, required=True, help="folder for the base schedules and the flagged files")
    ap.add_argument("--target", choices=["schedule", "costmodel"], default="schedule")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    if a.target == "schedule":
        bases = [json.loads(p.read_text()) for p in base_schedules(a.out)]
    else:
        from infermax.costmodel import profile_folder

        folder = profile_folder("a100", "llama-2-7b", 1)
        bases = [json.loads((folder / f"infermax_{kind}.json").read_text()) for kind in ("linear", "piecewise")]
    cli = [sys.executable, "-c", "from infermax.cli import app; app()"]
    flagged = 0
    for run in range(a.runs):
        path = a.out / f"run{run}.json"
        path.write_text(json.dumps(mutate(rng, rng.choice(bases))))
        if a.target == "schedule":
            command = ["validate", str(path), "--json"]
        else:
            command = rng.choice([["simulate", "--I", "64", "--O", "8", "--B", "8", "--json", "--no-progress"],
                                  ["optimize", "--I", "16", "--O", "4", "--B", "3", "--time-limit", "5", "--json"]])
            command += ["--cost-model-file", str(path)]
        p = subprocess.run(cli + command, capture_output=True, text=True, timeout=300)
        bad = "Traceback" in p.stderr or "Traceback" in p.stdout or p.returncode not in EXIT_CODES or (
            command[0] == "simulate" and p.returncode == 0 and "null" in p.stdout)
        last = (p.stderr.strip().splitlines() or [""])[-1][:200]
        print(("PROBLEM " if bad else "ok ") + f"{p.returncode} {run} {last}", flush=True)
        if bad:
            flagged += 1
            path.rename(a.out / f"bad{run}.json")
            print(p.stderr[-1500:], flush=True)
        else:
            path.unlink()
    print(f"{a.runs} runs, {flagged} flagged")
    sys.exit(1 if flagged else 0)


if __name__ == "__main__":
    main()
