"""Random `infermax simulate` / `optimize` / `better` invocations, each in its own process, checked for what a
user must never see: a traceback, an exit code other than 0 / 1 / 2, stdout that is not JSON under ``--json``,
an `optimize` / `better` running more than ``--slack`` seconds past its ``--time-limit``, or a `simulate` that
outlasts ``--simulate-timeout``. Prints one line per run (``ok``, exit code, seconds, the arguments and, for a
refused input, its one-line message) and ``PROBLEM`` / ``TIMEOUT`` lines for the flagged ones; writes nothing
but the small length-only CSV traces it draws, in a temporary directory.

    python benchmarks/cli_fuzz.py --seed 3 --runs 400                      # mixed commands
    python benchmarks/cli_fuzz.py --seed 11 --runs 1500 --commands simulate

Inputs drawn: fixed grids (including 0 and negative sizes, which must be refused), heterogeneous mixes, length
distributions, both Azure traces with a limit and a time scale, and length-only CSVs with or without arrival
times, extra columns, zero token counts, unsorted or negative arrivals (which must be refused with the line and
column); limits (C, P, M, Rmax, block size, GPU memory fraction), cost-model families, GPUs and models;
objectives, warm starts and forced policies for `optimize`; schedulers, margins and objectives for `better`.
On 2026-11-29 it found `simulate --I 16 --O 600 --B 1000 --Rmax 1 --gpu-mem-util 0.9 --scheduler aptserve-kv`
running for minutes (docs/design.md, Apt-Serve decision 13, fifth pass), among 3,326 runs; 1,000 runs after
the fix (and the ranking fix of the same day) flagged nothing, nor did 300 mixed runs (seed 3200) at 87203e5 on
2026-12-02.
Run it under a frozen checkout (``PYTHONPATH``), not a working tree being edited.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

EXIT_CODES = (0, 1, 2)  # answered / the scheduler's own run outlasted the limit (`better`) / refused input


def _length_csv(rng: random.Random, folder: str, i: int) -> str:
    # names a terminal library could read as markup or emoji ('[/x]' once stopped a command with rich's MarkupError)
    path = os.path.join(folder, f"trace{i}{rng.choice(['', '', '[/x]', ' [red]', ':smile:'])}.csv")
    os.makedirs(os.path.dirname(path), exist_ok=True)  # ('[/x]': a folder 'trace<i>[' holding 'x].csv')
    cols = ["num_prefill_tokens", "num_decode_tokens"] + (["arrived_at"] if rng.random() < 0.5 else [])
    cols += ["note"] if rng.random() < 0.3 else []
    t, rows = 0.0, []
    for _ in range(rng.randint(0, 40)):
        row = [rng.choice([0, 1, 5, 100, 900, 3000, 5000]), rng.choice([0, 1, 3, 50, 400])]
        if "arrived_at" in cols:
            t += rng.choice([0, 0.1, 1.0, -0.5])
            row.append(round(t, 3))
        if "note" in cols:
            row.append("x")
        rows.append(",".join(map(str, row)))
    with open(path, "w") as f:
        f.write("\n".join([",".join(cols), *rows]) + "\n")
    return path


def _workload(rng: random.Random, folder: str, i: int) -> list[str]:
    k = rng.random()
    if k < 0.45:
        return ["--I", str(rng.choice([1, 2, 16, 64, 512, 2000, 5000, 0])), "--O", str(rng.choice([1, 2, 4, 128, 600, 0])),
                "--B", str(rng.choice([1, 2, 3, 8, 16, 64, 300, 1000]))]
    if k < 0.6:
        return ["--mix", rng.choice(["LILO+SILO", "SISO", "LISO+SISO+LILO", "LILO+SILO+SISO+LISO", "BAD"]),
                "--B", str(rng.choice([1, 3, 4, 16, 64]))]
    if k < 0.7:
        return ["--input-dist", rng.choice(["uniform:16:1024", "lognormal:512:1.0", "lognormal:2500:0.3:4000",
                                            "uniform:5:2", "zipf:3"]),
                "--output-dist", rng.choice(["uniform:1:64", "lognormal:200:1.0:3900", "uniform:0:3"]),
                "--B", str(rng.choice([8, 50, 200]))]
    if k < 0.85:
        args = ["--trace", rng.choice(["azure-conv", "azure-code"]), "--trace-limit", str(rng.choice([1, 5, 50, 300, 0]))]
        return args + (["--time-scale", str(rng.choice([0.1, 0.5, 2.0, 0]))] if rng.random() < 0.3 else [])
    args = ["--trace", _length_csv(rng, folder, i)]
    arrival = rng.choice(["poisson", "gamma", "offline", "trace", None])
    if arrival:
        args += ["--arrival", arrival]
    if rng.random() < 0.7:
        args += ["--rate", str(rng.choice([0.5, 5, 100, 0]))]
    if arrival == "gamma" or rng.random() < 0.1:
        args += ["--cv", str(rng.choice([0.5, 2, 0]))]
    return args


def _limits(rng: random.Random) -> list[str]:
    draws = [("--C", 0.5, [16, 64, 512, 2048, 4096, 1]), ("--P", 0.3, [1, 16, 512, 100000]),
             ("--M", 0.5, [100, 700, 5000, 20000, 100000, 2000000]), ("--Rmax", 0.3, [1, 2, 8, 64]),
             ("--block-size", 0.3, [1, 16, 7]), ("--gpu-mem-util", 0.1, [0.9, 0.3, 1.5]),
             ("--cost-model", 0.3, ["linear", "piecewise", "roofline", "auto"]), ("--gpu", 0.15, ["h100", "a100", "h200"]),
             ("--model", 0.1, ["llama-3-8b", "llama-2-13b", "llama-2-7b"])]
    args = []
    for flag, p, values in draws:
        if rng.random() < p:
            args += [flag, str(rng.choice(values))]
    return args


def _command(rng: random.Random, commands: list[str], schedulers: list[str], folder: str, i: int
             ) -> tuple[list[str], float | None]:
    """The arguments and the time limit (None for `simulate`)."""
    cmd = rng.choice(commands)
    args = [cmd, *_workload(rng, folder, i), *_limits(rng)]
    limit = None
    if cmd == "simulate":
        if rng.random() < 0.9:
            args += ["--scheduler", rng.choice(schedulers)]
    else:
        limit = rng.choice([1, 3, 8, 15])
        args += ["--objective", rng.choice(["makespan", "latency", "ttft"] + (["makespan=1,ttft=0.5"] if cmd == "optimize"
                                                                                 else [])),
                 "--time-limit", str(limit)]
        if cmd == "optimize":
            if rng.random() < 0.2:
                args += ["--warm-start", rng.choice(["none", "sarathi", "bros"])]
            if rng.random() < 0.2:
                args.append(rng.choice(["--no-hybrid", "--no-chunked-prefill", "--eviction-free"]))
        else:
            args += ["-s", rng.choice(schedulers), "--margin", str(rng.choice([0.01, 0.05, 0.1, 0, 1.5]))]
    if rng.random() < 0.5:
        args.append("--json")
    return args, limit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--commands", default="simulate,simulate,optimize,better",
                    help="comma-separated, drawn uniformly (repeat one to weight it)")
    ap.add_argument("--slack", type=float, default=5.0, help="seconds allowed past --time-limit (imports, start-up)")
    ap.add_argument("--simulate-timeout", type=float, default=120.0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    exe = [sys.executable, "-c", "from infermax.cli import app; app()"]  # the `infermax` entry point, this interpreter
    from infermax.schedulers import available

    schedulers, commands, flagged = available(), args.commands.split(","), 0
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.runs):
            argv, limit = _command(rng, commands, schedulers, folder, i)
            wall_limit = args.simulate_timeout if limit is None else limit + 60
            start = time.perf_counter()
            try:
                p = subprocess.run(exe + argv, capture_output=True, text=True, timeout=wall_limit)
            except subprocess.TimeoutExpired:
                flagged += 1
                print("TIMEOUT", " ".join(argv), flush=True)
                continue
            wall = time.perf_counter() - start
            out = (p.stdout + p.stderr).strip()
            problems = []
            if "Traceback" in out:
                problems.append("traceback")
            if p.returncode not in EXIT_CODES:
                problems.append(f"exit {p.returncode}")
            if "--json" in argv and p.returncode == 0:
                try:
                    json.loads(p.stdout)
                except ValueError:
                    problems.append("stdout is not JSON")
            if limit is not None and wall > limit + args.slack:
                problems.append(f"{wall:.1f} s under --time-limit {limit}")
            last = out.splitlines()[-1][:160] if out else ""
            if problems:
                flagged += 1
                print("PROBLEM", problems, " ".join(argv), "||", last, flush=True)
            else:
                print("ok", p.returncode, f"{wall:.1f}s", " ".join(argv), "||", last if p.returncode else "", flush=True)
    print(f"{args.runs} runs, {flagged} flagged")
    sys.exit(1 if flagged else 0)


if __name__ == "__main__":
    main()
