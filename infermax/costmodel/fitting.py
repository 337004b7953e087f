"""Fit the linear (paper) and convex piecewise-linear cost models to a profile folder, with error tables.

Usage: ``python -m infermax.costmodel.fitting PROFILE_DIR`` (or ``infermax fit PROFILE_DIR``).
``PROFILE_DIR`` is either one of ours (``measurements.csv`` + ``profile.json``) or a Vidur-format
folder (``mlp.csv``, optionally ``attention.csv`` and ``all_reduce.csv``), imported first (see
``profile_import``).

Operator groups (whole-model times per batch, ms; ``L`` layers, Vidur's per-layer medians):

* ``non_attention`` vs ``n_tokens`` (piecewise: and, where cross-validation prefers them, the padded
  counts ``⌈n/q⌉·q``, GEMM tile sizes, q in {64, 128} or {32, 64, 128, 256}, or non-negative steps
  ``[n > t]`` at the thresholds ``step_thresholds`` places on the profiled grid, one height per block,
  because cuBLAS picks another kernel at some tile boundaries and the jump varies from block to
  block): ``L ×`` (input_layernorm + attn_pre_proj + attn_rope +
  attn_post_proj + post_attention_layernorm + mlp_up_proj + mlp_act + mlp_down_proj + 2 × add; a
  Llama layer has two residual adds, Vidur profiles one) + ``emb`` once per batch + the LM head's time at
  one generating row once per batch (``lm_head_floor_ms``; profiles without ``lm_head`` rows, Vidur's, add 0).
* ``communication`` (TP > 1) vs ``n_tokens``: ``L × 2`` all-reduces (after the attention output
  projection and after the MLP) of ``n_tokens × hidden`` fp16 values.
* ``prefill_attention`` (prefill rows, batch 1: chunk ``c`` after ``m`` cached tokens) is fitted as two
  parts and scored on their sum: ``prefill_attention_kernel`` (``L ×`` the attention kernel) vs
  ``Σc², Σc·m, Σc`` and, where CV prefers it, ``Σc·min(m, K)`` (K in 256..2048; small chunks switch to a
  split-KV kernel whose time stops growing with the context), intercepts >= 0; and ``prefill_kv_save``
  (``L ×`` the KV-cache write) vs ``Σc, Σc·m`` and optionally ``Σc·min(m, K)``, intercepts free (one kernel
  writes the whole batch's tokens, so its time is a function of the batch totals; it is convex in ``c``:
  the per-token cost doubles between 512 and 1024 tokens). The linear family keeps one plane over
  ``Σc², Σc·m, Σc`` (the sum of the parts' planes). The decodes' KV write is in ``decode_attention``, below.
* ``decode_attention`` (``L ×`` the attention call + the decodes' K/V write where profiled,
  ``decode_kv_save_ms``) vs KV read ``batch × kv_cache_size`` (and, piecewise, sequences ``batch`` and,
  where CV prefers it, the longest KV read capped at K ``min(kv_cache_size, K)``, K in 256..2048).
  Piecewise prefill-kernel and decode intercepts are held >= 0 (batches are priced on sums over items).

Families: **linear** is the paper's model, an ordinary least-squares line/plane per group
(scikit-learn ``LinearRegression``; decode on KV read only; slopes, and whole groups' intercepts, held
>= 0: ``_ols``, ``_ols_nonneg_intercept``), stored as ``infermax_linear.json``;
**piecewise** is the maximum of ``k`` affine pieces per group (``maxaffine``: relative-error loss,
each token range weighted equally, non-negative slopes, feature subset and ``k ≤ 4`` chosen by 5-fold
CV), stored as
``infermax_piecewise.json``. Held-out error: 5-fold cross-validation (shuffled, seed 0; for piecewise
the features and ``k`` are re-chosen inside every training fold), MAPE per token range (``n_tokens``; chunk size for
prefill, batch size for decode) and overall. The roofline model (``roofline.py``) is scored on the
same rows where they are measurements (not derived). ``auto`` is the family with the lower mean
over groups of overall held-out MAPE; the choice is stored in ``profile.json``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression

from ..jsonio import read_json
from . import maxaffine
from .base import (CAPPED_FEATURES, PADDED_FEATURES, PREFILL_CTX_CAP_FEATURES, PREFILL_CTX_CAPS, AffinePiece, BatchFeatures,
                   CostTerm, kv_cap, padded, padding_quantum, step_name, token_step)
from .linear import KIND as LINEAR_KIND, VERSION as LINEAR_VERSION, LinearCostModel
from .measurements import LINEAR_JSON, MEASUREMENTS_CSV, NON_ATTENTION_OPS, PIECEWISE_JSON, PROFILE_JSON, read_measurements
from .piecewise import PiecewiseCostModel

TOKEN_RANGES = ((1, 16), (17, 128), (129, 1024), (1025, 4096), (4097, 16384))  # extended by ``token_ranges``
STEP_QUANTUM, STEP_MIN_ROWS = 32, 4  # non-attention steps: the smallest GEMM row tile of PADDED_FEATURES; rows per block
ADDS_PER_LAYER = 2
FAMILIES = ("linear", "piecewise", "roofline")


@dataclass(frozen=True)
class ProfileSpec:
    """What a profile folder is: GPU, model, TP degree and the model's layer count and hidden size."""

    gpu: str
    model: str
    tp: int
    num_layers: int
    hidden_size: int

    @classmethod
    def read(cls, folder: Path) -> "ProfileSpec":
        doc = read_json(folder / PROFILE_JSON)
        try:
            return cls(*(doc[k] for k in ("gpu", "model", "tp", "num_layers", "hidden_size")))
        except KeyError as exc:
            raise ValueError(f"{folder / PROFILE_JSON}: missing key {exc}") from None


