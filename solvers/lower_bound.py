"""Lower bounds that scale: makespan, sum of latencies and mean TTFT over every schedule of an instance.

The MILP's dual bound closes only for a handful of requests. These bounds instead reason about
*aggregate* quantities that every complete schedule must produce (total tokens, prefill attention
work, decode KV reads, the number of batches, the KV memory–time area) and solve one small LP over
them (a few dozen variables, whatever the number of requests), so they run in seconds up to B = 20,000.
Every ingredient and its proof is in docs/design.md, "Lower bounds at scale"; the tests check the
bound against brute-force optima and against every registered scheduler on random workloads.

Scope: the semantics of docs/design.md with KV-form caches (recompute evictions and swapping
included). Apt-Serve's hidden-form caches hold half the memory; ``hidden_cache=True`` relaxes the
memory area accordingly (valid for those schedules too, and weaker).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from infermax.costmodel.base import (CAPPED_FEATURES, PREFILL_CTX_CAPS, AffinePiece, CostTerm, kv_cap, padding_quantum,
                                     token_step)
from infermax.limits import Limits
from infermax.request import Request

from .bounds import DECODE_FEATURES, PREFILL_FEATURES, vanishes_with_gate
from .busy_time_bound import chain_sums, kept_work_and_gap, phase_costs, phase_marginals, spt_mean_busy_times
from .crowding_bound import batch_marginal_cap_s, crowded_service_sum
from .objective import Objective
from .pairwise_bound import RequestClass, class_qp_bound, joint_qp_bound, lower_convex_envelope, step_lower
from .policy import Policies, check_policies_feasible
from .queue_bound import INTERCEPT_SHARES, fine_classes, srpt_finish_times
from .progress_bound import PhaseTerms, phase_terms, progress_sum
from .scale import refuse_prefix_caching

# The LP is solved in floating point (HiGHS, tolerances ~1e-7 relative): the reported bound is the LP
# value reduced by this relative margin, so solver round-off can never lift it above a true optimum.
LP_SAFETY_RTOL = 1e-6
# The counts of batches (in total, with prefill / decode items, per size bin) are integers: a small MILP (a
# few dozen integer variables). Its dual bound is used, so a time limit never yields a non-bound.
MIP_TIME_LIMIT_S = 5.0
# Solved to this relative gap (its dual bound is what is used; HiGHS's default 1e-4 would leave that much on the table)
MIP_REL_GAP = 1e-9
# The makespan's one MILP with every term priced per size bin (`_price_per_bin`) may take this long (--I 64 --O 4:
# B = 8 reaches the proven optimum in 6.7 s, 0.003% below it at 5 s; B = 16 takes 1.4 s).
BINNED_MIP_TIME_LIMIT_S = 20.0
# Tangents of c² used to bound Σc² from below given Σc and the number of chunks: c² ≥ 2ac − a².
_SQ_TANGENTS = tuple(2 ** k for k in range(0, 16))
DECODE_KV_CAPS = tuple(kv_cap(f) for f in CAPPED_FEATURES)  # caps of the longest-read features a model may use


class BoundUnavailable(ValueError):
    """The cost model lacks a property a bound needs (e.g. a term that can be negative when active)."""


# --------------------------------------------------------------------------------------------------
# Per-request demand: what any schedule must do for each request, as arrays over requests
# --------------------------------------------------------------------------------------------------

def _capped_read_sum(prompt: np.ndarray, decodes: np.ndarray, cap: int) -> np.ndarray:
    """Σ_{k=1}^{decodes} min(prompt + k, cap) per request (the reads below the cap, then cap per decode)."""
    below = np.clip(cap - prompt, 0, decodes)
    return below * prompt + below * (below + 1) // 2 + (decodes - below) * cap


def _block_prefix(n: np.ndarray, b: int) -> np.ndarray:
    """Σ_{x=1}^{n} ⌈x/b⌉·b (elementwise, exact integers)."""
    q, r = n // b, n % b
    return b * (b * q * (q + 1) // 2 + r * (q + 1))


@dataclass(frozen=True)
class DemandArrays:
    """Per-request components of the work every schedule must do (one entry per request).

    ``first_token_only`` restricts the work to each request's first token (the prefill of ``I`` and the
    batch that generates token 1), which bounds the time to first tokens."""

    prompt: np.ndarray          # I
    decode_items: np.ndarray    # O − 1 (0 when first_token_only)
    generated: np.ndarray       # O (1)
    prompt_sq: np.ndarray       # I²
    prompt_sq_cap: dict         # K -> min(I, K)²
    decode_read: np.ndarray     # Σ_{k=1}^{O−1} (I + k)
    decode_read_cap: dict       # K -> Σ_{k=1}^{O−1} min(I + k, K), K of the capped longest-read features
    kv_area: np.ndarray         # Σ_{j=1}^{O} blocks(I + j − 1)
    chain: np.ndarray           # ⌈I / chunk⌉ + O − 1: batches the request needs one after another
    prefill_per_batch: int      # min(C, P): prompt tokens one batch can prefill
    min_decode_read: int        # min over requests with decodes of I + 1
    min_output: int             # min O
    max_peak: int               # max I + O − 1
    min_refill: int             # min I + 1

    @classmethod
    def of(cls, requests: list[Request], limits: Limits, first_token_only: bool = False) -> "DemandArrays":
        I = np.array([r.prompt_tokens for r in requests], dtype=np.int64)
        O = np.array([r.output_tokens for r in requests], dtype=np.int64)
        if first_token_only:
            O = np.ones_like(O)
        chunk = min(limits.C, limits.prefill_budget, limits.M)
        b = limits.block_size
        dec = O - 1
        has_dec = dec > 0
        return cls(
            prompt=I, decode_items=dec, generated=O, prompt_sq=I * I,
            prompt_sq_cap={k: np.minimum(I, k) ** 2 for k in PREFILL_CTX_CAPS},
            decode_read=dec * I + dec * (dec + 1) // 2,
            decode_read_cap={k: _capped_read_sum(I, dec, k) for k in DECODE_KV_CAPS},
            kv_area=_block_prefix(I + O - 1, b) - _block_prefix(I - 1, b),
            chain=-(-I // chunk) + O - 1, prefill_per_batch=min(limits.C, limits.prefill_budget),
            min_decode_read=int((I[has_dec] + 1).min()) if has_dec.any() else 0, min_output=int(O.min()),
            max_peak=int((I + O - 1).max()),
            min_refill=int((I + 1).min()),
        )

    def __len__(self) -> int:
        return len(self.prompt)

    def subset(self, index: np.ndarray) -> "DemandArrays":
        """The arrays of the requests at ``index`` (instance-wide constants kept: they stay valid, weaker)."""
        take = {f: getattr(self, f)[index] for f in ("prompt", "decode_items", "generated", "prompt_sq", "decode_read",
                                                        "kv_area", "chain")}
        return replace(self, prompt_sq_cap={k: v[index] for k, v in self.prompt_sq_cap.items()},
                       decode_read_cap={k: v[index] for k, v in self.decode_read_cap.items()}, **take)

    def total(self) -> "Demand":
        """The demand of all requests together."""
        return self.smallest(len(self))

    def smallest(self, k: int) -> "Demand":
        """A demand no larger, component by component, than that of *any* k of the requests: each sum
        over the k smallest values, each maximum the k-th smallest value."""
        def low(a):
            return int(np.partition(a, k - 1)[:k].sum()) if k < len(a) else int(a.sum())

        def kth(a):
            return int(np.partition(a, k - 1)[k - 1])

        # The j-th last of the k requests to get its first token gets it no earlier than the batch by which the
        # k − j + 1 smallest prompts can have been prefilled, and one of the last j still needs >= (j-th
        # smallest O) − 1 more batches.
        prompts = np.cumsum(np.sort(np.partition(self.prompt, k - 1)[:k] if k < len(self) else self.prompt))
        outputs = np.sort(np.partition(self.generated, k - 1)[:k] if k < len(self) else self.generated)
        j = np.arange(1, k + 1)
        first_token_chain = int((-(-prompts[k - j] // self.prefill_per_batch) + outputs[j - 1] - 1).max())

        return Demand(requests=k, prompt_tokens=low(self.prompt), decode_items=low(self.decode_items),
                      generated=low(self.generated), prompt_sq=low(self.prompt_sq),
                      prompt_sq_cap={c: low(v) for c, v in self.prompt_sq_cap.items()},
                      decode_read=low(self.decode_read), kv_area=low(self.kv_area),
                      longest_read=kth(self.decode_read),
                      longest_read_cap={c: kth(v) for c, v in self.decode_read_cap.items()},
                      longest_chain=max(kth(self.chain), first_token_chain),
                      longest_output=kth(self.generated), min_decode_read=self.min_decode_read,
                      min_output=self.min_output,
                      max_peak=self.max_peak, min_refill=self.min_refill)


@dataclass(frozen=True)
class Demand:
    """Aggregate work of a set of requests (see `DemandArrays`)."""

    requests: int
    prompt_tokens: int
    decode_items: int
    generated: int
    prompt_sq: int
    prompt_sq_cap: dict
    decode_read: int
    kv_area: int
    longest_read: int        # one request's Σ_{k=1}^{O−1} (I + k): its decodes are in distinct batches
    longest_read_cap: dict   # K -> the same with each read capped at K
    longest_chain: int
    longest_output: int
    min_decode_read: int
    min_output: int
    max_peak: int
    min_refill: int


# --------------------------------------------------------------------------------------------------
# The aggregate LP: a lower bound on the busy time of any schedule doing a given demand
# --------------------------------------------------------------------------------------------------

@dataclass
class _LP:
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
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, len(self.rows)
        cost = np.zeros(n)
        for name, coef in objective.items():
            cost[index[name]] = coef
        lp.col_cost_ = cost
        lp.col_lower_ = (np.array([-inf if name in self.free else 0.0 for name in self.names]) if self.free
                         else np.zeros(n))  # (free sums only for a model with a term that can be negative)
        lp.col_upper_ = np.array([inf if self.upper.get(name) is None else self.upper[name] for name in self.names])
        lp.row_lower_, lp.row_upper_ = np.array(lower), np.array(upper)
        a = lp.a_matrix_
        a.format_ = highspy.MatrixFormat.kRowwise
        a.num_col_, a.num_row_ = n, len(self.rows)
        a.start_, a.index_, a.value_ = np.array(start, dtype=np.int32), np.array(cols, dtype=np.int32), np.array(coefs)
        h = _quiet_highs()
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


_HIGHS_GREETED = False


def _quiet_highs():
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


TIME_SCALE = 1e3  # the LP works in milliseconds (coefficients such as 1e-9 s per c² would sit at tolerances)


def _floor_features(gate: str, d: Demand, q_features: dict) -> dict:
    """The least value each feature can take in a batch in which the term gated by ``gate`` is active."""
    low = {}
    if gate == "n_tokens":
        low["n_tokens"] = 1
    elif gate in PREFILL_FEATURES:
        low.update(n_tokens=1, prefill_tokens=1, n_prefill_seqs=1, prefill_sq_tokens=1)
    elif gate in DECODE_FEATURES:
        r = d.min_decode_read
        low.update(n_tokens=1, n_decode_seqs=1, decode_kv_tokens=r, decode_kv_max=r)
    out = {}
    for f in q_features:
        q, cap = padding_quantum(f), kv_cap(f)
        if q is not None:
            out[f] = q if low.get("n_tokens") else 0
        elif cap is not None:
            out[f] = min(cap, low.get("decode_kv_max", 0))
        else:
            out[f] = low.get(f, 0)
    return out


def term_floor_s(term: CostTerm, d: Demand) -> float:
    """A lower bound on the term's value in any batch in which it is active (its pieces at the least
    feature values such a batch can have; every slope is >= 0 when this is used for monotonicity)."""
    feats = {f for p in term.pieces for f in p.coef_s}
    low = _floor_features(term.active_if, d, feats)
    return max(p.intercept_s + sum(c * low[f] for f, c in p.coef_s.items()) for p in term.pieces)


def nonnegative_gated_terms(terms: tuple[CostTerm, ...], d: Demand) -> tuple[CostTerm, ...]:
    """``terms`` with every term gated on something else than ``n_tokens`` (prefills, decodes, swaps, hidden-form
    recompute) that can be negative when active (``term_floor_s`` below 0, e.g. the H100 linear fit's prefill-
    attention intercept, −94 µs) raised by its floor's magnitude, and one term active in every non-empty batch (gate
    ``n_tokens``) lowered by their sum; ``terms`` itself when there is no such term, or when no always-active term's
    floor covers the sum (nothing can be done then: `LowerBounder` refuses such a model).

    The result is a *lower* cost model: a batch in which every raised term is active costs the same, any other less
    (by the floors of the raised terms it lacks), so every schedule's batches, finish times and objectives are at
    most what ``terms`` give, and a bound for it is a bound for ``terms``. Its every active term is ``>= 0`` on the
    demand ``d`` (the instance's, whose least features bound every subset's), which the bounds over subsets of the
    requests need (removing items then never lengthens a batch)."""
    floors = {t.name: term_floor_s(t, d) for t in terms}
    # each raised by a hair more than its floor's magnitude, so that it stays >= 0 in floats
    shifts = {t.name: -floors[t.name] * (1 + 1e-9) for t in terms if t.active_if != "n_tokens" and floors[t.name] < 0}
    if not shifts:
        return terms
    total = sum(shifts.values())
    base = next((t.name for t in terms if t.active_if == "n_tokens" and floors[t.name] >= total), None)
    if base is None:
        return terms

    def moved(t: CostTerm, by_s: float) -> CostTerm:
        return replace(t, pieces=tuple(replace(p, intercept_s=p.intercept_s + by_s) for p in t.pieces))

    return tuple(moved(t, shifts[t.name]) if t.name in shifts else moved(t, -total) if t.name == base else t
                 for t in terms)


def monotone_terms(terms: tuple[CostTerm, ...]) -> str | None:
    """None if every slope is >= 0 (batch time never decreases when items are added, so the time of any
    batch is at least that of its items from a subset of requests), else the offending term and feature."""
    for t in terms:
        for p in t.pieces:
            for f, c in p.coef_s.items():
                if c < 0:
                    return f"cost term {t.name!r} has a negative coefficient for {f!r} ({c:.3g})"
    return None


# The pipelined-completions DP is exact over all groupings (cubic in the number of requests): up to this many.
PIPELINE_MAX_REQUESTS = 128
# The pairwise-completions QP (`pairwise_bound`): one per distinct (I, O), so only up to this many classes, within
# this time budget for all of them together (a budget cut short still yields a valid, weaker bound).
PAIRWISE_MAX_CLASSES = 16
PAIRWISE_TIME_LIMIT_S = 10.0
# Several classes: one joint QP with cross-class blocks (`joint_qp_bound`); False: each class's QP on its own plus
# min(w) per cross pair (the earlier bound, kept to measure what the joint QP buys).
JOINT_PAIRWISE = True
# The per-request LPs of the queued-completions bound (online arrivals) together take at most this long by
# default; requests not reached keep their coarse-grid work (`LowerBounder._classes`).
QUEUE_TIME_LIMIT_S = 10.0
# Under a caller's time limit (`lower_bound_or_zero`), the bound's optional ingredients stop past this share of the
# time left: 60 online Azure requests took 6.7 s for the sum of latencies (24 release times × a grid of busy LPs) and
# 10.9 s for latency + TTFT under `--time-limit 2`; the search and the MILP need the rest.
BOUND_SHARE_OF_TIME_LEFT = 0.5
# Features that are sums over a batch's items (so a batch's value is the sum of its items' values).
_ADDITIVE = ("n_tokens", "prefill_tokens", "prefill_sq_tokens", "prefill_ctx_tokens", "n_prefill_seqs",
             "n_decode_seqs", "decode_kv_tokens") + tuple(f"prefill_ctx_cap{k}" for k in PREFILL_CTX_CAPS)


def _linearised_steps(steps: list[tuple[int, float]], max_tokens: int, shift_s: float) -> float:
    """The largest α with Σ_t s_t·[n > t] >= α·n − shift_s for every token count n in 1..max_tokens (s_t >= 0).
    Within a level of the step function (S + shift)/n falls with n, so the minimum over n is at a level's last
    count: each threshold t (where [n > t] is still 0) and max_tokens."""
    ends = sorted({t for t, _ in steps if 1 <= t < max_tokens} | {max_tokens})
    return min((sum(s for t, s in steps if n > t) + shift_s) / n for n in ends)


def _depends_on_tokens_only(term: CostTerm) -> bool:
    """Whether ``term`` is active in every non-empty batch and each of its pieces depends on the token count alone
    (``n_tokens``, its steps and its padded counts)."""
    if term.active_if != "n_tokens":
        return False
    for piece in term.pieces:
        for f in piece.coef_s:
            step = token_step(f)
            if f != "n_tokens" and padding_quantum(f) is None and (step is None or step[0] != "n_tokens"):
                return False
    return True


def _linearised_term(term: CostTerm, max_tokens: int, keep_s: float) -> float:
    """For a term `_depends_on_tokens_only`: the largest α with f(n) >= keep_s + α·n for every token count n in
    1..max_tokens, f the term (the maximum of its pieces, every piece evaluated at every n, so a piece that takes over
    at large counts is priced too)."""
    n = np.arange(1, max_tokens + 1, dtype=float)
    f = np.full(max_tokens, -np.inf)
    for piece in term.pieces:
        value = np.full(max_tokens, piece.intercept_s)
        for feature, c in piece.coef_s.items():
            q, step = padding_quantum(feature), token_step(feature)
            value += c * (n if feature == "n_tokens" else np.ceil(n / q) * q if q is not None else n > step[1])
        f = np.maximum(f, value)
    return float(((f - keep_s) / n).min())


def _kept_piece(term: CostTerm, totals: dict[str, float] | None) -> AffinePiece:
    """The piece `additive_split` keeps for ``term``: the largest intercept; with ``totals``, among the pieces of
    intercept >= 0 (a negative one would lower the batch intercepts every bound shares), the one whose slopes are
    worth the most on ``totals``. Any one piece is below the term, so either choice is valid; the second keeps
    the piece that prices a whole workload's items highest. On the fitted A100 model it keeps the prefill
    attention piece with ``Σc²`` and prompt-token slopes rather than the one with context slopes only, which
    prices an unchunked prompt at 0."""
    top = max(term.pieces, key=lambda p: p.intercept_s)
    if totals is None:
        return top
    eligible = [p for p in term.pieces if p.intercept_s >= 0] or [top]
    return max(eligible, key=lambda p: (sum(c * totals.get(f, 0.0) for f, c in p.coef_s.items()), p.intercept_s))


def additive_split(terms: tuple[CostTerm, ...], max_tokens: int | None = None, step_share: float = 0.0,
                   totals: dict[str, float] | None = None) -> tuple[float, float, tuple[CostTerm, ...]] | None:
    """Batch time >= intercepts + Σ over items of an item's marginal cost: ``(a0, a_p, marginal terms)``.

    Per term one piece is kept (the term is the maximum of its pieces, so at least any one): the one with the
    largest intercept, or, given ``totals`` (feature sums of the work to be bounded, `_kept_piece`), the piece of
    non-negative intercept whose slopes are worth the most on them. When every piece of a term active in every
    batch depends on the token count alone and ``max_tokens`` is given, the whole term (the maximum of its pieces)
    is replaced by the line below it instead (`_linearised_term`). Padded counts ``⌈n/q⌉q`` are replaced by
    ``n``; KV maxima and the swap / hidden-recompute features are dropped (all >= 0 with slopes >= 0, which the
    callers check). Token-count steps ``[n_tokens > t]`` are dropped too, unless ``max_tokens`` (the most tokens a batch can
    hold) is given and the term is active in every non-empty batch (gate ``n_tokens``): then their sum S(n) is
    replaced by the line ``α·n − β`` below it for 1 <= n <= max_tokens, with
    β = ``step_share`` × the piece's intercept (moved out of the intercept) and α the largest slope that keeps
    the line below S (`_linearised_steps`); a step model's batching cost then reaches the marginal costs.
    What remains is additive over items, so a batch's time is at least the gate intercepts plus the sum
    over requests of the intercept-free terms on that request's items. ``a0``: the least intercept of a
    non-empty batch (the token gate plus the cheaper of the prefill and decode gates, plus any negative
    intercept of the other gates); ``a_p``: the same for a batch with a prefill item. None if ``a0 < 0``."""
    a_n = a_p = a_d = a_o = 0.0
    marginal = []
    for t in terms:
        tokens_only = _depends_on_tokens_only(t)
        piece = _kept_piece(t, None if tokens_only else totals)
        intercept = piece.intercept_s
        coefs: dict[str, float] = {}
        steps = []
        for f, c in piece.coef_s.items():
            step = token_step(f)
            if padding_quantum(f) is not None:
                f = "n_tokens"
            elif step is not None and step[0] == "n_tokens":
                steps.append((step[1], c))
                continue
            elif f not in _ADDITIVE:
                continue
            coefs[f] = coefs.get(f, 0.0) + c
        if tokens_only and max_tokens and len(t.pieces) > 1:  # every piece a function of n: the line below their
            keep = intercept - step_share * max(0.0, intercept)  # maximum, all pieces priced
            alpha = _linearised_term(t, max_tokens, keep)
            if alpha >= 0:
                coefs, intercept = {"n_tokens": alpha}, keep
        elif steps and max_tokens and t.active_if == "n_tokens":  # a term active in every batch: α·n sums exactly
            shift = step_share * max(0.0, intercept)
            alpha = _linearised_steps(steps, max_tokens, shift)
            if alpha > 0:
                coefs["n_tokens"] = coefs.get("n_tokens", 0.0) + alpha
                intercept -= shift
        if t.active_if == "n_tokens":
            a_n += intercept
        elif t.active_if in PREFILL_FEATURES:
            a_p += intercept
        elif t.active_if in DECODE_FEATURES:
            a_d += intercept
        else:  # charged only with swaps or hidden-form caches
            a_o += min(0.0, intercept)
            continue
        marginal.append(CostTerm(t.name, t.active_if, (AffinePiece(0.0, coefs),)))
    a0 = a_n + min(a_p, a_d) + a_o
    if a0 < 0:
        return None
    return a0, a_n + a_p + a_o, tuple(marginal)


@dataclass(frozen=True)
class _Aggregates:
    """The busy-time LP's variables (their names in the `_LP`): batch counts ``K`` (non-empty), ``Kp`` / ``Kd``
    (with a prefill / decode item); tokens ``N``, prefill tokens ``Pt``, decode items ``D``, tokens generated by
    refills ``X``, extra prefill tokens ``E``, prefill items ``NP``, ``SQ = Σc²``, ``CTX = Σc·m`` and its capped
    forms ``CAP[k]``, decode reads ``DKV`` and the sum of each batch's longest read ``DMAX``."""

    K: str
    Kp: str
    Kd: str
    N: str
    Pt: str
    D: str
    X: str
    E: str
    NP: str
    SQ: str
    CTX: str
    CAP: dict
    DKV: str
    DMAX: str

    @classmethod
    def declare(cls, lp: "_LP", whole: bool) -> "_Aggregates":
        counts = {n: lp.var(n, integer=whole) for n in ("K", "Kp", "Kd")}
        sums = {n: lp.var(n) for n in ("N", "Pt", "D", "X", "E", "NP", "SQ", "CTX")}
        cap = {k: lp.var(f"CAP{k}") for k in PREFILL_CTX_CAPS}
        return cls(**counts, **sums, CAP=cap, DKV=lp.var("DKV"), DMAX=lp.var("DMAX"))

    def additive(self) -> dict[str, str]:
        """Feature name -> variable, for the features that are sums over a batch's items (besides ``n_tokens``)."""
        return {"prefill_tokens": self.Pt, "n_decode_seqs": self.D, "prefill_sq_tokens": self.SQ,
                "prefill_ctx_tokens": self.CTX, "n_prefill_seqs": self.NP, "decode_kv_tokens": self.DKV,
                "decode_kv_max": self.DMAX, **{f"prefill_ctx_cap{k}": v for k, v in self.CAP.items()}}


