"""Optimal schedules: build the MILP, warm-start it from a Schedule, solve, and accept a solution only
after the replayer validated it and reproduced the solver's objective."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import pulp

from infermax.engine import check_fits, check_requests
from infermax.limits import Limits
from infermax.replay import ScheduleViolation, replay
from infermax.request import Request
from infermax.schedule import Schedule

from .assign import label_identical, set_from_schedule, to_schedule, violations
from .backends import SolveOptions, SolveOutcome, SolverFailed, quiet_stdout, relative_gap, solve
from .bounds import SlotBound, slot_bound
from .formulation import TIME_UNIT, Formulation, Strengthening
from .objective import Objective
from .scale import Deadline, checked_arguments
from .policy import Policies, check_policies_feasible

REPLAY_RTOL = 1e-6


class SolutionRejected(RuntimeError):
    """The solver's solution failed replay, or the replayed objective differs from the solver's."""


@dataclass
class OptimizeResult:
    """``status``: optimal (proven within the MIP gap over ``slots`` slots) | feasible (an incumbent,
    not proven) | infeasible | no_solution. ``global_optimum``: ``slots`` is at least the slot bound,
    so an optimum over the slots is an optimum over all schedules. Values in seconds."""

    status: str
    objective: Objective
    value_s: float | None
    solver_value_s: float | None
    bound_s: float
    slots: int
    slot_bound: SlotBound
    schedule: Schedule | None
    result: object | None
    solve: SolveOutcome | None
    warm_start: dict | None = None
    size: dict = field(default_factory=dict)
    policies: Policies = Policies()

    @property
    def gap(self) -> float:
        return relative_gap(self.value_s if self.value_s is not None else math.inf, self.bound_s)

    @property
    def global_optimum(self) -> bool:
        return self.slot_bound.slots is not None and self.slots >= self.slot_bound.slots

    def summary(self) -> dict:
        out = {
            "status": self.status, "objective": str(self.objective),
            "objective_s": self.value_s, "solver_objective_s": self.solver_value_s,
            "best_bound_s": self.bound_s, "gap": self.gap,
            "slots": self.slots, "slot_bound": self.slot_bound.slots, "slot_bound_reason": self.slot_bound.reason,
            "optimal_over_all_schedules": self.status == "optimal" and self.global_optimum,
            "policies": self.policies.names(),
            "solver": self.solve.backend if self.solve else None,
            "solver_status": self.solve.status if self.solve else None,
            "solve_wall_s": self.solve.wall_s if self.solve else None,
            "solver_notes": "; ".join(self.solve.notes) if self.solve and self.solve.notes else None,
            **{f"model_{k}": v for k, v in self.size.items()},
        }
        if self.warm_start is not None:
            out.update({f"warm_start_{k}": v for k, v in self.warm_start.items() if k != "violations"})
        if self.result is not None:
            out.update({f"replay_{k}": self.result.summary[k] for k in
                        ("num_batches", "makespan_s", "mean_latency_s", "mean_ttft_s", "evictions")})
        return out


def objective_of(schedule: Schedule, cost_model, objective: Objective) -> float:
    return objective.value(replay(schedule, cost_model))


def choose_slots(requests, cost_model, objective: Objective, slots: int | None, warm: Schedule | None,
                 budget_s: float | None) -> tuple[int, SlotBound]:
    """The slot count: ``slots`` if given, else the bound implied by ``budget_s`` (the warm start's
    objective), else the warm start's batch count."""
    sb = SlotBound(None, "no warm start or objective budget given")
    if budget_s is not None:
        sb = slot_bound(requests, cost_model.milp_terms(), objective, budget_s)
    if slots is not None:
        return slots, sb
    if sb.slots is not None:
        return max(sb.slots, 1), sb
    if warm is not None:
        return len(warm.batches), sb
    raise ValueError(f"give the number of slots: no slot bound could be derived ({sb.reason})")


