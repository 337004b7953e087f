"""Schedule search vs the registered schedulers on the KV-bound Fig. 5 points (B = 1024, M = 100K).

For each point (I in {1, 64, 512}, O in {128, 256, 1024}) and objective, runs `solvers.search.search`
with a time limit and reports the best registered scheduler (and the best of the figure's three:
vLLM, Sarathi, Sarathi P=C), the search's best, the gain, the time taken and the winning candidate.
The cost model is the one experiments/fig5_6.toml names (the paper's linear model).

    PYTHONPATH=$PWD python benchmarks/search_fig5.py OUT.md [--time-limit 60] [--points 1x256,64x256]
        [--objectives makespan,latency,ttft] [--latency-points 1x256,512x256] [--extra azure2000,LILO+SISO:1024]
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path

from infermax.costmodel import load_cost_model
from infermax.limits import Limits
from infermax.workload import fixed, heterogeneous_mix, load_trace
from solvers.objective import Objective
from solvers.search import search

ROOT = Path(__file__).resolve().parents[1]
FIGURE_SCHEDULERS = ("vllm", "sarathi", "sarathi-pc")
TRACE = "azure-conv"  # the bundled Azure LLM inference conversation trace (2023)


def _points(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in p.split("x")) for p in text.split(",") if p]


def _extra(name: str):
    if name.startswith("azure"):
        return load_trace(TRACE, limit=int(name[len("azure"):]))
    mix, _, B = name.partition(":")
    return heterogeneous_mix(mix, int(B), seed=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="markdown table to write (a .json with the raw candidates is written beside it)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per search (default 60)")
    ap.add_argument("--points", default="1x128,1x256,1x1024,64x128,64x256,64x1024,512x128,512x256,512x1024",
                    help="IxO points for makespan")
    ap.add_argument("--latency-points", default="1x256,512x256", help="IxO points for latency and ttft")
    ap.add_argument("--objectives", default="makespan,latency,ttft")
    ap.add_argument("--extra", default="azure2000,LILO+SISO:1024",
                    help="latency/ttft rows beyond Fig. 5: azureN (first N requests of the Splitwise conversation "
                         "trace, with arrivals) and MIX:B (appendix A.3 mix); empty for none")
    args = ap.parse_args()

    spec = tomllib.loads((ROOT / "experiments" / "fig5_6.toml").read_text())["base"]
    cm = load_cost_model(kind=spec["cost_model"])
    limits = Limits(C=spec["C"], M=spec["M"])
    rows, raw = [], []
    for obj_name in args.objectives.split(","):
        objective = Objective.parse(obj_name)
        points = _points(args.points if obj_name == "makespan" else args.latency_points)
        workloads = [(f"I={I} O={O}", I, O, fixed(I, O, spec["B"])) for I, O in points]
        if obj_name != "makespan":
            workloads += [(w, "-", "-", _extra(w)) for w in args.extra.split(",") if w]
        for label, I, O, reqs in workloads:
            t0 = time.perf_counter()
            res = search(reqs, limits, cm, objective, time_limit_s=args.time_limit)
            wall = time.perf_counter() - t0
            reg = {c["name"]: c["value_s"] for c in res.candidates if c["family"] == "registered" and "value_s" in c}
            best_reg = min(reg, key=reg.get)
            fig = {n: reg[n] for n in FIGURE_SCHEDULERS if n in reg}
            best_fig = min(fig, key=fig.get) if fig else None
            rows.append({"objective": obj_name, "workload": label, "I": I, "O": O, "best_registered": best_reg,
                         "best_registered_s": reg[best_reg], "best_fig5": best_fig,
                         "best_fig5_s": fig.get(best_fig), "search_s": res.value_s, "method": res.method,
                         "gain_vs_registered": 1 - res.value_s / reg[best_reg],
                         "gain_vs_fig5": (1 - res.value_s / fig[best_fig]) if best_fig else None,
                         "evaluations": res.evaluations, "wall_s": wall})
            raw.append({**rows[-1], "result": res.to_dict()})
            r = rows[-1]
            print(f"{obj_name} {label}: registered {best_reg} {reg[best_reg]:.4f} | search {res.value_s:.4f} "
                  f"({r['gain_vs_registered']:.1%}) by {res.method} | {res.evaluations} evals {wall:.0f} s", flush=True)
    out = Path(args.out)
    lines = [f"Schedule search, Fig. 5 points (B={spec['B']}, C={spec['C']}, M={spec['M']}, cost model "
             f"{spec['cost_model']}), time limit {args.time_limit:g} s per search.", "",
             "| objective | workload | best of vLLM/Sarathi/Sarathi P=C (s) | best registered (s) | search (s) | "
             "gain vs registered | gain vs Fig. 5 three | wall (s) | evals | winning candidate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fig = f"{r['best_fig5']} {r['best_fig5_s']:.4f}" if r["best_fig5"] else "-"
        gfig = f"{r['gain_vs_fig5']:.1%}" if r["gain_vs_fig5"] is not None else "-"
        lines.append(f"| {r['objective']} | {r['workload']} | {fig} | {r['best_registered']} "
                     f"{r['best_registered_s']:.4f} | {r['search_s']:.4f} | {r['gain_vs_registered']:.1%} | {gfig} | "
                     f"{r['wall_s']:.0f} | {r['evaluations']} | {r['method']} |")
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