@dataclass(frozen=True)
class Group:
    """One operator group's rows: features (``FEATURE_COLUMNS`` names), whole-model ms, token key."""

    name: str
    gate: str
    features: tuple[str, ...]
    linear_features: tuple[str, ...]
    x: np.ndarray
    y_ms: np.ndarray
    tokens: np.ndarray
    measured: np.ndarray
    candidates: tuple[tuple[str, ...], ...] = ()  # feature subsets the piecewise fit chooses from (default: all)
    nonneg_intercept: bool = False  # piecewise intercepts >= 0 (rows measure single items, batches are priced on sums)
    part_of: str | None = None  # a part of a composite group whose error is scored on the sum of its parts

    def columns(self, names: tuple[str, ...]) -> np.ndarray:
        return self.x[:, [self.features.index(n) for n in names]]

    def candidate_columns(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(self.features.index(n) for n in c) for c in self.candidates or (self.features,))


def step_thresholds(tokens: np.ndarray, quantum: int = STEP_QUANTUM, min_rows: int = STEP_MIN_ROWS) -> tuple[int, ...]:
    """Where the non-attention fit may place steps ``[n > t]``: from ``t = 0`` up, the next ``t + w`` with the
    smallest ``w = quantum·2^j`` whose block ``(t, t + w]`` holds at least ``min_rows`` profiled token counts,
    while at least ``min_rows`` counts lie above it (so every step height rests on rows either side, and the
    steps follow the profiler's grid: every 32 tokens where Vidur samples every 8, every 128 where every 32)."""
    grid = np.unique(np.asarray(tokens))
    thresholds, t = [], 0
    while True:
        w = quantum
        while np.count_nonzero((grid > t) & (grid <= t + w)) < min_rows and t + w < grid.max():
            w *= 2
        if np.count_nonzero((grid > t) & (grid <= t + w)) < min_rows or np.count_nonzero(grid > t + w) < min_rows:
            return tuple(thresholds)
        t += w
        thresholds.append(int(t))


def token_ranges(max_tokens: float) -> tuple[tuple[int, int], ...]:
    """``TOKEN_RANGES``, followed by ranges four times wider (16385-65536, 65537-262144, ...) until they hold
    ``max_tokens``: a profile that measured larger batches gets error-table columns (and equal range weights)
    for them; a profile within 16,384 tokens is fitted exactly as before."""
    ranges = list(TOKEN_RANGES)
    while ranges[-1][1] < max_tokens:
        ranges.append((ranges[-1][1] + 1, 4 * ranges[-1][1]))
    return tuple(ranges)


def error_columns(errors: dict) -> list[str]:
    """The columns of an error table (``heldout_error``): ``all``, then every token range any cell has, by size."""
    keys = {r for families in errors.values() for table in families.values() for r in table if r != "all"}
    return ["all"] + sorted(keys, key=lambda r: int(r.split("-")[0]))


def _is_measured(frame: pd.DataFrame) -> np.ndarray:
    return frame["derivation"].fillna("").astype(str).eq("").to_numpy()


