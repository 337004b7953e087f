"""Work in progress: a lower bound on the sum of latencies that prices the batches' unused intercept.

"Mean busy times" (`busy_time_bound`) splits ``Σ_r C_r`` into ``Σ_r M_r`` (the mean busy times of each request's
kept work on one machine of rate 1, at least the preemptive-SPT value) plus ``Σ_r (C_r − M_r)``, and charges the
second part only with each request's own chain of steps. Under load a request waits for much more: every batch that
runs between its first and its last token, full of other requests. A schedule can keep its batches small, but then
their intercepts stay unused by the kept work and delay every request queued behind them. This bound prices both
sides of that trade-off (docs/design.md, "Work in progress", has the proof):

- *Kept work*: per request its first-token work and, per token g = 2..O, a phase: at least
  ``ph_g = min(decode, refill)`` marginal plus the KV share ``a0·(I + g − 1)/M`` of the intercept, given to the batch
  that generates token g. Each batch's kept pieces fit in it (its generating items hold at most ``M`` tokens), and
  its *waste* ``w_j ≥ a0·(1 − κ_j)``, ``κ_j`` the generating items' KV over ``M``, is idle time of the machine.
- *Priced idle*: ``Σ_r M_r = ∫ Ψ(t) dt`` with ``Ψ`` the requests' summed unprocessed fraction of kept work, and idle
  time at ``τ`` raises ``Ψ`` at every later ``t`` of the SPT schedule's busy period by at least its length over the
  largest work SPT ran in that period by ``t``. So ``Σ_r M_r ≥ SPT + Σ_j w_j·V(τ_j)`` with
  ``V(τ) = ∫_τ^e dt / p_max[b, t]`` (`IdlePrice`).
- *Crowding*: ``C_r − M_r ≥ Σ_j t_j·φ_r(j)`` over the batches ``j`` after r's first piece up to its last token,
  ``φ_r(j)`` the fraction of r's kept work before ``j``. A batch lasts ``t_j ≥ a0 + Σ`` of its items' marginal costs,
  so by Cauchy–Schwarz its term, with its priced waste, is at least ``a0·Φ_j + Y_j² + a0·V̄·(1 − κ_j)`` with
  ``Y_j = Σ_items √(μ_i·φ_i)`` and any ``V̄`` at most the least ``V`` over the batch's idle, and by AM–GM at least
  ``a0·Φ_j + Σ_phases [2·√(a0·V̄·ph_g·φ_g) − a0·V̄·(I + g − 1)/M]``: per phase, separable.
- *Which V̄*: ``V`` falls inside the busy period, so a request that arrives in the main busy period ``[b, e)`` and
  finishes by ``T`` has ``V̄ ≥ V(T)`` in all its batches. With thresholds ``T_1 < … < T_m`` each request either
  finishes in ``(T_{k−1}, T_k]`` (class k: its phases get ``V̄ ∈ [V(T_k), V_cap]``; its finish is at least
  ``max(lower_r, T_{k−1})``) or later (``V̄ ∈ [0, V_cap]``). Both lines of the bound (the crowding one and
  ``Σ_r C_r ≥ Σ_r`` finish floors) hold for the schedule's classes, so any mix ``θ·first + (1 − θ)·second`` does,
  and its minimum over the classes is separable: each request takes its cheapest class.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .busy_time_bound import mean_busy_times, spt_schedule

THRESHOLDS = 24  # finish-time classes over the main busy period
THETAS = np.linspace(0.0, 1.0, 101)
# V_cap as a multiple of the median over phases of the V where a phase's term peaks (0.25 never won on the Azure slice)
CAP_FACTORS = (0.5, 1.0, 2.0)


def spt_pieces(release_s: np.ndarray, work_s: np.ndarray, schedule: np.ndarray | None = None) -> np.ndarray:
    """``(start, end, work of the job run)`` of every piece of the preemptive SPT schedule (`spt_schedule`, or
    ``schedule`` when already computed), the empty ones left out."""
    start, length, work, _ = (spt_schedule(release_s, work_s) if schedule is None else schedule).T
    pieces = np.stack([start, start + length, work], axis=1)
    return pieces[length > 0]


class IdlePrice:
    """``V(τ) = ∫_τ^e dt / p_max[b, t]`` over the SPT pieces, for ``τ`` in a busy period ``[b, e)`` of that schedule
    (0 outside every busy period): a lower bound on how much idle time at ``τ`` adds to ``Σ M`` per unit
    (docs/design.md, "Work in progress"). ``p_max[b, t]``: the largest work among the jobs SPT ran in ``[b, t]``."""

    def __init__(self, pieces: np.ndarray):
        self.start, self.end = pieces[:, 0], pieces[:, 1]
        new_period = np.concatenate([[True], self.start[1:] > self.end[:-1]])
        self.period = np.cumsum(new_period) - 1
        firsts = np.flatnonzero(new_period)
        lasts = np.concatenate([firsts[1:], [len(pieces)]]) - 1
        self.period_start, self.period_end = self.start[firsts], self.end[lasts]
        p_max = pieces[:, 2].copy()
        for a, z in zip(firsts, lasts):
            p_max[a:z + 1] = np.maximum.accumulate(p_max[a:z + 1])
        self.p_max = p_max
        length = (self.end - self.start) / p_max
        # tail[i] = Σ of length over the pieces after i in i's busy period
        suffix = np.concatenate([np.cumsum(length[::-1])[::-1], [0.0]])
        self.tail = suffix[1:] - suffix[lasts[self.period] + 1]

    def at(self, tau) -> np.ndarray:
        tau = np.atleast_1d(np.asarray(tau, dtype=float))
        i = np.clip(np.searchsorted(self.end, tau, side="right"), 0, len(self.end) - 1)
        inside = (tau >= self.period_start[self.period[i]]) & (tau < self.period_end[self.period[i]])
        value = (self.end[i] - np.maximum(tau, self.start[i])) / self.p_max[i] + self.tail[i]
        return np.where(inside, value, 0.0)

    def least(self, start: float, end: float) -> float:
        """The least ``V`` over ``[start, end]``: ``V(end)`` when the interval lies in one busy period (``V`` falls
        inside a period), else 0 (between periods ``V`` is 0)."""
        k = int(np.searchsorted(self.period_start, start, side="right")) - 1
        if k < 0 or end >= self.period_end[k]:
            return 0.0
        return float(self.at(end)[0])

    def main_period(self, release_s: np.ndarray) -> tuple[float, float]:
        """The busy period ``[b, e)`` in which the most requests are released."""
        counts = np.bincount(np.clip(np.searchsorted(self.period_start, release_s, side="right") - 1, 0, None),
                             minlength=len(self.period_start))
        k = int(np.argmax(counts))
        return float(self.period_start[k]), float(self.period_end[k])


class PhaseTerms(NamedTuple):
    """One (I, O)'s kept work ``work_s`` (first token, then per phase its least marginal plus its KV share of a0),
    ``Σ_g φ_g``, and per phase g = 2..O: ``phi`` (φ_g), the phase's costs as `PhaseCosts` (``refill`` and
    ``last_chunk`` None when no schedule may evict) and ``share`` = (I + g − 1)·kv_factor, its KV over ``M``."""

    work_s: float
    phi_sum: float
    phi: np.ndarray
    decode: np.ndarray
    refill: np.ndarray | None
    last_chunk: np.ndarray | None
    share: np.ndarray


def phase_terms(first_s: float, costs, kv_tokens: np.ndarray, a0: float, kv_factor: float, refills: bool
                ) -> PhaseTerms:
    """`PhaseTerms` from the first-token work ``first_s``, the phases' `PhaseCosts` ``costs`` and KV ``kv_tokens``;
    a phase's kept marginal is the decode's, or the cheaper of it and the refill's with ``refills``."""
    share = kv_tokens * kv_factor
    least = np.minimum(costs.decode, costs.refill) if refills else costs.decode
    pieces = least + a0 * share
    work = first_s + float(pieces.sum())
    before = first_s + np.concatenate([[0.0], np.cumsum(pieces)[:-1]]) if len(pieces) else pieces
    phi = before / work if work > 0 else np.zeros(len(pieces))
    return PhaseTerms(work, float(phi.sum()), phi, costs.decode, costs.refill if refills else None,
                      costs.last_chunk if refills else None, share)