def busy_time_lb_s(d: Demand, limits: Limits, terms: tuple[CostTerm, ...], policies: Policies = Policies(),
                   hidden_cache: bool = False, ingredients: frozenset[str] | None = None,
                   values: dict | None = None, integer_counts: bool = False, binned_terms: bool = False,
                   time_limit_s: float = MIP_TIME_LIMIT_S) -> float:
    """Lower bound (seconds) on the total time of the batches in which any schedule does demand ``d``
    (docs/design.md, "Lower bounds at scale", items 1–8).

    ``binned_terms``: also price every cost term bin by bin (`_price_per_bin`; tighter for terms with several
    pieces, a larger LP). ``integer_counts``: the batch counts are integers (a small MILP, whose dual bound is
    returned if ``time_limit_s`` runs out).

    ``ingredients`` (tests and the benchmark) switches parts off to measure what each buys: ``area``
    (KV memory–time area), ``steps`` (token-count steps), ``attention`` (prefill Σc²/Σc·m relations),
    ``decode`` (decode KV reads), ``counts`` (batch counts from C, P, Rmax and chains). None = all."""
    use = (lambda name: True) if ingredients is None else (lambda name: name in ingredients)
    if d.requests == 0:
        return 0.0
    lp = _LP()
    v = _Aggregates.declare(lp, integer_counts)
    pcap = min(limits.C, limits.prefill_budget)
    nmax = min(limits.C, pcap + min(limits.C, d.requests, limits.Rmax or d.requests))
    _add_schedule_rows(lp, v, d, limits, policies, hidden_cache, use)
    bins = _size_bins(lp, v, terms, d, nmax, integer_counts) if use("steps") else []
    taus = _price_terms(lp, v, terms, d, _DerivedFeatures(lp, v, d, bins, nmax, use("decode")))
    if binned_terms and bins:
        _price_per_bin(lp, terms, taus, bins, v.additive(), d, limits, policies, integer_counts)
    value = lp.solve({tau: 1.0 for tau in taus}, values, time_limit_s)
    if values:
        values.update({f"term:{t.name}": values[f"tau{i}"] / TIME_SCALE for i, t in enumerate(terms)})
    if math.isinf(value):
        return math.inf
    return max(0.0, value * (1 - LP_SAFETY_RTOL) / TIME_SCALE)