def lm_head_floor_ms(table: pd.DataFrame) -> float:
    """The LM head's time at its fewest generating rows (the measured ``lm_head`` rows: final norm, LM head and
    greedy pick for ``num_tokens`` sequences), charged once per non-empty batch in the non-attention group; 0 for a
    profile without such rows (Vidur's have none).

    Why: every batch that generates runs the LM head over its generating rows, and ``gpu-replay`` times it. Left out,
    it was the larger part of what the cost model under-predicted on an H200's fixed-grid decode batches
    (2026-11-30, CUDA graphs): Llama-3-8B's 128K-entry head takes 0.29 ms at 1 row and 0.31 ms at 128, beside an
    11.6 ms 64-decode batch measured 0.43 ms above its prediction. A batch's features do not count its generating
    rows (a prefill chunk that completes its prompt generates, one that does not, does not), so the head is charged
    at its floor: nearly exact up to 128 rows (+8% at 128), short by the growth beyond that (0.42 ms at 256 rows),
    and 0.29 ms too much on the rare batch of prefill chunks none of which completes."""
    rows = table[(table["operator"] == "lm_head") & (table["num_tokens"] >= 1) & (table["median_ms"] > 0)]
    rows = rows[_is_measured(rows)]
    return 0.0 if rows.empty else float(rows.loc[rows["num_tokens"].idxmin(), "median_ms"])


def decode_kv_save_ms(table: pd.DataFrame, batch_sizes: np.ndarray) -> np.ndarray:
    """Per decode row of ``batch_sizes`` sequences, one layer's write of their new K and V into the cache (the
    measured ``attn_decode_kv_save`` rows, interpolated in the batch size), added to decode attention as the KV
    save is to prefill attention; zeros for a profile without such rows (those before 2026-11-30, Vidur's)."""
    rows = table[(table["operator"] == "attn_decode_kv_save") & (table["median_ms"] > 0)]
    rows = rows[_is_measured(rows)].sort_values("batch_size")
    if rows.empty:
        return np.zeros(len(batch_sizes))
    return np.interp(batch_sizes, rows["batch_size"].to_numpy(float), rows["median_ms"].to_numpy(float))


def build_groups(table: pd.DataFrame, spec: ProfileSpec) -> list[Group]:
    """The operator groups present in a measurement table (rows with a 0 ms median are left out)."""
    layers, groups = spec.num_layers, []
    ops = table[table["operator"].isin(("emb",) + NON_ATTENTION_OPS)]
    if not ops.empty:
        wide = ops.pivot_table(index="num_tokens", columns="operator", values="median_ms", aggfunc="first")
        missing = [op for op in ("emb",) + NON_ATTENTION_OPS if op not in wide]
        if missing:
            raise ValueError(f"non-attention rows lack operator(s) {', '.join(missing)}")
        wide = wide.dropna()
        y = (layers * (wide[list(NON_ATTENTION_OPS)].sum(axis=1) + (ADDS_PER_LAYER - 1) * wide["add"]) + wide["emb"]
             + lm_head_floor_ms(table))
        n = wide.index.to_numpy(dtype=float)
        derived = ops.groupby("num_tokens")["derivation"].apply(lambda d: d.fillna("").astype(str).ne("").any())
        thresholds = step_thresholds(n)
        steps = tuple(step_name("n_tokens", t) for t in thresholds)
        x = np.column_stack([n] + [padded(wide.index.to_numpy(dtype=np.int64), padding_quantum(f)) for f in PADDED_FEATURES]
                            + [n > t for t in thresholds])
        groups.append(Group("non_attention", "n_tokens", ("n_tokens",) + PADDED_FEATURES + steps, ("n_tokens",),
                            x.astype(float), y.to_numpy(), n, ~derived.reindex(wide.index).to_numpy(),
                            candidates=(("n_tokens",), ("n_tokens", "n_tokens_pad64", "n_tokens_pad128"),
                                        ("n_tokens",) + PADDED_FEATURES) + ((("n_tokens",) + steps,) if steps else ())))
    comm = table[(table["operator"] == "all_reduce") & (table["num_tokens"] >= 1) & (table["num_tokens"] <= 16384)]
    if not comm.empty and spec.tp > 1:
        n = comm["num_tokens"].to_numpy(dtype=float)
        groups.append(Group("communication", "n_tokens", ("n_tokens",), ("n_tokens",), n[:, None],
                            layers * 2 * comm["median_ms"].to_numpy(), n, _is_measured(comm)))
    prefill_base = ("prefill_sq_tokens", "prefill_ctx_tokens", "prefill_tokens")
    for op, name, base, nonneg in (("attn_prefill", "prefill_attention_kernel", prefill_base, True),
                                   ("attn_kv_cache_save", "prefill_kv_save", ("prefill_tokens", "prefill_ctx_tokens"), False)):
        rows = table[table["operator"] == op]
        if rows.empty:
            continue
        c, m = rows["prefill_chunk_size"].to_numpy(float), rows["kv_cache_size"].to_numpy(float)
        x = np.column_stack([c * c, c * m, c] + [c * np.minimum(m, k) for k in PREFILL_CTX_CAPS])
        groups.append(Group(name, "n_prefill_seqs", prefill_base + PREFILL_CTX_CAP_FEATURES, prefill_base, x,
                            layers * rows["median_ms"].to_numpy(), c, _is_measured(rows),
                            candidates=(base,) + tuple(base + (f,) for f in PREFILL_CTX_CAP_FEATURES),
                            nonneg_intercept=nonneg, part_of="prefill_attention"))
    decode = table[table["operator"] == "attn_decode"]
    if not decode.empty:
        b, m = decode["batch_size"].to_numpy(float), decode["kv_cache_size"].to_numpy(float)
        save_ms = decode_kv_save_ms(table, b)
        base = ("decode_kv_tokens", "n_decode_seqs")
        x = np.column_stack([b * m, b] + [np.minimum(m, kv_cap(f)) for f in CAPPED_FEATURES])  # rows: b sequences of m KV
        groups.append(Group("decode_attention", "n_decode_seqs", base + CAPPED_FEATURES, ("decode_kv_tokens",), x,
                            layers * (decode["median_ms"].to_numpy() + save_ms), b, _is_measured(decode),
                            candidates=(base,) + tuple(base + (f,) for f in CAPPED_FEATURES), nonneg_intercept=True))
    return [_positive(g) for g in groups]


