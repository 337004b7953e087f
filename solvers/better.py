""""Could any schedule beat this scheduler by ``margin``?" — yes (with a validated schedule), no (with the
bound that proves it) or unknown (time limit: incumbent and bound)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from infermax.engine import simulate
from infermax.schedule import Schedule

from .backends import SolveOptions
from .bounds import slot_bound
from .formulation import TIME_UNIT
from .objective import Objective
from .optimize import optimize
from .policy import Policies

BOUND_RTOL = 1e-6  # the solver's bound must clear the target by this much to answer "no"


@dataclass
class BetterAnswer:
    answer: str  # yes | no | unknown
    explanation: str
    scheduler: str
    scheduler_objective_s: float
    target_s: float
    found_s: float | None
    bound_s: float
    slots: int
    slot_bound: int | None
    solver_status: str | None
    schedule: Schedule | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "schedule"}


def better(requests, limits, cost_model, scheduler: str, margin: float, objective: Objective = Objective(makespan=1),
           policies: Policies = Policies(), options: SolveOptions | None = None) -> BetterAnswer:
    """Search for a schedule with objective <= (1 − margin) × the scheduler's on the same workload and limits.

    The slots are bounded with the target as budget (any schedule that good has at most that many
    non-empty batches), so "no" covers every schedule, not only those of some length."""
    sim = simulate(requests, scheduler, limits, cost_model)
    base = objective.value(sim)
    target = (1 - margin) * base
    sb = slot_bound(requests, cost_model.milp_terms(), objective, target)
    common = dict(scheduler=scheduler, scheduler_objective_s=base, target_s=target, slot_bound=sb.slots)
    if sb.slots is not None and sb.slots < 1:
        return BetterAnswer("no", f"no schedule can reach {target:.6g} s: even one batch exceeds it ({sb.reason})",
                            found_s=None, bound_s=math.inf, slots=0, solver_status=None, **common)
    slots = sb.slots if sb.slots is not None else len(sim.schedule.batches)
    options = replace(options or SolveOptions(), stop_if_incumbent_below=target * TIME_UNIT,
                      stop_if_bound_above=target * TIME_UNIT * (1 + BOUND_RTOL))
    warm = sim.schedule if len(sim.schedule.batches) <= slots else None
    res = optimize(requests, limits, cost_model, objective, policies, slots=slots, warm_start=warm, options=options,
                   budget_s=target)
    status = res.solve.status if res.solve else None
    common.update(found_s=res.value_s, bound_s=res.bound_s, slots=slots, solver_status=status)
    if res.value_s is not None and res.value_s <= target:
        gain = 1 - res.value_s / base
        return BetterAnswer("yes", f"found a schedule {gain:.1%} better than {scheduler} ({res.value_s:.6g} s vs "
                            f"{base:.6g} s), validated by replay", schedule=res.schedule, **common)
    proven = res.status == "infeasible" or res.bound_s > target * (1 + BOUND_RTOL)
    if proven and sb.slots is not None:
        why = (f"no schedule reaches target {target:.6g} s (the model with that budget is infeasible)"
               if res.status == "infeasible" else f"every schedule has objective >= {res.bound_s:.6g} s > target {target:.6g} s")
        return BetterAnswer("no", f"{why} "
                            f"({margin:.0%} below {scheduler}'s {base:.6g} s); slots {slots} cover every schedule that "
                            f"good ({sb.reason})", **common)
    if proven:
        return BetterAnswer("unknown", f"no schedule of at most {slots} batches reaches {target:.6g} s, but the batch "
                            f"count cannot be bounded for this objective ({sb.reason})", **common)
    inc = "none" if res.value_s is None else f"{res.value_s:.6g} s"
    return BetterAnswer("unknown", f"solver stopped ({status}) with incumbent {inc} and bound {res.bound_s:.6g} s; "
                        f"target {target:.6g} s lies between", **common)
