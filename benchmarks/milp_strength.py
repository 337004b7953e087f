"""What each strengthening of the exact MILP buys: time to proven optimality, or the gap at the time limit.

Instance as ``infermax optimize`` builds it (default cost model: the A100 Llama-2-7B profile fit, C = 4096,
default M), objective makespan unless ``--objective``. Every variant gets the same inputs: the vLLM warm
start, the slot count from the slot bound with vLLM's makespan as budget, and the aggregate lower bound as
objective cut (as `solvers.analyse` does). Variants are `solvers.formulation.Strengthening` settings.

Run: ``python benchmarks/milp_strength.py --B 8,16 --variants before,cuts [--time-limit 120]``, or a heterogeneous
instance with ``--classes 64:4:4,32:8:4``.
Prints one markdown row per (B, variant) as it finishes, with ``uptime``'s load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's infermax and solvers

from infermax.cli.common import run_config  # noqa: E402
from infermax.engine import simulate  # noqa: E402
from infermax.request import Request  # noqa: E402
from solvers import Objective, SolveOptions  # noqa: E402
from solvers.bounds import slot_bound  # noqa: E402
from solvers.formulation import Strengthening  # noqa: E402
from solvers.lower_bound import lower_bound_report  # noqa: E402
from solvers.optimize import optimize  # noqa: E402

# "before": the model as it was (finish-order symmetry, big-M pieces, the slot bound without token-count steps);
# "slots": the same with the current slot bound; "cuts": also perspective form (the default); "full": also the
# symmetry tie-break; "none": no symmetry breaking and no cuts.
VARIANTS = {
    "before": Strengthening(symmetry="finish", cuts=False),
    "slots": Strengthening(symmetry="finish", cuts=False),
    "cuts": Strengthening(symmetry="finish", cuts=True),
    "full": Strengthening(symmetry="full", cuts=True),
    "none": Strengthening(symmetry="none", cuts=False),
}


def instance(I, O, B, mix):
    keys = dict(model="llama-2-7b", gpu="a100", tp=1, cost_model="auto", costmodel=None, I=I, O=O, B=B, mix=mix,
                input_dist=None, output_dist=None, trace=None, trace_limit=None, arrival=None, rate=None, cv=None,
                time_scale=1.0, C=4096, P=None, M=None, gpu_mem_util=None, Rmax=None, block_size=1, seed=0)
    config = run_config("vllm", **keys)
    return config.requests(), config.limits(), config.cost()


def classes(spec: str, limits_and_cost):
    """Requests from ``I:O:count,...`` (all arriving at 0), with the default limits and cost model."""
    requests = []
    for part in spec.split(","):
        I, O, n = (int(x) for x in part.split(":"))
        requests += [Request(len(requests) + k, 0.0, I, O) for k in range(n)]
    return requests, *limits_and_cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--I", type=int, default=64)
    ap.add_argument("--O", type=int, default=4)
    ap.add_argument("--B", default="8,16")
    ap.add_argument("--classes", default=None, help="heterogeneous instead: I:O:count,... (then --B is ignored)")
    ap.add_argument("--objective", default="makespan")
    ap.add_argument("--variants", default="before,cuts")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--threads", type=int, default=1, help="solver threads (1: HiGHS is deterministic, so nodes and "
                    "LP iterations compare variants independently of the machine's load)")
    args = ap.parse_args()
    obj = Objective.parse(args.objective)
    print("| B | variant | slots | vars (int) | constraints | incumbent ms | bound ms | gap | status | solve s | nodes | LP iterations | warm | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    sizes = [None] if args.classes else [int(b) for b in args.B.split(",")]
    for B in sizes:
        if args.classes:
            requests, limits, cost = classes(args.classes, instance(args.I, args.O, 1, None)[1:])
            B = args.classes
        else:
            requests, limits, cost = instance(args.I, args.O, B, None)
        warm = simulate(requests, "vllm", limits, cost).schedule
        cut = lower_bound_report(requests, limits, cost, obj).value_s
        budget = obj.value(simulate(requests, "vllm", limits, cost))
        sb = slot_bound(requests, cost.milp_terms(), obj, budget)
        tokens = sum(r.prompt_tokens + r.output_tokens - 1 for r in requests)
        old_slots = math.floor((budget - sb.alpha_s * tokens) / sb.tau0_s * (1 + 1e-9) + 1e-9)
        for name in args.variants.split(","):
            opts = SolveOptions("highs", args.time_limit, 1e-6, args.threads)
            res = optimize(requests, limits, cost, obj, warm_start=warm, options=opts, objective_cut_s=cut or None,
                           strengthening=VARIANTS[name], slots=old_slots if name == "before" else None)
            s = res.size
            load = os.getloadavg()[0]
            print(f"| {B} | {name} | {res.slots} | {s['variables']} ({s['integer']}) | {s['constraints']} | "
                  f"{res.value_s * 1e3:.4f} | {res.bound_s * 1e3:.4f} | {res.gap:.2%} | {res.solve.status} | "
                  f"{res.solve.wall_s:.1f} | {res.solve.nodes} | {res.solve.lp_iterations} | {'yes' if res.warm_start['accepted'] else 'no'} | {load:.2f} |", flush=True)


if __name__ == "__main__":
    main()
