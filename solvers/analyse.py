"""``infermax optimize`` at any size: the best schedule found and a lower bound, with the certified gap and
which method produced each, under one time limit.

Methods: the warm-start scheduler's schedule, the schedule search (`search.py`), the exact MILP when its
estimated size fits the time and memory at hand (`scale.py`; never built otherwise), and the aggregate
lower bound (`lower_bound.py`). "optimal" is claimed only when the MILP proves it over all schedules or
the incumbent meets the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infermax.engine import SimulationTimeout, check_fits, check_requests, simulate
from infermax.schedulers import InfeasibleRequestError, SchedulerError
from infermax.schedule import Schedule

from .backends import SolveOptions
from .differences import compared
from .lower_bound import REFINE_RESERVE_S, lower_bound_report, refine_bound
from .objective import Objective
from .optimize import OptimizeResult, choose_slots, optimize
from .policy import Policies, check_policies_feasible, policy_violations
from .scale import (Deadline, certified_gap, checked_arguments, command_deadline, estimate_milp, milp_refusal,
                    simulation_setup_refusal)

# "optimal" when the incumbent is within this relative distance of a valid lower bound. It must exceed the lower
# bound's own safety margin (`small_lp.LP_SAFETY_RTOL`, 1e-6, which keeps LP round-off from lifting a bound above
# the optimum), or a bound that meets the optimum exactly could never certify it; the MILP declares optimality at a
# relative gap of 1e-6 (`SolveOptions.mip_gap`). So "optimal" means: no schedule is better by more than 0.001%.
OPTIMAL_RTOL = 1e-5
SEARCH_SHARE_WITH_MILP = 0.25
AUTO_WARM_START = "auto"


@dataclass
class Analysis:
    objective: Objective
    incumbent_s: float | None
    incumbent_by: str | None
    schedule: Schedule | None
    bound_s: float
    bound_by: str
    status: str  # optimal | feasible | no_solution
    elapsed_s: float
    milp: OptimizeResult | None = None
    details: dict = field(default_factory=dict)
    # what the best schedule does differently from the warm start's (`differences.differences`), when it is another
    differences: dict | None = None

    @property
    def gap(self) -> float:
        return certified_gap(self.incumbent_s, self.bound_s)

    def summary(self) -> dict:
        out = {"status": self.status, "objective": str(self.objective), "objective_s": self.incumbent_s,
               "found_by": self.incumbent_by, "lower_bound_s": self.bound_s, "bound_by": self.bound_by,
               "certified_gap": self.gap, "optimal_over_all_schedules": self.status == "optimal",
               "wall_s": self.elapsed_s, **self.details}
        if self.milp is not None:
            out.update({f"milp_{k}" if k in ("status", "objective_s", "gap") else k: v
                        for k, v in self.milp.summary().items() if k not in ("objective", "optimal_over_all_schedules")})
        if self.differences is not None:
            out["differences"] = self.differences
        return out


def meets(incumbent_s: float, bound_s: float) -> bool:
    """Whether an incumbent is certified optimal by a lower bound (within `OPTIMAL_RTOL`)."""
    return bound_s > 0 and incumbent_s <= bound_s * (1 + OPTIMAL_RTOL)


def default_warm_start(requests, limits, policies: Policies) -> str:
    """The scheduler `AUTO_WARM_START` stands for: vLLM (the paper's baseline), unless a prompt is longer than the
    min(C, P) that vLLM prefills in one batch and the policies allow chunked prefills; then Sarathi, the paper's
    chunked-prefill baseline. vLLM stops on such a prompt (`InfeasibleRequestError`), and the command would then
    report no warm start and no table of what the best schedule does differently (on azure-code's first 200
    requests at C = 4,096, its 4,808-token first prompt did). A warm start named explicitly is run as named."""
    from .search import whole_prompt_cap  # (as `analyse` imports the search: on use)

    cap = whole_prompt_cap("vllm", limits)
    longest = max((r.prompt_tokens for r in requests), default=0)
    if cap is not None and longest > cap and not policies.no_chunked_prefill:
        return "sarathi"
    return "vllm"


def _run_warm_start(requests, limits, cost_model, objective: Objective, policies: Policies, warm_start: str | None,
                    deadline: Deadline, details: dict) -> tuple[Schedule | None, float]:
    """The warm start's schedule (None: none, or it failed) and its objective (inf where the forced policies exclude
    it); its name and any failure go in ``details``. Its objective comes from the simulation's own replayer, as
    `better` takes the scheduler's."""
    if not warm_start:
        return None, math.inf
    details["warm_start"] = warm_start
    if too_big := simulation_setup_refusal(len(requests), deadline.left()):
        details["warm_start_error"] = f"not run: {too_big}"
        return None, math.inf
    try:
        sim = simulate(requests, warm_start, limits, cost_model, deadline_s=deadline.at())
    except (InfeasibleRequestError, SchedulerError, SimulationTimeout) as exc:  # e.g. vLLM cannot batch a prompt
        details["warm_start_error"] = str(exc)  # longer than C, or its run outlasts the time limit
        return None, math.inf
    if policy_violations(sim.schedule, policies, cost_model):
        return sim.schedule, math.inf
    return sim.schedule, objective.value(sim)


