"""Choosing the method by instance size: the exact MILP where it can be built and solved within the time
and memory at hand, the scalable lower bound plus the schedule search everywhere.

`estimate_milp` predicts a model's size *before* it is built (one PuLP constraint object per row, which is
what fills memory); `milp_refusal` says why a model must not be built (too large for the memory budget or
for the time left), and callers then fall back to bound + search. Calibration of the estimate (this
machine, HiGHS 1.16, default A100 Llama-2-7B profile; `Formulation(...).size()` and peak RSS):

| B × slots | I, O | cells | variables | constraints | build s | peak RSS |
|---|---|---|---|---|---|---|
| 2 × 264 | 512, 128 | 528 | 41,710 | 97,141 | 5.0 | 307 MB |
| 8 × 64 | 512, 128 | 512 | 35,320 | 87,127 | 5.1 | 285 MB |
| 16 × 40 | 64, 4 | 640 | 28,864 | 76,519 | 4.8 | 262 MB |

i.e. at most ~190 constraints per (request, slot) cell plus ~370 per slot (the step binaries), built at
~15,000 constraints/s, ~3 KB per constraint once the solver holds its copy. The estimate uses those
upper rates, so it overstates rather than understates.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

CONSTRAINTS_PER_CELL = 190
CONSTRAINTS_PER_SLOT = 370
VARIABLES_PER_CELL = 80
BYTES_PER_CONSTRAINT = 3_000
CONSTRAINTS_PER_S = 15_000
# the model may use at most this share of the time left (building and the LP root need the rest)
BUILD_TIME_SHARE = 0.25


def available_memory_bytes() -> int:
    """Physical memory currently available (Linux ``MemAvailable``; else total physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class MilpEstimate:
    cells: int
    variables: int
    constraints: int
    memory_bytes: int
    build_s: float

    def to_dict(self) -> dict:
        return {"milp_cells": self.cells, "milp_variables_est": self.variables,
                "milp_constraints_est": self.constraints, "milp_memory_est_mb": round(self.memory_bytes / 2**20),
                "milp_build_est_s": round(self.build_s, 1)}


def estimate_milp(num_requests: int, slots: int) -> MilpEstimate:
    """Upper estimate of the MILP's size over ``slots`` batch slots (see the module docstring)."""
    cells = num_requests * slots
    constraints = CONSTRAINTS_PER_CELL * cells + CONSTRAINTS_PER_SLOT * slots
    return MilpEstimate(cells, VARIABLES_PER_CELL * cells, constraints, BYTES_PER_CONSTRAINT * constraints,
                        constraints / CONSTRAINTS_PER_S)


def milp_refusal(est: MilpEstimate, time_left_s: float, memory_budget_bytes: int | None = None) -> str | None:
    """Why a model of this size must not be built (None: it may be). ``memory_budget_bytes`` defaults to half
    the available memory."""
    budget = memory_budget_bytes if memory_budget_bytes is not None else available_memory_bytes() // 2
    if est.memory_bytes > budget:
        return (f"the exact MILP ({est.cells:,} request×slot cells, ~{est.constraints:,} constraints) would need "
                f"~{est.memory_bytes / 2**30:.1f} GiB, more than the {budget / 2**30:.1f} GiB budget")
    if est.build_s > BUILD_TIME_SHARE * time_left_s:
        return (f"the exact MILP ({est.cells:,} cells, ~{est.constraints:,} constraints) would take ~{est.build_s:.0f} s "
                f"to build, more than {BUILD_TIME_SHARE:.0%} of the {time_left_s:.0f} s left")
    return None


# Per-request costs below which a command cannot even start on its workload (this machine, 2 cores, fixed-grid
# requests, 2026-11-28; B = 20,000 and 1,000,000 alike): building a request ~2 µs, the lower bound's core (its
# makespan LP; the optional ingredients stop at their deadline) ~1.9 µs, a simulation's state before its first batch
# (the replayer's and the scheduler's) ~1.5 µs. `startup_refusal` refuses only when these lower rates alone exceed
# the limit: 1,000,000 requests under --time-limit 1 spent 16 s, 3.9 s of it in a warm start's set-up.
BUILD_AND_BOUND_S_PER_REQUEST = 3.5e-6
SIMULATION_SETUP_S_PER_REQUEST = 1.5e-6


def startup_refusal(num_requests: int, time_limit_s: float) -> str | None:
    """Why a command under ``time_limit_s`` must not start on ``num_requests`` requests (None: it may): building
    them and their lower bound alone would take longer (`BUILD_AND_BOUND_S_PER_REQUEST`). The limit it advises is
    twice that estimate, so that the warm start and the search get about as long again."""
    need_s = num_requests * BUILD_AND_BOUND_S_PER_REQUEST
    if need_s <= time_limit_s:
        return None
    return (f"{num_requests:,} requests: building them and their lower bound alone take about {need_s:.1f} s here "
            f"(~{BUILD_AND_BOUND_S_PER_REQUEST * 1e6:.1f} µs per request), more than the time limit of "
            f"{time_limit_s:g} s; raise --time-limit to at least {math.ceil(2 * need_s)} s")


def simulation_setup_refusal(num_requests: int, time_left_s: float) -> str | None:
    """Why a simulation of ``num_requests`` requests must not start with ``time_left_s`` left (None: it may): its
    set-up alone would take longer (`SIMULATION_SETUP_S_PER_REQUEST`), before its first look at the clock. Runs of
    at most the engine's `LARGE_RUN_REQUESTS` always may: their first iterations go unwatched anyway, so that a
    small instance's warm start or first search candidate finishes under any time limit (its set-up takes < 0.1 s)."""
    from infermax.engine import LARGE_RUN_REQUESTS

    need_s = num_requests * SIMULATION_SETUP_S_PER_REQUEST
    if num_requests <= LARGE_RUN_REQUESTS or need_s <= time_left_s:
        return None
    return (f"setting up a simulation of {num_requests:,} requests takes about {need_s:.1f} s, more than the "
            f"{time_left_s:.1f} s left")


DEFAULT_TIME_LIMIT_S = 60.0  # the command line's --time-limit default


def command_deadline(time_limit_s: float | None, options_limit_s: float | None, started_s: float | None) -> "Deadline":
    """The one `Deadline` of `analyse` or `better`: ``time_limit_s``, else the solver options' limit, else
    `DEFAULT_TIME_LIMIT_S` (a Python call without either ended in a TypeError: everything these do is sized by the
    time left); a limit that is not a finite number > 0 is a ValueError."""
    limit_s = time_limit_s if time_limit_s is not None else options_limit_s
    if limit_s is None:
        limit_s = DEFAULT_TIME_LIMIT_S
    if isinstance(limit_s, bool) or not isinstance(limit_s, (int, float)) or not 0 < limit_s < math.inf:
        raise ValueError(f"the time limit must be a finite number of seconds > 0, got {limit_s!r}")
    return Deadline(float(limit_s), started_s)


class Deadline:
    """One time limit over a whole command: ``left()`` seconds remain. ``start_s`` (a ``time.perf_counter()``
    time; default: now): when the command began, so that building its workload counts too."""

    def __init__(self, limit_s: float, start_s: float | None = None):
        self.limit_s = limit_s
        self.start = time.perf_counter() if start_s is None else start_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return max(0.0, self.limit_s - self.elapsed())

    def at(self) -> float:
        """The ``time.perf_counter()`` time at which the limit is reached (for `simulate`'s ``deadline_s``)."""
        return self.start + self.limit_s


def checked_arguments(limits, cost_model, objective, options):
    """The Python arguments of `optimize`, `analyse`, `better` and `lower_bound_report` (``options`` None there),
    checked before any work (a dict of limits, a cost model's name or an objective's text had ended in
    AttributeErrors deep inside): ``limits`` a `Limits`, ``cost_model`` one with ``milp_terms`` (every fitted and
    roofline model has them), ``options`` a `SolveOptions` or None, ``objective`` an `Objective` or its text
    (`Objective.parse`: ``"latency"``, ``"makespan=1,ttft=0.5"``), returned as an `Objective`. Then
    `refuse_prefix_caching`."""
    from infermax.limits import Limits

    from .backends import SolveOptions
    from .objective import Objective

    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be an infermax.limits.Limits, got {type(limits).__name__} {limits!r:.60}")
    if not hasattr(cost_model, "milp_terms"):
        raise TypeError(f"cost_model must be a cost model with milp_terms (infermax.costmodel.load_cost_model builds "
                        f"one), got {type(cost_model).__name__} {cost_model!r:.60}")
    if options is not None and not isinstance(options, SolveOptions):
        raise TypeError(f"options must be a solvers.SolveOptions or None, got {type(options).__name__} {options!r:.60}")
    if isinstance(objective, str):
        objective = Objective.parse(objective)
    elif not isinstance(objective, Objective):
        raise TypeError(f"objective must be a solvers.objective.Objective or its text (e.g. 'latency'), got "
                        f"{type(objective).__name__} {objective!r:.60}")
    refuse_prefix_caching(limits)
    return objective


def refuse_prefix_caching(limits) -> None:
    """The MILP, the lower bounds and the search model no prefix caching (a hit makes a prefill cheaper
    than any of them allows, so their bounds would not be bounds): refuse such an instance."""
    if getattr(limits, "prefix_caching", False):
        raise ValueError("the optimizer, lower bounds and schedule search do not model prefix caching "
                         "(Limits.prefix_caching): a cache hit makes prefills cheaper than their bounds allow; "
                         "simulate instead, or turn caching off")


def certified_gap(incumbent_s: float | None, bound_s: float) -> float:
    """incumbent ÷ bound − 1 (inf without an incumbent or a positive bound)."""
    if incumbent_s is None or not math.isfinite(incumbent_s) or bound_s <= 0:
        return math.inf
    return max(0.0, incumbent_s / bound_s - 1)
