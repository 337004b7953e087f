"""Convex piecewise-linear regression: the maximum of a few affine pieces, pieces chosen by cross-validation.

``fit_max_affine`` is the least-squares partition algorithm of Magnani & Boyd ("Convex piecewise-linear
fitting", Optimization and Engineering, 2009): split the rows into ``k`` groups, fit one affine piece
per group, reassign every row to the piece that is largest there, repeat until the groups stop
changing; several deterministic starts, the best (lowest loss) kept. Two choices of ours:

* the loss is the weighted squared **relative** error ``Σ w ((f(x) − y) / y)²`` (the error we report
  is MAPE, and times span three orders of magnitude); the fitting pipeline weights rows so that every
  token-count range counts equally (``range_weights``), because profilers sample sizes unevenly
  (Vidur: 5 rows in 1–16 tokens, 128 in 1025–4096) and the error is judged per range;
* every slope is constrained **non-negative** (scipy's NNLS, the intercept free): each feature counts
  work (tokens, KV read, sequences), so the fitted time never decreases when a batch grows.

``select_pieces`` picks ``k`` by K-fold cross-validated (weighted) MAPE: the smallest ``k`` within
5% (relative) of the best ``k``'s, preferring fewer pieces when more do not clearly help. ``select_model``
does the same over candidate feature subsets (e.g. with and without padded token counts): the first
(simplest) candidate whose best CV MAPE is within 5% of the best candidate's, then its ``k``.
``heldout_predictions`` scores a fitting procedure on rows it never saw (nested: the features and ``k``
are chosen inside each training fold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import nnls
from sklearn.model_selection import KFold

CV_FOLDS, CV_SEED = 5, 0
MAX_PIECES = 4
PIECE_SLACK = 1.05  # choose the fewest pieces whose CV MAPE is within 5% of the best
MAX_ITERATIONS = 50
RANDOM_STARTS = 1


@dataclass(frozen=True)
class MaxAffine:
    """``f(x) = max_j (intercepts[j] + slopes[j] · x)``; ``x`` has ``slopes.shape[1]`` features."""

    intercepts: np.ndarray
    slopes: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float).reshape(-1, self.slopes.shape[1])
        return (x @ self.slopes.T + self.intercepts).max(axis=1)

    @property
    def pieces(self) -> int:
        return len(self.intercepts)


def mape_pct(y: np.ndarray, pred: np.ndarray, weights: np.ndarray | None = None) -> float:
    """(Weighted) mean absolute percentage error in percent."""
    return float(100 * np.average(np.abs(pred - y) / np.abs(y), weights=weights))


def range_mask(tokens: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Rows with ``lo − 1 < tokens ≤ hi`` (integer ranges, extended to fractional token counts)."""
    return (tokens > lo - 1) & (tokens <= hi)


