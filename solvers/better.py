""""Could any schedule beat this scheduler by ``margin``?" — yes (with a validated schedule), no (with the
bound that proves it) or unknown (time limit: incumbent and bound), at any instance size.

Methods, in order, all under one time limit: the scalable lower bound (`lower_bound.py`; "no" when it
exceeds the target), the schedule search (`search.py`; "yes" when it reaches the target), and the exact
MILP when its estimated size fits the time and memory at hand (`scale.py`); a model too large is never
built. "Every schedule" means every schedule of the CSP (docs/design.md): KV-form caches with recompute
evictions and swapping; Apt-Serve's hidden-form caches are outside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from numbers import Real

from infermax.engine import SimulationTimeout, simulate
from infermax.schedule import Schedule

from .backends import SolveOptions
from .bounds import slot_bound
from .differences import compared
from .formulation import TIME_UNIT
from .lower_bound import REFINE_RESERVE_S, lower_bound_report, refine_bound
from .objective import Objective
from .optimize import optimize
from .policy import Policies, check_policies_feasible, policy_violations
from .scale import (certified_gap, checked_arguments, command_deadline, estimate_milp, milp_refusal,
                    simulation_setup_refusal)

BOUND_RTOL = 1e-6  # a bound must clear the target by this much to answer "no"
SEARCH_SHARE_WITH_MILP = 0.25  # share of the time the search gets when the MILP runs after it


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
    found_by: str | None = None
    bound_by: str | None = None
    gap: float = math.inf  # best known objective ÷ bound − 1
    methods: dict = field(default_factory=dict)
    # what the schedule found does differently from the scheduler's (`differences.differences`), when there is one
    differences: dict | None = None

    def to_dict(self) -> dict:
        """The answer's fields and its methods' as one flat mapping (``differences`` stays nested). The fields are read
        one by one: `dataclasses.asdict` deep-copied the schedule before it was dropped, 11.5 s for a schedule of the
        whole azure-conv trace, after the search had used up the time limit (`better --time-limit 120` took 130 s)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("schedule", "methods", "differences")}
        out.update(self.methods)
        if self.differences is not None:
            out["differences"] = self.differences
        return out


def better(requests, limits, cost_model, scheduler: str, margin: float, objective: Objective = Objective(makespan=1),
           policies: Policies = Policies(), options: SolveOptions | None = None, time_limit_s: float | None = None,
           progress=None, memory_budget_bytes: int | None = None, swap_cost=None,
           started_s: float | None = None) -> BetterAnswer:
    """Search for a schedule with objective <= (1 − margin) × the scheduler's on the same workload and limits.
    ``swap_cost`` times the scheduler's KV swaps (`simulate`; BROS swaps, and without it cannot be compared): a swap
    only lengthens a batch, so the bound, which charges swaps nothing, stays valid.

    ``time_limit_s`` (default: the solver options' limit, else 60 s: `command_deadline`) covers everything: the
    scheduler's own simulation, bound, search, model building and solving; ``started_s`` (``time.perf_counter()``
    time, default now): when it began."""
    if isinstance(margin, bool) or not isinstance(margin, Real) or not 0 < margin < 1:  # (NaN fails too)
        raise ValueError(f"margin must be a fraction in (0, 1), got {margin!r}")
    margin = float(margin)
    objective = checked_arguments(limits, cost_model, objective, options)
    options = options or SolveOptions()
    deadline = command_deadline(time_limit_s, options.time_limit_s, started_s)
    say = progress or (lambda msg: None)
    check_policies_feasible(requests, limits, policies)
    if too_big := simulation_setup_refusal(len(requests), deadline.left()):
        raise SimulationTimeout(f"{scheduler}'s own simulation, which sets the target, cannot finish within the time "
                                f"limit of {deadline.limit_s:g} s: {too_big}; raise the time limit")
    try:
        sim = simulate(requests, scheduler, limits, cost_model, swap_cost=swap_cost, deadline_s=deadline.at())
    except SimulationTimeout as exc:  # without the scheduler's objective there is no target to answer for
        raise SimulationTimeout(f"{scheduler}'s own simulation, which sets the target, did not finish within the time "
                                f"limit of {deadline.limit_s:g} s ({exc}); raise the time limit") from None
    answer = _answer(requests, limits, cost_model, scheduler, margin, objective, policies, options, deadline, say, sim,
                     memory_budget_bytes)
    if answer.schedule is not None:
        answer.differences = compared(sim.schedule, answer.schedule, deadline.left(), answer.methods)
    return answer


