"""Batch features and the cost-model interface shared by the engine, validator and solver."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:  # tables only where a model is fitted or evaluated in bulk: simulating needs neither
    import numpy as np
    import pandas as pd

from ..jsonio import read_json


@dataclass(slots=True)
class BatchFeatures:
    """What a batch's time depends on (never request identities).

    Per processed item with ``c`` tokens and ``m`` cached tokens before the batch:
    a *prefill* chunk adds ``c`` to ``n_tokens`` and ``prefill_tokens``, ``c*c`` to
    ``prefill_sq_tokens``, ``c*m`` to ``prefill_ctx_tokens`` and ``c*min(m, K)`` to
    ``prefill_ctx_cap<K>`` (K in ``PREFILL_CTX_CAPS``: context read up to a cap); a *decode* item adds
    1 to ``n_tokens`` and ``m + 1`` to ``decode_kv_tokens`` (the KV it reads,
    including its own new token); ``decode_kv_max`` is the largest ``m + 1`` over the decode items.

    Derived features (``__getattr__``): ``n_tokens_pad<q>`` = ``⌈n_tokens/q⌉·q``,
    ``decode_kv_max_cap<K>`` = ``min(decode_kv_max, K)`` = max over decode items of ``min(m + 1, K)``, and
    the steps ``n_tokens_gt<t>`` = ``[n_tokens > t]`` and ``hidden_recompute_tokens_gt<t>`` (0 or 1).
    """

    n_tokens: int = 0
    prefill_tokens: int = 0
    prefill_sq_tokens: int = 0
    prefill_ctx_tokens: int = 0
    prefill_ctx_cap256: int = 0
    prefill_ctx_cap512: int = 0
    prefill_ctx_cap1024: int = 0
    prefill_ctx_cap2048: int = 0
    n_prefill_seqs: int = 0
    n_decode_seqs: int = 0
    decode_kv_tokens: int = 0
    decode_kv_max: int = 0
    swap_tokens: int = 0
    hidden_recompute_tokens: int = 0

    def add_prefill(self, c: int, m_before: int) -> None:
        self.n_tokens += c
        self.prefill_tokens += c
        self.prefill_sq_tokens += c * c
        self.prefill_ctx_tokens += c * m_before
        self.prefill_ctx_cap256 += c * min(m_before, 256)
        self.prefill_ctx_cap512 += c * min(m_before, 512)
        self.prefill_ctx_cap1024 += c * min(m_before, 1024)
        self.prefill_ctx_cap2048 += c * min(m_before, 2048)
        self.n_prefill_seqs += 1

    def add_decode(self, m_before: int) -> None:
        self.n_tokens += 1
        self.decode_kv_tokens += m_before + 1
        self.decode_kv_max = max(self.decode_kv_max, m_before + 1)
        self.n_decode_seqs += 1

    @property
    def empty(self) -> bool:
        return self.n_tokens == 0 and self.swap_tokens == 0

    def __getattr__(self, name: str) -> int:
        """Derived features: ``n_tokens_pad<q>`` (``n_tokens`` rounded up to a multiple of ``q``),
        ``decode_kv_max_cap<K>`` (``decode_kv_max`` capped at ``K``) and ``<count>_gt<t>`` (``[count > t]``)."""
        q = padding_quantum(name)
        if q is not None:
            return padded(self.n_tokens, q)
        cap = kv_cap(name)
        if cap is not None:
            return min(self.decode_kv_max, cap)
        step = token_step(name)
        if step is not None:
            return int(getattr(self, step[0]) > step[1])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


FEATURE_COLUMNS = tuple(f.name for f in fields(BatchFeatures))
_PADDED = re.compile(r"n_tokens_pad([1-9][0-9]*)")
_CAPPED = re.compile(r"decode_kv_max_cap([1-9][0-9]*)")
# Derived features a fitted model may use (see docs/design.md, "Cost models from profiles"): GEMM tile
# sizes, and caps on the longest decode KV read (split-KV decode attention is flat beyond a knee).
PADDED_FEATURES = ("n_tokens_pad32", "n_tokens_pad64", "n_tokens_pad128", "n_tokens_pad256")
CAPPED_FEATURES = ("decode_kv_max_cap256", "decode_kv_max_cap512", "decode_kv_max_cap1024", "decode_kv_max_cap2048")
# Σ c·min(m, K) over prefill chunks (replay fields): a chunk's context read up to a cap (small-chunk attention
# switches to a split-KV kernel and KV-cache writes stop slowing down beyond a context length).
PREFILL_CTX_CAPS = (256, 512, 1024, 2048)
PREFILL_CTX_CAP_FEATURES = tuple(f"prefill_ctx_cap{k}" for k in PREFILL_CTX_CAPS)
_PREFILL_CAP = re.compile(r"prefill_ctx_cap([1-9][0-9]*)")
# Steps of a token count: ``<count>_gt<t>`` = [count > t] (GEMM kernels' times jump where the row count crosses a
# tile boundary by amounts no uniform padding reproduces; the fit places steps on the profiled grid). The
# hidden-recompute steps mirror the non-attention ones (``hidden.py``).
STEP_COUNTS = ("n_tokens", "hidden_recompute_tokens")
_STEP = re.compile(rf"({'|'.join(STEP_COUNTS)})_gt([1-9][0-9]*)")


def padding_quantum(name: str) -> int | None:
    """``q`` for a derived feature name ``n_tokens_pad<q>`` (the token count padded to a multiple of ``q``), else None."""
    match = _PADDED.fullmatch(name)
    return int(match.group(1)) if match else None


def kv_cap(name: str) -> int | None:
    """``K`` for a derived feature name ``decode_kv_max_cap<K>`` (``min(decode_kv_max, K)``), else None."""
    match = _CAPPED.fullmatch(name)
    return int(match.group(1)) if match else None


def padded(n, q: int):
    """``⌈n/q⌉·q`` for an integer or an integer array ``n``."""
    return -(-n // q) * q


def prefill_ctx_cap(name: str) -> int | None:
    """``K`` for a feature name ``prefill_ctx_cap<K>`` (Σ c·min(m, K) over prefill chunks), else None."""
    match = _PREFILL_CAP.fullmatch(name)
    return int(match.group(1)) if match else None


def token_step(name: str) -> tuple[str, int] | None:
    """``(count, t)`` for a feature name ``<count>_gt<t>`` (``[count > t]``, count in ``STEP_COUNTS``), else None."""
    match = _STEP.fullmatch(name)
    return (match.group(1), int(match.group(2))) if match else None


def step_name(count: str, t: int) -> str:
    """The feature name of the step ``[count > t]``."""
    return f"{count}_gt{t}"


def is_feature(name: str) -> bool:
    """Whether a cost term may use ``name``: a ``BatchFeatures`` field, a padded token count, a capped KV read
    or a token-count step."""
    return (name in FEATURE_COLUMNS or padding_quantum(name) is not None or kv_cap(name) is not None
            or token_step(name) is not None)


def features_frame(features: list[BatchFeatures]) -> pd.DataFrame:
    """A DataFrame with one row per batch and one column per feature (fields, ``PADDED_FEATURES``, ``CAPPED_FEATURES``)."""
    import pandas as pd

    columns = FEATURE_COLUMNS + PADDED_FEATURES + CAPPED_FEATURES
    return pd.DataFrame([[getattr(f, c) for c in columns] for f in features], columns=list(columns))


def feature_column(table, name: str) -> np.ndarray:
    """Column ``name`` of a feature table (a ``features_frame`` DataFrame, or a mapping of feature names to arrays)
    as floats, deriving a padded, capped or step feature if absent."""
    import numpy as np

    if name in table:
        return np.asarray(table[name], dtype=float)
    q, cap, step = padding_quantum(name), kv_cap(name), token_step(name)
    if q is not None:
        return padded(np.asarray(table["n_tokens"], dtype=np.int64), q).astype(float)
    if cap is not None:
        return np.minimum(np.asarray(table["decode_kv_max"], dtype=float), cap)
    if step is not None:
        return (np.asarray(table[step[0]], dtype=float) > step[1]).astype(float)
    raise KeyError(f"feature table has no column {name!r}")


def terms_time_table(terms: tuple[CostTerm, ...], table) -> np.ndarray:
    """`terms_time_s` for every row of a feature table (`feature_column`), vectorised: per term, the max of its
    pieces where its gate feature is positive."""
    import numpy as np

    n = len(feature_column(table, "n_tokens"))
    total = np.zeros(n)
    for term in terms:
        values = np.full(n, -np.inf)
        for p in term.pieces:
            piece = np.full(n, p.intercept_s)
            for name, c in p.coef_s.items():
                piece = piece + c * feature_column(table, name)
            values = np.maximum(values, piece)
        total += np.where(feature_column(table, term.active_if) > 0, values, 0.0)
    return total


@dataclass(frozen=True)
class AffinePiece:
    """``intercept_s + Σ coef_s[f] · feature f`` over feature names (``is_feature``), in seconds."""

    intercept_s: float
    coef_s: Mapping[str, float]

    def value_s(self, features: BatchFeatures) -> float:
        return self.intercept_s + sum(c * getattr(features, f) for f, c in self.coef_s.items())


@dataclass(frozen=True)
class CostTerm:
    """One additive part of a batch's time: the maximum of its affine pieces (convex), charged only
    when the feature ``active_if`` is positive (so an empty batch, or a batch without prefills, pays
    no intercept). This is the form a MILP can represent exactly: an epigraph variable
    ``t ≥ piece(x)`` per piece, relaxed by big-M when the term is inactive."""

    name: str
    active_if: str
    pieces: tuple[AffinePiece, ...]

    def value_s(self, features: BatchFeatures) -> float:
        if getattr(features, self.active_if) <= 0:
            return 0.0
        return max(p.value_s(features) for p in self.pieces)


def terms_time_s(terms: tuple[CostTerm, ...], features: BatchFeatures) -> float:
    """Batch time from a cost model's ``milp_terms()``; equals its ``batch_time_s`` on every batch."""
    return sum(t.value_s(features) for t in terms)