def analyse(requests, limits, cost_model, objective: Objective = Objective(makespan=1), policies: Policies = Policies(),
            warm_start: str | None = AUTO_WARM_START, slots: int | None = None, options: SolveOptions | None = None,
            time_limit_s: float | None = None, progress=None, memory_budget_bytes: int | None = None,
            cut: bool = True, started_s: float | None = None) -> Analysis:
    """Best schedule and lower bound for ``objective`` (see the module docstring). ``cut``: give the MILP the
    lower bound as an objective cut. ``warm_start``: a scheduler's name, `AUTO_WARM_START` (`default_warm_start`) or
    None; the one run is in ``details["warm_start"]``. ``time_limit_s``: default the solver options' limit, else
    60 s (`command_deadline`). ``started_s`` (``time.perf_counter()`` time): when the time limit began (default: now;
    the command line passes its own start, so that building the workload counts)."""
    objective = checked_arguments(limits, cost_model, objective, options)
    options = options or SolveOptions()
    deadline = command_deadline(time_limit_s, options.time_limit_s, started_s)
    say = progress or (lambda msg: None)
    check_requests(requests)
    check_fits(requests, limits)
    check_policies_feasible(requests, limits, policies)
    details: dict = {}
    report = lower_bound_report(requests, limits, cost_model, objective, policies, time_left_s=deadline.left())
    bound_s, details["lower_bound_method"] = report.value_s, report.method
    bound_by = "lower bound" if bound_s > 0 else "none"
    say(f"lower bound {bound_s:.6g} s")
    if warm_start == AUTO_WARM_START:
        warm_start = default_warm_start(requests, limits, policies)
    warm, best_s = _run_warm_start(requests, limits, cost_model, objective, policies, warm_start, deadline, details)
    best_by, best = (warm_start, warm) if math.isfinite(best_s) else (None, None)
    if best is not None:
        say(f"{warm_start}: {best_s:.6g} s")

    def plan_milp(known: Schedule | None, budget: float | None):
        """Slots, slot bound and the reason not to build the MILP (None: build it), from a known schedule."""
        try:
            K, sb = choose_slots(requests, cost_model, objective, slots, known, budget)
        except ValueError as exc:
            return None, None, str(exc)
        est = estimate_milp(len(requests), K)
        details.update(est.to_dict())
        return K, sb, milp_refusal(est, deadline.left(), memory_budget_bytes)

    budget = best_s if math.isfinite(best_s) else None
    K, sb, refusal = plan_milp(warm, budget)
    share = SEARCH_SHARE_WITH_MILP if refusal is None else 1.0
    from .search import search_within

    found = search_within(requests, limits, cost_model, objective, deadline.left() * share, policies, say)
    if found is None:
        details["search_skipped"] = "too little time left after the lower bound for one simulation"
    else:
        details.update(found.report())
        if found.schedule is not None and found.value_s < best_s:
            best_s, best_by, best = found.value_s, f"search: {found.method}", found.schedule
    bounded = slots is None and sb is not None and sb.slots is not None  # K came from the slot bound of `budget`
    if best is not None and (K is None or (bounded and best_s < budget)):
        # no warm start, or the search beat it: the better schedule's objective bounds the slots (as many or fewer)
        budget = best_s
        K, sb, refusal = plan_milp(best, budget)
    if best is not None and meets(best_s, bound_s):
        refusal = "not needed: the incumbent meets the lower bound"
    details["milp_refused"] = refusal
    if refusal is not None and report.refinable is not None and not (best is not None and meets(best_s, bound_s)):
        report = refine_bound(report, deadline.left() - REFINE_RESERVE_S, say)  # no MILP: what the search left
        if report.value_s > bound_s:
            bound_s, details["lower_bound_method"] = report.value_s, report.method
            say(f"lower bound {bound_s:.6g} s ({report.method})")
    milp = None
    if refusal is None:
        seed = best if best is not None and len(best.batches) <= K else warm
        milp = optimize(requests, limits, cost_model, objective, policies, slots=K, warm_start=seed, options=options,
                        budget_s=budget, objective_cut_s=bound_s if bound_by == "lower bound" and cut else None,
                        deadline=deadline)  # the solver's time limit: what the deadline leaves after the build
        if milp.value_s is not None and milp.value_s < best_s:
            best_s, best_by, best = milp.value_s, "MILP", milp.schedule
        if milp.global_optimum and milp.bound_s > bound_s:
            bound_s, bound_by = milp.bound_s, "MILP"
        if milp.status == "optimal" and milp.global_optimum and milp.value_s is not None:
            bound_s, bound_by = max(bound_s, min(milp.bound_s, best_s)), "MILP"
    status = "no_solution" if best is None else ("optimal" if meets(best_s, bound_s) else "feasible")
    diffs = None
    if warm is not None and best is not None and best_by != warm_start:
        diffs = compared(warm, best, deadline.left(), details)
    return Analysis(objective, None if best is None else best_s, best_by, best, bound_s, bound_by, status,
                    deadline.elapsed(), milp, details, diffs)