class PhaseValues:
    """`phase_values` of fixed phases at many (v_low, v_cap): the square roots √(a0·φ·cost) of each cost and, per
    v_cap, the v_cap end of each concave term are computed once (`progress_tables` asks 25 v_low per v_cap). The
    same float operations as computing each value afresh, so the same values."""

    def __init__(self, a0: float, phi: np.ndarray, decode: np.ndarray, share: np.ndarray,
                 refill: np.ndarray | None = None, last_chunk: np.ndarray | None = None):
        self.a0, self.phi, self.share = a0, phi, share
        costs = (decode,) if refill is None else (decode, last_chunk, refill)
        self.roots = [np.sqrt(a0 * phi * cost) for cost in costs]
        self.rest = None if refill is None else np.maximum(refill - last_chunk, 0.0)
        self._cap_ends: tuple[float, list[np.ndarray]] | None = None

    def _at_ends(self, v_low: float, v_cap: float, i: int) -> np.ndarray:
        """min over V ∈ {v_low, v_cap} of 2·√(a0·V·cost·φ) − a0·V·share for cost i: the least of the concave term
        on [v_low, v_cap]."""
        if self._cap_ends is None or self._cap_ends[0] != v_cap:
            self._cap_ends = (v_cap, [2 * np.sqrt(v_cap) * root - self.a0 * v_cap * self.share for root in self.roots])
        return np.minimum(2 * np.sqrt(v_low) * self.roots[i] - self.a0 * v_low * self.share, self._cap_ends[1][i])

    def at(self, v_low: float, v_cap: float) -> np.ndarray:
        value = self._at_ends(v_low, v_cap, 0)
        if self.rest is not None:
            split = 2 * np.sqrt(self.a0 * v_low * self.phi * self.rest) + self._at_ends(v_low, v_cap, 1)
            value = np.minimum(value, np.minimum(split, self._at_ends(v_low, v_cap, 2)))
        return value