def smallest_batches() -> dict[str, BatchFeatures]:
    """The cheapest non-empty batch of each kind: one prefill token, one decode token, and both. With every
    coefficient on a feature ≥ 0, every non-empty batch costs at least one of these (each term is
    non-decreasing in its features, and the gates depend only on which kinds of item the batch holds)."""
    prefill, decode, both = BatchFeatures(), BatchFeatures(), BatchFeatures()
    prefill.add_prefill(1, 0)
    decode.add_decode(0)
    both.add_prefill(1, 0)
    both.add_decode(0)
    return {"one prefill token": prefill, "one decode token": decode, "one prefill and one decode token": both}


def check_positive_batch_times(model, source: str, intercepts: dict[str, float]) -> None:
    """Reject a model (built from ``source``) under which some non-empty batch takes zero or negative time.

    Call only after checking that every coefficient on a feature is ≥ 0 (``smallest_batches`` then covers
    every batch). ``intercepts`` (the document's intercept keys and values) are named in the error, the
    negative ones first, since only an intercept can pull a batch's time to or below zero."""
    for what, features in smallest_batches().items():
        t_s = model.batch_time_s(features)
        if not t_s > 0:
            named = sorted(intercepts.items(), key=lambda kv: kv[1])
            listed = ", ".join(f"{k} = {v:.6g}" for k, v in named if v < 0) or "none negative"
            raise ValueError(f"{source}: a batch of {what} would take {t_s:.6g} s; every non-empty batch must take "
                             f"positive time (intercepts: {listed})")