def _add_schedule_rows(lp: _LP, v: _Aggregates, d: Demand, limits: Limits, policies: Policies, hidden_cache: bool,
                       use) -> None:
    """Items 1–5 of the busy-time LP: work, batch counts, KV memory–time area, prefill attention, decode reads."""
    K, Kp, Kd, N, Pt, D, X, E, NP = v.K, v.Kp, v.Kd, v.N, v.Pt, v.D, v.X, v.E, v.NP
    SQ, CTX, DKV, DMAX = v.SQ, v.CTX, v.DKV, v.DMAX
    pcap = min(limits.C, limits.prefill_budget)
    per_batch_decodes = min(limits.C, d.requests, limits.Rmax or d.requests)
    # work: prefill tokens = prompts + refills; decode items + refill-generated tokens = Σ(O − 1)
    lp.add({Pt: 1, E: -1}, "==", d.prompt_tokens)
    lp.add({D: 1, X: 1}, "==", d.decode_items)
    lp.add({N: 1, Pt: -1, D: -1}, "==", 0)
    if policies.eviction_free:
        lp.add({X: 1}, "==", 0)
        lp.add({E: 1}, "==", 0)
    else:
        lp.add({E: 1, X: -d.min_refill}, ">=", 0)  # a refill that generates a token recomputes >= I + 1 tokens
    # batches: each non-empty batch has a prefill item, a decode item or both
    lp.add({K: 1, Kp: -1}, ">=", 0)
    lp.add({K: 1, Kd: -1}, ">=", 0)
    lp.add({Kp: 1, Kd: 1, K: -1}, "==" if policies.no_hybrid else ">=", 0)
    lp.add({NP: 1}, ">=", d.requests)  # every request has at least one prefill item
    lp.add({NP: 1, Kp: -1}, ">=", 0)
    lp.add({NP: 1, Pt: -1}, "<=", 0)  # a prefill item processes at least one token
    lp.add({Kp: 1}, ">=", 1)
    if use("counts"):
        lp.add({N: 1, K: -limits.C}, "<=", 0)
        lp.add({Pt: 1, Kp: -pcap}, "<=", 0)
        lp.add({D: 1, Kd: -per_batch_decodes}, "<=", 0)
        # Capped at one batch per prompt token and decode item: never binding for a real set of requests (a
        # request's chain ceil(I/P) + O − 1 is at most I + O − 1), but `DemandArrays.smallest` takes each quantity's
        # minimum over the requests separately, so its chain can come from a longer prompt than its token count;
        # uncapped, an eviction-free LP (no refill tokens) was then infeasible (an infinite "bound") and a free
        # one had to buy refills, so the LP was not monotone in the prompt tokens.
        lp.add({K: 1}, ">=", min(max(d.longest_chain, d.longest_output), d.prompt_tokens + d.decode_items))
        if limits.Rmax is not None:
            lp.add({K: limits.Rmax}, ">=", d.generated)  # every generating item holds KV in its batch
    if use("area"):
        # the batch generating a request's j-th token holds >= blocks(I + j − 1) KV tokens during it
        lp.add({K: limits.M}, ">=", d.kv_area * (0.5 if hidden_cache else 1.0))
    # prefill attention: a prefill from m = 0 to Icur in chunks c_i has Σc² + 2Σc·m = Icur² (and with the
    # context capped at K: Σc² + 2Σc·min(m, K) >= min(Icur, K)²); each request's last one reaches Icur >= I
    lp.add({SQ: 1, NP: -1}, ">=", 0)
    lp.add({SQ: 1, Pt: -1}, ">=", 0)
    if use("attention"):
        if policies.no_chunked_prefill:
            lp.add({SQ: 1}, ">=", d.prompt_sq)
        else:
            lp.add({SQ: 1, CTX: 2}, ">=", d.prompt_sq)
            for k, cap in v.CAP.items():
                lp.add({SQ: 1, cap: 2}, ">=", d.prompt_sq_cap[k])
        for a in _SQ_TANGENTS:
            if a <= pcap:
                lp.add({SQ: 1, Pt: -2 * a, NP: a * a}, ">=", 0)
    for cap in v.CAP.values():
        lp.add({CTX: 1, cap: -1}, ">=", 0)
    # the token after g generated ones is produced by a decode reading I + g KV tokens or by a refill
    # recomputing I + g tokens (all extra prefill tokens): reads + extra prefill tokens >= Σ_r Σ_g (I + g)
    if use("decode"):
        lp.add({DKV: 1, E: 1}, ">=", d.decode_read)
        lp.add({DKV: 1, D: -d.min_decode_read}, ">=", 0)
        lp.add({DMAX: 1, Kd: -d.min_decode_read}, ">=", 0)
        # one request's decodes are in distinct batches, each batch's longest read at least that decode's (a token
        # made by a refill instead recomputes >= the read it replaces, in E)
        lp.add({DMAX: 1, E: 1}, ">=", d.longest_read)