def range_weights(tokens: np.ndarray, ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Row weights making every non-empty token range weigh the same in total (mean weight 1)."""
    tokens = np.asarray(tokens, dtype=float)
    weights = np.zeros(len(tokens))
    masks = [range_mask(tokens, lo, hi) for lo, hi in ranges]
    masks = [m for m in masks if m.any()]
    for mask in masks:
        weights[mask] = len(tokens) / (len(masks) * mask.sum())
    if not (weights > 0).all():
        raise ValueError(f"token counts outside the ranges {ranges}")
    return weights


def _fit_piece(x1: np.ndarray, y: np.ndarray, w: np.ndarray, nonneg_intercept: bool) -> np.ndarray:
    """Weighted relative-error least squares, non-negative slopes, the intercept free or (``nonneg_intercept``)
    non-negative; ``x1`` = [1, x]."""
    root = np.sqrt(w)
    if nonneg_intercept:
        coef, _ = nnls(x1 * (root / y)[:, None], root, maxiter=50 * x1.shape[1])
        return coef
    a = np.column_stack([x1[:, :1], -x1[:, :1], x1[:, 1:]]) * (root / y)[:, None]
    coef, _ = nnls(a, root, maxiter=50 * a.shape[1])
    return np.concatenate([[coef[0] - coef[1]], coef[2:]])


def _refine(x1: np.ndarray, y: np.ndarray, w: np.ndarray, labels: np.ndarray, nonneg_intercept: bool,
            fitted: dict[bytes, np.ndarray] | None = None) -> tuple[np.ndarray, float]:
    """Alternate piece fits and argmax reassignment from ``labels``; returns (coef rows, loss).

    ``fitted``: the piece fits already made on these rows, by group (its row mask's bytes), shared by the calls of
    one `_fit_scaled`. The alternation and the starts revisit the same groups again and again (for `infermax fit`
    of the bundled A100 Llama-2-7B profile 731,625 of 858,612 piece fits were repeats), and a piece fit is a
    function of its rows alone, so reusing it changes no result."""
    coef = None
    fitted = {} if fitted is None else fitted
    for _ in range(MAX_ITERATIONS):
        rows = []
        for g in np.unique(labels):
            mask = labels == g
            key = mask.tobytes()
            piece = fitted.get(key)
            if piece is None:
                piece = fitted[key] = _fit_piece(x1[mask], y[mask], w[mask], nonneg_intercept)
            rows.append(piece)
        coef = np.array(rows)
        new = np.argmax(x1 @ coef.T, axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    active = np.unique(np.argmax(x1 @ coef.T, axis=1))
    coef = coef[active]  # drop pieces that are never the maximum on the data
    loss = float(np.sum(w * ((x1 @ coef.T).max(axis=1) / y - 1.0) ** 2))
    return coef, loss


def _starts(xs: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Initial partitions: ``k`` quantile bands along each feature and their sum, plus random ones."""
    keys = [xs[:, j] for j in range(xs.shape[1])] + ([xs.sum(axis=1)] if xs.shape[1] > 1 else [])
    starts = []
    for key in keys:
        ranks = np.argsort(np.argsort(key, kind="stable"), kind="stable")
        starts.append(ranks * k // len(key))
    starts += [rng.integers(0, k, len(xs)) for _ in range(RANDOM_STARTS)]
    return starts


def _split_start(x1: np.ndarray, y: np.ndarray, w: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Labels from a fitted model with its worst piece's rows split in two along their feature sum."""
    labels = np.argmax(x1 @ coef.T, axis=1)
    residual = w * ((x1 @ coef.T).max(axis=1) / y - 1.0) ** 2
    worst = max(np.unique(labels), key=lambda g: residual[labels == g].sum())
    rows = np.flatnonzero(labels == worst)
    key = x1[rows, 1:].sum(axis=1)
    labels = labels.copy()
    labels[rows[key > np.median(key)]] = labels.max() + 1
    return labels


def _fit_scaled(x1: np.ndarray, y: np.ndarray, w: np.ndarray, k: int, seed: int,
                nonneg_intercept: bool) -> list[tuple[np.ndarray, float]]:
    """Best (coef, loss) for 1 .. ``k`` pieces; a ``j − 1``-piece model is also a ``j``-piece candidate."""
    fitted: dict[bytes, np.ndarray] = {}  # piece fits by group, shared by every refinement below (`_refine`)
    fits = [_refine(x1, y, w, np.zeros(len(y), dtype=int), nonneg_intercept, fitted)]
    for j in range(2, k + 1):
        best = fits[-1]
        for labels in _starts(x1[:, 1:], j, np.random.default_rng(seed)) + [_split_start(x1, y, w, best[0])]:
            coef, loss = _refine(x1, y, w, labels, nonneg_intercept, fitted)
            if loss < best[1] - 1e-12:
                best = (coef, loss)
        fits.append(best)
    return fits


def fit_max_affine_all(x: np.ndarray, y: np.ndarray, k: int, weights: np.ndarray | None = None,
                       seed: int = CV_SEED, nonneg_intercept: bool = False) -> list[MaxAffine]:
    """The fits with at most 1, 2, .., ``k`` affine pieces of ``y`` (positive) over the columns of ``x``.

    Starts: quantile bands, random partitions, and the best ``j − 1``-piece fit with its worst piece
    split; the lowest loss wins, including the ``j − 1``-piece fit itself (so the loss never grows).
    ``nonneg_intercept`` constrains every piece's intercept to be >= 0 (slopes always are)."""
    y = np.asarray(y, dtype=float)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
    x = np.asarray(x, dtype=float).reshape(len(y), -1)
    if np.any(y <= 0):
        raise ValueError("max-affine fitting needs positive targets (relative-error loss)")
    scale = np.where(np.abs(x).max(axis=0) > 0, np.abs(x).max(axis=0), 1.0)
    fits = _fit_scaled(np.column_stack([np.ones(len(y)), x / scale]), y, w, k, seed, nonneg_intercept)
    return [MaxAffine(intercepts=coef[:, 0].copy(), slopes=coef[:, 1:] / scale) for coef, _ in fits]


def fit_max_affine(x: np.ndarray, y: np.ndarray, k: int, weights: np.ndarray | None = None,
                   seed: int = CV_SEED, nonneg_intercept: bool = False) -> MaxAffine:
    """Fit ``max`` of at most ``k`` affine pieces (see ``fit_max_affine_all``)."""
    return fit_max_affine_all(x, y, k, weights, seed, nonneg_intercept)[-1]


def _folds(n: int):
    return KFold(min(CV_FOLDS, n), shuffle=True, random_state=CV_SEED).split(np.arange(n))


def cv_mape_by_pieces(x: np.ndarray, y: np.ndarray, weights: np.ndarray, max_pieces: int = MAX_PIECES,
                      nonneg_intercept: bool = False) -> dict[int, float]:
    """Cross-validated weighted MAPE (%) of ``fit_max_affine`` for ``k = 1 .. max_pieces``."""
    x = np.asarray(x, dtype=float).reshape(len(y), -1)
    pred = np.empty((max_pieces, len(y)))
    for train, test in _folds(len(y)):
        for j, fitted in enumerate(fit_max_affine_all(x[train], y[train], max_pieces, weights[train],
                                                               nonneg_intercept=nonneg_intercept)):
            pred[j, test] = fitted.predict(x[test])
    return {j + 1: mape_pct(y, pred[j], weights) for j in range(max_pieces)}


def select_pieces(x: np.ndarray, y: np.ndarray, weights: np.ndarray, max_pieces: int = MAX_PIECES,
                  nonneg_intercept: bool = False) -> tuple[int, dict[int, float]]:
    """The number of pieces to use (fewest within ``PIECE_SLACK`` of the best CV MAPE) and every ``k``'s CV MAPE."""
    errors = cv_mape_by_pieces(x, y, weights, max_pieces, nonneg_intercept)
    return _fewest_pieces(errors), errors


def _fewest_pieces(errors: dict[int, float]) -> int:
    return min(k for k, e in errors.items() if e <= PIECE_SLACK * min(errors.values()))


@dataclass(frozen=True)
class Selection:
    """The chosen feature subset (column indices) and piece count, with every candidate's CV MAPE by ``k``,
    and whether intercepts are held >= 0."""

    columns: tuple[int, ...]
    pieces: int
    cv_mape: dict[tuple[int, ...], dict[int, float]]
    nonneg_intercept: bool = False


def select_model(x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                 candidates: tuple[tuple[int, ...], ...] | None = None, nonneg_intercept: bool = False) -> Selection:
    """Choose a feature subset among ``candidates`` (column-index tuples, simplest first; default: all
    columns) and then ``k``, each the simplest choice within ``PIECE_SLACK`` of the best CV MAPE."""
    x = np.asarray(x, dtype=float).reshape(len(y), -1)
    candidates = candidates or (tuple(range(x.shape[1])),)
    errors = {cols: cv_mape_by_pieces(x[:, list(cols)], y, weights, nonneg_intercept=nonneg_intercept)
              for cols in candidates}
    best = min(min(e.values()) for e in errors.values())
    cols = next(c for c in candidates if min(errors[c].values()) <= PIECE_SLACK * best)
    return Selection(cols, _fewest_pieces(errors[cols]), errors, nonneg_intercept)


def fit_model(x: np.ndarray, y: np.ndarray, weights: np.ndarray, selection: Selection) -> MaxAffine:
    """Fit the selected subset and piece count on all rows; unused columns get zero slopes."""
    x = np.asarray(x, dtype=float).reshape(len(y), -1)
    fitted = fit_max_affine(x[:, list(selection.columns)], y, selection.pieces, weights,
                            nonneg_intercept=selection.nonneg_intercept)
    slopes = np.zeros((fitted.pieces, x.shape[1]))
    slopes[:, list(selection.columns)] = fitted.slopes
    return MaxAffine(fitted.intercepts, slopes)


def fit_selected(x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                 candidates: tuple[tuple[int, ...], ...] | None = None, nonneg_intercept: bool = False) -> MaxAffine:
    """Choose the features and ``k`` by cross-validation on ``(x, y)`` (``select_model``), then fit on all of it."""
    return fit_model(x, y, weights, select_model(x, y, weights, candidates, nonneg_intercept))


def heldout_predictions(x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                        fit: Callable[[np.ndarray, np.ndarray, np.ndarray], object]) -> np.ndarray:
    """Predictions for every row by ``fit(x_train, y_train, w_train).predict`` on the folds that leave it out."""
    x = np.asarray(x, dtype=float).reshape(len(y), -1)
    pred = np.empty(len(y))
    for train, test in _folds(len(y)):
        pred[test] = fit(x[train], y[train], weights[train]).predict(x[test])
    return pred