def _positive(group: Group) -> Group:
    keep = group.y_ms > 0
    return replace(group, x=group.x[keep], y_ms=group.y_ms[keep], tokens=group.tokens[keep], measured=group.measured[keep])


def mape_table(y: np.ndarray, pred: np.ndarray, tokens: np.ndarray, ranges=TOKEN_RANGES) -> dict:
    """``{"all": {"rows": n, "mape_pct": p}, "1-16": {...}, ...}``; ``mape_pct`` is None for an empty range."""
    def cell(mask):
        return {"rows": int(mask.sum()), "mape_pct": round(maxaffine.mape_pct(y[mask], pred[mask]), 2) if mask.any() else None}

    table = {"all": cell(np.ones(len(y), dtype=bool))}
    for lo, hi in ranges:
        table[f"{lo}-{hi}"] = cell(maxaffine.range_mask(tokens, lo, hi))
    return table


def _ols(x, y, _w=None):
    """The paper's least-squares plane, with slopes kept >= 0 (a cost model may not make a larger batch cheaper,
    ``base.check_slope``); the same plane as plain OLS whenever OLS's slopes are already >= 0, as on every
    bundled profile (issue 18: a noisy CPU profile gave a negative per-token slope)."""
    return LinearRegression(positive=True).fit(x, y)


def _ols_nonneg_intercept(x, y, _w=None):
    """``_ols`` with the intercept also kept >= 0: where ``_ols``'s is negative, the least-squares plane through
    the origin, which is then the constrained optimum (the problem is convex and the bound binds). For the
    planes of whole operator groups (non-attention, communication, decode attention), whose time at zero work is
    a launch overhead: a negative intercept there can time a batch of one decode token at <= 0 s, which
    ``base.check_positive_batch_times`` rejects (a noisy CPU smoke profile did: decode intercept -2.6 ms per
    layer). Every bundled profile's planes have positive intercepts, so their fits are unchanged. The composite
    prefill-attention plane keeps a free intercept (its KV-save part's is free by design) unless a one-token
    prefill would then take no time (`_linear_doc`)."""
    plane = _ols(x, y)
    if plane.intercept_ < 0:
        plane = LinearRegression(positive=True, fit_intercept=False).fit(x, y)
    return plane


@dataclass(frozen=True)
class GroupFit:
    """Both families fitted to one group, their held-out predictions (ms) and error tables, and the roofline's."""

    group: Group
    linear: LinearRegression
    piecewise: maxaffine.MaxAffine
    features: tuple[str, ...]
    cv_mape_by_pieces: dict
    heldout: dict[str, np.ndarray]
    errors: dict


