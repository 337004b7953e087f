"""Engine speed at scale, this tree against an old tree, for every registered scheduler.

Run (quick): ``python benchmarks/engine_scale.py --out /tmp/engine_scale --schedulers vllm,sarathi
--workloads azure-conv --repeats 1``; the full matrix is every scheduler of this tree's
``infermax.schedulers.available()`` on three workloads:

- ``azure-conv``: the full bundled Azure conversation trace (19,366 requests, own arrival times);
- ``azure-code``: the full bundled Azure code trace (8,819 requests, own arrival times);
- ``long-prompt``: 2,000 requests, ``sampled(2000, "lognormal:2500:0.3:4000", "lognormal:200:1.0:3900")``
  with Poisson arrivals at 2 req/s (seed 0);
- ``offline-512-128`` (only when named in ``--workloads``): 1,024 requests, I=512, O=128, all at 0,
  with ``C = P = 512``, ``M = 483,328``, ``Rmax = 128``, block size 16 (issue 17's first target).

KV swaps (BROS, EcoServe) are timed with the default system's host link (A100, Llama-2-7B, 0.8 of the
link's datasheet rate: ``SwapCost.for_system``), as ``infermax simulate`` does.
Limits for the first three: ``M = 475,136`` tokens, ``Rmax = 512``, block size 1, ``C = 4096`` (P: the
scheduler's default; issue 17's second target is azure-conv with sarathi). A scheduler that does not chunk prefills cannot run a request whose prefill (or refill,
up to ``I + O − 1``) exceeds ``min(C, P)``; when a run raises that, it is repeated with ``C`` = the
workload's largest ``I + O − 1`` and the table says so (old and new get the same rule).

Every run is a fresh subprocess with the tree first on ``PYTHONPATH`` (``--old``: default
/work/wt/old, a worktree of commit fc1abe4), runs of the two trees interleaved (alternating which
goes first), each under ``--timeout`` seconds; a run that times out or fails is reported as such.
Per run: the wall and CPU time of the ``simulate()`` call alone (``loop_s``, ``loop_cpu_s``: no
import, no workload building), the simulated batches, batches per second of the loop, and the
whole process's wall time. The table shows the minimum over ``--repeats`` and the old/new ratio,
and whether the two trees' summaries are identical. Output: ``OUT.md`` and ``OUT.json``; a path git
tracks is refused unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
WORKLOADS = ("azure-conv", "azure-code", "long-prompt")
EXTRA_WORKLOADS = ("offline-512-128",)
LIMITS = {"M": 475_136, "Rmax": 512, "C": 4096, "P": 0, "block_size": 1}  # P 0: the scheduler's default
WORKLOAD_LIMITS = {"offline-512-128": {"M": 483_328, "Rmax": 128, "C": 512, "P": 512, "block_size": 16}}

# The child: builds the workload, runs simulate() once, prints one JSON line. It uses only APIs the
# old tree has too.
CHILD = r"""
import json, sys, time
from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.schedulers import InfeasibleRequestError
from infermax.workload import fixed, load_trace, sampled, with_arrivals

workload, scheduler = sys.argv[1], sys.argv[2]
M, Rmax, C, P, block = (int(x) for x in sys.argv[3:8])
if workload == "offline-512-128":
    requests = fixed(512, 128, 1024)
elif workload == "long-prompt":
    requests = with_arrivals(sampled(2000, "lognormal:2500:0.3:4000", "lognormal:200:1.0:3900", seed=0),
                             "poisson", rate_per_s=2.0, seed=0)
else:
    requests = with_arrivals(load_trace(workload), "trace")
cost = load_cost_model()
swap = SwapCost.for_system("a100", "llama-2-7b", 1)  # the default system: BROS and EcoServe swap KV
def run(C):
    t, c = time.perf_counter(), time.process_time()
    result = simulate(requests, scheduler, Limits(C=C, P=P or None, M=M, Rmax=Rmax, block_size=block), cost,
                      swap_cost=swap)
    return result, time.perf_counter() - t, time.process_time() - c