def phase_values(a0: float, v_low: float, v_cap: float, phi: np.ndarray, decode: np.ndarray, share: np.ndarray,
                 refill: np.ndarray | None = None, last_chunk: np.ndarray | None = None) -> np.ndarray:
    """Per phase, a lower bound on its items' share of ``Σ_j [a0·Φ_j + Y_j² + a0·V̄_j·(1 − κ_j)]`` beyond ``a0·φ``
    when every batch holding them has ``V̄ ∈ [v_low, v_cap]`` (docs/design.md, "Work in progress", (iv)). A decode
    phase is one item: 2·√(a0·V̄·decode·φ) − a0·V̄·share, concave in V̄, least at an end. A refill phase spreads at
    least ``refill`` over items of its request's span, all with φ >= φ_g; only the last one carries the KV share:
    the earlier chunks give at least 2·√(a0·v_low·φ·rest) (√ is subadditive), so with the last chunk costing c >=
    ``last_chunk`` the phase gives 2·√(a0·v_low·φ·(refill − c)) + the decode form of c, least at c = last_chunk or
    c = refill (concave in c). (`PhaseValues` computes it for many (v_low, v_cap).)"""
    return PhaseValues(a0, phi, decode, share, refill, last_chunk).at(v_low, v_cap)


class ProgressTables(NamedTuple):
    """The bound's ingredients for one instance (module docstring): ``constant`` = SPT's Σ M + a0·Σ_r Σ_g φ_g;
    ``price`` (V); the main busy period ``[b, e)``; ``thresholds`` T_1..T_m and ``v_low`` = V(T_k) (0 at T_m = e);
    per request ``in_main`` (released in ``[b, e)``), ``floors`` (its finish floor in class k: max(lower, T_{k−1})),
    ``late`` (its floor past T_m, or its lower bound outside the main period); and per ``V_cap`` in ``caps`` the
    crowding sums per (I, O) class (`phase_values` summed over its phases): ``classes[c]`` (n_classes × m: class k,
    V̄ ∈ [min(V(T_k), V_cap), V_cap]) and ``none[c]`` (V̄ ∈ [0, V_cap])."""

    constant: float
    price: IdlePrice
    period: tuple[float, float]
    thresholds: np.ndarray
    v_low: np.ndarray
    in_main: np.ndarray
    floors: np.ndarray
    late: np.ndarray
    caps: list[float]
    classes: list[np.ndarray]
    none: list[np.ndarray]