def _size_bins(lp: _LP, v: _Aggregates, terms: tuple[CostTerm, ...], d: Demand, nmax: int, whole: bool) -> list:
    """Item 6: batch-size bins between consecutive step thresholds, ``(lo, hi, x, n)``: ``x`` batches of
    ``(lo, hi]`` tokens carrying ``n`` tokens. Every step ``[n > t]`` is then the count of the bins above t,
    consistently for all thresholds at once (the tightest relaxation of the staircase given K and N; per-threshold
    bounds alone are far weaker). Also the first prefills: the batches holding first-token prefill chunks all
    come by the last first token, which leaves >= O_min − 1 batches after it, so at most K − O_min + 1 of them
    carry >= ΣI tokens (in their own bins). Empty without token steps."""
    thresholds = sorted({token_step(f)[1] for t in terms for p in t.pieces for f in p.coef_s
                         if token_step(f) is not None and token_step(f)[0] == "n_tokens" and token_step(f)[1] < nmax})
    if not thresholds:
        return []
    bins = []
    edges = [0] + thresholds + [nmax]
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        x, n = lp.var(f"bin{i}", integer=whole), lp.var(f"bin_tokens{i}")
        lp.add({n: 1, x: -(lo + 1)}, ">=", 0)
        lp.add({n: 1, x: -hi}, "<=", 0)
        bins.append((lo, hi, x, n))
    lp.add({v.K: 1, **{x: -1 for lo, hi, x, n in bins}}, "==", 0)
    lp.add({v.N: 1, **{n: -1 for lo, hi, x, n in bins}}, "==", 0)
    K1 = lp.var("K_first_prefill", integer=whole)
    first = [(lp.var(f"bin_first{i}", integer=whole), lp.var(f"bin_first_tokens{i}"), x, n, hi)
             for i, (lo, hi, x, n) in enumerate(bins)]
    for x1, n1, x, n, hi in first:
        lp.add({x1: 1, x: -1}, "<=", 0)
        lp.add({n1: 1, n: -1}, "<=", 0)
        lp.add({n1: 1, x1: -hi}, "<=", 0)
    lp.add({K1: 1, **{x1: -1 for x1, *_ in first}}, "==", 0)
    lp.add({**{n1: 1 for x1, n1, *_ in first}}, ">=", d.prompt_tokens)
    lp.add({K1: 1, v.K: -1}, "<=", -(d.min_output - 1))
    lp.add({v.Kp: 1, K1: -1}, ">=", 0)
    return bins