def fit_group(group: Group, roofline: PiecewiseCostModel | None = None, ranges=TOKEN_RANGES) -> GroupFit:
    """Fit and score one group (see the module docstring); a part (``part_of``) is not scored against the
    roofline, whose terms are whole groups (``combine_parts`` scores the sum)."""
    x_lin, y = group.columns(group.linear_features), group.y_ms
    weights = maxaffine.range_weights(group.tokens, ranges)
    table = partial(mape_table, ranges=ranges)
    candidates = group.candidate_columns()
    piecewise = partial(maxaffine.fit_selected, candidates=candidates, nonneg_intercept=group.nonneg_intercept)
    linear = _ols if group.part_of is not None else _ols_nonneg_intercept
    heldout = {"linear": maxaffine.heldout_predictions(x_lin, y, weights, linear),
               "piecewise": maxaffine.heldout_predictions(group.x, y, weights, piecewise)}
    errors = {family: table(y, pred, group.tokens) for family, pred in heldout.items()}
    if group.name == "decode_attention":  # the single plane over (KV read, sequences), for reference
        errors["linear_plane"] = table(y, maxaffine.heldout_predictions(group.columns(("decode_kv_tokens", "n_decode_seqs")), y, weights, _ols), group.tokens)
    if roofline is not None and group.part_of is None and group.measured.any():
        m = group.measured
        errors["roofline"] = table(y[m], roofline_group_ms(roofline, group.name, group)[m], group.tokens[m])
    selection = maxaffine.select_model(group.x, y, weights, candidates, group.nonneg_intercept)
    fitted = maxaffine.fit_model(group.x, y, weights, selection)
    if any(token_step(group.features[i]) for i in selection.columns):
        fitted = extend_past_grid(fitted, group.features, int(group.tokens.max()))
    return GroupFit(group, linear(x_lin, y), fitted,
                    tuple(group.features[i] for i in selection.columns),
                    {_subset_name(group, cols): {str(j): round(e, 3) for j, e in by_k.items()}
                     for cols, by_k in selection.cv_mape.items()}, heldout, errors)