def check_slope(value: float, where: str) -> float:
    """``value`` if it is a valid coefficient on a batch feature (≥ 0: more work never costs less), else raise
    an error naming ``where`` (the file and the key)."""
    if value < 0:
        raise ValueError(f"{where} is {value:.6g}; a coefficient on a batch feature must be >= 0 "
                         f"(a larger batch never takes less time)")
    return value


@runtime_checkable
class CostModel(Protocol):
    """Predicts batch execution time in seconds from batch features.

    ``batch_time_s`` is the engine's per-batch call (scalar, hot path); ``predict_s``
    is the vectorised form over a feature table (``features_frame``). An empty
    batch costs nothing. ``milp_terms`` gives the same function as a sum of gated convex
    piecewise-linear terms (``terms_time_s(model.milp_terms(), f) == model.batch_time_s(f)``),
    which the solver turns into MILP constraints.
    """

    name: str

    def batch_time_s(self, features: BatchFeatures) -> float: ...

    def predict_s(self, table: pd.DataFrame) -> np.ndarray: ...

    def milp_terms(self) -> tuple[CostTerm, ...]: ...


class JsonDocumentModel:
    """Loading and saving for cost models built from a validated JSON document kept in ``self.doc``;
    subclasses take ``(doc, source)`` and validate in ``__init__``."""

    doc: dict

    @classmethod
    def from_json(cls, path: str | Path):
        """Load and validate a model JSON file."""
        doc = read_json(Path(path))
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: top level must be a JSON object")
        return cls(doc, source=str(path))

    def to_dict(self) -> dict:
        """The JSON document (a copy)."""
        return json.loads(json.dumps(self.doc))

    def save(self, path: str | Path) -> None:
        """Write the JSON document to ``path``."""
        Path(path).write_text(json.dumps(self.doc, indent=2) + "\n")
