"""A lower bound on the sum of latencies of identical requests that arrive together: the state-path bound.

For B requests of the same prompt I and output O arriving at the same time (a fixed I/O grid point), every schedule
passes through states (p, f): p requests have had their first token (their prompt prefilled once), f have finished.
A batch started in state (p, f) is paid by the B − f unfinished requests (Σ latency = Σ_j t_j·u_j), decodes at most
p − f of them, and prefills first-time prompt tokens of the B − p others only. The bound is a small MILP: a monotone
path of states from (0, 0) to (B, B) (binaries), and in each state on the path a mix of batch *configurations* (d
later-token items, q first-time prompt tokens) priced by a lower bound on the time of any batch of that shape,
under the work every schedule must do: B·I first-time prompt tokens, (p + 1)·I of them before the (p + 1)-th first
token, and B·(O − 1) later tokens, the finishers ranked s..e needing (e − s + 1)·(O − 1) of them from batches started
before the e-th finish, at most one per request per batch. Above 16 requests the states are grouped into *cells*
(intervals of p and of f, `cells`), each priced at its least favourable member, so that the MILP keeps about ten cells
a side. Proof and measurements: docs/design.md, "The state-path bound".

It is what the other latency bounds miss on such instances: a batch's intercept is paid by every unfinished request,
so a request that finishes early pays with the batches the others wait through, and prompt tokens that ride on decode
batches cheaply (a piecewise model's flat steps) need decoders that are already prefilled.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from infermax.costmodel.base import FEATURE_COLUMNS, terms_time_table
from infermax.limits import Limits
from infermax.request import Request

from .small_lp import LP_SAFETY_RTOL

MAX_REQUESTS = 64  # I = 512, O = 128 (highspy): B = 16 every state ~10 s; cells: B = 32 ~6 s, 48 ~11 s, 64 ~22 s
FINE_REQUESTS = 16  # up to this many requests every (p, f) is a state of its own
CELLS_A_SIDE = 8  # above it, p and f in 1..B − 1 are grouped into about this many cells each at first
REFINE_FACTOR = 3.0  # then cells one narrower while the time left is this many times the last MILP's (B = 48: 12 s, then 29 s)
BELOW_FLOOR = object()  # `_cell_milp_bound`: its MILP found a solution at or below the caller's floor
TIME_UNIT = 1000.0  # seconds -> ms inside the MILP
SAFETY = 1 - 1e-9  # vectorised term sums against the cost model's scalar path: rounding only
# The batch-shape table (`table_cells`) is refused above this many entries: B = 64 with 4,096 prompt-token values fills
# 17.3 M in ~11 s (181 MB at its peak); B = 64 at C = 8,192 would take twice that, more than the bound's budget.
MAX_TABLE_CELLS = 20_000_000
MIP_REL_GAP = 1e-6  # the MILP's dual bound is what is used; closer than this is not worth HiGHS's time


def applicable(requests: list[Request], limits: Limits, cost_model, hidden_cache: bool = False) -> str | None:
    """Why the bound does not apply, or None: it needs identical requests arriving together, at most
    `MAX_REQUESTS` of them, no prefix caching or hidden-form caches, and a cost model whose terms never fall when a
    feature grows (every coefficient ≥ 0, every term with a piece of intercept ≥ 0), so that the least features of a
    batch shape give the least time; and a batch-shape table of at most `MAX_TABLE_CELLS` entries."""
    if not requests or len(requests) > MAX_REQUESTS:
        return f"more than {MAX_REQUESTS} requests"
    if len({(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests}) > 1:
        return "requests differ or arrive at different times"
    if hidden_cache or getattr(limits, "prefix_caching", False):
        return "hidden-form caches or prefix caching"
    cells_needed = table_cells(requests[0].prompt_tokens, len(requests), limits)
    if cells_needed > MAX_TABLE_CELLS:
        return (f"its batch-shape table would hold {cells_needed:,} entries ({cells_needed * 8 / 2**20:,.0f} MiB), "
                f"more than {MAX_TABLE_CELLS:,}")
    for term in cost_model.milp_terms():
        if any(c < 0 for p in term.pieces for c in p.coef_s.values()) or max(p.intercept_s for p in term.pieces) < 0:
            return f"cost term {term.name!r} can fall as a feature grows"
    return None


def shape_times(I: int, B: int, limits: Limits, cost_model, deadline: float | None = None) -> dict[int, np.ndarray] | None:
    """``times[d][k, q]``: a lower bound on the time of any batch with ``d`` later-token items (decodes, or the last
    chunk of a recomputation after an eviction) and ``q`` first-time prompt tokens in at most ``k`` chunks, inf where
    no batch has that shape. Decodes read I + 1 KV tokens, the prompt tokens are split evenly over the chunks (Σc² is
    least there) with no context before them. Of the ``d``, any number ``r`` may be recomputation chunks (each one
    token at context 0, plus the ``I`` or more other tokens its recomputation processes somewhere, charged at the least
    slope of the always-active token term, `_least_token_slope`): without prompt chunks (q = 0) every r is priced
    exactly; with them the batch is priced without its r chunks plus, per chunk, the least growth of every term whose
    gate is already open (one token, one prefill token and item, Σc² + 1) and I·slope. With coefficients ≥ 0 removing
    items never lengthens a batch and adding one grows each active term by at least its least piece's growth, so
    both are below every batch of that shape. (Enumerating r in every shape, as the first version did, gave the same
    bounds at B = 8 and 16 in a tenth of the time; tests/test_identical_bound.py keeps it as the reference.) None when
    ``deadline`` (a `time.perf_counter` value) passes first."""
    terms = tuple(cost_model.milp_terms())
    slope = _least_token_slope(terms)
    P = min(limits.C, limits.prefill_budget)
    Q = min(B * I, limits.C)
    q = np.arange(0, Q + 1)
    step = {"n_tokens": 1.0, "prefill_tokens": 1.0, "prefill_sq_tokens": 1.0, "n_prefill_seqs": 1.0}
    per_chunk = I * slope + sum(min(sum(c * step.get(f, 0.0) for f, c in piece.coef_s.items()) for piece in t.pieces)
                                for t in terms if t.active_if in ("n_tokens", "n_prefill_seqs", "prefill_tokens"))
    out = {}
    fewer = np.full((B + 1, Q + 1), np.inf)  # min over d' < d of decodes(d') − d'·per_chunk (k ≥ 1)
    for d in range(B + 1):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        decodes = np.full((B + 1, Q + 1), np.inf)  # [k, q]: d decodes, exactly k chunks, no recomputation
        for k in range(1, B + 1):
            qk = q[(q >= k) & (q <= k * I) & (q <= P) & (q + d <= limits.C)]
            if len(qk):
                decodes[k, qk] = _batch_times(terms, I, d, k, qk, r=np.zeros(len(qk), dtype=int))
        if 0 < d <= limits.C:
            r = np.arange(0, min(d, P) + 1)  # k = 0, q = 0: d − r decodes and r recomputation chunks
            decodes[0, 0] = float(np.min(_batch_times(terms, I, d, 0, np.zeros(len(r), dtype=int), r) + r * I * slope))
        decodes = np.minimum.accumulate(decodes, axis=0)  # at most k chunks
        t = decodes.copy()
        if d:
            t[1:] = np.minimum(t[1:], np.where(q + d <= limits.C, fewer[1:] + d * per_chunk, np.inf))
        out[d] = t * SAFETY
        fewer = np.minimum(fewer, decodes - d * per_chunk)
    return out


def table_cells(I: int, B: int, limits: Limits) -> int:
    """How many entries `shape_times` fills: (B + 1)² × (q values + 1), 8 bytes each, and about as many model
    evaluations."""
    return (B + 1) ** 2 * (min(B * I, limits.C) + 1)


def _batch_times(terms, I: int, d: int, k: int, q: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Model time of batches of ``d`` later-token items, ``r`` of them one-token recomputation chunks at context 0
    (the rest decodes reading I + 1), and ``q`` first-time prompt tokens split evenly over ``k`` chunks."""
    n = len(q)
    base, extra = (q // k, q % k) if k else (q * 0, q * 0)
    sq = (k - extra) * base ** 2 + extra * (base + 1) ** 2 if k else q * 0
    dec = d - r
    feats = {f: np.zeros(n) for f in FEATURE_COLUMNS}
    feats.update(n_tokens=(q + d).astype(float), prefill_tokens=(q + r).astype(float),
                 prefill_sq_tokens=(sq + r).astype(float), n_prefill_seqs=(k + r).astype(float),
                 n_decode_seqs=dec.astype(float), decode_kv_tokens=(dec * (I + 1)).astype(float),
                 decode_kv_max=np.where(dec > 0, I + 1.0, 0.0))
    return terms_time_table(terms, feats)


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


def default_width(B: int) -> int:
    """The first cells' width: 1 up to `FINE_REQUESTS` requests, else about `CELLS_A_SIDE` cells over 1..B − 1."""
    return 1 if B <= FINE_REQUESTS else -(-(B - 1) // CELLS_A_SIDE)


def cells(B: int, width: int | None = None) -> list[tuple[int, int]]:
    """The intervals the counts p and f (0..B) are grouped into: 0 and B alone, 1..B − 1 in runs of ``width``
    (default 1 up to `FINE_REQUESTS` requests, else about `CELLS_A_SIDE` runs)."""
    if width is None:
        width = default_width(B)
    return [(0, 0)] + [(a, min(a + width - 1, B - 1)) for a in range(1, B, width)] + ([(B, B)] if B else [])


@dataclass(frozen=True)
class StatePathOutcome:
    """What `state_path_latency` gave: ``value_s``, the bound (None: it does not apply, or no MILP gave one within
    the time), and ``stopped_at_floor``, whether a MILP stopped at a solution at or below the caller's floor (then
    no grouping tried could beat it: nothing was lost for want of time). ``width``: the narrowest cells whose MILP
    gave a value, ``milp_s`` that MILP's time and ``times`` the batch-shape table (`shape_times`), so that a later
    call with time to spare can go on with narrower cells (``start_width``) without rebuilding the table."""

    value_s: float | None
    stopped_at_floor: bool = False
    width: int | None = None
    milp_s: float = 0.0
    times: dict | None = field(default=None, repr=False, compare=False)


def state_path_latency_bound(requests: list[Request], limits: Limits, cost_model, upper_s: float,
                             time_limit_s: float = 10.0, hidden_cache: bool = False,
                             cell_width: int | None = None, floor_s: float | None = None) -> float | None:
    """`state_path_latency`'s value: the bound, or None."""
    return state_path_latency(requests, limits, cost_model, upper_s, time_limit_s, hidden_cache, cell_width,
                              floor_s).value_s


def state_path_latency(requests: list[Request], limits: Limits, cost_model, upper_s: float,
                       time_limit_s: float = 10.0, hidden_cache: bool = False,
                       cell_width: int | None = None, floor_s: float | None = None,
                       start_width: int | None = None, times: dict | None = None) -> StatePathOutcome:
    """A lower bound on Σ (finish − arrival) over every schedule of ``requests`` (module docstring), as a
    `StatePathOutcome` (its value None where the bound does not apply, `applicable`). ``upper_s``: the sum of latencies of some schedule (it caps the batches a better
    schedule can have, the MILP's big-M); the result is at most ``upper_s``. With ``time_limit_s`` the MILP's dual
    bound when it stops early, still a bound. ``cell_width``: the states' grouping (`cells`; the tests force it);
    by default the cells of `cells`, then narrower ones while the time left is at least `REFINE_FACTOR` times what
    the last MILP took (each MILP's value is a bound; the largest is returned); ``start_width``: the first cells'
    width instead of `default_width` (a caller going on after an earlier outcome's ``width``), ``times``: that
    outcome's batch-shape table. ``floor_s``: a bound the caller has
    already; a MILP stops, giving nothing, as soon as it finds a solution at or below it (its optimum, and so its
    value, could not exceed ``floor_s``; HiGHS's ``objective_target``), and then no narrower cells are tried: each
    narrowing lifted the bound by a few percent where measured (B = 32: 88.15 → 90.60 s) and costs more than the
    last, so a grouping that cannot beat the floor is where the time is better left to the caller."""
    if applicable(requests, limits, cost_model, hidden_cache) is not None:
        return StatePathOutcome(None)
    started = time.perf_counter()
    B, I, O = len(requests), requests[0].prompt_tokens, requests[0].output_tokens
    if times is None:
        times = shape_times(I, B, limits, cost_model, deadline=started + time_limit_s - 1.0)
    if times is None:
        return StatePathOutcome(None)
    best, last_s, solved, solved_s = None, 0.0, None, 0.0
    first = start_width if start_width is not None else default_width(B)
    for width in ([cell_width] if cell_width is not None else range(first, 0, -1)):
        left = time_limit_s - (time.perf_counter() - started)
        if left <= 1.0 or (best is not None and left < REFINE_FACTOR * last_s):
            break
        run = time.perf_counter()
        value = _cell_milp_bound(_Lattice(cells(B, width), B), times, I, O, limits, upper_s, left, floor_s)
        last_s = time.perf_counter() - run
        if value is BELOW_FLOOR:
            return StatePathOutcome(best, stopped_at_floor=True, width=solved, milp_s=solved_s, times=times)
        if value is not None:
            solved, solved_s = width, last_s
            if best is None or value > best:
                best = value
        if best is not None and best >= upper_s:  # (infeasible: no schedule is better than upper_s)
            break
    return StatePathOutcome(best, width=solved, milp_s=solved_s, times=times)


def _cell_milp_bound(lattice: "_Lattice", times: dict, I: int, O: int, limits: Limits, upper_s: float,
                     left_s: float, floor_s: float | None = None) -> float | None:
    """The MILP over ``lattice`` within ``left_s``: its optimum or dual bound (at most ``upper_s``; ``upper_s`` when
    it is infeasible), `BELOW_FLOOR` when it found a solution at or below ``floor_s``, None without one."""
    started = time.perf_counter()
    B = lattice.cell[-1][1]
    cols = _columns(lattice, times, I, limits)
    if not len(cols) or cols[:, 6].min() <= 0:
        return None  # (a batch shape of no time would leave the big-M below unbounded)
    matrix, lo, hi = _rows(lattice, cols, I, O, upper_s * TIME_UNIT)
    nx, ne = len(cols), len(lattice.edges)
    left = left_s - (time.perf_counter() - started)
    if left <= 1.0:
        return None
    weight = B - cols[:, 3]  # the unfinished requests, at least B − (the cell's largest f)
    problem = _Problem(np.concatenate([weight * cols[:, 6], np.zeros(ne)]), matrix, np.array(lo, float),
                       np.array(hi, float), nx, ne, max(0.5, left - 1.0),
                       None if floor_s is None else floor_s * TIME_UNIT)
    found = _solve_within(problem, left + 0.5)
    if found is None:
        return None
    status, value = found
    if status == "infeasible":  # no schedule is better than upper_s
        return upper_s
    if status == "below floor":
        return BELOW_FLOOR
    if value is None or not math.isfinite(value):
        return None
    return min(value / TIME_UNIT, upper_s)


class _Lattice:
    """The states: pairs (i, j) of a p-cell and an f-cell that hold some p ≥ f, the f-cell {B} only with the p-cell
    {B} (the end state); edges step one cell in p or in f."""

    def __init__(self, cell: list[tuple[int, int]], B: int):
        self.cell, last = cell, len(cell) - 1
        self.states = [(i, j) for i in range(len(cell)) for j in range(len(cell))
                       if cell[j][0] <= cell[i][1] and (j < last or i == last)]
        self.end = (last, last)
        self.index = {s: k for k, s in enumerate(self.states)}
        self.edges = [(s, n) for s in self.states for n in ((s[0] + 1, s[1]), (s[0], s[1] + 1)) if n in self.index]


def _columns(lattice: _Lattice, times: dict, I: int, limits: Limits) -> np.ndarray:
    """One row per (state, d, q) hull vertex, as (state index, p_lo, f_lo, f_hi, d, q, time in ms). In a cell a batch
    has at most p_hi − f_lo later-token items and B − p_lo prompts (chunks) left to start."""
    B = lattice.cell[-1][1]
    kv_per_decoder = limits.blocks(I + 1)
    cols, hulls = [], {}
    for k, (i, j) in enumerate(lattice.states):
        if (i, j) == lattice.end:
            continue
        (p_lo, p_hi), (f_lo, f_hi) = lattice.cell[i], lattice.cell[j]
        for d in range(p_hi - f_lo + 1):
            kcap = min(B - p_lo, (limits.Rmax - d) if limits.Rmax is not None else B)
            qcap = min((B - p_lo) * I, limits.M - d * kv_per_decoder)
            if kcap < 0 or qcap < 0:
                continue
            key = (d, kcap, qcap)
            if key not in hulls:
                t = times[d][kcap, :qcap + 1]
                keep = np.isfinite(t)
                hulls[key] = _lower_hull(np.flatnonzero(keep), t[keep]) if keep.any() else []
            cols += [(k, p_lo, f_lo, f_hi, d, q, t * TIME_UNIT) for q, t in hulls[key]]
    return np.array(cols, dtype=float).reshape(-1, 7)


def _rows(lattice: _Lattice, cols: np.ndarray, I: int, O: int, upper_ms: float):
    """The MILP's rows over (columns, edges): the work (vi)-(viii) of docs/design.md's proof, each over the cells
    that may hold its batches, then the unit flow along the path and batches only in states the path leaves (big-M:
    a schedule below ``upper_ms`` has fewer batches in a state than upper / (τ_min·(B − f_hi)))."""
    import scipy.sparse as sp

    B = lattice.cell[-1][1]
    state, p_lo, f_lo, f_hi, d, q = (cols[:, c] for c in range(6))
    nx, ne = len(cols), len(lattice.edges)
    work, lo = [d, q], [B * (O - 1), B * I]
    for _, p_hi in lattice.cell[:-1]:  # the first p_hi + 1 first tokens end batches started with p ≤ p_hi
        work.append(np.where(p_lo <= p_hi, q, 0.0))
        lo.append((p_hi + 1) * I)
    points = sorted({b for a, b in lattice.cell[1:]} | {a for a, b in lattice.cell[1:]})
    for s, e in sorted({(1, e) for e in points} | {(s, B) for s in points}):  # the first e, and the last B − s + 1
        share = np.clip(e - np.maximum(f_lo + 1, s) + 1, 0, None)
        work.append(np.where(f_lo <= e - 1, np.minimum(d, share), 0.0))
        lo.append((e - s + 1) * (O - 1))
    blocks = [sp.hstack([sp.csr_matrix(np.array(work)), sp.csr_matrix((len(work), ne))])]
    hi = [np.inf] * len(work)
    n_states = len(lattice.states)
    src = np.array([lattice.index[a] for a, _ in lattice.edges])
    dst = np.array([lattice.index[b] for _, b in lattice.edges])
    flow = sp.csr_matrix((np.r_[np.ones(ne), -np.ones(ne)], (np.r_[src, dst], np.r_[np.arange(ne), np.arange(ne)])),
                         shape=(n_states, ne))
    blocks.append(sp.hstack([sp.csr_matrix((n_states, nx)), flow]))
    start, end = lattice.index[(0, 0)], lattice.index[lattice.end]
    net = np.zeros(n_states)
    net[start], net[end] = 1.0, -1.0
    lo += net.tolist()
    hi += net.tolist()
    tmin = cols[:, 6].min()
    nbig = np.array([upper_ms / (tmin * (B - lattice.cell[j][1])) if (i, j) != lattice.end else 0.0
                     for i, j in lattice.states])
    member = sp.csr_matrix((np.ones(nx), (state.astype(int), np.arange(nx))), shape=(n_states, nx))
    leaves = sp.csr_matrix((-nbig[src], (src, np.arange(ne))), shape=(n_states, ne))
    keep = np.array([s != lattice.end for s in lattice.states])
    blocks.append(sp.hstack([member, leaves]).tocsr()[keep])
    lo += [-np.inf] * int(keep.sum())
    hi += [0.0] * int(keep.sum())
    return sp.vstack(blocks, format="csr"), lo, hi


@dataclass
class _Problem:
    """min cost·x over rows lo ≤ matrix·x ≤ hi, x ≥ 0: ``n_counts`` continuous batch counts, then ``n_edges`` binaries."""

    cost: np.ndarray
    matrix: object  # scipy.sparse CSR
    lo: np.ndarray
    hi: np.ndarray
    n_counts: int
    n_edges: int
    time_limit_s: float
    target: float | None = None  # stop once a solution is at or below this (HiGHS's objective_target)


def _solve_within(problem: _Problem, limit_s: float) -> tuple[str, float | None] | None:
    """(status, optimum or dual bound) of ``problem``, solved by HiGHS in a forked process that is stopped after
    ``limit_s``: HiGHS does not always keep its own time limit (`backends.solve`; here one instance of 16 requests,
    I = 1,518, O = 16, C = 1,518, M = 15,330, ran for minutes on a 5 s limit). None when it was stopped or no fork is
    safe here (the bound is then skipped, never late)."""
    from .backends import _can_fork, forked

    if not _can_fork():
        return None
    with forked(lambda send: _solve_and_send(problem, send)) as (_, receive):
        try:
            return receive.recv() if receive.poll(limit_s) else None
        except EOFError:  # the child died
            return None


def _solve_and_send(problem: _Problem, send) -> None:
    """The dual bound, also when HiGHS reports an optimum (its objective may lie up to the MIP gap above the true
    minimum), less `LP_SAFETY_RTOL` for the solver's tolerances. HiGHS through highspy, not SciPy's copy of it: the
    same model solved 1.5-2x faster (I = 512, O = 128: B = 32 with cells of 2, 76 s against 45 s; B = 64 with cells of
    8, ~26 s against 13 s)."""
    import highspy

    from .small_lp import quiet_highs, rowwise_lp

    n, inf = problem.n_counts + problem.n_edges, highspy.kHighsInf
    edge = np.arange(n) >= problem.n_counts
    lp = rowwise_lp(problem.cost, np.zeros(n), np.where(edge, 1.0, inf),
                    np.where(np.isfinite(problem.lo), problem.lo, -inf), np.where(np.isfinite(problem.hi), problem.hi, inf),
                    problem.matrix.indptr, problem.matrix.indices, problem.matrix.data, integer=edge)
    h = quiet_highs()
    h.setOptionValue("time_limit", problem.time_limit_s)
    if problem.target is not None:
        h.setOptionValue("objective_target", problem.target)
    h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
    h.passModel(lp)
    h.run()
    status, info = h.getModelStatus(), h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        send.send(("infeasible", None))
        return
    if status == highspy.HighsModelStatus.kObjectiveTarget:
        send.send(("below floor", None))
        return
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit):
        send.send((h.modelStatusToString(status), None))  # (a solver error: no bound)
        return
    value = info.mip_dual_bound
    if not math.isfinite(value) and status == highspy.HighsModelStatus.kOptimal:
        value = info.objective_function_value * (1 - MIP_REL_GAP)
    send.send((h.modelStatusToString(status), float(value) * (1 - LP_SAFETY_RTOL) if math.isfinite(value) else None))
