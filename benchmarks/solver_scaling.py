"""Solve time and final gap of the optimal-schedule MILP for B in {4, 8, 16, 32} requests, per backend.

Instance: fixed I = 4, O = 2, M = max(2I, I + O − 1) = 8 (section 4.5's memory rule), C = 4096, A100
Llama-2-7B linear cost model, objective makespan, warm start and slot bound from vLLM's schedule.
Run: ``python benchmarks/solver_scaling.py [--backends highs,cbc] [--sizes 4,8,16,32] [--time-limit 300]``.
Prints one markdown row per (backend, B) as it finishes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's infermax and solvers

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.engine import simulate  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.workload import fixed  # noqa: E402
from solvers import Objective, SolveOptions, SolverFailed, optimize  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="highs,cbc")
    ap.add_argument("--sizes", default="4,8,16,32")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    cost = load_cost_model(kind="linear")
    I, O = 4, 2
    limits = Limits(C=4096, M=max(2 * I, I + O - 1))
    print("| backend | B | slots | variables (integer) | constraints | vLLM ms | incumbent ms | bound ms | gap | status | "
          "solve s | total s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for backend in args.backends.split(","):
        for B in (int(b) for b in args.sizes.split(",")):
            requests = fixed(I, O, B)
            t0 = time.perf_counter()
            sim = simulate(requests, "vllm", limits, cost)
            try:
                res = optimize(requests, limits, cost, Objective(makespan=1), warm_start=sim.schedule,
                               options=SolveOptions(backend, args.time_limit, 1e-4, args.threads))
            except SolverFailed as exc:
                print(f"| {backend} | {B} | solver failure: {exc} |", flush=True)
                continue
            total = time.perf_counter() - t0
            s = res.size
            print(f"| {backend} | {B} | {res.slots} | {s['variables']} ({s['integer']}) | {s['constraints']} | "
                  f"{sim.summary['makespan_s'] * 1e3:.3f} | {res.value_s * 1e3:.3f} | {res.bound_s * 1e3:.3f} | "
                  f"{res.gap:.1%} | {res.solve.status} | {res.solve.wall_s:.1f} | {total:.1f} |"
                  + (f" {'; '.join(res.solve.notes)}" if res.solve.notes else ""), flush=True)


if __name__ == "__main__":
    main()