def progress_tables(release_s: np.ndarray, lower_s: np.ndarray, terms: list[PhaseTerms], which: np.ndarray, a0: float,
                    past_deadline: Callable[[], bool] = lambda: False) -> ProgressTables | None:
    """`ProgressTables` for requests released at ``release_s`` with completion floors ``lower_s`` and `PhaseTerms`
    ``terms[which[r]]``. None when no request has kept work."""
    release_s, lower_s = np.asarray(release_s, dtype=float), np.asarray(lower_s, dtype=float)
    work = np.array([t.work_s for t in terms])[which]
    if not (work > 0).any():
        return None
    schedule = spt_schedule(release_s, work)
    price = IdlePrice(spt_pieces(release_s, work, schedule))
    constant = float(mean_busy_times(schedule, release_s, work).sum()) + a0 * float(
        np.array([t.phi_sum for t in terms])[which].sum())
    b, e = price.main_period(release_s)
    thresholds = b + (e - b) * np.arange(1, THRESHOLDS + 1) / THRESHOLDS
    v_low = price.at(thresholds)
    v_low[-1] = 0.0  # e itself is past the period
    in_main = (release_s >= b) & (release_s < e)
    floors = np.maximum(lower_s[:, None], np.concatenate([[-np.inf], thresholds[:-1]])[None, :])
    late = np.where(in_main, np.maximum(lower_s, thresholds[-1]), lower_s)
    # the phases of every (I, O) class, flattened with the class index
    sizes = np.array([len(t.phi) for t in terms])
    owner = np.repeat(np.arange(len(terms)), sizes)

    def flat(field: str) -> np.ndarray | None:
        parts = [getattr(t, field) for t in terms]
        return None if parts[0] is None else np.concatenate(parts) if sizes.sum() else np.zeros(0)

    phi, decode, share, refill, last_chunk = (flat(f) for f in ("phi", "decode", "share", "refill", "last_chunk"))
    with np.errstate(divide="ignore", invalid="ignore"):
        break_even = np.where(share > 0, phi * decode / (a0 * share * share), np.nan)  # the V at which it peaks
    typical = float(np.nanmedian(break_even)) if np.isfinite(break_even).any() else float(v_low.max(initial=0.0))
    caps, classes, none = [], [], []
    phases = PhaseValues(a0, phi, decode, share, refill, last_chunk)
    for factor in CAP_FACTORS:
        if past_deadline():
            break
        v_cap = factor * typical
        table = np.empty((len(terms), THRESHOLDS))
        for k, v in enumerate(np.minimum(v_low, v_cap)):
            table[:, k] = np.bincount(owner, weights=phases.at(v, v_cap), minlength=len(terms))
        caps.append(v_cap)
        classes.append(table)
        none.append(np.bincount(owner, weights=phases.at(0.0, v_cap), minlength=len(terms)))
    return ProgressTables(constant, price, (b, e), thresholds, v_low, in_main, floors, late, caps, classes, none)


def progress_sum(release_s: np.ndarray, lower_s: np.ndarray, terms: list[PhaseTerms], which: np.ndarray, a0: float,
                 past_deadline: Callable[[], bool] = lambda: False) -> float | None:
    """A lower bound on ``Σ_r C_r`` (completion times, not latencies): the largest over ``θ`` and ``V_cap`` of
    ``θ·(constant + Σ_r crowding of its class) + (1 − θ)·Σ_r floor of its class``, each request in its cheapest
    class (`progress_tables`). None past the deadline or when no request has kept work."""
    tables = progress_tables(release_s, lower_s, terms, which, a0, past_deadline)
    if tables is None or not tables.caps:
        return None
    # requests alike in class, release and floors have the same options: each distinct row once, with its count
    rows = np.column_stack([which, tables.in_main, tables.late, tables.floors])
    _, first, count = np.unique(rows, axis=0, return_index=True, return_counts=True)
    which, main, late, floors = which[first], tables.in_main[first], tables.late[first], tables.floors[first]
    best = None
    for table, none in zip(tables.classes, tables.none):
        crowd, none = table[which[main]], none[which]
        for theta in THETAS:
            options = theta * none + (1 - theta) * late
            options[main] = np.minimum(options[main], (theta * crowd + (1 - theta) * floors[main]).min(axis=1))
            value = theta * tables.constant + float(options @ count)
            best = value if best is None else max(best, value)
    return best