def optimize(requests: list[Request], limits: Limits, cost_model, objective: Objective = Objective(makespan=1),
             policies: Policies = Policies(), slots: int | None = None, warm_start: Schedule | None = None,
             options: SolveOptions | None = None, budget_s: float | None = None,
             objective_cut_s: float | None = None, strengthening: Strengthening = Strengthening(),
             deadline: Deadline | None = None) -> OptimizeResult:
    """Solve the CSP for ``requests``; see `OptimizeResult`. ``budget_s`` overrides the objective value
    used to bound the slots (default: the warm start's). ``objective_cut_s``: a lower bound over every
    schedule, added as a cut (`Formulation`). ``strengthening``: optional symmetry breaking and cuts (changes
    the solve time, never the optimum). ``deadline``: the command's. Handing the model to the solver and the final
    LP that polishes the solution (which hands it over again) each take about the build time ``b`` (B = 32,
    I = 4, O = 2: a 1.81 s build, a 1.57 s polish; B = 8 mixes once ended 34 s over a 300 s limit without this
    reserve). So the solver's process is stopped, if it has not returned (HiGHS can overrun its own limit:
    `backends.solve`), when ``b`` + 1 s of the deadline are left, for the polish and the replay; and the solver's
    own limit is ``b`` + 2 s before that, for the hand-over and a margin."""
    objective = checked_arguments(limits, cost_model, objective, options)
    options = options or SolveOptions()
    check_requests(requests)
    check_fits(requests, limits)
    check_policies_feasible(requests, limits, policies)
    warm_info = None
    if warm_start is not None:
        warm_value = objective_of(warm_start, cost_model, objective)
        warm_info = {"scheduler": warm_start.meta.get("scheduler"), "objective_s": warm_value,
                     "batches": len(warm_start.batches)}
        budget_s = warm_value if budget_s is None else budget_s
    K, sb = choose_slots(requests, cost_model, objective, slots, warm_start, budget_s)
    built_from = time.perf_counter()
    form = Formulation(requests, limits, cost_model, K, objective, policies, objective_cut_s, strengthening)
    warm = False
    if warm_start is not None:
        if len(warm_start.batches) > K:
            warm_info.update(accepted=False, reason=f"{len(warm_start.batches)} batches do not fit {K} slots")
        else:
            set_from_schedule(form, label_identical(form, warm_start), cost_model)
            bad = violations(form.prob)
            warm = not bad
            warm_info.update(accepted=warm, model_objective_s=form.objective_s(), violations=bad[:10])
            if bad:
                warm_info["reason"] = "breaks " + "; ".join(bad[:3])
    if deadline is not None:  # see the docstring
        build_s = time.perf_counter() - built_from
        stop_after_s = max(deadline.left() - build_s - 1.0, 2.0)
        options = replace(options, stop_after_s=stop_after_s, time_limit_s=max(stop_after_s - build_s - 2.0, 1.0))
    outcome = solve(form.prob, options, warm=warm)
    base = dict(objective=objective, slots=K, slot_bound=sb, solve=outcome, warm_start=warm_info, size=form.size(),
                policies=policies)
    bound_s = outcome.bound / TIME_UNIT
    if warm and outcome.status == "infeasible":
        raise SolverFailed(f"{outcome.backend} declared the model infeasible although the warm start satisfies "
                           "every constraint")
    if not outcome.has_solution:
        status = "infeasible" if outcome.status == "infeasible" else "no_solution"
        return OptimizeResult(status, value_s=None, solver_value_s=None, bound_s=bound_s, schedule=None, result=None, **base)
    solver_value = polish(form)
    schedule = to_schedule(form, {"scheduler": "milp", "objective": str(objective), "solver": outcome.backend,
                                  "solver_objective_s": solver_value, "slots": K})
    try:
        result = replay(schedule, cost_model)
    except ScheduleViolation as exc:
        raise SolutionRejected(f"the solver's solution does not replay: {exc}") from exc
    value = objective.value(result)
    if abs(value - solver_value) > REPLAY_RTOL * max(abs(value), abs(solver_value), 1e-12):
        raise SolutionRejected(
            f"replayed objective {value:.12g} s differs from the solver's {solver_value:.12g} s "
            f"(relative {abs(value - solver_value) / max(abs(value), 1e-12):.3g} > {REPLAY_RTOL}); result rejected")
    status = "optimal" if outcome.status == "optimal" else "feasible"
    bound_s = min(bound_s, value) if status == "optimal" else bound_s
    return OptimizeResult(status, value_s=value, solver_value_s=solver_value, bound_s=bound_s, schedule=schedule,
                          result=result, **base)


def polish(form: Formulation) -> float:
    """Round the integer variables, fix them and re-solve the LP: every continuous variable (batch,
    finish and first-token times) then takes its exact value. Returns the objective in seconds."""
    fixed = []
    for v in form.prob.variables():
        if v.cat == pulp.LpInteger:
            fixed.append((v, v.lowBound, v.upBound))
            v.lowBound = v.upBound = round(v.varValue)
    try:
        with quiet_stdout():
            form.prob.solve(pulp.HiGHS(msg=False, primal_feasibility_tolerance=1e-10))
        if form.prob.status != pulp.LpStatusOptimal:
            raise SolutionRejected("the rounded integer solution is infeasible in the MILP")
        for v, lo, hi in fixed:
            v.varValue = round(v.varValue)
        return form.objective_s()
    finally:
        for v, lo, hi in fixed:
            v.lowBound, v.upBound = lo, hi
