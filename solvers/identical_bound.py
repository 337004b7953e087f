"""A lower bound on the sum of latencies of identical requests that arrive together: the state-path bound.

For B requests of the same prompt I and output O arriving at the same time (a fixed I/O grid point), every schedule
passes through states (p, f): p requests have had their first token (their prompt prefilled once), f have finished.
A batch started in state (p, f) is paid by the B − f unfinished requests (Σ latency = Σ_j t_j·u_j), decodes at most
p − f of them, and prefills first-time prompt tokens of the B − p others only. The bound is a small MILP: a monotone
path of states from (0, 0) to (B, B) (binaries), and in each state on the path a mix of batch *configurations* (d
later-token items, q first-time prompt tokens) priced by a lower bound on the time of any batch of that shape,
under the work every schedule must do: B·I first-time prompt tokens, (p + 1)·I of them before the (p + 1)-th first
token, and B·(O − 1) later tokens, the finishers ranked s..e needing (e − s + 1)·(O − 1) of them from batches started
before the e-th finish, at most one per request per batch. Proof and measurements: docs/design.md, "The state-path
bound".

It is what the other latency bounds miss on such instances: a batch's intercept is paid by every unfinished request,
so a request that finishes early pays with the batches the others wait through, and prompt tokens that ride on decode
batches cheaply (a piecewise model's flat steps) need decoders that are already prefilled.
"""

from __future__ import annotations

import math
import time

import numpy as np

from infermax.costmodel.base import FEATURE_COLUMNS, terms_time_table
from infermax.limits import Limits
from infermax.request import Request

from .small_lp import LP_SAFETY_RTOL

MAX_REQUESTS = 16  # the MILP grows as ~10·B³ columns: B = 16 (I = 512, O = 128) takes ~30 s; 32 was not tried
TIME_UNIT = 1000.0  # seconds -> ms inside the MILP
SAFETY = 1 - 1e-9  # vectorised term sums against the cost model's scalar path: rounding only


