"""What the additive split's choice of pieces buys: the online bounds under three splits, side by side.

`solvers.cost_terms.additive_split` keeps, per cost term, something below the maximum of its pieces:

- *top piece*: the piece with the largest intercept (the split before 2026-11-28), its token steps linearised;
- *every piece*: for a term active in every batch whose pieces all depend on the token count alone, the line below
  their maximum (`_linearised_term`), which prices the fitted A100 model's second non-attention piece (the larger
  above about 4,087 tokens);
- *+ ranked*: also, for every other term with several pieces, the piece of intercept >= 0 whose slopes are worth the
  most on the workload's totals (`_kept_piece`), which keeps the prefill-attention piece with Σc² and prompt-token
  slopes.

Each arm switches the later ones off (`_depends_on_tokens_only` answering False, `_unchunked_totals` answering
None). All run in one process on the same workload; the best schedule is simulated once for scale. Prints a markdown
table; writes nothing.

    PYTHONPATH=. python benchmarks/split_all_pieces.py [--limit 0] [--C 8192] [--M 121752] [--scheduler work-ranked]

Defaults: all 19,366 azure-conv requests with their arrival times, the fitted (default) cost model, C = 8,192 and
M = 121,752 (what `--gpu-mem-util 0.9` gives for Llama-2-7B on the A100).
"""

from __future__ import annotations

import argparse
import time

import solvers.cost_terms as cost_terms
import solvers.lower_bound as lower_bound
from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace
from solvers import search
from solvers.search_policies import marginal_work_s


def _best_schedule(reqs, limits, cost, name: str) -> dict:
    """The summary of ``name``: a registered scheduler, or ``work-ranked`` (the search's candidate that won on the
    whole trace: least own work first, rank-i-ef's admission rules)."""
    if name != "work-ranked":
        return simulate(reqs, name, limits, cost).summary
    work = marginal_work_s(reqs, cost, limits)
    cand = search._work_ranked(limits, search._algorithm1_policy("rank-i-ef"), work, None)
    scheduler, lim = cand.build()
    return simulate(reqs, scheduler, lim, cost).summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=0, help="first requests of azure-conv (0: all)")
    ap.add_argument("--C", type=int, default=8192)
    ap.add_argument("--M", type=int, default=121_752)
    ap.add_argument("--scheduler", default="work-ranked", help="the schedule to compare with (default work-ranked)")
    args = ap.parse_args()
    reqs = load_trace("azure-conv", limit=args.limit or None)
    cost, limits = load_cost_model(), Limits(C=args.C, M=args.M)
    best = _best_schedule(reqs, limits, cost, args.scheduler)
    print(f"{len(reqs)} requests, C = {args.C}, M = {args.M}, fitted model; {args.scheduler}: mean latency "
          f"{best['mean_latency_s']:.3f} s, mean TTFT {best['mean_ttft_s']:.4f} s\n")
    arms = ("top piece", "every piece", "+ ranked")
    print(f"| objective | {' | '.join(arms)} | last / first | gap to {args.scheduler}: {', '.join(arms)} | wall s |")
    print("|---|---:|---:|---:|---:|---|---|")
    every_piece, totals = cost_terms._depends_on_tokens_only, lower_bound.LowerBounder._unchunked_totals
    switches = {"top piece": (lambda term: False, lambda self: None), "every piece": (every_piece, lambda self: None),
                "+ ranked": (every_piece, totals)}
    # the gap only for latency: a schedule ranked for latency says nothing about how low TTFT can go
    for objective, scale, found in (("mean latency", len(reqs), best["mean_latency_s"]), ("mean TTFT", 1, None)):
        values, walls = {}, {}
        for arm in arms:
            cost_terms._depends_on_tokens_only, lower_bound.LowerBounder._unchunked_totals = switches[arm]
            t = time.perf_counter()
            bounder = lower_bound.LowerBounder(reqs, limits, cost)
            bound = bounder.latency_sum_s() if objective == "mean latency" else bounder.mean_ttft_s()
            values[arm], walls[arm] = bound.value_s / scale, time.perf_counter() - t
        cost_terms._depends_on_tokens_only, lower_bound.LowerBounder._unchunked_totals = every_piece, totals
        gaps = ", ".join(f"{found / values[arm] - 1:.1%}" if found else "-" for arm in arms)
        print(f"| {objective} | {' | '.join(f'{values[arm]:.4g}' for arm in arms)} | "
              f"{values[arms[-1]] / values[arms[0]]:.2f} | {gaps} | {', '.join(f'{walls[a]:.0f}' for a in arms)} |",
              flush=True)


if __name__ == "__main__":
    main()