try:
    result, wall, cpu = run(C)
except Exception as exc:  # a non-chunking scheduler and a prefill larger than C: retry with C = max I + O - 1
    if not isinstance(exc, InfeasibleRequestError) and not isinstance(exc.__cause__, InfeasibleRequestError):
        raise
    C = max(r.prompt_tokens + r.output_tokens - 1 for r in requests)
    result, wall, cpu = run(C)
summary = {k: (None if isinstance(v, float) and v != v else v) for k, v in result.summary.items()}
print(json.dumps({"loop_s": wall, "loop_cpu_s": cpu, "batches": len(result.batches), "C": C, "summary": summary}))
"""


def run_once(tree: Path, workload: str, scheduler: str, timeout_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    lim = WORKLOAD_LIMITS.get(workload, LIMITS)
    args = [sys.executable, "-c", CHILD, workload, scheduler,
            *(str(lim[k]) for k in ("M", "Rmax", "C", "P", "block_size"))]
    start = time.perf_counter()
    try:
        proc = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "process_s": time.perf_counter() - start}
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": "error", "error": last[:300], "process_s": process_s}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"status": "ok", "process_s": process_s, **out}


def best(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r["status"] == "ok"]
    return min(values) if values else None


def cell(runs: list[dict], key: str, fmt: str) -> str:
    value = best(runs, key)
    if value is not None:
        return format(value, fmt)
    return "/".join(sorted({r["status"] for r in runs}))


def table(rows: list[dict]) -> str:
    lines = [
        "| workload | scheduler | batches | C | old loop s | new loop s | loop ratio (old/new) | old loop CPU s | "
        "new loop CPU s | CPU ratio | new batches/s | new µs/batch ÷ Sarathi's | old process s | new process s | summaries |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    per_batch = {}  # (workload, scheduler) -> new loop seconds per batch
    for row in rows:
        ok = [r for r in row["new"] if r["status"] == "ok"]
        if ok and ok[0]["batches"]:
            per_batch[row["workload"], row["scheduler"]] = best(row["new"], "loop_s") / ok[0]["batches"]
    for row in rows:
        old, new = row["old"], row["new"]
        ratio = lambda key: (f"{best(old, key) / best(new, key):.2f}x"  # noqa: E731
                             if best(old, key) is not None and best(new, key) else "n/a")
        ok_new = [r for r in new if r["status"] == "ok"]
        batches = ok_new[0]["batches"] if ok_new else None
        loop = best(new, "loop_s")
        rate = f"{batches / loop:,.0f}" if batches and loop else "n/a"
        mine, sarathi = per_batch.get((row["workload"], row["scheduler"])), per_batch.get((row["workload"], "sarathi"))
        vs_sarathi = f"{mine / sarathi:.1f}x" if mine and sarathi else "n/a"
        lines.append(
            f"| {row['workload']} | {row['scheduler']} | {batches if batches is not None else 'n/a'} | "
            f"{ok_new[0]['C'] if ok_new else 'n/a'} | {cell(old, 'loop_s', '.3f')} | {cell(new, 'loop_s', '.3f')} | "
            f"{ratio('loop_s')} | {cell(old, 'loop_cpu_s', '.3f')} | {cell(new, 'loop_cpu_s', '.3f')} | "
            f"{ratio('loop_cpu_s')} | {rate} | {vs_sarathi} | {cell(old, 'process_s', '.2f')} | "
            f"{cell(new, 'process_s', '.2f')} | "
            f"{row['summaries']} |")
    return "\n".join(lines)


def same_summaries(old: list[dict], new: list[dict]) -> str:
    a = [r for r in old if r["status"] == "ok"]
    b = [r for r in new if r["status"] == "ok"]
    if not a or not b:
        return "n/a"
    x, y = a[0]["summary"], b[0]["summary"]
    if x.keys() != y.keys():
        return "keys differ"
    differ = [k for k in x if not (x[k] == y[k] or (isinstance(x[k], float) and isinstance(y[k], float)
                                                     and math.isnan(x[k]) and math.isnan(y[k])))]
    return "identical" if not differ else "differ: " + ", ".join(differ)


def tracked(path: Path) -> bool:
    probe = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=HERE, capture_output=True)
    return probe.returncode == 0


def main() -> None:
    sys.path.insert(0, str(HERE))
    from infermax.schedulers import available

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output path without suffix: writes OUT.md and OUT.json")
    parser.add_argument("--old", default="/work/wt/old", help="the old tree (default /work/wt/old)")
    parser.add_argument("--schedulers", default=None, help="comma-separated (default: every registered one)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated of {', '.join(WORKLOADS + EXTRA_WORKLOADS)}")
    parser.add_argument("--repeats", type=int, default=1, help="runs per tree and case (the table shows the minimum)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    parser.add_argument("--old-timeout", type=float, default=None,
                        help="seconds per run of the old tree (default: --timeout); a shorter one bounds the matrix "
                             "where the old engine is known to be slow (the table then says 'timeout' for it)")
    parser.add_argument("--force", action="store_true", help="allow overwriting files git tracks")
    args = parser.parse_args()

    old = Path(args.old).resolve()
    if not (old / "infermax" / "engine.py").is_file():
        parser.error(f"--old {old}: not an InferMax tree (no infermax/engine.py)")
    schedulers = args.schedulers.split(",") if args.schedulers else available()
    unknown = [s for s in schedulers if s not in available()]
    workloads = args.workloads.split(",")
    bad = [w for w in workloads if w not in WORKLOADS + EXTRA_WORKLOADS]
    if unknown or bad:
        parser.error(f"unknown scheduler(s) {unknown} / workload(s) {bad}")
    old_timeout = args.timeout if args.old_timeout is None else args.old_timeout
    if args.repeats < 1 or args.timeout <= 0 or old_timeout <= 0:
        parser.error("--repeats must be >= 1 and --timeout, --old-timeout > 0")
    out = Path(args.out)
    md, js = out.with_name(out.name + ".md"), out.with_name(out.name + ".json")
    if not args.force and (tracked(md) or tracked(js)):
        parser.error(f"{md} or {js} is tracked by git; pass --force to overwrite")

    rows = [{"workload": w, "scheduler": s, "old": [], "new": []} for w in workloads for s in schedulers]
    for rep in range(args.repeats):
        for i, row in enumerate(rows):
            order = (("old", old), ("new", HERE)) if (rep + i) % 2 == 0 else (("new", HERE), ("old", old))
            for label, tree in order:
                run = run_once(tree, row["workload"], row["scheduler"], old_timeout if label == "old" else args.timeout)
                row[label].append(run)
                print(f"[{rep + 1}/{args.repeats}] {row['workload']} {row['scheduler']} {label}: {run['status']} "
                      f"loop {run.get('loop_s', float('nan')):.3f}s process {run['process_s']:.2f}s", flush=True)
    for row in rows:
        row["summaries"] = same_summaries(row["old"], row["new"])
    header = (f"Engine scale: new = {HERE}, old = {old}; limits {LIMITS}, {WORKLOAD_LIMITS} (see benchmarks/engine_scale.py); "
              f"minimum of {args.repeats} run(s) per cell; python {sys.version.split()[0]}, {os.cpu_count()} CPUs.\n\n")
    md.write_text(header + table(rows) + "\n")
    for row in rows:  # keep the JSON small: one summary per tree
        for label in ("old", "new"):
            for r in row[label][1:]:
                r.pop("summary", None)
    js.write_text(json.dumps({"new": str(HERE), "old": str(old), "limits": LIMITS, "workload_limits": WORKLOAD_LIMITS,
                              "repeats": args.repeats,
                              "rows": rows}, indent=1))
    print(header + table(rows))
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()
