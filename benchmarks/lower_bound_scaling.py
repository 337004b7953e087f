"""Bound time, search time and certified gap against B, for makespan and for the sum of latencies.

For each B (fixed I/O requests, offline, default limits C = 4096, M = 100K, the default cost model): the
aggregate lower bound (`solvers/lower_bound.py`) and its wall time, vLLM's and Sarathi's objectives, the
schedule search's best (`solvers/search.py`, with a time limit) and its wall time, and the certified gap
best ÷ bound − 1. With ``--refine-s S`` also the bound `refine_bound` reaches in S more seconds after the search (what
`infermax optimize` and an unsettled `better` do with the time their search left: the state path with narrower
cells, identical requests up to 64) and the gap with it. Writes a markdown table (and JSON beside it) to --out;
never touches tracked files.

    python benchmarks/lower_bound_scaling.py --out /tmp/lb_scaling.md [--B 8 64 1024] [--search-limit 60] [--refine-s 90]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.engine import simulate  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.workload import fixed  # noqa: E402
from solvers.lower_bound import lower_bound_report, refine_bound  # noqa: E402
from solvers.objective import Objective  # noqa: E402

SIZES = (8, 16, 64, 256, 1024, 4096, 16384)


def run(sizes, I, O, search_limit_s, objectives, refine_s=0.0):
    cost = load_cost_model()
    limits = Limits(C=4096, M=100_000)
    rows = []
    for B in sizes:
        reqs = fixed(I, O, B)
        sims = {s: simulate(reqs, s, limits, cost) for s in ("vllm", "sarathi")}
        for name in objectives:
            obj = Objective(**{name: 1})
            t = time.perf_counter()
            report = lower_bound_report(reqs, limits, cost, obj)  # (LowerBounder's default budgets: no time limit)
            lb = report.value_s
            bound_s = time.perf_counter() - t
            values = {s: obj.value(r) for s, r in sims.items()}
            best = min(values.values())
            row = {"B": B, "objective": name, "bound_s": lb, "bound_wall_s": bound_s, **{f"{s}_s": v for s, v in values.items()}}
            if search_limit_s > 0:
                from solvers.search import search

                t = time.perf_counter()
                found = search(reqs, limits, cost, obj, time_limit_s=search_limit_s)
                row.update(search_s=found.value_s, search_wall_s=time.perf_counter() - t, search_method=found.method)
                best = min(best, found.value_s)
            row["gap_best_registered"] = min(values.values()) / lb - 1
            row["gap"] = best / lb - 1
            if refine_s > 0:
                t = time.perf_counter()
                refined = refine_bound(report, refine_s).value_s
                row.update(refined_bound_s=refined, refine_wall_s=time.perf_counter() - t, gap_refined=best / refined - 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows) -> str:
    refined = any("refined_bound_s" in r for r in rows)
    head = "| B | objective | bound (s) | bound wall (s) | vLLM (s) | Sarathi (s) | search best (s) | search wall (s) | gap registered | gap |"
    head += " refined bound (s) | refine wall (s) | gap refined |" if refined else ""
    out = [head, "|" + "---|" * (13 if refined else 10)]
    nan = float("nan")
    for r in rows:
        line = (f"| {r['B']:,} | {r['objective']} | {r['bound_s']:.6g} | {r['bound_wall_s']:.2f} | {r['vllm_s']:.6g} | "
                f"{r['sarathi_s']:.6g} | {r.get('search_s', nan):.6g} | {r.get('search_wall_s', nan):.1f} | "
                f"{r['gap_best_registered']:.2%} | {r['gap']:.2%} |")
        if refined:
            line += (f" {r.get('refined_bound_s', nan):.6g} | {r.get('refine_wall_s', nan):.1f} |"
                     f" {r.get('gap_refined', nan):.2%} |")
        out.append(line)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--B", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--I", type=int, default=512)
    ap.add_argument("--O", type=int, default=128)
    ap.add_argument("--search-limit", type=float, default=60.0, help="seconds per search (0: no search)")
    ap.add_argument("--objective", nargs="+", default=["makespan", "latency"])
    ap.add_argument("--refine-s", type=float, default=0.0,
                    help="seconds for `refine_bound` after the search (0: none)")
    args = ap.parse_args()
    rows = run(args.B, args.I, args.O, args.search_limit, args.objective, args.refine_s)
    md = f"I = {args.I}, O = {args.O}, C = 4096, M = 100,000, default cost model\n\n" + table(rows) + "\n"
    args.out.write_text(md)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(md)


if __name__ == "__main__":
    main()