def applicable(requests: list[Request], limits: Limits, cost_model, hidden_cache: bool = False) -> str | None:
    """Why the bound does not apply, or None: it needs identical requests arriving together, at most
    `MAX_REQUESTS` of them, no prefix caching or hidden-form caches, and a cost model whose terms never fall when a
    feature grows (every coefficient ≥ 0, every term with a piece of intercept ≥ 0), so that the least features of a
    batch shape give the least time."""
    if not requests or len(requests) > MAX_REQUESTS:
        return f"more than {MAX_REQUESTS} requests"
    if len({(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests}) > 1:
        return "requests differ or arrive at different times"
    if hidden_cache or getattr(limits, "prefix_caching", False):
        return "hidden-form caches or prefix caching"
    for term in cost_model.milp_terms():
        if any(c < 0 for p in term.pieces for c in p.coef_s.values()) or max(p.intercept_s for p in term.pieces) < 0:
            return f"cost term {term.name!r} can fall as a feature grows"
    return None


def shape_times(I: int, B: int, limits: Limits, cost_model) -> dict[int, np.ndarray]:
    """``times[d][k, q]``: the least time of a batch with ``d`` later-token items (decodes, or the last chunk of a
    recomputation after an eviction) and ``q`` first-time prompt tokens in at most ``k`` chunks, inf where no batch
    has that shape. Least over: how many of the ``d`` are recomputation chunks (each one token, context 0, plus the
    ``I`` or more other tokens its recomputation processes somewhere, charged at the least slope of the always-active
    token term, `_least_token_slope`), how many chunks the prompt tokens take (≥ ⌈q/I⌉) split evenly, decodes reading
    I + 1 KV tokens, no context before a chunk."""
    terms = tuple(t for t in cost_model.milp_terms())
    slope = _least_token_slope(terms)
    P = min(limits.C, limits.prefill_budget)
    q = np.arange(0, min(B * I, limits.C) + 1)
    out = {}
    for d in range(0, B + 1):
        best = np.full((B + 1, len(q)), np.inf)
        for k in range(0, B + 1):
            qk = q[(q >= k) & (q <= k * I)] if k else q[:1]
            if not len(qk):
                continue
            for d_ref in range(0, d + 1):
                dec = d - d_ref
                ok = (qk + d_ref <= P) & (qk + d <= limits.C) & (qk + d > 0)
                if not ok.any():
                    continue
                qq = qk[ok]
                base, extra = (qq // k, qq % k) if k else (qq * 0, qq * 0)
                sq = (k - extra) * base ** 2 + extra * (base + 1) ** 2 + d_ref if k else qq * 0 + d_ref
                n = len(qq)
                feats = {f: np.zeros(n) for f in FEATURE_COLUMNS}
                feats.update(n_tokens=(qq + d).astype(float), prefill_tokens=(qq + d_ref).astype(float),
                             prefill_sq_tokens=sq.astype(float), n_prefill_seqs=np.full(n, float(k + d_ref)),
                             n_decode_seqs=np.full(n, float(dec)), decode_kv_tokens=np.full(n, float(dec * (I + 1))),
                             decode_kv_max=np.full(n, float(I + 1 if dec else 0)))
                t = terms_time_table(terms, feats) + d_ref * I * slope
                np.minimum.at(best[k], qq, t)
        out[d] = np.minimum.accumulate(best, axis=0) * SAFETY  # at most k chunks
    return out


def _least_token_slope(terms) -> float:
    """The least rate at which a batch's time grows per token: the least ``n_tokens`` coefficient among the pieces of
    the terms gated on ``n_tokens`` (with every coefficient ≥ 0, each piece, so their max, grows at least that fast)."""
    slopes = [min(p.coef_s.get("n_tokens", 0.0) for p in t.pieces) for t in terms if t.active_if == "n_tokens"]
    return sum(slopes)


def _lower_hull(q: np.ndarray, t: np.ndarray) -> list[tuple[int, float]]:
    hull: list[tuple[int, float]] = []
    for x, y in zip(q.tolist(), t.tolist()):
        while len(hull) >= 2 and ((hull[-1][1] - hull[-2][1]) * (x - hull[-2][0])
                                  >= (y - hull[-2][1]) * (hull[-1][0] - hull[-2][0])):
            hull.pop()
        hull.append((x, y))
    return hull


def state_path_latency_bound(requests: list[Request], limits: Limits, cost_model, upper_s: float,
                             time_limit_s: float = 10.0, hidden_cache: bool = False) -> float | None:
    """A lower bound on Σ (finish − arrival) over every schedule of ``requests`` (module docstring), or None where it
    does not apply (`applicable`). ``upper_s``: the sum of latencies of some schedule (it caps the batches a better
    schedule can have, the MILP's big-M); the result is at most ``upper_s``. With ``time_limit_s`` the MILP's dual
    bound when it stops early, still a bound."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    import scipy.sparse as sp

    if applicable(requests, limits, cost_model, hidden_cache) is not None:
        return None
    started = time.perf_counter()
    B, I, O = len(requests), requests[0].prompt_tokens, requests[0].output_tokens
    times = shape_times(I, B, limits, cost_model)
    kv_per_decoder = limits.blocks(I + 1)
    cols = []  # (p, f, d, q, t_ms)
    hulls: dict = {}
    for p in range(B + 1):
        for f in range(min(p, B - 1) + 1):
            for d in range(p - f + 1):
                kcap = min(B - p, (limits.Rmax - d) if limits.Rmax is not None else B)
                qcap = min((B - p) * I, limits.M - d * kv_per_decoder)
                if kcap < 0 or qcap < 0:
                    continue
                key = (d, kcap, qcap)
                if key not in hulls:
                    t = times[d][kcap, :qcap + 1]
                    keep = np.isfinite(t)
                    hulls[key] = _lower_hull(np.flatnonzero(keep), t[keep]) if keep.any() else []
                cols += [(p, f, d, q, t * TIME_UNIT) for q, t in hulls[key]]
    if not cols or min(c[4] for c in cols) <= 0 or time.perf_counter() - started > time_limit_s:
        return None  # (a batch shape of no time would leave the big-M below unbounded)
    states = [(p, f) for p in range(B + 1) for f in range(p + 1)]  # every state, with batch shapes or not
    index = {s: i for i, s in enumerate(states)}
    edges = [(s, n) for s in states for n in ((s[0] + 1, s[1]), (s[0], s[1] + 1)) if n in index]
    nx, ne = len(cols), len(edges)
    p_, f_, d_, q_, t_ = (np.array(c) for c in zip(*cols))
    cost = np.concatenate([(B - f_) * t_, np.zeros(ne)])
    # a schedule better than upper_s has fewer batches than this in a state with f finished (each costs ≥ τ_min·(B − f))
    nbig = {f: upper_s * TIME_UNIT / (t_.min() * (B - f)) for f in range(B)}
    rows, lo, hi = [], [], []

    def add(coef: np.ndarray, low: float, high: float) -> None:  # rows kept sparse: up to ~10^5 columns
        rows.append(sp.csr_matrix(np.concatenate([coef, np.zeros(ne)]) if len(coef) == nx else coef))
        lo.append(low)
        hi.append(high)

    add(d_.astype(float), B * (O - 1), np.inf)
    add(q_.astype(float), B * I, np.inf)
    for p in range(B):
        add(np.where(p_ <= p, q_, 0).astype(float), (p + 1) * I, np.inf)
    for s in range(1, B + 1):
        for e in range(s, B + 1):
            share = np.clip(e - np.maximum(f_ + 1, s) + 1, 0, None)
            add(np.where(f_ <= e - 1, np.minimum(d_, share), 0).astype(float), (e - s + 1) * (O - 1), np.inf)
    for s in states:
        row = np.zeros(nx + ne)
        for j, (a, b) in enumerate(edges):
            row[nx + j] += (a == s) - (b == s)
        flow = 1.0 if s == (0, 0) else -1.0 if s == (B, B) else 0.0
        add(row, flow, flow)
        if s != (B, B):  # batches only in a state the path leaves
            row = np.zeros(nx + ne)
            row[:nx] = (p_ == s[0]) & (f_ == s[1])
            row[nx:] = [-nbig[s[1]] * (a == s) for a, _ in edges]
            add(row, -np.inf, 0.0)
    matrix = sp.vstack(rows, format="csr")
    left = time_limit_s - (time.perf_counter() - started)
    if left <= 1.0:
        return None
    problem = dict(c=cost, constraints=LinearConstraint(matrix, lo, hi),
                   integrality=np.concatenate([np.zeros(nx), np.ones(ne)]),
                   bounds=Bounds(np.zeros(nx + ne), np.concatenate([np.full(nx, np.inf), np.ones(ne)])),
                   options={"time_limit": max(0.5, left - 1.0), "disp": False, "mip_rel_gap": 1e-6})
    found = _solve_within(milp, problem, left + 0.5)
    if found is None:
        return None
    status, value = found
    if status == 2:  # infeasible: no schedule is better than upper_s
        return upper_s
    if value is None or not math.isfinite(value):
        return None
    return min(value / TIME_UNIT, upper_s)


def _solve_within(milp, problem: dict, limit_s: float) -> tuple[int, float | None] | None:
    """(status, optimum or dual bound) of ``milp(**problem)``, run in a forked process that is stopped after
    ``limit_s``: HiGHS does not always keep its own time limit (`backends.solve`; here one instance of 16 requests,
    I = 1,518, O = 16, C = 1,518, M = 15,330, ran for minutes on a 5 s limit). None when it was stopped or no fork is
    safe here (the bound is then skipped, never late)."""
    import multiprocessing as mp

    from .backends import _can_fork

    if not _can_fork():
        return None
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_solve_and_send, args=(milp, problem, send), daemon=True)
    child.start()
    send.close()
    try:
        return receive.recv() if receive.poll(limit_s) else None
    except EOFError:  # the child died
        return None
    finally:
        child.kill()
        child.join()
        receive.close()


def _solve_and_send(milp, problem: dict, send) -> None:
    """The dual bound, also when HiGHS reports an optimum (its objective may lie up to the MIP gap above the true
    minimum), less `LP_SAFETY_RTOL` for the solver's tolerances."""
    res = milp(**problem)
    value = getattr(res, "mip_dual_bound", None)
    if value is None and res.status == 0:
        value = res.fun * (1 - problem["options"]["mip_rel_gap"])
    send.send((int(res.status), None if value is None else float(value) * (1 - LP_SAFETY_RTOL)))
