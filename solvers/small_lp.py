"""A small LP or MILP built row by row and solved with HiGHS, silently: the aggregate LP (`aggregate_lp.py`) and
the per-request LPs of the scalable lower bounds are a few dozen variables each, solved thousands of times."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# The LP is solved in floating point (HiGHS, tolerances ~1e-7 relative): the reported bound is the LP
# value reduced by this relative margin, so solver round-off can never lift it above a true optimum.
LP_SAFETY_RTOL = 1e-6
# The counts of batches (in total, with prefill / decode items, per size bin) are integers: a small MILP (a
# few dozen integer variables). Its dual bound is used, so a time limit never yields a non-bound.
MIP_TIME_LIMIT_S = 5.0
# Solved to this relative gap (its dual bound is what is used; HiGHS's default 1e-4 would leave that much on the table)
MIP_REL_GAP = 1e-9


@dataclass
class SmallLP:
    """Variables (by name, ≥ 0 unless ``free``, optionally bounded above or integer) and rows ``Σ coef·var
    sense rhs``, added one by one; `solve` minimises a linear objective over them."""

    names: list = field(default_factory=list)
    rows: list = field(default_factory=list)  # (coef dict, sense, rhs) with sense in ("<=", ">=", "==")
    upper: dict = field(default_factory=dict)
    integer: set = field(default_factory=set)
    free: set = field(default_factory=set)  # variables without the lower bound 0 (a term's time that can be < 0)

    def var(self, name: str, upper: float | None = None, integer: bool = False, free: bool = False) -> str:
        self.names.append(name)
        if upper is not None:
            self.upper[name] = upper
        if integer:
            self.integer.add(name)
        if free:
            self.free.add(name)
        return name

    def add(self, coefs: dict, sense: str, rhs: float) -> None:
        self.rows.append(({k: v for k, v in coefs.items() if v != 0}, sense, float(rhs)))

    def solve(self, objective: dict, values: dict | None = None, time_limit_s: float = MIP_TIME_LIMIT_S) -> float:
        """The optimum (a MILP's dual bound when ``time_limit_s`` runs out); inf when infeasible."""
        if not self.integer:
            return self._solve_lp(objective, values)
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix

        index = {n: i for i, n in enumerate(self.names)}
        ub_r, ub_c, ub_v, ub_b, eq_r, eq_c, eq_v, eq_b = [], [], [], [], [], [], [], []
        for coefs, sense, rhs in self.rows:
            sign = -1.0 if sense == ">=" else 1.0
            r, c, v, b = (eq_r, eq_c, eq_v, eq_b) if sense == "==" else (ub_r, ub_c, ub_v, ub_b)
            row = len(b)
            for name, coef in coefs.items():
                r.append(row)
                c.append(index[name])
                v.append(sign * coef if sense != "==" else coef)
            b.append(sign * rhs if sense != "==" else rhs)
        n = len(self.names)
        a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(len(ub_b), n)).tocsr() if ub_b else None
        a_eq = coo_matrix((eq_v, (eq_r, eq_c)), shape=(len(eq_b), n)).tocsr() if eq_b else None
        c = np.zeros(n)
        for name, coef in objective.items():
            c[index[name]] = coef
        bounds = [(None if name in self.free else 0, self.upper.get(name)) for name in self.names]
        integrality = np.array([1 if name in self.integer else 0 for name in self.names]) if self.integer else None
        from .backends import quiet_stdout

        with quiet_stdout():  # HiGHS's MIP solver can print debugging lines to descriptor 1 (breaking --json)
            res = linprog(c, A_ub=a_ub, b_ub=ub_b or None, A_eq=a_eq, b_eq=eq_b or None, bounds=bounds,
                          method="highs", integrality=integrality,
                          options={"time_limit": time_limit_s, "mip_rel_gap": MIP_REL_GAP} if self.integer else None)
        if res.status == 2:
            return math.inf  # no schedule does this demand within the limits
        if values is not None and res.x is not None:
            values.update(zip(self.names, res.x))
        if self.integer and res.status == 1:  # time limit: the dual bound is still a bound
            dual = getattr(res, "mip_dual_bound", None)
            if dual is not None and math.isfinite(dual):
                return float(dual)
            # none yet (a loaded machine can spend the limit before the root bound): the LP relaxation is one too
            integer, self.integer = self.integer, set()
            try:
                return self.solve(objective, values)
            finally:
                self.integer = integer
        if res.status != 0:
            raise RuntimeError(f"lower-bound LP failed: {res.message}")
        if self.integer:
            dual = getattr(res, "mip_dual_bound", None)
            if dual is not None and math.isfinite(dual):
                return float(min(res.fun, dual))
        return float(res.fun)

    def _solve_lp(self, objective: dict, values: dict | None) -> float:
        """A pure LP straight through highspy (row-wise matrix, no SciPy wrapper): the bounds solve thousands of
        these small LPs, and SciPy's input checks and sparse conversions cost more than HiGHS itself."""
        import highspy

        index = {n: i for i, n in enumerate(self.names)}
        n, inf = len(self.names), highspy.kHighsInf
        lower, upper, start, cols, coefs = [], [], [0], [], []
        for row, sense, rhs in self.rows:
            lower.append(-inf if sense == "<=" else rhs)
            upper.append(inf if sense == ">=" else rhs)
            cols.extend(index[name] for name in row)
            coefs.extend(row.values())
            start.append(len(cols))
        cost = np.zeros(n)
        for name, coef in objective.items():
            cost[index[name]] = coef
        lp = rowwise_lp(cost, (np.array([-inf if name in self.free else 0.0 for name in self.names]) if self.free
                               else np.zeros(n)),  # (free sums only for a model with a term that can be negative)
                        np.array([inf if self.upper.get(name) is None else self.upper[name] for name in self.names]),
                        np.array(lower), np.array(upper), start, cols, coefs)
        h = quiet_highs()
        h.passModel(lp)
        h.run()
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return math.inf  # no schedule does this demand within the limits
        if status != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError(f"lower-bound LP failed: {h.modelStatusToString(status)}")
        if values is not None:
            values.update(zip(self.names, h.getSolution().col_value))
        return float(h.getInfo().objective_function_value)


def rowwise_lp(cost, col_lower, col_upper, row_lower, row_upper, start, index, value, integer=None):
    """A highspy.HighsLp from a row-wise (CSR) matrix: ``start``/``index``/``value`` as a CSR matrix's
    indptr/indices/data, bounds of ±highspy.kHighsInf for none; ``integer``: a boolean per column (a MILP)."""
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cost), len(row_lower)
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, col_lower, col_upper
    lp.row_lower_, lp.row_upper_ = row_lower, row_upper
    a = lp.a_matrix_
    a.format_ = highspy.MatrixFormat.kRowwise
    a.num_col_, a.num_row_ = len(cost), len(row_lower)
    a.start_, a.index_ = np.asarray(start, dtype=np.int32), np.asarray(index, dtype=np.int32)
    a.value_ = np.asarray(value, dtype=float)
    if integer is not None:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in integer]
    return lp


_HIGHS_GREETED = False


def quiet_highs():
    """A silent highspy.Highs. HiGHS prints its banner to file descriptor 1 when the process creates its first
    instance, which would break ``--json`` output, so that first one is created with descriptor 1 muted."""
    global _HIGHS_GREETED
    import highspy

    if _HIGHS_GREETED:
        h = highspy.Highs()
    else:
        from .backends import quiet_stdout

        with quiet_stdout():
            h = highspy.Highs()
        _HIGHS_GREETED = True
    h.setOptionValue("output_flag", False)
    return h