def extend_past_grid(fitted: maxaffine.MaxAffine, features: tuple[str, ...], n_max: int) -> maxaffine.MaxAffine:
    """A token-count model with steps continued past the largest profiled count ``n_max``: the steps stop at
    the last threshold, so beyond ``n_max`` the fit would grow only at its ``n`` slope. Adds one piece, the piece
    that is largest at ``n_max`` with its ``n`` slope raised to the fit's average slope over ``[n_max/2, n_max]``
    and its intercept lowered to match at ``n_max``: it lies below that piece up to ``n_max`` (every prediction
    on the profiled range is unchanged) and takes over beyond. ``features`` name the columns (``n_tokens`` and
    features derived from it)."""
    def row(n: int) -> np.ndarray:
        batch = BatchFeatures(n_tokens=n)
        return np.array([[float(getattr(batch, f)) for f in features]])

    top, half = row(n_max), row(n_max // 2)
    average = float(fitted.predict(top)[0] - fitted.predict(half)[0]) / (n_max - n_max // 2)
    best = int(np.argmax(fitted.intercepts + fitted.slopes @ top[0]))
    beyond = row(2 * n_max)  # the piece's own slope past n_max (n and padded counts; the steps are all on)
    own = float((fitted.slopes[best] @ (beyond[0] - top[0]))) / n_max
    rise = average - own
    if rise <= 0:
        return fitted
    slopes = fitted.slopes[best].copy()
    slopes[features.index("n_tokens")] += rise
    return maxaffine.MaxAffine(np.append(fitted.intercepts, fitted.intercepts[best] - rise * n_max),
                               np.vstack([fitted.slopes, slopes]))


def _aligned(fits: list[GroupFit]) -> tuple[list[list[int]], np.ndarray]:
    """Row indices of each part on the rows every part measures (matched on their linear features), and the
    summed target there."""
    index = [{tuple(row): i for i, row in enumerate(f.group.columns(f.group.linear_features))} for f in fits]
    shared = [k for k in index[0] if all(k in ix for ix in index[1:])]
    rows = [[ix[k] for k in shared] for ix in index]
    return rows, sum(f.group.y_ms[r] for f, r in zip(fits, rows))


def combine_parts(fits: list[GroupFit], roofline: PiecewiseCostModel | None = None, ranges=TOKEN_RANGES) -> dict:
    """Error tables of a composite group (e.g. prefill attention = kernel + KV-cache save) on the rows every
    part measures: each family's held-out part predictions summed, and the roofline's term named after the
    composite."""
    rows, y = _aligned(fits)
    table = partial(mape_table, ranges=ranges)
    tokens = fits[0].group.tokens[rows[0]]
    errors = {family: table(y, sum(f.heldout[family][r] for f, r in zip(fits, rows)), tokens)
              for family in fits[0].heldout}
    measured = np.logical_and.reduce([f.group.measured[r] for f, r in zip(fits, rows)])
    if roofline is not None and measured.any():
        first = replace(fits[0].group, x=fits[0].group.x[rows[0]])
        errors["roofline"] = table(y[measured], roofline_group_ms(roofline, fits[0].group.part_of, first)[measured],
                                        tokens[measured])
    return errors


def composite_linear(fits: list[GroupFit], nonneg_intercept: bool = False) -> LinearRegression:
    """The paper's single OLS plane for a composite group, fitted to the summed target of its parts (its intercept
    held >= 0 with ``nonneg_intercept``: `_linear_doc`)."""
    rows, y = _aligned(fits)
    fit = _ols_nonneg_intercept if nonneg_intercept else _ols
    return fit(fits[0].group.columns(fits[0].group.linear_features)[rows[0]], y)


def composites(fits: dict[str, GroupFit]) -> dict[str, list[GroupFit]]:
    """Each composite group's parts (groups with ``part_of``), in group order."""
    parts: dict[str, list[GroupFit]] = {}
    for f in fits.values():
        if f.group.part_of is not None:
            parts.setdefault(f.group.part_of, []).append(f)
    return parts


def heldout_errors(fits: dict[str, GroupFit], roofline: PiecewiseCostModel | None = None, ranges=TOKEN_RANGES) -> dict:
    """``{group: {family: table}}`` in group order; a composite group (``part_of``) scored on the sum of its
    parts (``combine_parts``), followed by each part's own table."""
    errors, by_composite = {}, composites(fits)
    for name, f in fits.items():
        composite = f.group.part_of
        if composite is None:
            errors[name] = f.errors
        elif composite not in errors:
            errors[composite] = combine_parts(by_composite[composite], roofline, ranges)
            errors.update({p.group.name: p.errors for p in by_composite[composite]})
    return errors


def _subset_name(group: Group, columns: tuple[int, ...]) -> str:
    return "+".join(group.features[i] for i in columns)


def roofline_group_ms(model: PiecewiseCostModel, term_name: str, group: Group) -> np.ndarray:
    """The roofline model's term ``term_name`` evaluated on ``group``'s rows, in ms."""
    term = next(t for t in model.milp_terms() if t.name == term_name)
    return 1e3 * np.max([p.intercept_s + sum(c * group.columns((f,))[:, 0] for f, c in p.coef_s.items())
                         for p in term.pieces], axis=0)


def _linear_doc(spec: ProfileSpec, fits: dict[str, GroupFit], fit_info: dict) -> dict:
    """The paper's linear model: one OLS plane per group, a composite group's fitted to its summed target.

    The composite prefill-attention plane keeps a free intercept (14 bundled profiles' are slightly negative),
    unless a batch of one prefill token would then take <= 0 s, which `base.check_positive_batch_times` refuses:
    its intercept is then held >= 0 too (`_ols_nonneg_intercept`). The whole groups' planes already have
    intercepts and slopes >= 0, so that batch is the only one that can fail. ``fit.prefill_intercept_held``
    records it (the held-out errors stay those of the parts' planes, as for every composite)."""
    doc = _linear_doc_with(spec, fits, fit_info, composite_nonneg=False)
    attention, non_attention = doc["per_layer_ms"]["prefill_attention"], doc["per_layer_ms"]["non_attention"]
    one_prefill_token_ms = (non_attention["intercept"] + non_attention["per_token"] + attention["intercept"]
                            + attention["per_c2"] + attention["per_token"])
    if one_prefill_token_ms > 0:
        return doc
    doc = _linear_doc_with(spec, fits, fit_info, composite_nonneg=True)
    doc["fit"]["prefill_intercept_held"] = (f"least squares timed a batch of one prefill token at "
                                            f"{one_prefill_token_ms:.6g} ms per layer; prefill attention's "
                                            f"intercept held >= 0")
    return doc


def _linear_doc_with(spec: ProfileSpec, fits: dict[str, GroupFit], fit_info: dict, composite_nonneg: bool) -> dict:
    layers = spec.num_layers
    planes = {name: (f.linear, f.group.linear_features) for name, f in fits.items() if f.group.part_of is None}
    for composite, parts in composites(fits).items():
        planes[composite] = (composite_linear(parts, composite_nonneg), parts[0].group.linear_features)

    def coef(name, feature):
        if name not in planes:
            return 0.0
        model, features = planes[name]
        return float(model.coef_[features.index(feature)]) / layers

    def intercept(name):
        return float(planes[name][0].intercept_) / layers if name in planes else 0.0

    return {"kind": LINEAR_KIND, "version": LINEAR_VERSION, "gpu": spec.gpu, "model": spec.model, "tp": spec.tp,
            "num_layers": layers,
            "per_layer_ms": {
                "non_attention": {"intercept": intercept("non_attention") + intercept("communication"),
                                  "per_token": coef("non_attention", "n_tokens") + coef("communication", "n_tokens")},
                "prefill_attention": {"intercept": intercept("prefill_attention"),
                                      "per_c2": coef("prefill_attention", "prefill_sq_tokens"),
                                      "per_c_ctx": coef("prefill_attention", "prefill_ctx_tokens"),
                                      "per_token": coef("prefill_attention", "prefill_tokens")},
                "decode_attention": {"intercept": intercept("decode_attention"),
                                     "per_kv_token": coef("decode_attention", "decode_kv_tokens")}},
            "per_batch_ms": {"intercept": 0.0, "per_token": 0.0},
            "fit": {**fit_info, "method": "ordinary least squares per operator group (the paper's linear model); "
                                          "whole-model group lines divided by num_layers; communication folded "
                                          "into non_attention; embedding and the LM head's one-row time "
                                          "(lm_head_per_batch_ms) included in non_attention; prefill "
                                          "attention = kernel + KV-cache save"}}


def _piecewise_terms(fits: dict[str, GroupFit]) -> tuple[CostTerm, ...]:
    terms = []
    for name, f in fits.items():
        pieces = tuple(AffinePiece(float(b) / 1e3, {feat: float(s) / 1e3 for feat, s in zip(f.group.features, slopes)
                                                    if s != 0.0})
                       for b, slopes in zip(f.piecewise.intercepts, f.piecewise.slopes))
        terms.append(CostTerm(name, f.group.gate, pieces))
    return tuple(terms)


def _mean_overall(errors: dict, family: str, parts: set[str]) -> float:
    return float(np.mean([e[family]["all"]["mape_pct"] for name, e in errors.items() if name not in parts]))


def recorded_device_spec(doc: dict, name: str):
    """The registered figures of the device a profile says it was measured on (``profiled.device``, e.g.
    "NVIDIA H200"), under the profile's own GPU ``name``; None when no registered GPU's name is in it.

    A profile of a registered GPU kept under another folder name (``h200-graphs``: the same chip timed through CUDA
    graphs; ``h200-pytorch``, ``h200-<date>``: see benchmarks/gpu_check.sh) then gets its roofline comparison, and
    ``--gpu NAME`` finds its memory size, as the registered GPU's profile does."""
    import dataclasses

    from ..models import GPUS, gpu_named_in

    profiled = doc.get("profiled")
    key = gpu_named_in(str(profiled.get("device", "") if isinstance(profiled, dict) else ""), GPUS)
    return None if key is None else dataclasses.replace(GPUS[key], name=name.lower())


def fit_profile(folder: str | Path, plots: bool = True, gpu_spec=None) -> dict:
    """Fit ``folder`` (ours: ``measurements.csv`` + ``profile.json``) and write, into it, both model
    JSONs, the error tables (into ``profile.json``) and one PNG per group. Returns ``profile.json``.

    The fit needs only the measurements, whatever the GPU. The roofline comparison needs the GPU's figures:
    a registered GPU's, ``gpu_spec`` (a ``models.GPUSpec``, saved into ``profile.json`` so that
    ``--gpu NAME`` finds it afterwards, ``models.saved_gpus``) or one saved there before; without them it is
    skipped and ``profile.json``'s ``roofline`` says why. A GPU name that is not registered but whose profile
    recorded a registered device (``recorded_device_spec``) gets that device's figures."""
    from ..models import GPU_SPEC_KEY, GPUS, get_gpu, gpu_spec_from_dict, gpu_spec_to_dict
    from .roofline import roofline_model

    out = folder = Path(folder)
    spec, table = ProfileSpec.read(folder), read_measurements(folder / MEASUREMENTS_CSV)
    doc = read_json(folder / PROFILE_JSON)
    if gpu_spec is None and GPU_SPEC_KEY in doc:
        gpu_spec = gpu_spec_from_dict(doc[GPU_SPEC_KEY], spec.gpu, f"{folder / PROFILE_JSON}: {GPU_SPEC_KEY}")
    if gpu_spec is None and spec.gpu.lower() not in GPUS:
        gpu_spec = recorded_device_spec(doc, spec.gpu)
    if gpu_spec is not None:
        if gpu_spec.name != spec.gpu.lower():
            raise ValueError(f"the GPU spec is for {gpu_spec.name!r} but {folder / PROFILE_JSON} profiles {spec.gpu!r}")
        doc[GPU_SPEC_KEY] = gpu_spec_to_dict(gpu_spec)
    try:
        roofline = roofline_model(gpu_spec or get_gpu(spec.gpu), spec.model, spec.tp)
        doc.pop("roofline", None)
    except ValueError as exc:
        roofline = None
        doc["roofline"] = f"not compared: {exc} (give the GPU's figures with infermax fit --gpu-spec)"
    groups = build_groups(table, spec)
    if not any(g.name == "non_attention" for g in groups):
        raise ValueError(f"{folder / MEASUREMENTS_CSV}: no non-attention operator rows to fit")
    ranges = token_ranges(max(g.tokens.max() for g in groups))
    fits = {g.name: fit_group(g, roofline, ranges) for g in groups}
    errors = heldout_errors(fits, roofline, ranges)
    parts = {g.name for g in groups if g.part_of is not None}
    sources = sorted({(r.source, r.derivation) for r in table[["source", "derivation"]].fillna("").itertuples()})
    fit_info = {"sources": [{"source": s, "derivation": d} for s, d in sources],
                "heldout_error": errors, "token_ranges": [f"{lo}-{hi}" for lo, hi in ranges]}
    lm_head_ms = lm_head_floor_ms(table)
    if lm_head_ms:  # (a profile without lm_head rows, e.g. an imported Vidur one, fits as before)
        fit_info["lm_head_per_batch_ms"] = lm_head_ms
    linear = LinearCostModel(_linear_doc(spec, fits, fit_info), source=f"fit of {folder}")
    piecewise = PiecewiseCostModel.from_terms(
        _piecewise_terms(fits), family="piecewise", gpu=spec.gpu, model=spec.model, tp=spec.tp,
        fit={**fit_info, "method": maxaffine.__doc__.split("\n\n")[0].replace("\n", " "),
             "pieces": {n: f.piecewise.pieces for n, f in fits.items()},
             "features": {n: list(f.features) for n, f in fits.items()},
             "cv_mape_by_features_and_pieces": {n: f.cv_mape_by_pieces for n, f in fits.items()}})
    linear.save(out / LINEAR_JSON)
    piecewise.save(out / PIECEWISE_JSON)
    means = {fam: _mean_overall(errors, fam, parts) for fam in ("linear", "piecewise")}
    doc.update(auto="piecewise" if means["piecewise"] <= means["linear"] else "linear",
               auto_rule="family with the lower mean over groups of overall held-out MAPE (prefill attention "
                         "scored on kernel + KV save, not on the parts)",
               mean_overall_mape_pct={k: round(v, 2) for k, v in means.items()}, heldout_error=errors,
               groups=[g.name for g in groups])
    (out / PROFILE_JSON).write_text(json.dumps(doc, indent=2) + "\n")
    if plots:
        from .plots import plot_group

        for f in fits.values():
            plot_group(f, out / f"fit_{f.group.name}.png", title=f"{spec.gpu} / {spec.model} / tp{spec.tp}")
    return doc


def error_lines(errors: dict) -> list[str]:
    """An error table (``profile.json``'s ``heldout_error``) as fixed-width text, one line per group and family."""
    ranges = error_columns(errors)
    lines = [f"{'group':<26}{'family':<14}" + "".join(f"{r:>11}" for r in ranges)]
    for group, families in errors.items():
        for family, table in families.items():
            cells = [table.get(r, {}).get("mape_pct") for r in ranges]
            lines.append(f"{group:<26}{family:<14}" + "".join(f"{'-' if c is None else f'{c:.1f}%':>11}" for c in cells))
    return lines


def main(argv: list[str] | None = None) -> None:
    """``python -m infermax.costmodel.fitting PROFILE_DIR [--out DIR]``: import if Vidur-format, fit, print the table."""
    from .profile_import import prepare

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, help="where to write (default: the folder itself)")
    parser.add_argument("--gpu"), parser.add_argument("--model")
    parser.add_argument("--tp", type=int, help="only this TP degree (Vidur folders hold several)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    for folder in prepare(args.folder, args.out, gpu=args.gpu, model=args.model, tp=args.tp):
        doc = fit_profile(folder, plots=not args.no_plots)
        print(f"{folder}: auto = {doc['auto']}")
        print("\n".join(error_lines(doc["heldout_error"])))


if __name__ == "__main__":
    main()