def _answer(requests, limits, cost_model, scheduler, margin, objective, policies, options, deadline, say, sim,
            memory_budget_bytes) -> BetterAnswer:
    """`better`'s answer once the scheduler's own run ``sim`` sets the target: bound, search, then the MILP."""
    base = objective.value(sim)
    target = (1 - margin) * base
    report = lower_bound_report(requests, limits, cost_model, objective, policies, time_left_s=deadline.left())
    lb_s, lb_how = report.value_s, report.method
    say(f"lower bound {lb_s:.6g} s, target {target:.6g} s ({lb_how})")
    sb = slot_bound(requests, cost_model.milp_terms(), objective, target)
    methods = {"lower_bound_s": lb_s, "lower_bound_method": lb_how}
    every, obeys = "every schedule" + policies.scope(), True
    if policies.names():  # the forced policies restrict the schedules searched, not the scheduler's own
        obeys = methods["scheduler_obeys_policies"] = not policy_violations(sim.schedule, policies, cost_model)
        if not obeys:
            every += f" (which excludes {scheduler}'s own)"
    common = dict(scheduler=scheduler, scheduler_objective_s=base, target_s=target, slot_bound=sb.slots)
    if lb_s > target * (1 + BOUND_RTOL):
        return BetterAnswer("no", f"{every} has objective >= {lb_s:.6g} s > target {target:.6g} s "
                            f"({margin:.0%} below {scheduler}'s {base:.6g} s); {lb_how}", found_s=None, bound_s=lb_s,
                            slots=0, solver_status=None, bound_by="lower bound",
                            gap=certified_gap(base if obeys else None, lb_s), methods=methods, **common)
    if sb.slots is not None and sb.slots < 1:
        return BetterAnswer("no", f"no schedule can reach {target:.6g} s: even one batch exceeds it ({sb.reason})",
                            found_s=None, bound_s=math.inf, slots=0, solver_status=None, bound_by="slot bound",
                            gap=0.0, methods=methods, **common)
    slots = sb.slots if sb.slots is not None else len(sim.schedule.batches)
    estimate = estimate_milp(len(requests), slots)
    refusal = milp_refusal(estimate, deadline.left(), memory_budget_bytes)
    methods.update(estimate.to_dict(), milp_refused=refusal)
    share = SEARCH_SHARE_WITH_MILP if refusal is None else 1.0
    from .search import search_within

    found = search_within(requests, limits, cost_model, objective, deadline.left() * share, policies, say)
    # the incumbent is a schedule the forced policies allow: the scheduler's own only if it obeys them
    best_s, best_by, best_schedule = (base, scheduler, None) if obeys else (math.inf, None, None)
    if found is not None:
        methods.update(found.report())
        if found.schedule is not None and found.value_s < best_s:
            best_s, best_by, best_schedule = found.value_s, f"search: {found.method}", found.schedule
    if best_s <= target:
        gain = 1 - best_s / base
        return BetterAnswer("yes", f"found a schedule {gain:.1%} better than {scheduler} ({best_s:.6g} s vs {base:.6g} s, "
                            f"{best_by}), validated by replay", found_s=best_s, bound_s=lb_s, slots=slots,
                            solver_status=None, schedule=best_schedule, found_by=best_by, bound_by="lower bound",
                            gap=certified_gap(best_s, lb_s), methods=methods, **common)
    if refusal is not None and report.refinable is not None:  # unsettled, no MILP: the time left tightens the bound
        report = refine_bound(report, deadline.left() - REFINE_RESERVE_S, say)
        if report.value_s > lb_s:
            lb_s, lb_how = report.value_s, report.method
            methods.update(lower_bound_s=lb_s, lower_bound_method=lb_how)
            say(f"lower bound {lb_s:.6g} s ({lb_how})")
            if lb_s > target * (1 + BOUND_RTOL):
                return BetterAnswer("no", f"{every} has objective >= {lb_s:.6g} s > target {target:.6g} s "
                                    f"({margin:.0%} below {scheduler}'s {base:.6g} s); {lb_how}",
                                    found_s=_finite(best_s), bound_s=lb_s, slots=0, solver_status=None,
                                    bound_by="lower bound", gap=certified_gap(best_s, lb_s), methods=methods,
                                    **common)
    if refusal is not None:
        best = (f"the search's best is {best_s:.6g} s ({best_by}) and the lower bound {lb_s:.6g} s: target "
                f"{target:.6g} s lies between" if best_by else f"the search found no schedule{policies.scope()}; the "
                f"lower bound {lb_s:.6g} s is below target {target:.6g} s")
        return BetterAnswer("unknown", f"{refusal}; {best}", found_s=_finite(best_s), bound_s=lb_s,
                            slots=slots, solver_status=None, schedule=best_schedule, found_by=best_by,
                            bound_by="lower bound", gap=certified_gap(best_s, lb_s), methods=methods, **common)
    return _better_by_milp(requests, limits, cost_model, objective, policies, options, deadline,
                           sim.schedule if obeys else None, sb, slots, lb_s, best_s, best_by, best_schedule, methods,
                           common, margin, every)


