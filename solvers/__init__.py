"""Optimal schedules for InferMax: the paper's CSP (section 3.3) as a MILP, solved with HiGHS, CBC or
Gurobi, every solution validated by the replayer. Imports `infermax`, never the other way round."""

from .backends import BACKENDS, SolveOptions, SolverFailed, SolverUnavailable
from .bounds import slot_bound
from .objective import Objective
from .optimize import OptimizeResult, SolutionRejected, optimize
from .policy import Policies, policy_violations

__all__ = ["BACKENDS", "Objective", "OptimizeResult", "Policies", "SolutionRejected", "SolveOptions", "SolverFailed", "SolverUnavailable",
           "optimize", "policy_violations", "slot_bound"]
