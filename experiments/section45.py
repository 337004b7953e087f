"""InferMax section 4.5 ("Are evictions always evil?") under our cost model.

O = B = 4, I in {1, 2, 4, ..., 1024}, M = max(2I, I + O − 1), C = 4096, objective total latency
(makespan). For each I: vLLM, Sarathi and their eviction-free variants (simulated), the MILP optimum
(seeded with the best of the four schedules) and the eviction-free MILP optimum, each with its
incumbent, best bound and gap after ``--time-limit`` seconds, and whether the optimum evicts.

Run: ``python experiments/section45.py [--time-limit 60] [--out experiments/section45.md]``.
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
from solvers import Objective, Policies, SolveOptions, optimize  # noqa: E402

SCHEDULERS = ("vllm", "vllm-ef", "sarathi", "sarathi-ef")
FINDINGS = "<!-- findings: written by hand from the table; the script keeps this part -->"


def row(I: int, O: int, B: int, cost, time_limit: float) -> dict:
    requests, limits = fixed(I, O, B), Limits(C=4096, M=max(2 * I, I + O - 1))
    sims = {s: simulate(requests, s, limits, cost) for s in SCHEDULERS}
    out = {"I": I, "M": limits.M}
    for s, r in sims.items():
        out[s] = r.summary["makespan_s"] * 1e3
        out[s + "_ev"] = r.summary["evictions"]
    seed = min(sims.values(), key=lambda r: r.summary["makespan_s"]).schedule
    free_seed = min((sims[s] for s in ("vllm-ef", "sarathi-ef")), key=lambda r: r.summary["makespan_s"]).schedule
    for tag, pol, warm in (("opt", Policies(), seed), ("opt_ef", Policies(eviction_free=True), free_seed)):
        t0 = time.perf_counter()
        res = optimize(requests, limits, cost, Objective(makespan=1), pol, warm_start=warm,
                       options=SolveOptions(time_limit_s=time_limit, mip_gap=1e-4, threads=1))
        out[tag] = res.value_s * 1e3
        out[tag + "_bound"] = res.bound_s * 1e3
        out[tag + "_gap"] = res.gap
        out[tag + "_status"] = res.status + ("" if res.global_optimum else " (within slots)")
        out[tag + "_ev"] = res.result.summary["evictions"]
        out[tag + "_slots"] = res.slots
        out[tag + "_wall"] = time.perf_counter() - t0
    return out


def markdown(rows: list[dict], time_limit: float) -> str:
    head = ("| I | M | vLLM | vLLM-ef | Sarathi | Sarathi-ef | optimum (bound, gap) | evicts | opt. eviction-free (bound, gap) "
            "| evicting opt. vs eviction-free opt. |")
    lines = [f"Makespan in ms (A100 Llama-2-7B linear cost model), O = B = 4, C = 4096, M = max(2I, I+3); solver HiGHS, "
             f"{time_limit:g} s per MILP, 1 thread, MIP gap 1e-4. Eviction counts in brackets.", "", head,
             "|" + "---|" * 10]
    for r in rows:
        def opt(tag):
            return f"{r[tag]:.3f} ({r[tag + '_bound']:.3f}, {r[tag + '_gap']:.1%})"
        lines.append(
            f"| {r['I']} | {r['M']} | " + " | ".join(f"{r[s]:.3f} [{r[s + '_ev']}]" for s in SCHEDULERS)
            + f" | {opt('opt')} | {r['opt_ev']} | {opt('opt_ef')} | {1 - r['opt'] / r['opt_ef']:+.1%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64,128,256,512,1024")
    ap.add_argument("--out", type=Path, default=Path("experiments/section45.md"))
    args = ap.parse_args()
    cost = load_cost_model(kind="linear")
    rows = []
    for I in (int(x) for x in args.sizes.split(",")):
        rows.append(row(I, 4, 4, cost, args.time_limit))
        r = rows[-1]
        print(f"I={I}: opt {r['opt']:.3f} ms [{r['opt_status']}, gap {r['opt_gap']:.1%}, ev {r['opt_ev']}], "
              f"opt-ef {r['opt_ef']:.3f} ms [{r['opt_ef_status']}, gap {r['opt_ef_gap']:.1%}], "
              f"vllm {r['vllm']:.3f}, vllm-ef {r['vllm-ef']:.3f}", file=sys.stderr, flush=True)
        write(args.out, markdown(rows, args.time_limit))
    print(markdown(rows, args.time_limit))


def write(path: Path, table: str) -> None:
    """Replace the table, keeping the hand-written reading below the ``FINDINGS`` marker."""
    old = path.read_text() if path.exists() else ""
    tail = old[old.index(FINDINGS):] if FINDINGS in old else ""
    path.write_text(table + ("\n" + tail if tail else ""))


if __name__ == "__main__":
    main()
