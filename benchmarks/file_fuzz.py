"""Mutated input files through the commands that read them, each in its own process, checked for what a user must
never see: a traceback, an exit code other than 0 / 1 (`validate`: a rule broken) / 2 (refused input), or a
`simulate` summary with a null metric. Targets: Schedule files through `infermax validate` (``schedule``), cost-model
files through `simulate` and `optimize` (``costmodel``), sweep specs through `infermax sweep`, with and without
``--dry-run`` (``spec``). Prints one line per run (``ok``, exit code, run, the last line of stderr) and a ``PROBLEM``
line with the error's tail for a flagged one, whose file is kept as ``bad<run>.<ext>`` in the output folder.

    python benchmarks/file_fuzz.py --seed 3 --runs 150 --out /tmp/schedule_fuzz
    python benchmarks/file_fuzz.py --target costmodel --seed 3 --runs 100 --out /tmp/costmodel_fuzz
    python benchmarks/file_fuzz.py --target spec --seed 3 --runs 100 --out /tmp/spec_fuzz

The base schedules are simulated first, one per kind of batch field: vLLM (items only), hybrid Apt-Serve under a
small M (evictions, hidden forms), BROS on the first 60 azure-conv requests at M = 6,000 (swaps out and in, start
times), vLLM V1 with prefix caching on a multi-turn workload (cache hits, request objects). The cost models are the
A100 Llama-2-7B linear and piecewise fits; the spec is a four-point sweep with one plot. A mutation replaces one to
three values at random places (top-level fields, every key of a table, four random elements of each list) by null,
negative, fractional, huge, infinite or NaN numbers, strings, booleans, lists or tables, deletes a key, or appends
an element (a spec is written back as TOML, which has no null: those are left out).

Found on 2026-12-01 (each a traceback or a silent wrong output, each fixed with a test): in the first 320 schedules,
six tracebacks (a list for meta.config's model, a number for its cost-model path, four malformed meta.swap_cost), and
by hand around them a folder for that path and JSON nested 5,000 deep (3ad5de4); by hand while fuzzing cost models, a
coefficient of 1e308 s accepted with null metrics and exit code 0 (1a60680; the fuzz checks null metrics since); in
200 sweep specs, five (an integer beyond 64 bits, plot keys of the wrong type or missing: b914017). After the fixes:
260 schedules (seeds 4, 8, 11), 320 cost models (seeds 5, 10, and 220 runs of the ad-hoc script this grew from)
and 140 specs (seeds 7, 9) flagged nothing, nor did 240 more at 22d305f on 2026-12-02 (schedules seed 12, 100 runs;
cost models seed 13, 80; specs seed 14, 60); the finds before the fixes came from that script (the same mutations,
another random stream, one base schedule). Later on 2026-12-02, at e37c56f: schedules seed 15 and specs seed 16
(150 runs each) flagged nothing; cost models seed 17 (150) flagged one, a 'kind' holding an object ("unhashable
type: 'dict'", 8fb50aa); at 1e08eb2, cost models seed 18 (200 runs) and schedules seed 19 (150) flagged nothing.
Writes only into ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import shutil
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


SPEC = {"name": "fz", "description": "fuzz",
        "base": {"B": 4, "O": 4, "C": 512, "M": 2000, "cost_model": "linear"},
        "axes": {"scheduler": ["vllm", "sarathi"], "I": [4, 8]},
        "plot": [{"kind": "lines", "file": "f.png", "metrics": ["makespan_s", "tps"], "x": "I", "hue": "scheduler",
                  "title": "t"}]}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    return '""'


def to_toml(doc: dict) -> str:
    """A spec as TOML: scalars and arrays first, then tables, then arrays of tables (nulls left out)."""
    def is_tables(v) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items()
             if v is not None and not isinstance(v, dict) and not is_tables(v)]
    for k, v in doc.items():
        for table, header in ([(v, f"[{json.dumps(k)}]")] if isinstance(v, dict) else
                              [(t, f"[[{json.dumps(k)}]]") for t in v] if is_tables(v) else []):
            lines.append(header)
            lines += [f"{json.dumps(a)} = {_toml_value(b)}" for a, b in table.items() if b is not None]
    return "\n".join(lines) + "\n"


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
    ap.add_argument("--target", choices=["schedule", "costmodel", "spec"], default="schedule")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    if a.target == "schedule":
        bases = [json.loads(p.read_text()) for p in base_schedules(a.out)]
    elif a.target == "spec":
        bases = [SPEC]
    else:
        from infermax.costmodel import profile_folder

        folder = profile_folder("a100", "llama-2-7b", 1)
        bases = [json.loads((folder / f"infermax_{kind}.json").read_text()) for kind in ("linear", "piecewise")]
    cli = [sys.executable, "-c", "from infermax.cli import app; app()"]
    flagged = 0
    for run in range(a.runs):
        path = a.out / f"run{run}.{'toml' if a.target == 'spec' else 'json'}"
        doc = mutate(rng, rng.choice(bases))
        path.write_text(to_toml(doc) if a.target == "spec" else json.dumps(doc))
        results = a.out / f"results{run}"
        if a.target == "schedule":
            command = ["validate", str(path), "--json"]
        elif a.target == "spec":
            command = ["sweep", str(path), "--out", str(results), "--no-progress", "-j", "1"]
            command += rng.choice([[], ["--dry-run"]])
        else:
            command = rng.choice([["simulate", "--I", "64", "--O", "8", "--B", "8", "--json", "--no-progress"],
                                  ["optimize", "--I", "16", "--O", "4", "--B", "3", "--time-limit", "5", "--json"]])
            command += ["--cost-model-file", str(path)]
        p = subprocess.run(cli + command, capture_output=True, text=True, timeout=300)
        bad = "Traceback" in p.stderr or "Traceback" in p.stdout or p.returncode not in EXIT_CODES or (
            command[0] == "simulate" and p.returncode == 0 and "null" in p.stdout)
        last = (p.stderr.strip().splitlines() or [""])[-1][:200]
        print(("PROBLEM " if bad else "ok ") + f"{p.returncode} {run} {last}", flush=True)
        shutil.rmtree(results, ignore_errors=True)
        if bad:
            flagged += 1
            path.rename(a.out / f"bad{run}{path.suffix}")
            print(p.stderr[-1500:], flush=True)
        else:
            path.unlink()
    print(f"{a.runs} runs, {flagged} flagged")
    sys.exit(1 if flagged else 0)


if __name__ == "__main__":
    main()