def _finite(value_s: float) -> float | None:
    """An objective, or None for "no schedule" (inf)."""
    return value_s if math.isfinite(value_s) else None


def _better_by_milp(requests, limits, cost_model, objective, policies, options, deadline, own, sb, slots, lb_s,
                    best_s, best_by, best_schedule, methods, common, margin, every) -> BetterAnswer:
    """The exact MILP's verdict; ``own``: the scheduler's schedule when the forced policies allow it (a warm start),
    else None."""
    scheduler, base, target = common["scheduler"], common["scheduler_objective_s"], common["target_s"]
    # the solver's time limit comes from the deadline, after the model is built (`optimize`)
    options = replace(options, stop_if_incumbent_below=target * TIME_UNIT,
                      stop_if_bound_above=target * TIME_UNIT * (1 + BOUND_RTOL))
    warm = best_schedule if best_schedule is not None and len(best_schedule.batches) <= slots else (
        own if own is not None and len(own.batches) <= slots else None)
    res = optimize(requests, limits, cost_model, objective, policies, slots=slots, warm_start=warm, options=options,
                   budget_s=target, objective_cut_s=lb_s or None, deadline=deadline)
    status = res.solve.status if res.solve else None
    bound = max(lb_s, res.bound_s) if sb.slots is not None else lb_s
    common.update(slots=slots, solver_status=status)
    if res.value_s is not None and res.value_s < best_s:
        best_s, best_by, best_schedule = res.value_s, "MILP", res.schedule
    gap = certified_gap(best_s, bound)
    if best_s <= target:
        gain = 1 - best_s / base
        return BetterAnswer("yes", f"found a schedule {gain:.1%} better than {scheduler} ({best_s:.6g} s vs "
                            f"{base:.6g} s), validated by replay", found_s=best_s, bound_s=bound, schedule=best_schedule,
                            found_by=best_by, bound_by="MILP", gap=gap, methods=methods, **common)
    proven = res.status == "infeasible" or res.bound_s > target * (1 + BOUND_RTOL)
    found = None if res.value_s is None else res.value_s
    if proven and sb.slots is not None:
        why = (f"no schedule{policies.scope()} reaches target {target:.6g} s (the model with that budget is infeasible)"
               if res.status == "infeasible" else f"{every} has objective >= {res.bound_s:.6g} s > target {target:.6g} s")
        return BetterAnswer("no", f"{why} "
                            f"({margin:.0%} below {scheduler}'s {base:.6g} s); slots {slots} cover every schedule that "
                            f"good ({sb.reason})", found_s=found, bound_s=res.bound_s, bound_by="MILP",
                            gap=gap, methods=methods, **common)
    if proven:
        return BetterAnswer("unknown", f"no schedule{policies.scope()} of at most {slots} batches reaches {target:.6g} "
                            f"s, but the batch count cannot be bounded for this objective ({sb.reason})", found_s=found,
                            bound_s=bound, bound_by="lower bound", gap=gap, methods=methods, **common)
    inc = "none" if res.value_s is None else f"{res.value_s:.6g} s"
    return BetterAnswer("unknown", f"solver stopped ({status}) with incumbent {inc} and bound {bound:.6g} s; "
                        f"target {target:.6g} s lies {'between' if math.isfinite(best_s) else 'above the bound'}",
                        found_s=_finite(best_s), bound_s=bound, schedule=best_schedule, found_by=best_by,
                        bound_by="lower bound" if bound == lb_s else "MILP", gap=gap, methods=methods, **common)
