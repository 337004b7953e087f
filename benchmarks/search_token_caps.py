"""What the search's token-capped candidates buy: the schedule search with and without them, side by side.

`solvers.search.cheap_batch_tokens` gives the batch token counts just under a piecewise cost model's cheapest
token-count steps (384 and 512 on the fitted A100 Llama-2-7B profile); work-ranked, first-token-first SRPT and the
chunking Algorithm-1 template points also run with every batch capped there (docs/design.md, "Schedule search",
(6b)). The "without" arm replaces `cheap_batch_tokens` by one that returns no cap, which is exactly the candidate set
before they were added. For each case both arms run in one process, one after the other, under the same time limit;
the lower bound is computed once (it does not depend on the search). Prints a markdown table; never touches tracked
files.

    PYTHONPATH=. python benchmarks/search_token_caps.py [--time-limit 60] [--cases azure-code-latency,...]
"""

from __future__ import annotations

import argparse
import time

from infermax.costmodel import load_cost_model
from infermax.limits import Limits
from infermax.workload import fixed, load_trace
from solvers import search as search_module
from solvers.lower_bound import LowerBounder
from solvers.objective import Objective

CASES = {  # name: (workload, objective)
    "azure-code-latency": (("azure-code", 1000), "latency"),
    "azure-code-ttft": (("azure-code", 1000), "ttft"),
    "azure-conv-latency": (("azure-conv", 2000), "latency"),
    "azure-conv-ttft": (("azure-conv", 2000), "ttft"),
    "offline-64-latency": ((512, 128, 64), "latency"),
    "offline-256-latency": ((512, 128, 256), "latency"),
    "offline-256-makespan": ((512, 128, 256), "makespan"),
    "offline-1024-latency": ((512, 128, 1024), "latency"),
    "offline-1024-makespan": ((512, 128, 1024), "makespan"),
}


def _requests(spec):
    if isinstance(spec[0], str):
        return load_trace(spec[0], limit=spec[1])
    return fixed(*spec)


def _bound_s(reqs, limits, cost, objective: str) -> float:
    bounder = LowerBounder(reqs, limits, cost)
    bound = {"latency": bounder.latency_sum_s, "ttft": bounder.mean_ttft_s, "makespan": bounder.makespan_s}[objective]()
    return bound.value_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per search")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    args = ap.parse_args()
    cost, limits = load_cost_model(), Limits(C=4096, M=100_000)
    with_caps = search_module.cheap_batch_tokens
    print(f"caps on this model and limits: {with_caps(cost, limits)}; search --time-limit {args.time_limit:g} s\n")
    print("| case | objective | bound | without caps | with caps | ratio (with / without) | gap without | gap with | "
          "found with caps by |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for name in args.cases.split(","):
        spec, objective = CASES[name]
        reqs = _requests(spec)
        bound = _bound_s(reqs, limits, cost, objective)
        values, methods = {}, {}
        for arm, caps in (("without", lambda *a, **k: []), ("with", with_caps)):
            search_module.cheap_batch_tokens = caps
            t = time.perf_counter()
            res = search_module.search(reqs, limits, cost, Objective(**{objective: 1}), time_limit_s=args.time_limit)
            values[arm], methods[arm] = res.value_s, f"{res.method} ({time.perf_counter() - t:.0f} s)"
        search_module.cheap_batch_tokens = with_caps
        print(f"| {name} | {objective} | {bound:.6g} | {values['without']:.6g} | {values['with']:.6g} | "
              f"{values['with'] / values['without']:.3f} | {values['without'] / bound - 1:.1%} | "
              f"{values['with'] / bound - 1:.1%} | {methods['with']} |", flush=True)


if __name__ == "__main__":
    main()
