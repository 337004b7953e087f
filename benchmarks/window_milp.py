"""Re-optimising the first batches of the search's best schedule with the exact MILP: tried, not kept.

Issue 21 suggests a large-neighbourhood search that re-optimises windows of a schedule with the existing MILP. This
script measures what the simplest such window can give: the first W batches of the best schedule the search finds
(offline instances, so the window starts from the empty state), with every request pinned to the state it has after
them in that schedule (tokens generated, and KV tokens if it is unfinished), so that the rest of the schedule replays
unchanged and takes the same time. Every objective the MILP knows is then the window's own (a request unfinished at
the window's end counts the window's end; what follows is shifted by the same amount for everyone), so

- the window MILP's solution, spliced before the unchanged rest, is a full schedule (the replayer checks it and gives
  its objective), and
- the window MILP's dual bound says how much *any* re-arrangement of those W batches that reaches the same state can
  save: "at most" below. It is not a bound over every schedule (a schedule that reaches another state is not
  covered).

Identical requests are not labelled by finishing order here (`Strengthening(symmetry="none")`): the pins name each
request's own state.

    PYTHONPATH=. python benchmarks/window_milp.py [--windows 8 14 20] [--milp-limit 60] [--search-limit 30]

Prints one JSON line per (instance, window). Measured on 2026-11-29 (2-core machine, HiGHS, nothing else running):
see ``docs/design.md``, "Schedule search", "Window re-optimisation with the MILP".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pulp  # noqa: E402

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.replay import Replayer, replay  # noqa: E402
from infermax.schedule import Schedule  # noqa: E402
from infermax.workload import fixed, heterogeneous_mix  # noqa: E402
from solvers.assign import set_from_schedule, to_schedule, violations  # noqa: E402
from solvers.backends import SolveOptions, solve  # noqa: E402
from solvers.formulation import TIME_UNIT, Formulation, Strengthening  # noqa: E402
from solvers.objective import Objective  # noqa: E402
from solvers.optimize import polish  # noqa: E402
from solvers.policy import Policies  # noqa: E402
from solvers.search import search  # noqa: E402

# (name, requests, cost-model family, objective): the README's B = 8 and B = 16 latency rows (default model, gaps
# 12.1% and 21.7%) and the A.3 mix with the largest latency gap at B = 16 (paper's linear model, 16.4%)
INSTANCES = (
    ("I=512 O=128 B=8", lambda: fixed(512, 128, 8), "auto", "latency"),
    ("I=512 O=128 B=16", lambda: fixed(512, 128, 16), "auto", "latency"),
    ("LISO+SISO B=16", lambda: heterogeneous_mix("LISO+SISO", 16, seed=0), "linear", "latency"),
)


def prefix_window(schedule: Schedule, window: int, cost_model, objective: Objective, limit_s: float) -> dict:
    """Re-optimise ``schedule``'s first ``window`` batches with the MILP (module docstring)."""
    requests = schedule.requests
    rp = Replayer(requests, schedule.limits, cost_model)
    for batch in schedule.batches[:window]:
        rp.apply(batch)
    t = time.perf_counter()
    form = Formulation(requests, schedule.limits, cost_model, window, objective, Policies(),
                       strengthening=Strengthening(symmetry="none"), finish_all=False)
    for i, r in enumerate(requests):
        s = rp.states[r.id]
        form.prob += pulp.lpSum(form.cells[i][j].g for j in range(window)) == s.generated, f"pin_generated_{i}"
        if s.generated < r.output_tokens:
            form.prob += form.cells[i][window - 1].m == s.m, f"pin_kv_{i}"
    set_from_schedule(form, Schedule(requests, schedule.limits, schedule.batches[:window], dict(schedule.meta)),
                      cost_model)
    bad = violations(form.prob)
    if bad:
        raise RuntimeError(f"the incumbent's window breaks its own pinned model: {bad[:3]}")
    window_incumbent_s = form.objective_s()
    build_s = time.perf_counter() - t
    outcome = solve(form.prob, SolveOptions(time_limit_s=limit_s), warm=True)
    window_found_s = polish(form)
    spliced = Schedule(requests, schedule.limits, to_schedule(form, {}).batches + schedule.batches[window:],
                       dict(schedule.meta))
    whole_s = objective.value(replay(spliced, cost_model))  # the judge
    incumbent_s = objective.value(replay(schedule, cost_model))
    bound_s = min(outcome.bound / TIME_UNIT, window_found_s)
    return {"window": window, "cells": len(requests) * window, **form.size(), "build_s": round(build_s, 2),
            "status": outcome.status, "solve_s": round(outcome.wall_s, 1),
            "window_incumbent_s": window_incumbent_s, "window_found_s": window_found_s, "window_bound_s": bound_s,
            "incumbent_s": incumbent_s, "spliced_s": whole_s,
            "improved_pct": 100 * (1 - whole_s / incumbent_s),
            "at_most_pct": 100 * (window_incumbent_s - bound_s) / incumbent_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, nargs="+", default=[8, 14, 20])
    ap.add_argument("--milp-limit", type=float, default=60.0, help="seconds per window MILP")
    ap.add_argument("--search-limit", type=float, default=30.0, help="seconds for the search that gives the incumbent")
    a = ap.parse_args()
    limits = Limits(C=4096, M=100_000)
    for name, make, family, objective_name in INSTANCES:
        requests, cost_model, objective = make(), load_cost_model(kind=family), Objective.parse(objective_name)
        found = search(requests, limits, cost_model, objective, time_limit_s=a.search_limit)
        for window in a.windows:
            if window > len(found.schedule.batches):
                continue
            row = prefix_window(found.schedule, window, cost_model, objective, a.milp_limit)
            print(json.dumps({"instance": name, "cost_model": family, "objective": objective_name,
                              "found_by": found.method, "batches": len(found.schedule.batches), **row}), flush=True)


if __name__ == "__main__":
    main()
