"""Crowded service: a lower bound on the sum of latencies with online arrivals that charges the batches' crowding.

The other latency bounds charge each request at most its own work, run alone or queued behind the others on one
machine. Under load a request really waits its whole batch at every token, and a batch is long when many share it;
a schedule that keeps batches short runs more of them, and their intercepts take the time the work needed. This
bound keeps both sides of that trade-off inside time windows (docs/design.md, "Crowded service", has the proof):

- Fix a threshold ``ℓ*`` and disjoint windows ``[u, u + L)``; ``A`` = the requests arriving in ``[u, u + L − ℓ*]``.
  A request of ``A`` that finishes within ``ℓ*`` of its arrival (*kept*) has every item in a batch starting in the
  window; every other request of ``A`` has latency ``> ℓ*`` (and at least its time alone, ``solo``).
- A kept request waits, over its batches, their whole durations. With ``p_j`` kept requests in batch ``j``,
  ``Σ_kept latency ≥ Σ_j t_j·p_j ≥ a0·Σ_kept O + Σ_j p_j·μ_j``, ``μ_j`` the kept items' marginal cost in ``j``, and by
  Cauchy–Schwarz twice ``Σ_j p_j·μ_j ≥ Q²/K`` with ``Q = Σ_kept q_r``, ``q_r = Σ`` over the request's token phases of
  ``√(phase marginal)``, and ``K`` the batches starting in the window; also ``Σ_j p_j·μ_j ≥ W = Σ_kept w_r`` (the
  kept marginal work), so any ``λ·W + (1 − λ)·Q²/K`` with ``λ ∈ [0, 1]``.
- Those batches, but the last, end within the window: ``(K − 1)·a0 + W − w_cap ≤ L`` (``w_cap``: the most marginal
  cost one batch can have within the limits), so ``K ≤ 1 + (L + w_cap − W)/a0``, and a kept set whose work exceeds
  ``L + w_cap`` cannot occur.

So ``Σ_A latency ≥ min over kept sets S of Σ_{A∖S} max(ℓ*, solo_r) + Σ_S (a0·O_r + λ·w_r) + (1 − λ)·Q_S²/K(W_S)``.
The last term is jointly convex in ``(Q, W)`` (a square over a positive affine function), so any tangent plane at a
point of its domain lies below it, which makes the minimum separable: each request takes the cheaper of its two
linear costs. The tangent point is moved a few times towards the kept set it selects (each point gives a valid
bound; the largest is kept). Windows, thresholds and ``λ`` are tried on a small grid; requests outside every ``A``
keep ``solo``.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from infermax.costmodel.base import CostTerm
from infermax.limits import Limits

TANGENT_STEPS = 12  # moves of the tangent point per window (each gives a valid bound)
LAMBDAS = (0.0, 0.5)
THRESHOLD_FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)  # ℓ*, in mean times alone
WINDOW_FACTORS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)  # L, in units of ℓ*
COARSE_GRID = ((2.0, 6.0, 16.0), (2.0, 4.0))  # tried first (`crowded_service_sum`)


def batch_marginal_cap_s(marginal: tuple[CostTerm, ...], limits: Limits, max_context: int, hidden: bool = False) -> float:
    """An upper bound on the marginal cost (the `additive_split`'s terms) of any one batch within ``limits``: each
    feature at its largest (tokens ≤ C, prefill tokens ≤ min(C, P), Σc² ≤ P², Σc·m ≤ P·``max_context``, decode KV
    reads ≤ M, twice that with hidden-form caches, item counts ≤ C); inf for a feature it does not know."""
    C, P = limits.C, min(limits.C, limits.prefill_budget)
    kv = (2 if hidden else 1) * limits.M
    largest = {"n_tokens": C, "prefill_tokens": P, "n_prefill_seqs": C, "n_decode_seqs": C, "prefill_sq_tokens": P * P,
               "prefill_ctx_tokens": P * max_context, "decode_kv_tokens": kv}
    cap = 0.0
    for term in marginal:
        for f, coef in term.pieces[0].coef_s.items():
            value = largest.get(f)
            if value is None:
                value = P * max_context if f.startswith("prefill_ctx_cap") else math.inf
            cap += coef * value
    return cap


def _window_bound(cost_out: np.ndarray, own: np.ndarray, q: np.ndarray, w: np.ndarray, a0: float, room_s: float,
                  lam: float) -> float:
    """``min over kept sets S`` of ``Σ_{∉S} cost_out + Σ_S own + (1 − λ)·Q_S²/(1 + (room − W_S)/a0)`` (module
    docstring), bounded below through tangent planes of the convex last term; ``room_s`` = ``L + w_cap``."""
    keep = np.ones(len(q), bool)
    best = -math.inf
    for _ in range(TANGENT_STEPS):
        Q0, W0 = float(q[keep].sum()), float(w[keep].sum())
        W0 = min(W0, room_s)  # the tangent point must lie in the domain (K >= 1)
        K = 1.0 + (room_s - W0) / a0
        h0 = (1 - lam) * Q0 * Q0 / K
        dQ = 2 * (1 - lam) * Q0 / K
        dW = (1 - lam) * Q0 * Q0 / (K * K * a0)  # d/dW of Q²/K(W), K decreasing in W
        kept_cost = own + dQ * q + dW * w
        value = h0 - dQ * Q0 - dW * W0 + float(np.minimum(cost_out, kept_cost).sum())
        best = max(best, value)
        new = kept_cost < cost_out
        if np.array_equal(new, keep):
            break
        keep = new
    return best


def crowded_service_sum(arrivals: np.ndarray, solo: np.ndarray, outputs: np.ndarray, work: np.ndarray,
                        sqrt_work: np.ndarray, a0: float, w_cap: float, floor_s: float = 0.0,
                        past_deadline: Callable[[], bool] = lambda: False) -> float | None:
    """The largest bound on Σ latency over the grid of thresholds, windows, offsets and λ (module docstring).
    Per request: ``solo`` (its time alone), ``outputs`` (O), ``work`` (w_r) and ``sqrt_work`` (q_r). A coarse grid
    runs first; the fine one only when the coarse best reaches half of ``floor_s`` (what the caller already has),
    so an instance where queueing dominates (an overloaded trace) does not pay for it. None when ``past_deadline()``
    turns true before the first grid point is done, or when there is nothing to bound."""
    n = len(arrivals)
    if n == 0 or not a0 > 0:
        return None
    order = np.argsort(arrivals, kind="stable")
    a = arrivals[order]
    solo, outputs, work, sqrt_work = solo[order], outputs[order].astype(float), work[order], sqrt_work[order]
    unit = float(solo.mean())
    if not unit > 0:
        return None
    best = None
    for thresholds, windows in (COARSE_GRID, (THRESHOLD_FACTORS, WINDOW_FACTORS)):
        if best is not None and best < 0.5 * floor_s:
            break
        for t_factor in thresholds:
            ell = unit * t_factor
            for l_factor in windows:
                L = ell * l_factor
                for offset in (0.0, L / 2):
                    for lam in LAMBDAS:
                        if best is not None and past_deadline():
                            return best
                        value = _windows_bound(a, solo, outputs, work, sqrt_work, a0, w_cap, ell, L, offset, lam)
                        best = value if best is None else max(best, value)
    return best


def _windows_bound(a: np.ndarray, solo: np.ndarray, outputs: np.ndarray, work: np.ndarray, sqrt_work: np.ndarray,
                   a0: float, w_cap: float, ell: float, L: float, offset: float, lam: float) -> float:
    """One grid point: windows ``[u0 + kL, u0 + (k + 1)L)``, ``u0 = a[0] − offset``, threshold ``ell`` (arrivals ``a``
    sorted). Only windows holding an arrival are visited. A request counts in its window's A when ``a_r + ell`` is
    below the window's end by a relative 1e-9 margin, so that rounding never puts one in that should not be (leaving
    one out only weakens the bound)."""
    u0 = a[0] - offset
    k = np.floor((a - u0) / L)
    end = u0 + (k + 1) * L
    in_a = (a >= u0 + k * L) & (a + ell <= end - 1e-9 * (np.abs(end) + L))
    own = a0 * outputs + lam * work
    total = float(solo[~in_a].sum())
    idx = np.flatnonzero(in_a)
    if len(idx):
        cuts = np.flatnonzero(np.diff(k[idx])) + 1  # a is sorted, so each window's requests are consecutive
        for group in np.split(idx, cuts):
            total += _window_bound(np.maximum(ell, solo[group]), own[group], sqrt_work[group], work[group], a0,
                                   L + w_cap, lam)
    return total
