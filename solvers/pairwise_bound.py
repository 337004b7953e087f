"""Sum of latencies bounded through every pair of completions: a convex QP over the completion profile.

Offline instances only (every request arrives at the same time). The rule and its proof are in
docs/design.md, "Pairwise completions"; in short, with the batch time split into a per-batch intercept
``a0`` plus per-item marginal work (`lower_bound.additive_split`), and ``x_j`` the number of requests
completing in batch ``j``, every schedule of ``n`` identical requests has

    Σ_r (F_r − T) >= ½·n²·w + a0·Σ_j j·x_j + ½·Σ_{i,j} x_i·x_j·g(|i − j|)

where ``w`` is one request's least marginal work and ``g(d)`` a convex lower bound on the marginal work of
its first ``O − d`` tokens (``g(0) = w``, ``g(d) = 0`` for ``d >= O``). A convex decreasing ``g`` that
ends at 0 makes the Toeplitz matrix ``g(|i − j|)`` positive semidefinite (Pólya's criterion), so the
right-hand side is a convex quadratic in ``x``; its minimum over the polytope {x >= 0, Σx = n, at most
``cap(j)`` requests done by batch ``j``} is a lower bound, and Frank–Wolfe gives a *certified* lower bound
on that minimum at every iteration (convexity: f(y) >= f(x) + ∇f(x)·(y − x)), so stopping early (time
budget) still yields a valid bound, only a weaker one.

Several request classes: each class's own QP (its requests among themselves), plus, for every pair of
requests of different classes, the marginal work of the one that finishes first (at least the smaller of
the two classes' ``w``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

# Frank–Wolfe stops when its certified gap is below this fraction of the objective...
FW_RELATIVE_GAP = 1e-4
# ...or after this many iterations, or when its time budget is spent (the certificate stays valid).
FW_MAX_ITERATIONS = 5000
# The horizon (batches) above which a class is skipped rather than solved: the FFTs would not fit in memory
# and time (2^22 positions: two float arrays of 32 MiB each).
MAX_HORIZON_BATCHES = 1 << 22


def lower_convex_envelope(values: np.ndarray) -> np.ndarray:
    """The largest convex function on 0..len−1 below ``values`` (its lower convex hull, evaluated at the
    integers). Below the values everywhere, so a bound built on it stays a bound."""
    hull: list[tuple[int, float]] = []
    for d, y in enumerate(values.tolist()):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (d - x1) >= (y - y1) * (x2 - x1):  # the middle point is not below the chord
                hull.pop()
            else:
                break
        hull.append((d, y))
    xs, ys = zip(*hull)
    return np.minimum(values, np.interp(np.arange(len(values)), xs, ys))


def step_lower(grid: list[int], at_grid: list[float], O: int) -> np.ndarray:
    """A lower bound on a non-increasing M(d) for every integer d in 0..O from its values on ``grid``
    (ascending, containing 0 and O): a d between grid points takes the value at the grid point above."""
    g = np.asarray(grid)
    above = np.searchsorted(g, np.arange(O + 1), side="left")
    return np.asarray(at_grid, dtype=float)[above]


def cheapest_profile(cost: np.ndarray, earliest: np.ndarray) -> np.ndarray:
    """The exact minimiser of Σ_j cost[j]·x_j over {x >= 0, Σx = n, the k-th completion in a batch >= earliest[k]}
    (0-based batches, ``earliest`` non-decreasing, n = len(earliest)), as completions per batch.

    Each completion may take any batch at or after its earliest, as many per batch as wanted, so each takes
    the cheapest such batch (a suffix argmin); the k-th smallest of the chosen batches is still >= earliest[k]
    (the n − k + 1 completions from k on all sit at or after earliest[k]), so the choice is feasible, and no
    feasible point is cheaper (its k-th completion costs at least the cheapest batch from earliest[k] on)."""
    J = len(cost)
    running = np.minimum.accumulate(cost[::-1])
    new_min = np.concatenate([[True], running[1:] < running[:-1]])
    where_reversed = np.maximum.accumulate(np.where(new_min, np.arange(J), 0))
    suffix_argmin = (J - 1 - where_reversed)[::-1]
    return np.bincount(suffix_argmin[earliest], minlength=J).astype(float)


@dataclass(frozen=True)
class ClassBound:
    """One class's QP: its certified lower bound, the objective where Frank–Wolfe stopped, and how far it got."""

    lower_s: float
    upper_s: float
    iterations: int
    horizon: int


def class_qp_bound(n: int, a0: float, kernel: np.ndarray, ch: np.ndarray, budget_s: float) -> ClassBound | None:
    """Certified lower bound on min ½n²w + a0·Σ j·x_j + ½xᵀKx over {x >= 0, Σx = n, X_j <= cap(j)}.

    ``kernel[d]`` (d = 0..O) is convex, non-increasing, ``kernel[O] = 0``; ``ch[k]`` (k = 0..n, ``ch[0] = 0``,
    non-decreasing) is the least batch by which k of the requests can all be done, so the k-th completion is
    in a batch >= ch[k] (positions are batches 1, 2, …). Returns None when the horizon is too large.

    Horizon: moving mass from a batch p to ch[n] is feasible and changes the objective at rate
    a0·(ch[n] − p) + (Kx)_{ch[n]} − (Kx)_p <= a0·(ch[n] − p) + n·w, negative beyond p = ch[n] + n·w/a0, so
    every minimiser lives in batches 1..ch[n] + ⌊n·w/a0⌋ and nothing is lost by cutting there."""
    w = float(kernel[0])
    O = len(kernel) - 1
    if n == 0:
        return ClassBound(0.0, 0.0, 0, 0)
    if a0 <= 0:
        return None
    J = int(max(ch[n], 1) + math.floor(n * w / a0) + 1)
    if J > MAX_HORIZON_BATCHES:
        return None
    size = 1 << int(math.ceil(math.log2(J + O + 1)))
    wrapped = np.zeros(size)
    wrapped[:O + 1] = kernel
    wrapped[size - O:] = kernel[1:][::-1]
    kernel_f = np.fft.rfft(wrapped)

    def K_times(v: np.ndarray) -> np.ndarray:
        return np.fft.irfft(np.fft.rfft(v, size) * kernel_f, size)[:J]

    position = np.arange(1, J + 1, dtype=float)
    earliest = np.clip(np.asarray(ch[1:n + 1], dtype=np.int64), 1, J) - 1  # 0-based earliest batch of completion k

    start = time.perf_counter()
    x = cheapest_profile(a0 * position, earliest)
    Kx = K_times(x)
    best_lower, value, it = -math.inf, math.inf, 0
    for it in range(1, FW_MAX_ITERATIONS + 1):
        value = 0.5 * n * n * w + a0 * float(position @ x) + 0.5 * float(x @ Kx)
        grad = a0 * position + Kx
        y = cheapest_profile(grad, earliest)
        gap = float(grad @ (x - y))
        best_lower = max(best_lower, value - gap)
        if gap <= FW_RELATIVE_GAP * value or time.perf_counter() - start > budget_s:
            break
        direction = y - x
        K_direction = K_times(direction)
        curvature = float(direction @ K_direction)
        step = 1.0 if curvature <= 0 else min(1.0, max(0.0, gap / curvature))
        x = x + step * direction
        Kx = Kx + step * K_direction
    return ClassBound(best_lower, value, it, J)