class _DerivedFeatures:
    """The LP variable of each feature a cost term uses (`of`): the aggregates for the additive ones, and for the
    derived ones a variable created on first use with the rows that bound it (item 6)."""

    def __init__(self, lp: _LP, v: _Aggregates, d: Demand, bins: list, nmax: int, reads: bool):
        self.lp, self.v, self.d, self.bins, self.nmax, self.reads = lp, v, d, bins, nmax, reads
        self.known = {"n_tokens": v.N, **v.additive()}

    def of(self, f: str) -> str | None:
        """The variable for feature ``f``; None for a feature bounded by 0 from below only."""
        if f in ("swap_tokens", "hidden_recompute_tokens"):
            return None  # informational / hidden-form only: bounded by 0 from below
        if f not in self.known:
            self.known[f] = self._derive(f)
        return self.known[f]

    def _derive(self, f: str) -> str | None:
        lp, v, d, bins = self.lp, self.v, self.d, self.bins
        q, cap, step = padding_quantum(f), kv_cap(f), token_step(f)
        if q is not None:  # Σ⌈n/q⌉q >= Σn and >= q per non-empty batch
            var = lp.var(f)
            lp.add({var: 1, v.N: -1}, ">=", 0)
            lp.add({var: 1, v.K: -q}, ">=", 0)
            if bins:  # a batch in bin (lo, hi] pads to at least ⌈(lo + 1)/q⌉·q
                lp.add({var: 1, **{x: -(-(lo + 1) // q) * q for lo, hi, x, n in bins}}, ">=", 0)
            return var
        if cap is not None:  # Σ over decode batches of min(longest read, cap) >= min(cap, I+1) per batch
            var = lp.var(f)
            if self.reads:
                lp.add({var: 1, v.Kd: -min(cap, d.min_decode_read)}, ">=", 0)
                if cap in d.longest_read_cap:  # and >= one request's capped reads (as DMAX)
                    lp.add({var: 1, v.E: 1}, ">=", d.longest_read_cap[cap])
            return var
        if step is not None:
            count, t = step
            if count != "n_tokens":
                return None  # hidden-recompute steps: that term is bounded by its floor only
            var = lp.var(f)
            lp.add({var: 1, v.K: -1}, "<=", 0)
            if t >= self.nmax:
                lp.add({var: 1}, "==", 0)
            elif bins:  # the batches above t are those of the bins above t
                lp.add({var: 1, **{x: -1 for lo, hi, x, n in bins if lo >= t}}, "==", 0)
            return var
        raise BoundUnavailable(f"the lower bound does not know feature {f!r}")


def _price_terms(lp: _LP, v: _Aggregates, terms: tuple[CostTerm, ...], d: Demand, features: _DerivedFeatures
                 ) -> list[str]:
    """Item 7: per cost term a variable ``τ`` at least each piece applied to the schedule's sums (and the term's
    floor per gated batch); returns the ``τ`` variables, whose sum the LP minimises."""
    taus = []
    for i, term in enumerate(terms):
        floor = term_floor_s(term, d) * TIME_SCALE
        tau = lp.var(f"tau{i}", free=floor < 0)  # a term that can be negative: its sum can be too
        taus.append(tau)
        gate = term.active_if
        count = (v.K if gate == "n_tokens" else v.Kp if gate in PREFILL_FEATURES
                 else v.Kd if gate in DECODE_FEATURES else None)
        if count is None:
            # charged only in batches with swaps or hidden-form caches: at least min(0, floor) per batch
            if floor < 0:
                lp.add({tau: 1, v.K: -floor}, ">=", 0)
            continue
        lp.add({tau: 1, count: -floor}, ">=", 0)

        def whole(f: str, c: float, gate=gate) -> dict | None:
            # a feature that is not 0 where the gate is off is summed here over every batch, more than over the
            # gated ones: fine for a negative slope, dropped (a feature is >= 0) for a positive one
            var = features.of(f) if c < 0 or vanishes_with_gate(f, gate) else None
            return ({} if c >= 0 else None) if var is None else {var: 1.0}

        _add_pieces(lp, tau, count, term.pieces, whole)
    return taus


def _add_pieces(lp: _LP, tau: str, count: str, pieces, resolve) -> None:
    """``τ >= intercept·count + Σ coef·feature`` for every piece (item 7). ``resolve(feature, coef)`` gives the
    feature's lower bound as ``{variable: multiplier}`` ({}: bounded by 0 only, so dropped; it must then have
    ``coef >= 0``), or None when no usable bound exists for that slope: the piece is skipped (a valid, weaker LP)."""
    for p in pieces:
        coefs = {tau: 1.0, count: -p.intercept_s * TIME_SCALE}
        for f, c in p.coef_s.items():
            bound = resolve(f, c)
            if bound is None:
                break
            for var, mult in bound.items():
                coefs[var] = coefs.get(var, 0.0) - c * mult * TIME_SCALE
        else:
            lp.add(coefs, ">=", 0)


def _price_per_bin(lp: _LP, terms: tuple[CostTerm, ...], taus: list[str], bins: list, totals: dict, d: Demand,
                   limits: Limits, policies: Policies, whole: bool) -> None:
    """Price every cost term bin by bin (docs/design.md, "Lower bounds at scale", item 8).

    A term is the maximum of its pieces in each batch, and the whole-schedule LP bounds its sum by one piece
    applied to the schedule's sums; here each bin of batches (``(lo, hi]`` tokens, `busy_time_lb_s`) picks its own
    piece over its own sums, and the term is at least the sum over bins (Σ_bins max ≥ max Σ_bins). Per bin b:
    ``xp_b``/``xd_b`` batches with a prefill/decode item (each <= ``x_b``, together >= ``x_b``), and each additive
    feature's share, summing to the schedule's total, with the per-batch relations of the whole LP (token caps,
    ``Σc² >= tokens``, the tangents, reads per decode). Features not additive over items are bounded per bin: a
    step ``[n > t]`` is exactly the gated batches of a bin with ``lo >= t``, a padded count at least
    ``⌈(lo + 1)/q⌉·q`` per batch, a capped longest read at least ``min(cap, least read)`` per decode batch, and
    ``n_tokens`` in gated batches at least ``lo + 1`` each when its gate is not the token gate."""
    pcap = min(limits.C, limits.prefill_budget)
    per_batch_decodes = min(limits.C, d.requests, limits.Rmax or d.requests)
    shares: dict[str, list[str]] = {f: [] for f in totals}
    per_bin: dict[str, list[str]] = {}  # a term's τ -> its τ in each bin
    for b, (lo, hi, x, n) in enumerate(bins):
        xp, xd = lp.var(f"bin{b}_prefill", integer=whole), lp.var(f"bin{b}_decode", integer=whole)
        lp.add({xp: 1, x: -1}, "<=", 0)
        lp.add({xd: 1, x: -1}, "<=", 0)
        lp.add({xp: 1, xd: 1, x: -1}, "==" if policies.no_hybrid else ">=", 0)
        f = {name: lp.var(f"bin{b}_{name}") for name in totals}
        for name, v in f.items():
            shares[name].append(v)
        Pt, D, SQ, NP, DKV, DMAX = (f[k] for k in ("prefill_tokens", "n_decode_seqs", "prefill_sq_tokens",
                                                   "n_prefill_seqs", "decode_kv_tokens", "decode_kv_max"))
        lp.add({n: 1, Pt: -1, D: -1}, "==", 0)
        lp.add({Pt: 1, xp: -pcap}, "<=", 0)
        lp.add({Pt: 1, xp: -1}, ">=", 0)  # a batch with a prefill item has a prefill token
        lp.add({D: 1, xd: -per_batch_decodes}, "<=", 0)
        lp.add({D: 1, xd: -1}, ">=", 0)
        lp.add({NP: 1, xp: -1}, ">=", 0)
        lp.add({NP: 1, Pt: -1}, "<=", 0)
        lp.add({SQ: 1, Pt: -1}, ">=", 0)
        for a in _SQ_TANGENTS:
            if a <= pcap:
                lp.add({SQ: 1, Pt: -2 * a, NP: a * a}, ">=", 0)
        for k in PREFILL_CTX_CAPS:
            lp.add({f["prefill_ctx_tokens"]: 1, f[f"prefill_ctx_cap{k}"]: -1}, ">=", 0)
        lp.add({DKV: 1, D: -d.min_decode_read}, ">=", 0)
        lp.add({DMAX: 1, xd: -d.min_decode_read}, ">=", 0)
        # and from above (a bin's share of a total cannot exceed what its batches can hold): each chunk has at
        # most hi tokens and a context below the longest I + O − 1, one prefill item per request per batch,
        # each read at most I + O − 1
        lp.add({SQ: 1, Pt: -min(hi, pcap)}, "<=", 0)
        lp.add({NP: 1, xp: -d.requests}, "<=", 0)
        lp.add({f["prefill_ctx_tokens"]: 1, Pt: -d.max_peak}, "<=", 0)
        lp.add({DKV: 1, D: -d.max_peak}, "<=", 0)
        lp.add({DMAX: 1, xd: -d.max_peak}, "<=", 0)
        for i, term in enumerate(terms):
            gate = term.active_if
            g = x if gate == "n_tokens" else xp if gate in PREFILL_FEATURES else xd if gate in DECODE_FEATURES else None
            if g is None:
                continue  # swap / hidden-form terms: their whole-schedule floor stands
            floor = term_floor_s(term, d) * TIME_SCALE
            tau_b = lp.var(f"tau{i}_bin{b}", free=floor < 0)
            per_bin.setdefault(taus[i], []).append(tau_b)
            lp.add({tau_b: 1, g: -floor}, ">=", 0)

            def in_bin(feat: str, c: float, gate=gate, g=g, f=f, n=n, lo=lo) -> dict | None:
                v, per_batch = _bin_feature(feat, gate, f, n, lo, d)
                if v is None and per_batch is None:
                    return {} if c >= 0 else None  # a feature >= 0 with a slope >= 0: dropped
                # a per-batch amount over the gated batches: exact for a step, a lower bound otherwise (c >= 0 only)
                if per_batch and c < 0 and token_step(feat) is None:
                    return None
                return {**({v: 1.0} if v is not None else {}), **({g: per_batch} if per_batch else {})}

            _add_pieces(lp, tau_b, g, term.pieces, in_bin)
    for name, vs in shares.items():
        lp.add({totals[name]: 1, **{v: -1 for v in vs}}, "==", 0)
    for tau, vs in per_bin.items():
        lp.add({tau: 1, **{v: -1 for v in vs}}, ">=", 0)


def _bin_feature(feat: str, gate: str, f: dict, n: str, lo: int, d: Demand) -> tuple[str | None, float | None]:
    """How a feature of a piece enters the per-bin pricing (`_price_per_bin`): ``(variable, per-batch amount)``.
    The variable is the bin's share of an additive feature (exact); the per-batch amount multiplies the count of
    gated batches in the bin (exact for a token step, a lower bound otherwise). ``(None, None)``: bounded by 0."""
    step, q, cap = token_step(feat), padding_quantum(feat), kv_cap(feat)
    if step is not None:  # [n > t] is 1 in every batch of a bin above t, 0 below; hidden-recompute steps: >= 0
        return (None, float(lo >= step[1])) if step[0] == "n_tokens" else (None, None)
    if feat == "n_tokens":
        return (n, None) if gate == "n_tokens" else (None, float(lo + 1))
    if q is not None:
        return (None, float(-(-(lo + 1) // q) * q))
    if cap is not None:
        return (None, float(min(cap, d.min_decode_read))) if gate in DECODE_FEATURES else (None, None)
    if feat in f and vanishes_with_gate(feat, gate):
        return f[feat], None
    return None, None


# --------------------------------------------------------------------------------------------------
# Objective bounds
# --------------------------------------------------------------------------------------------------

@dataclass
class LowerBound:
    """A valid lower bound on an objective over every schedule (seconds), with its parts."""

    objective: str
    value_s: float
    parts: dict
    elapsed_s: float = 0.0


def _largest(values) -> float | None:
    """The largest of the values that are not None (None if there are none)."""
    return max((v for v in values if v is not None), default=None)


def _k_grid(n: int, dense: int = 64, ratio: float = 1.03) -> list[int]:
    """Counts 1..dense, then geometric steps up to n (n always included)."""
    ks = list(range(1, min(n, dense) + 1))
    k = float(ks[-1])
    while ks[-1] < n:
        k = max(k * ratio, ks[-1] + 1)
        ks.append(min(n, int(k)))
    return ks


class LowerBounder:
    """Bounds for one instance: ``makespan_s()``, ``latency_sum_s()``, ``mean_ttft_s()``, ``of(objective)``."""

    def __init__(self, requests: list[Request], limits: Limits, cost_model, policies: Policies = Policies(),
                 hidden_cache: bool = False, progress=None, pairwise_budget_s: float = PAIRWISE_TIME_LIMIT_S,
                 queue_budget_s: float = QUEUE_TIME_LIMIT_S, mip_budget_s: float = BINNED_MIP_TIME_LIMIT_S,
                 deadline_s: float | None = None):
        """``deadline_s`` (``time.perf_counter()`` time, None: none): past it, the optional ingredients are skipped
        (release times after the first, rank grid points after the first, the arrival suffixes of the makespan, the
        grouped, pipelined and pairwise completion bounds), so the bound comes back sooner, valid and possibly weaker;
        what every bound needs (the whole demand's busy time, one grid point of the first release, the per-request
        work within its own budget) still runs.
        ``pairwise_budget_s``: the time the pairwise-completions QPs may take together (offline instances);
        ``queue_budget_s``: the time the queued-completions bound may spend on per-request LPs (online
        instances); ``mip_budget_s``: the time of the makespan's binned MILP (`_price_per_bin`; the plain one gets
        at most `MIP_TIME_LIMIT_S` of it). A shorter budget
        gives a valid, possibly weaker bound; callers under a time limit pass a share of what is left."""
        if not requests:
            raise ValueError("the workload has no requests")
        check_policies_feasible(requests, limits, policies)  # a bound over no schedule at all would mean nothing
        self.requests, self.limits, self.policies, self.hidden = list(requests), limits, policies, hidden_cache
        self.progress = progress
        self.arrivals = np.array([r.arrival_s for r in requests], dtype=float)
        self.t0 = float(self.arrivals.min())
        self.full = DemandArrays.of(self.requests, limits)
        # The whole instance's busy time prices the model itself (a term that can be negative has a free sum in the
        # LP); the bounds over subsets of the requests restrict batches to some of their items, which needs every
        # active term >= 0, so they price a lower model that has none (`nonnegative_gated_terms`), or refuse.
        self.model_terms = cost_model.milp_terms()
        self.terms = nonnegative_gated_terms(self.model_terms, self.full.total())
        self.first = DemandArrays.of(self.requests, limits, first_token_only=True)
        self._monotone_problem = monotone_terms(self.terms)
        self._busy_cache: dict = {}
        self._alone_cache: dict = {}
        self._splits: list | None = None
        self.pairwise_budget_s, self.queue_budget_s, self.mip_budget_s = pairwise_budget_s, queue_budget_s, mip_budget_s
        self.deadline_s = deadline_s
        self.cut_by_deadline: list[str] = []  # the ingredients skipped past the deadline

    def _past_deadline(self, ingredient: str) -> bool:
        """Whether ``ingredient`` must be skipped (noted in ``cut_by_deadline``)."""
        if self.deadline_s is None or time.perf_counter() < self.deadline_s:
            return False
        self.cut_by_deadline.append(ingredient)
        return True

    def busy_s(self, d: Demand, integer_counts: bool = False, binned_terms: bool = False,
               time_limit_s: float | None = None, model_terms: bool = False) -> float:
        """`busy_time_lb_s` of ``d``, cached; a MILP gets ``time_limit_s`` (default: ``mip_budget_s``, at most
        `MIP_TIME_LIMIT_S` without ``binned_terms``). ``model_terms``: the cost model's own terms (only for the whole
        instance), not the lower model the subset bounds need (the same unless a term can be negative)."""
        key = (d.requests, d.prompt_tokens, d.decode_items, d.generated, d.prompt_sq, d.decode_read, d.kv_area,
               d.longest_chain, d.longest_output, tuple(sorted(d.prompt_sq_cap.items())), d.longest_read,
               tuple(sorted(d.longest_read_cap.items())), integer_counts, binned_terms, model_terms)
        if key not in self._busy_cache:
            self._busy_cache[key] = busy_time_lb_s(
                d, self.limits, self.model_terms if model_terms else self.terms, self.policies, self.hidden,
                integer_counts=integer_counts,
                binned_terms=binned_terms, time_limit_s=time_limit_s if time_limit_s is not None else
                self.mip_budget_s if binned_terms else min(MIP_TIME_LIMIT_S, self.mip_budget_s))
        return self._busy_cache[key]

    def _need_monotone(self, what: str) -> None:
        """Removing items from a batch never lengthens it: every slope ``>= 0`` and every active term ``>= 0`` in the
        lower model (`nonnegative_gated_terms`; only a model whose always-active term cannot absorb the others'
        negative floors fails that)."""
        for t in self.terms:
            if term_floor_s(t, self.full.total()) < 0:
                raise BoundUnavailable(f"{what} needs every active cost term to be >= 0; {t.name!r} can be negative")
        if self._monotone_problem:
            raise BoundUnavailable(f"{what} needs batch time non-decreasing in every feature: {self._monotone_problem}")

    # ---- makespan ------------------------------------------------------------------------------

    def makespan_s(self) -> LowerBound:
        """Makespan >= busy time of all the work; with arrivals also >= (T − T_min) + busy time of the
        work of requests arriving at or after T, for every T (those batches all run after T)."""
        t = time.perf_counter()
        # one call: worth the small MILP, and its terms priced bin by bin (the larger of the two, in case the binned
        # one stops at its time limit with a weaker dual bound)
        start = time.perf_counter()
        whole = self.busy_s(self.full.total(), integer_counts=True, model_terms=True)
        left = max(0.1, self.mip_budget_s - (time.perf_counter() - start))  # the two MILPs share the budget
        try:
            whole = max(whole, self.busy_s(self.full.total(), integer_counts=True, binned_terms=True,
                                           time_limit_s=left, model_terms=True))
        except RuntimeError:  # HiGHS can fail on the larger model's numerics (20,000 requests); the plain one stands
            pass
        best, best_at = whole, self.t0
        distinct = np.unique(self.arrivals)
        if len(distinct) > 1:
            self._need_monotone("the arrival-suffix makespan bound")
            order = np.argsort(self.arrivals, kind="stable")
            cuts = np.unique(np.linspace(0, len(order) - 1, num=min(len(order), 48)).astype(int))[1:]
            for c in cuts:
                if self._past_deadline("makespan arrival suffixes"):
                    break
                T = self.arrivals[order[c]]
                later = [self.requests[i] for i in order if self.arrivals[i] >= T]
                v = T - self.t0 + self.busy_s(DemandArrays.of(later, self.limits).total())
                if v > best:
                    best, best_at = v, T
        return LowerBound("makespan", float(best), {"busy_time_lb_s": whole, "suffix_from_s": float(best_at - self.t0)},
                          time.perf_counter() - t)

    # ---- sum of latencies and mean TTFT --------------------------------------------------------

    def _completion_sum(self, first_token_only: bool, what: str) -> tuple[float, dict]:
        """Σ over requests of (finish or first-token) time − arrival, bounded through order statistics. The
        k-th earliest completion is at least (a) the k-th smallest of T_r + solo_r, and (b) for every release
        time T among the arrivals: T + the busy time of the (k − n_T) least demanding requests arriving at or
        after T, where n_T requests arrive before T (at least k − n_T of the first k to complete arrived at or
        after T, and all their work runs after T); T = T_min gives T_min + busy time of the k least demanding."""
        self._need_monotone(what)
        arrays = self.first if first_token_only else self.full
        n = len(arrays)
        solo = self._solo_s(first_token_only)
        lower = np.sort(self.arrivals + solo)  # lower[k-1] bounds the k-th completion
        order = np.argsort(self.arrivals, kind="stable")
        sorted_arrivals = self.arrivals[order]
        releases = np.unique(sorted_arrivals[np.unique(np.linspace(0, n - 1, num=min(n, 24)).astype(int))])
        # The queued bound first: it has its own budget (`queue_budget_s`), and the release grid below runs until the
        # deadline, so in this order the two together stay within it (the other way round, the queued bound's budget
        # came on top: 9.6 s instead of 7.5 s for the whole Azure conversation trace's mean TTFT, same bound, under a
        # 7.5 s deadline).
        queued = self._queued_finish_times(arrays, first_token_only) if len(releases) > 1 else None
        # Crowded service next, before the release grid: it is cheap (a second or two on a whole trace) and under
        # load it is the strongest latency ingredient, while the grid runs until the deadline. Offline one window holds
        # every request and the queue bounds dominate (A.3 mixes), so it runs with online arrivals only.
        crowded = None
        if not first_token_only and len(releases) > 1:
            floor = max(float(lower.sum()), float(queued.sum()) if queued is not None else 0.0)
            crowded = _largest(self._crowded_service_sum(arrays, solo, sp, floor) for sp in self._additive_splits()
                               if not self._past_deadline("crowded service"))
        # With arrivals, mean busy times and work in progress next, also before the release grid: under load they are
        # the strongest (the whole azure-conv trace at C = 8,192, fitted model: 27.6 and 30.6 s per request against
        # 15.1 s queued), and the grid would spend a --time-limit deadline first (43 s of LPs there).
        busy_and_progress = (self._busy_and_progress(arrays, solo) if not first_token_only and len(releases) > 1
                             else None)
        points = 0
        for T in releases:
            if T != releases[0] and self._past_deadline("release times after the first"):
                break
            before = int(np.searchsorted(sorted_arrivals, T, side="left"))  # n_T
            late = arrays if before == 0 else arrays.subset(order[before:])
            grid = _k_grid(n - before)
            values = []
            for m in grid:  # past the deadline the larger m keep the last value: busy(m') <= busy(m) for m' <= m
                if values and self._past_deadline("rank grid points"):
                    break
                values.append(T + self.busy_s(late.smallest(m)))
            values = np.array(values)
            points += len(values)
            # completion k >= before + m gets T + busy(m') for the largest computed grid m' <= k − before
            ks = np.arange(before + 1, n + 1)
            idx = np.minimum(np.searchsorted(np.asarray(grid), ks - before, side="right") - 1, len(values) - 1)
            lower[before:] = np.maximum(lower[before:], values[idx])
            if self.progress:
                self.progress(int(T), n)
        parts = {"sum_solo_s": float(solo.sum()), "lp_grid_points": points, "release_times": len(releases),
                 "order_statistic_sum_s": float(lower.sum()) - float(self.arrivals.sum())}
        if queued is not None:
            parts["queued_sum_s"] = float(queued.sum()) - float(self.arrivals.sum())
            lower = np.maximum(lower, queued)
        total = float(lower.sum())
        splits = [] if self._past_deadline("grouped, pipelined and pairwise completions") else self._additive_splits()
        grouped = _largest(self._grouped_completion_sum(arrays, lower, first_token_only, sp) for sp in splits
                           if not self._past_deadline("grouped completions"))
        if grouped is not None:
            parts["grouped_sum_s"] = grouped - float(self.arrivals.sum())
            total = max(total, grouped)
        if not first_token_only and splits:
            pipelined = _largest(self._pipelined_completion_sum(arrays, lower, sp) for sp in splits
                                 if not self._past_deadline("pipelined completions"))
            if pipelined is not None:
                parts["pipelined_sum_s"] = pipelined - float(self.arrivals.sum())
                total = max(total, pipelined)
            pairwise = _largest(self._pairwise_completion_sum(arrays, sp, self.pairwise_budget_s / len(splits))
                                for sp in splits if not self._past_deadline("pairwise completions"))
            if pairwise is not None:
                parts["pairwise_sum_s"] = pairwise - float(self.arrivals.sum())
                total = max(total, pairwise)
        if not first_token_only:
            if busy_and_progress is None:  # offline: after the grid, unless its deadline cut the split-based bounds
                busy_and_progress = self._busy_and_progress(arrays, solo) if splits else (None, None)
            busy, progress = busy_and_progress
            if busy is not None:
                parts["mean_busy_sum_s"] = busy - float(self.arrivals.sum())
                total = max(total, busy)
            if progress is not None:
                parts["work_in_progress_sum_s"] = progress - float(self.arrivals.sum())
                total = max(total, progress)
        if crowded is not None:
            parts["crowded_service_sum_s"] = crowded - float(self.arrivals.sum())
            total = max(total, crowded)
        return total - float(self.arrivals.sum()), parts

    def _busy_and_progress(self, arrays: DemandArrays, solo: np.ndarray) -> tuple[float | None, float | None]:
        """The mean-busy-times and work-in-progress bounds on Σ finish (the largest over the additive splits; None
        where the deadline cut an ingredient before any split gave a value)."""
        splits = self._additive_splits()
        busy = _largest(self._mean_busy_completion_sum(arrays, sp) for sp in splits
                        if not self._past_deadline("mean busy times"))
        progress = _largest(self._work_in_progress_sum(arrays, sp, self.arrivals + solo) for sp in splits
                            if not self._past_deadline("work in progress"))
        return busy, progress

    def _queued_finish_times(self, arrays: DemandArrays, first_token_only: bool) -> np.ndarray | None:
        """Ascending lower bounds on the k-th finish (or first token) with online arrivals: SRPT on one machine
        of rate 1 over each request's attributed work (`queue_bound`; docs/design.md, "Queued completions"),
        the per-rank maximum over the additive splits and the ways of sharing the batch intercept. The work:
        the request's marginal LP alone on the fine grid (while `queue_budget_s` lasts, else its coarse-grid
        value) plus its share of the intercept, which is the prefill gate's ``a_p`` for first tokens (every
        batch with a first-token item has a prefill item) and ``a0`` otherwise."""
        lim = self.limits
        start, splits = time.perf_counter(), self._additive_splits()
        kv = arrays.kv_area * (0.5 if self.hidden else 1.0)
        # first-token items are prefill items: at most min(C, P) of their tokens per batch; otherwise C tokens
        tokens_per_batch = min(lim.C, lim.prefill_budget) if first_token_only else lim.C
        tokens = arrays.prompt + arrays.decode_items
        best = None
        for i, (a0, a_p, marginal) in enumerate(splits):  # split i may use its share of the budget and what is left
            work = self._fine_work_s(arrays, first_token_only, marginal,
                                     start + self.queue_budget_s * (i + 1) / len(splits))
            gate = a_p if first_token_only else a0
            for l_kv, l_tok, l_item in INTERCEPT_SHARES:
                if l_item and lim.Rmax is None:
                    continue
                share = l_kv * kv / lim.M + l_tok * tokens / tokens_per_batch
                if l_item:
                    share = share + l_item * arrays.generated / lim.Rmax
                finish = srpt_finish_times(self.arrivals, work + gate * share)
                best = finish if best is None else np.maximum(best, finish)
        return None if best is None else best * (1 - LP_SAFETY_RTOL)

    def _mean_busy_completion_sum(self, arrays: DemandArrays, split) -> float | None:
        """Σ_r f_r >= Σ_r (M_r + G_r) (docs/design.md, "Mean busy times"; `busy_time_bound`): the least total mean
        busy time of the requests' kept work on one machine of rate 1 (preemptive SPT) plus each request's least
        distance from that mean to its last token, for the given `additive_split`, the largest over the ways of
        sharing the intercept. Each request keeps the work of its (I, O) rounded down as in `fine_classes` (keeping
        less work is still valid). None when the deadline passes first."""
        a0, _, marginal = split
        lim = self.limits
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        refills = not self.policies.eviction_free
        chains, first = [], np.empty(len(classes))
        for c, (i, o) in enumerate(classes):
            if c % 64 == 0 and self._past_deadline("mean busy times"):
                return None
            chains.append(chain_sums(int(i), int(o), a0, marginal, refills))
            first[c] = self._work_alone_s(int(i), 1, marginal)
        prompt = classes[:, 0]
        prompt_blocks = -(-prompt // lim.block_size) * lim.block_size  # blocks(I), in tokens
        kv_factor = (0.5 if self.hidden else 1.0) / lim.M
        best = None
        for l_kv, l_tok, l_item in INTERCEPT_SHARES:
            if l_item and lim.Rmax is None:
                continue
            item = l_item / lim.Rmax if l_item else 0.0
            # the first token's items: the last chunk holds blocks(I), the chunks hold I tokens, one generates
            first_share = l_kv * kv_factor * prompt_blocks + l_tok * prompt / lim.C + item
            k, gap = kept_work_and_gap(chains, first, first_share, a0, l_kv * kv_factor, l_tok / lim.C + item)
            k, gap = k[which], gap[which]
            total = float((spt_mean_busy_times(self.arrivals, k) + gap).sum())
            best = total if best is None else max(best, total)
            if self._past_deadline("mean busy times"):
                break
        return None if best is None else best * (1 - LP_SAFETY_RTOL)

    def _work_in_progress_sum(self, arrays: DemandArrays, split, lower_s: np.ndarray) -> float | None:
        """Σ_r f_r >= the work-in-progress bound (docs/design.md, "Work in progress"; `progress_bound`) for the given
        `additive_split`: mean busy times with the batches' unused intercept priced and the crowding of every batch
        between a request's first piece and its last token. ``lower_s``: per request a lower bound on its finish.
        None past the deadline."""
        inputs = self._progress_inputs(arrays, split)
        if inputs is None:
            return None
        value = progress_sum(self.arrivals, lower_s, *inputs, split[0], lambda: self._past_deadline("work in progress"))
        return None if value is None else value * (1 - LP_SAFETY_RTOL)

    def _progress_inputs(self, arrays: DemandArrays, split) -> tuple[list[PhaseTerms], np.ndarray] | None:
        """The `PhaseTerms` of each (I, O) class and each request's class: its (I, O) rounded down as in
        `fine_classes` (less kept work: still valid). None past the deadline."""
        a0, _, marginal = split
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        refills = not self.policies.eviction_free
        kv_factor = (0.5 if self.hidden else 1.0) / self.limits.M
        terms = []
        for c, (i, o) in enumerate(classes):
            if c % 64 == 0 and self._past_deadline("work in progress"):
                return None
            terms.append(phase_terms(self._work_alone_s(int(i), 1, marginal), phase_costs(int(i), int(o), marginal),
                                     int(i) + np.arange(1, max(int(o), 1), dtype=float), a0, kv_factor, refills))
        return terms, which

    def _crowded_service_sum(self, arrays: DemandArrays, solo: np.ndarray, split, floor: float) -> float | None:
        """Σ_r f_r >= Σ arrivals + the crowded-service bound on Σ latency (docs/design.md, "Crowded service";
        `crowding_bound`), for the given `additive_split`. ``floor``: the completion sum already found (the fine grid
        runs only when the coarse one comes near it). None past the deadline."""
        inputs = self._crowded_service_inputs(arrays, split)
        if inputs is None:
            return None
        work, root, w_cap = inputs
        arrivals = float(self.arrivals.sum())
        value = crowded_service_sum(self.arrivals, solo, np.asarray(arrays.generated), work, root, split[0], w_cap,
                                    floor - arrivals, lambda: self._past_deadline("crowded service"))
        return None if value is None else (value + arrivals) * (1 - LP_SAFETY_RTOL)

    def _crowded_service_inputs(self, arrays: DemandArrays, split) -> tuple[np.ndarray, np.ndarray, float] | None:
        """Per request: its marginal work ``w_r`` (first-token items, then one phase per later token) and ``q_r`` (the
        square roots of those parts, summed), at its (I, O) rounded down as in `fine_classes` (less work: still
        valid); and the largest marginal cost of one batch. None past the deadline."""
        _, _, marginal = split
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        refills = not self.policies.eviction_free
        work, root = np.empty(len(classes)), np.empty(len(classes))
        for c, (i, o) in enumerate(classes):
            if c % 64 == 0 and self._past_deadline("crowded service"):
                return None
            first = self._work_alone_s(int(i), 1, marginal)
            phase = phase_marginals(int(i), int(o), marginal, refills)[0] if o > 1 else np.zeros(0)
            work[c] = first + float(phase.sum())
            root[c] = math.sqrt(first) + float(np.sqrt(phase).sum())
        w_cap = batch_marginal_cap_s(marginal, self.limits, int((arrays.prompt + arrays.generated).max()), self.hidden)
        return work[which], root[which], w_cap

    def _fine_work_s(self, arrays: DemandArrays, first_token_only: bool, marginal: tuple, deadline: float
                     ) -> np.ndarray:
        """Per request: its marginal work alone (`_work_alone_s`) at its (I, O) rounded down to the fine grid of
        `fine_classes`, the most populated grid points first until ``deadline`` (perf_counter); a request whose
        point is not reached keeps its coarse-grid value (`_marginal_work_s`). Both are lower bounds, so the
        larger is kept."""
        coarse = self._marginal_work_s(first_token_only, marginal)
        classes, which = fine_classes(arrays.prompt, arrays.generated)
        fine = np.zeros(len(classes))
        for c in np.argsort(-np.bincount(which, minlength=len(classes)), kind="stable"):
            if time.perf_counter() > deadline:
                break
            fine[c] = self._work_alone_s(*classes[c], marginal)
        return np.maximum(coarse, fine[which])

    def _additive_splits(self) -> list[tuple[float, float, tuple[CostTerm, ...]]]:
        """The additive splits the completion bounds try (each gives a valid bound; the largest is kept): token
        steps dropped, and linearised with none, half or all of their term's intercept moved into the slope.
        Computed once per instance (the marginal terms' identity keys `_work_alone_s`'s cache)."""
        if self._splits is None:
            self._splits = []
            totals = self._unchunked_totals()
            for sp in [additive_split(self.terms, self.limits.C, share, totals) for share in (0.0, 0.5, 1.0)] + [
                    additive_split(self.terms, totals=totals)]:
                if sp is not None and sp not in self._splits:
                    self._splits.append(sp)
        return self._splits

    def _unchunked_totals(self) -> dict[str, float]:
        """The instance's feature sums with every prompt prefilled in one chunk and every later token decoded: what
        `_kept_piece` ranks the pieces of a term on."""
        a = self.full
        return {"n_tokens": float(a.prompt.sum() + a.decode_items.sum()), "prefill_tokens": float(a.prompt.sum()),
                "prefill_sq_tokens": float(a.prompt_sq.sum()), "n_prefill_seqs": float(len(a)),
                "n_decode_seqs": float(a.decode_items.sum()), "decode_kv_tokens": float(a.decode_read.sum())}

    def _work_alone_s(self, I: int, O: int, marginal: tuple[CostTerm, ...]) -> float:
        """A lower bound on the intercept-free time of the items that give one request of prompt I its first O
        tokens: the busy LP of that request alone over ``marginal`` (0 for O <= 0). Cached per (I, O, terms):
        the completion bounds ask for the same values (``marginal`` is one of `_additive_splits`, which live as
        long as this object, so their ids are stable keys)."""
        if O <= 0:
            return 0.0
        key = (int(I), int(O), id(marginal))
        if key not in self._alone_cache:
            self._alone_cache[key] = busy_time_lb_s(DemandArrays.of([Request(0, 0.0, int(I), int(O))], self.limits)
                                                    .total(), self.limits, marginal, self.policies, self.hidden)
        return self._alone_cache[key]

    def _pairwise_completion_sum(self, arrays: DemandArrays, split, budget_s: float) -> float | None:
        """Σ_k f_(k) for an offline instance through every pair of completions (docs/design.md, "Pairwise
        completions"; `pairwise_bound`): a convex QP over the completion profiles of the distinct (I, O) classes,
        certified by Frank–Wolfe, joint across classes (`joint_qp_bound`; when that is unavailable, per class
        plus, for every two requests of different classes, the smaller of their marginal works). None with
        arrivals at different times, without an additive split, or above `PAIRWISE_MAX_CLASSES` classes."""
        if len(np.unique(self.arrivals)) > 1:
            return None
        a0, _, marginal = split
        keys = np.array([(r.prompt_tokens, r.output_tokens) for r in self.requests])
        classes, which = np.unique(keys, axis=0, return_inverse=True)
        which = np.ravel(which)
        if len(classes) > PAIRWISE_MAX_CLASSES:
            return None
        total, works, counts, parts = 0.0, [], [], []
        for c, (I, O) in enumerate(classes.tolist()):
            members = np.flatnonzero(which == c)
            grid = _k_grid(O - 1, dense=64, ratio=1.04) if O > 1 else []
            grid = [0, *grid, O]
            at = [self._work_alone_s(I, O - d, marginal) for d in grid]
            partial = step_lower(grid, at, O)
            kernel = lower_convex_envelope(partial)
            parts.append(RequestClass(len(members), kernel, partial, self._batches_needed(arrays.subset(members))))
        if len(parts) > 1 and JOINT_PAIRWISE:
            joint = joint_qp_bound(parts, a0, budget_s)
            if joint is not None:
                return (len(self.requests) * self.t0 + joint.lower_s) * (1 - LP_SAFETY_RTOL)
        for part in parts:
            qp = class_qp_bound(part.n, a0, part.kernel, part.ch, budget_s / len(classes))
            if qp is None:
                return None
            total += qp.lower_s
            works.append(float(part.kernel[0]))
            counts.append(part.n)
        cross = sum(counts[i] * counts[j] * min(works[i], works[j])
                    for i in range(len(counts)) for j in range(i + 1, len(counts)))
        return (len(self.requests) * self.t0 + total + cross) * (1 - LP_SAFETY_RTOL)

    def _pipelined_completion_sum(self, arrays: DemandArrays, lower: np.ndarray, split) -> float | None:
        """Σ_k f_(k) bounded with the work that requests finishing later must already have done
        (docs/design.md, "Pipelined completions"): a request finishing d batches after another has generated all
        but d of its tokens before it. Exact DP over every grouping of the completions (no grid), so only up
        to `PIPELINE_MAX_REQUESTS` requests; None beyond, without an additive split, or when some O = 1."""
        n = len(arrays)
        o_min = int(arrays.generated.min())
        if n > PIPELINE_MAX_REQUESTS or o_min < 2:
            return None
        a0, _, marginal = split
        work = np.sort(self._marginal_work_s(False, marginal))
        W = np.concatenate([[0.0], np.cumsum(work)])
        ch = self._batches_needed(arrays).astype(float)
        old = np.concatenate([[0.0], lower])
        # M(d): the least marginal work of any request's first O − d tokens, on a grid of d in [1, o_min − 1];
        # non-increasing in d, so a d between grid points g_{a−1} < d <= g_a gets M(g_a).
        classes = np.unique(np.array([(r.prompt_tokens, r.output_tokens) for r in self.requests]), axis=0)
        d_grid = sorted({1, o_min - 1, *np.geomspace(1, o_min - 1, 12).astype(int).tolist()})
        M = [min(self._work_alone_s(i, o - d, marginal) for i, o in classes) for d in d_grid]
        gaps = [(1, M[0])] + [(d_grid[a - 1] + 1, M[a]) for a in range(1, len(d_grid))] + [(o_min, 0.0)]
        k = np.arange(n + 1)
        best = 0.0
        for theta in (0.0, 0.25, 0.5, 0.75):
            for lam in (0.0, 0.5, 1.0):
                own = theta * k * old + (1 - theta) * k * (self.t0 + a0 * lam * ch + W)  # a group ending at k, per size
                V = np.full((n + 1, n + 1), math.inf)  # V[j, i]: groups up to the one covering (j, i]
                V[0, 1:] = own[1:] + (1 - theta) * a0 * (1 - lam) * ch[1:] * n  # β_1 >= ch(k_1), all n wait for it
                for i in range(1, n):
                    prev = V[:i, i]
                    s_prev = (i - np.arange(i)).astype(float)
                    s = k[i + 1:] - i
                    R = n - i
                    trans = np.full(len(s), math.inf)
                    for d, m in gaps:
                        val = (prev[:, None] + (1 - theta) * m * s_prev[:, None] * s[None, :]).min(axis=0)
                        trans = np.minimum(trans, val + (1 - theta) * a0 * (1 - lam) * d * R)
                    # the new group's own part: θ·s·old(k) + (1 − θ)·s·(T_min + a0·λ·ch(k) + W(k)) with k = i + s
                    V[i, i + 1:] = trans + theta * s * old[i + 1:] + (1 - theta) * s * (
                        self.t0 + a0 * lam * ch[i + 1:] + W[i + 1:])
                best = max(best, float(V[:, n].min()))
        return best * (1 - LP_SAFETY_RTOL)

    def _classes(self, first_token_only: bool) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (I, O) classes (O = 1 for first tokens) and each request's class. Above 400 classes a
        request takes the point of a geometric (I, O) grid at most as demanding in both I and O (every
        per-request bound used is monotone in the demand)."""
        keys = np.array([(r.prompt_tokens, 1 if first_token_only else r.output_tokens) for r in self.requests])
        if len(np.unique(keys, axis=0)) > 400:
            gi = np.unique(np.concatenate([[1], np.geomspace(1, keys[:, 0].max(), 24).astype(int)]))
            go = np.unique(np.concatenate([[1], np.geomspace(1, keys[:, 1].max(), 16).astype(int)]))
            keys = np.stack([gi[np.searchsorted(gi, keys[:, 0], side="right") - 1],
                             go[np.searchsorted(go, keys[:, 1], side="right") - 1]], axis=1)
        return np.unique(keys, axis=0, return_inverse=True)

    def _solo_s(self, first_token_only: bool) -> np.ndarray:
        """Per request: a lower bound on (its finish or first-token time) − arrival, the busy time of its own
        work (monotonicity: a batch is at least as long as its items from this request alone), computed once
        per distinct (I, O) (`_classes`)."""
        classes, which = self._classes(first_token_only)
        busy = np.array([self.busy_s(DemandArrays.of([Request(0, 0.0, int(i), int(o))], self.limits).total())
                         for i, o in classes])
        return busy[np.ravel(which)]

    def _marginal_work_s(self, first_token_only: bool, marginal: tuple) -> np.ndarray:
        """Per request: a lower bound on the intercept-free time of its own items (the busy LP of the request
        alone over the `additive_split` terms), per distinct (I, O) class as in `_solo_s`."""
        classes, which = self._classes(first_token_only)
        work = np.array([self._work_alone_s(i, o, marginal) for i, o in classes])
        return work[np.ravel(which)]

    def _grouped_completion_sum(self, arrays: DemandArrays, lower: np.ndarray, first_token_only: bool, split
                                ) -> float | None:
        """Σ_k f_(k) bounded by grouping the completions by batch (docs/design.md, "Batched completions").

        Requests completing in the same batch share its finish time, so each is charged the bound of the last
        of them; completing in many batches instead costs a per-batch intercept ``a0`` in every batch up to
        each finish. For a schedule whose completion batches are β_1 < … < β_m with k_1 < … < k_m requests done
        by them, every request of group g finishes at >= max(lower[k_g], T_min + a0·β_g + (a_c − a0)·g +
        W(k_g)), with W(k) the k smallest per-request marginal works and β_g >= max(ch(k_g), g − 1 + ch(1)).
        The least such sum over all groupings (a DP over k, exact on a grid of group ends where every
        quantity takes its value at the grid point below) is a lower bound, for the given `additive_split`."""
        a0, a_c, marginal = split
        n = len(arrays)
        if first_token_only or int(arrays.generated.max()) == 1:
            a_c = max(a_c, a0)  # the completing item is a prefill: its batch pays the prefill gate
        else:
            a_c = a0  # a last token may come from a decode or a refill: only the cheaper gate is sure
        work = np.sort(self._marginal_work_s(first_token_only, marginal))
        W = np.concatenate([[0.0], np.cumsum(work)])  # W[k]: the k smallest works
        ch = self._batches_needed(arrays)  # ch[k]: batches before any k requests can all be done (k >= 1)
        grid = np.asarray(_k_grid(n, dense=128, ratio=1.01))
        ends = np.concatenate([[0], grid[1:] - 1, [n]])  # group ends: the last k of each grid interval
        q = grid - 1  # 0-based index of each interval's first k
        base = self.t0 + W[grid]
        low = lower[q]
        size_end = ends[1:]
        G = len(grid)
        best = math.inf
        prev = np.full(G + 1, math.inf)
        prev[0] = 0.0
        later = np.tril_indices(G, -1)  # (j, i) with j after i
        for g in range(1, G + 1):
            beta = np.maximum(ch[grid], g - 1 + ch[1])
            h = np.maximum(low, base + a0 * beta + (a_c - a0) * g)  # per member of a group ending in interval i
            # cur[i] = min_{j < i} prev[j] + (ends[i] − ends[j])·h[i − 1]
            cand = prev[:-1, None] + (size_end[None, :] - ends[:-1, None]) * h[None, :]
            cand[later] = math.inf  # j must precede i
            cur = np.full(G + 1, math.inf)
            cur[1:] = cand.min(axis=0)
            best = min(best, cur[G])
            if not np.isfinite(cur).any() or cur[1:].min() >= best:
                break
            prev = cur
        return best * (1 - LP_SAFETY_RTOL) if math.isfinite(best) else None

    def _batches_needed(self, arrays: DemandArrays) -> np.ndarray:
        """ch[k] (k = 1..n, ch[0] = 0): batches any schedule needs before k requests can all be done: the
        k-th smallest chain, and the k smallest requests' tokens over C, prompts over min(C, P), KV area over
        M and generated tokens over Rmax."""
        lim = self.limits

        def cum(a):
            return np.concatenate([[0], np.cumsum(np.sort(a))])

        ch = np.concatenate([[0], np.sort(arrays.chain)])
        ch = np.maximum(ch, -(-cum(arrays.prompt + arrays.decode_items) // lim.C))
        ch = np.maximum(ch, -(-cum(arrays.prompt) // min(lim.C, lim.prefill_budget)))
        area = cum(arrays.kv_area)
        ch = np.maximum(ch, np.ceil((area * 0.5 if self.hidden else area) / lim.M).astype(np.int64))
        if lim.Rmax is not None:
            ch = np.maximum(ch, -(-cum(arrays.generated) // lim.Rmax))
        return ch

    def latency_sum_s(self) -> LowerBound:
        t = time.perf_counter()
        v, parts = self._completion_sum(False, "the latency bound")
        return LowerBound("latency", v, parts, time.perf_counter() - t)

    def mean_ttft_s(self) -> LowerBound:
        t = time.perf_counter()
        v, parts = self._completion_sum(True, "the TTFT bound")
        return LowerBound("ttft", v / len(self.requests), parts, time.perf_counter() - t)

    def of(self, objective: Objective) -> LowerBound:
        """The weighted sum of the component bounds (each is a lower bound of its component)."""
        t = time.perf_counter()
        total, parts = 0.0, {}
        for name, w in objective.weights().items():
            lb = {"makespan": self.makespan_s, "latency": self.latency_sum_s, "ttft": self.mean_ttft_s}[name]()
            total += w * lb.value_s
            parts[f"{name}_lower_bound_s"] = lb.value_s
        if self.cut_by_deadline:
            parts["cut_by_deadline"] = sorted(set(self.cut_by_deadline))
        return LowerBound(str(objective), total, parts, time.perf_counter() - t)


def lower_bound(requests: list[Request], limits: Limits, cost_model, objective: Objective = Objective(makespan=1),
                policies: Policies = Policies(), hidden_cache: bool = False) -> LowerBound:
    """A valid lower bound on ``objective`` over every schedule of the instance (docs/design.md)."""
    refuse_prefix_caching(limits)
    return LowerBounder(requests, limits, cost_model, policies, hidden_cache).of(objective)


def lower_bound_or_zero(requests, limits, cost_model, objective: Objective, policies: Policies = Policies(),
                        time_left_s: float | None = None) -> tuple[float, str]:
    """The bound and how it was obtained; 0 (the trivial bound) with the reason when the cost model does not
    allow one (`BoundUnavailable`) or an LP fails in HiGHS (a `RuntimeError`, seen once at O = 10^8).
    ``time_left_s``: the caller's remaining time; the pairwise QPs or the queued bound's LPs and the makespan's
    binned MILP get at most a quarter of it, and past half of it the optional ingredients are skipped
    (`LowerBounder`'s ``deadline_s``; the method string says which)."""
    budget = PAIRWISE_TIME_LIMIT_S if time_left_s is None else min(PAIRWISE_TIME_LIMIT_S, 0.25 * max(time_left_s, 0.0))
    try:  # (the pairwise QPs run offline only, the queued bound's LPs online only: one budget serves both)
        mip = BINNED_MIP_TIME_LIMIT_S if time_left_s is None else min(BINNED_MIP_TIME_LIMIT_S,
                                                                      0.25 * max(time_left_s, 0.0))
        deadline = None if time_left_s is None else time.perf_counter() + BOUND_SHARE_OF_TIME_LEFT * max(time_left_s, 0.0)
        lb = LowerBounder(requests, limits, cost_model, policies, pairwise_budget_s=budget,
                          queue_budget_s=budget, mip_budget_s=max(mip, 0.1), deadline_s=deadline).of(objective)
        cut = lb.parts.get("cut_by_deadline")
        return lb.value_s, f"aggregate LP bound ({lb.elapsed_s:.1f} s" + (f"; skipped for time: {', '.join(cut)})"
                                                                           if cut else ")")
    except BoundUnavailable as exc:
        return 0.0, f"no aggregate bound: {exc}"
    except RuntimeError as exc:  # HiGHS failing on an LP's numerics (seen at O = 10^8): the trivial bound stands
        return 0.0, f"no aggregate bound: {exc}"
