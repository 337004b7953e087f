"""Sum of latencies bounded through every pair of completions: a convex QP over the completion profile.

Offline instances only (every request arrives at the same time). The rule and its proof are in
docs/design.md, "Pairwise completions"; in short, with the batch time split into a per-batch intercept
``a0`` plus per-item marginal work (`cost_terms.additive_split`), and ``x_j`` the number of requests
completing in batch ``j``, every schedule of ``n`` identical requests has

    Σ_r (F_r − T) >= ½·n²·w + a0·Σ_j j·x_j + ½·Σ_{i,j} x_i·x_j·g(|i − j|)

where ``w`` is one request's least marginal work and ``g(d)`` a convex lower bound on the marginal work of
its first ``O − d`` tokens (``g(0) = w``, ``g(d) = 0`` for ``d >= O``). A convex decreasing ``g`` that
ends at 0 makes the Toeplitz matrix ``g(|i − j|)`` positive semidefinite (Pólya's criterion), so the
right-hand side is a convex quadratic in ``x``; its minimum over the polytope {x >= 0, Σx = n, at most
``cap(j)`` requests done by batch ``j``} is a lower bound, and Frank–Wolfe gives a *certified* lower bound
on that minimum at every iteration (convexity: f(y) >= f(x) + ∇f(x)·(y − x)), so stopping early (time
budget) still yields a valid bound, only a weaker one.

Several request classes (`joint_qp_bound`): one QP over every class's profile, whose off-diagonal blocks
charge a pair of requests of different classes finishing close together for the early work of the later one
(`cross_kernel`), as far as the block operator stays positive semidefinite (checked exactly, frequency by
frequency); with the cross blocks off it is each class's own QP plus, per cross pair, the smaller ``w``.
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
MAX_SPECTRA_BYTES = 512 << 20  # the kernels' spectra (about 2C² + 2C floats per frequency): the joint QP's memory
# The per-frequency C×C matrices are checked this many entries at a time.
SPECTRA_CHUNK_ENTRIES = 1 << 22
CROSS_RAISES = (1.0, 0.75, 0.5, 0.25, 0.125)
CROSS_PASSES = 16  # the fractions of the way to its own limit a pair's θ is tried at, in turn


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


def _wrap(kernel: np.ndarray, size: int) -> np.ndarray:
    """The first row of the symmetric circulant of ``size`` whose kernel is ``kernel`` (mirrored at the end)."""
    wrapped = np.zeros(size)
    wrapped[:len(kernel)] = kernel
    if len(kernel) > 1:
        wrapped[size - len(kernel) + 1:] = kernel[1:][::-1]
    return wrapped


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
    kernel_f = np.fft.rfft(_wrap(kernel, size))

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


@dataclass(frozen=True)
class RequestClass:
    """One class of identical requests for `joint_qp_bound`: how many, its own kernel (as in `class_qp_bound`),
    ``partial[d]`` (d = 0..O) a lower bound on the marginal work of its first O − d tokens (non-increasing,
    ``partial[0] = kernel[0] = w``, ``partial[O] = 0``) and ``ch`` (as in `class_qp_bound`)."""

    n: int
    kernel: np.ndarray
    partial: np.ndarray
    ch: np.ndarray


def cross_kernel(a: RequestClass, b: RequestClass) -> np.ndarray:
    """χ(e), e = 0..max(O_a, O_b): a lower bound on what a pair (r of a, r' of b) completing e batches apart adds
    to Σ_j t_j·U_j beyond min(w_a, w_b), as a convex non-increasing function ending at 0.

    The one finishing first adds its whole marginal work; the other, finishing e >= 1 batches later, has done at
    least the work of all but e of its tokens by then (``partial[e]``); finishing together both add all of it:
    ψ(0) = w_a + w_b, ψ(e) = min(partial_a[e] + w_b, partial_b[e] + w_a). ψ − min(w_a, w_b) >= 0 is
    non-increasing and 0 from e = max(O_a, O_b) on; its lower convex envelope is returned."""
    E = max(len(a.partial), len(b.partial)) - 1
    pa = np.zeros(E + 1)
    pa[:len(a.partial)] = a.partial
    pb = np.zeros(E + 1)
    pb[:len(b.partial)] = b.partial
    wa, wb = float(a.kernel[0]), float(b.kernel[0])
    psi = np.minimum(pa + wb, pb + wa)
    psi[0] = wa + wb
    return lower_convex_envelope(np.maximum(psi - min(wa, wb), 0.0))


@dataclass(frozen=True)
class JointBound:
    """`joint_qp_bound`'s answer: the certified lower bound, where Frank–Wolfe stopped, the horizon, each cross
    pair's θ, the smallest eigenvalue of the block operator and the cross kernels used."""

    lower_s: float
    upper_s: float
    iterations: int
    horizon: int
    cross_share: dict  # θ of each pair of classes (indices)
    min_eigenvalue: float
    # (i, j), i < j -> q_ij(t) for t = −(J − 1)..J − 1 (index t + J − 1): Q_ij[r, r'] = q_ij(r − r')
    cross_kernels: dict


def joint_qp_bound(classes: list[RequestClass], a0: float, budget_s: float) -> JointBound | None:
    """Certified lower bound on Σ_r (F_r − T) for an offline instance of several classes (the intercept before the
    first batch excluded, as in `class_qp_bound`), through every
    pair of requests (docs/design.md, "Pairwise completions", several classes): the minimum over the classes'
    completion profiles x^c of

        Σ_c ½n_c²w_c + Σ_{c<c'} n_c n_c' min(w_c, w_c') + a0·Σ_c Σ_j j·x^c_j + ½ Σ_{c,c'} x^cᵀ Q_cc' x^c'

    with Q_cc the Toeplitz matrix of the class's kernel and Q_cc' (c != c') that of θ_cc'·χ_cc' (`cross_kernel`,
    θ in [0, 1]). Q is positive semidefinite by construction, checked exactly: each block is a principal
    section of a circulant of the same size, a block circulant is block-diagonalised by the DFT, so Q is PSD
    when the C×C matrix of the kernels' spectra is at every frequency. The θ are the largest that keep it so
    (`_spectral_cross`); what round-off leaves of a negative eigenvalue (ε, plus a margin) is added to the
    diagonal, which makes the objective convex, and ½·ε·n² taken off the bound.
    None without a positive ``a0`` or when the horizon is too large."""
    if a0 <= 0:
        return None
    C = len(classes)
    n_total = sum(c.n for c in classes)
    w = np.array([float(c.kernel[0]) for c in classes])
    counts = np.array([c.n for c in classes], dtype=float)
    cross = {(i, j): cross_kernel(classes[i], classes[j]) for i in range(C) for j in range(i + 1, C)}
    E = max(len(c.kernel) for c in classes)  # every kernel, the cross ones too, is 0 from max O on
    # horizon: the kernel row sums are at most n_c'·k_cc'(0) with θ <= 1 (see `class_qp_bound`)
    row = [sum(counts[j] * (w[i] if i == j else cross[min(i, j), max(i, j)][0]) for j in range(C)) for i in range(C)]
    J = int(max(max(int(c.ch[c.n]), 1) + math.floor(r / a0) + 1 for c, r in zip(classes, row)))
    size = 1 << int(math.ceil(math.log2(J + E + 1)))
    if J > MAX_HORIZON_BATCHES // C or (size // 2 + 1) * (2 * C * C + 2 * C) * 8 > MAX_SPECTRA_BYTES:
        return None
    diag = np.stack([np.fft.rfft(_wrap(c.kernel, size)).real for c in classes], axis=1)  # (F, C)
    start = time.perf_counter()
    cross, cross_spec, theta, lam = _spectral_cross(counts, cross, diag, size, start + budget_s / 2)
    scale = float(max(np.abs(diag).max(), 1e-300))
    eps = max(0.0, -lam) * (1 + 1e-6) + 1e-10 * scale  # Q + eps·I is PSD, with a margin for round-off
    # the products use exactly the spectra whose PSD-ness was checked (real: every kernel is symmetric)
    kernel_f = [[None] * C for _ in range(C)]
    for i in range(C):
        kernel_f[i][i] = diag[:, i]
        for j in range(i + 1, C):
            kernel_f[i][j] = kernel_f[j][i] = theta[i, j] * cross_spec[i, j]

    def Q_times(x: np.ndarray) -> np.ndarray:  # x: (C, J); (Q + eps·I)·x
        xf = np.fft.rfft(x, size, axis=1)
        out = np.stack([np.fft.irfft(sum(xf[j] * kernel_f[i][j] for j in range(C)), size)[:J] for i in range(C)])
        return out + eps * x

    constant = 0.5 * float(counts @ (counts * w)) + sum(
        counts[i] * counts[j] * min(w[i], w[j]) for i in range(C) for j in range(i + 1, C))
    position = np.arange(1, J + 1, dtype=float)
    earliest = [np.clip(np.asarray(c.ch[1:c.n + 1], dtype=np.int64), 1, J) - 1 for c in classes]

    def cheapest(cost: np.ndarray) -> np.ndarray:
        return np.stack([cheapest_profile(cost[i], earliest[i]) for i in range(C)])

    x = cheapest(np.tile(a0 * position, (C, 1)))
    Qx = Q_times(x)
    best_lower, value, it = -math.inf, math.inf, 0
    for it in range(1, FW_MAX_ITERATIONS + 1):
        value = constant + a0 * float((x @ position).sum()) + 0.5 * float((x * Qx).sum())
        grad = a0 * position + Qx
        y = cheapest(grad)
        gap = float((grad * (x - y)).sum())
        best_lower = max(best_lower, value - gap)
        if gap <= FW_RELATIVE_GAP * value or time.perf_counter() - start > budget_s:
            break
        direction = y - x
        Q_direction = Q_times(direction)
        curvature = float((direction * Q_direction).sum())
        step = 1.0 if curvature <= 0 else min(1.0, max(0.0, gap / curvature))
        x = x + step * direction
        Qx = Qx + step * Q_direction
    offsets = np.abs(np.arange(-(J - 1), J))
    kernels = {ij: np.where(offsets < len(k), theta[ij] * k[np.minimum(offsets, len(k) - 1)], 0.0)
               for ij, k in cross.items()}
    return JointBound(best_lower - 0.5 * eps * n_total ** 2, value, it, J, dict(theta), lam, kernels)


def _spectra_matrices(diag: np.ndarray, cross: dict, theta: dict, factor: float, rows: slice) -> np.ndarray:
    """The C×C matrices of the block operator's spectra at the frequencies ``rows``: the classes' own spectra on
    the diagonal, ``factor·θ_ij·χ̂_ij`` off it (real: every kernel is symmetric)."""
    C = diag.shape[1]
    m = np.zeros((len(range(*rows.indices(diag.shape[0]))), C, C))
    m[:, np.arange(C), np.arange(C)] = diag[rows]
    for (i, j), K in cross.items():
        m[:, i, j] = m[:, j, i] = factor * theta[i, j] * K[rows]
    return m


def _chunks(frequencies: int, C: int) -> list[slice]:
    step = max(1, SPECTRA_CHUNK_ENTRIES // (C * C))
    return [slice(k, min(k + step, frequencies)) for k in range(0, frequencies, step)]


def _cross_shapes(chi: np.ndarray) -> list[np.ndarray]:
    """Kernels below a pair's χ to choose from: χ itself, and the largest multiple of the one triangle
    (1 − e/E)_+ below it (E = its support). A triangle's spectrum vanishes where that of a class whose kernel
    is one triangle of a divisor length does; χ's kinks do not, and a single such frequency would switch the
    pair off."""
    E = len(chi) - 1
    if E < 1 or chi[0] <= 0:
        return [chi]
    triangle = 1.0 - np.arange(E + 1) / E
    return [chi, float(np.min(chi[:E] / triangle[:E])) * triangle]


def _spectral_cross(counts, chi, diag, size, deadline):
    """The cross blocks for the pairs' χ (a dict): the kernel shape chosen per pair (`_cross_shapes`, the one whose
    own limit carries the most mass), its spectrum k̂_ij (real) and θ_ij, and the smallest eigenvalue over all
    frequencies. θ: each pair's own limit (θ²·k̂² <= ĝ_i·ĝ_j at every frequency, its 2×2 condition), then one
    common factor on all of them (the largest keeping every frequency's C×C matrix PSD, verified by a Cholesky
    factorisation with a tolerance), then, until ``deadline`` (perf_counter), passes over the heaviest pairs
    (pairs of requests × kernel), each raised towards its own limit under the same test."""
    C = diag.shape[1]
    scale = float(max(np.abs(diag).max(), 1e-300))
    cross, cross_spec, theta = {}, {}, {}
    for (i, j), chi_ij in chi.items():
        room = np.sqrt(np.maximum(diag[:, i], 0) * np.maximum(diag[:, j], 0))
        best = None
        for k in _cross_shapes(chi_ij):  # the pair's own 2×2 limit for each shape: θ²·K² <= G_i·G_j everywhere
            K = np.fft.rfft(_wrap(k, size)).real
            big = np.abs(K) > 1e-12 * scale
            limit = float(min(1.0, np.min(room[big] / np.abs(K[big])))) if big.any() else 0.0
            if best is None or limit * K[0] > best[0] * best[2][0]:
                best = (limit, k, K)
        theta[i, j], cross[i, j], cross_spec[i, j] = best
    cap = dict(theta)
    shift = 1e-9 * scale * np.eye(C)
    chunks = _chunks(diag.shape[0], C)

    def psd(factor: float) -> bool:  # every frequency's matrix + tolerance·I has a Cholesky factor
        try:
            for rows in chunks:
                np.linalg.cholesky(_spectra_matrices(diag, cross_spec, theta, factor, rows) + shift)
        except np.linalg.LinAlgError:
            return False
        return True

    if C > 1 and not psd(1.0):
        # one common factor on every pair's own limit: with the spectra normalised by √(ĝ_i·ĝ_j), a frequency's
        # matrix is I + s·A and stays PSD up to s = 1 / (−λ_min(A)); verified, and halved until it passes
        worst = 0.0
        for rows in chunks:
            root = np.sqrt(np.maximum(diag[rows], 0.0))
            norm = root[:, :, None] * root[:, None, :]
            A = _spectra_matrices(diag, cross_spec, theta, 1.0, rows)
            A = np.clip(np.divide(A, norm, out=np.zeros_like(A), where=norm > 1e-12 * scale), -1.0, 1.0)
            A[:, np.arange(C), np.arange(C)] = 0.0
            worst = max(worst, -float(np.linalg.eigvalsh(A)[:, 0].min()))
        factor = min(1.0, 0.999 / worst) if worst > 0 else 1.0
        while factor > 1e-6 and not psd(factor):
            factor *= 0.5
        factor = factor if factor > 1e-6 else 0.0
        for ij in theta:
            theta[ij] *= factor
        # ...then the heaviest pairs (most pairs of requests × kernel) raised one by one towards their own limit,
        # while the deadline allows (θ passes the test after every step)
        order = sorted(theta, key=lambda ij: -counts[ij[0]] * counts[ij[1]] * cap[ij] * cross[ij][0])
        for _ in range(CROSS_PASSES):  # passes until one raises nothing
            before = dict(theta)
            for ij in order:
                kept = theta[ij]
                for step in CROSS_RAISES:  # try the pair's own limit, then points part of the way to it
                    if time.perf_counter() > deadline or cap[ij] - kept <= 1e-9:
                        break
                    theta[ij] = kept + step * (cap[ij] - kept)
                    if psd(1.0):
                        kept = theta[ij]
                        break
                theta[ij] = kept
            if theta == before:
                break
    lam = min(float(np.linalg.eigvalsh(_spectra_matrices(diag, cross_spec, theta, 1.0, rows))[:, 0].min())
              for rows in chunks)
    return cross, cross_spec, theta, lam
