"""The convex piecewise-linear cost model: a sum of gated terms, each the maximum of affine pieces.

The JSON document (kind ``infermax-piecewise``, version 1) stores the terms exactly as the MILP
contract (``CostTerm``) states them, in seconds per batch::

    {"kind": "infermax-piecewise", "version": 1, "family": "piecewise" | "roofline",
     "gpu": ..., "model": ..., "tp": ...,
     "terms": [{"name": "non_attention", "active_if": "n_tokens",
                "pieces": [{"intercept_s": ..., "coef_s": {"n_tokens": ...}}, ...]}, ...],
     "fit": {...}}

so ``milp_terms()`` is the document itself and ``batch_time_s`` evaluates the same sum of maxima. A
coefficient may also name a padded token count ``n_tokens_pad<q>`` (``⌈n_tokens/q⌉·q``, see
``base.padding_quantum``); the solver represents it with one integer variable per batch. A coefficient
on a capped longest KV read ``decode_kv_max_cap<K>`` (``base.kv_cap``; concave in the KV lengths) must
be non-negative for the solver, which represents it with one binary per decode item and batch. A step
``n_tokens_gt<t>`` (``[n_tokens > t]``, ``base.token_step``) is one binary per batch in the solver. The
roofline fallback (``roofline.py``) is a document of the same kind with ``family: roofline``. A document
without a ``hidden_recompute`` term gets one derived from its ``non_attention`` term and the model's
K/V-projection share (``hidden.py``), appended to ``milp_terms()`` (not written to the document).
"""

from __future__ import annotations

import itertools
import json
import math
from bisect import bisect_left
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

from .base import (FEATURE_COLUMNS, AffinePiece, BatchFeatures, CostTerm, JsonDocumentModel, check_positive_batch_times,
                   check_slope, is_feature, kv_cap, padding_quantum, terms_time_table, token_step)
from .hidden import HIDDEN_TERM, hidden_recompute_term, kv_projection_share, no_share_error

KIND, VERSION = "infermax-piecewise", 1
FAMILIES = ("piecewise", "roofline")


def _check_number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _parse_terms(doc: dict, source: str) -> tuple[CostTerm, ...]:
    terms = doc.get("terms")
    if not isinstance(terms, list) or not terms:
        raise ValueError(f"{source}: key 'terms' must be a non-empty list")
    parsed = []
    for i, term in enumerate(terms):
        where = f"{source}: terms[{i}]"
        if not isinstance(term, dict) or not isinstance(term.get("name"), str):
            raise ValueError(f"{where}: needs a string 'name'")
        if term.get("active_if") not in FEATURE_COLUMNS:
            raise ValueError(f"{where}: 'active_if' must be one of {', '.join(FEATURE_COLUMNS)}, got {term.get('active_if')!r}")
        pieces = term.get("pieces")
        if not isinstance(pieces, list) or not pieces:
            raise ValueError(f"{where}: 'pieces' must be a non-empty list")
        affine = []
        for j, piece in enumerate(pieces):
            coef = piece.get("coef_s") if isinstance(piece, dict) else None
            if not isinstance(coef, dict):
                raise ValueError(f"{where}.pieces[{j}]: needs 'intercept_s' and a 'coef_s' object")
            unknown = sorted(f for f in coef if not is_feature(f))
            if unknown:
                raise ValueError(f"{where}.pieces[{j}]: unknown feature(s) {', '.join(unknown)}")
            affine.append(AffinePiece(_check_number(piece.get("intercept_s"), f"{where}.pieces[{j}].intercept_s"),
                                      {f: check_slope(_check_number(c, f"{where}.pieces[{j}].coef_s.{f}"),
                                                      f"{where}.pieces[{j}].coef_s.{f}") for f, c in coef.items()}))
        parsed.append(CostTerm(term["name"], term["active_if"], tuple(affine)))
    return tuple(parsed)


def _compile_piece(piece: AffinePiece) -> tuple:
    """A piece as plain tuples for the scalar hot path: (intercept, ((feature, coefficient, padding quantum or 0,
    KV cap or 0), ...), ((count, thresholds, prefix sums of their step heights), ...)); the steps ``[count > t]``
    of one count are summed by one bisection (the thresholds below the count)."""
    plain, steps = [], {}
    for f, c in piece.coef_s.items():
        step = token_step(f)
        if step is None:
            plain.append((f, c, padding_quantum(f) or 0, kv_cap(f) or 0))
        else:
            steps.setdefault(step[0], []).append((step[1], c))
    stairs = []
    for count, pairs in steps.items():
        pairs.sort()
        stairs.append((count, tuple(t for t, _ in pairs), tuple(itertools.accumulate((c for _, c in pairs), initial=0.0))))
    return piece.intercept_s, tuple(plain), tuple(stairs)


def _generate_batch_time(compiled: tuple, hidden_missing: bool, model: str):
    """``batch_time_s`` of the compiled terms as one generated function of straight-line arithmetic.

    The interpreted form (loops over terms, pieces and coefficients, a ``getattr`` per feature) was a fifth of
    Sarathi's simulation loop on the Azure conversation trace. The generated function performs exactly the
    same floating-point operations in the same order (``s = 0.0``, ``s += c·x`` per coefficient, ``s +=`` the
    steps' prefix sum, ``value = intercept + s``, the first largest piece, ``total +=`` per active term), so
    its results are identical; only the dispatch is gone. Constants are bound by name, never printed."""
    env: dict = {"bisect_left": bisect_left, "inf": math.inf, "no_share_error": no_share_error, "model": model}

    def const(value, prefix: str) -> str:
        name = f"{prefix}{len(env)}"
        env[name] = value
        return name

    def feature(name: str) -> str:
        return f"f.{name}" if name in FEATURE_COLUMNS else f"getattr(f, {const(name, 'n')})"

    lines = ["def batch_time_s(f):"]
    if hidden_missing:
        lines += ["    if f.hidden_recompute_tokens > 0:", "        raise no_share_error(model)"]
    lines.append("    total = 0.0")
    for active_if, pieces in compiled:
        lines += [f"    if {feature(active_if)} > 0:", "        best = -inf"]
        for intercept, coefs, stairs in pieces:
            lines.append("        s = 0.0")
            for name, c, q, cap in coefs:
                x = (f"(-(-f.n_tokens // {const(q, 'q')}) * {const(q, 'q')})" if q else
                     f"min(f.decode_kv_max, {const(cap, 'k')})" if cap else feature(name))
                lines.append(f"        s += {const(c, 'c')} * {x}")
            for count, thresholds, heights in stairs:
                lines.append(f"        s += {const(heights, 'h')}[bisect_left({const(thresholds, 't')}, {feature(count)})]")
            lines += [f"        value = {const(intercept, 'i')} + s", "        if value > best:", "            best = value"]
        lines.append("        total += best")
    lines.append("    return total")
    exec("\n".join(lines), env)  # noqa: S102  (source built above from names and constants bound in env)
    return env["batch_time_s"]


def terms_document(terms: tuple[CostTerm, ...]) -> list[dict]:
    """The JSON form of ``CostTerm``s."""
    return [{"name": t.name, "active_if": t.active_if,
             "pieces": [{"intercept_s": p.intercept_s, "coef_s": dict(p.coef_s)} for p in t.pieces]} for t in terms]


class PiecewiseCostModel(JsonDocumentModel):
    """Batch time = Σ over terms (when its gate feature is positive) of the max of its affine pieces."""

    def __init__(self, doc: dict, source: str = "<dict>"):
        if doc.get("kind") != KIND:
            raise ValueError(f"{source}: key 'kind' must be {KIND!r}, got {doc.get('kind')!r}")
        if doc.get("version") != VERSION:
            raise ValueError(f"{source}: key 'version' must be {VERSION}, got {doc.get('version')!r}")
        if doc.get("family") not in FAMILIES:
            raise ValueError(f"{source}: key 'family' must be one of {', '.join(FAMILIES)}, got {doc.get('family')!r}")
        for key in ("gpu", "model"):
            if not isinstance(doc.get(key), str):
                raise ValueError(f"{source}: key '{key}' must be a string")
        if isinstance(doc.get("tp"), bool) or not isinstance(doc.get("tp"), int) or doc["tp"] < 1:
            raise ValueError(f"{source}: key 'tp' must be a positive integer")
        self._terms = _parse_terms(doc, source)
        self.doc = json.loads(json.dumps(doc))
        self.family, self.gpu, self.model, self.tp = doc["family"], doc["gpu"], doc["model"], doc["tp"]
        names = {t.name: t for t in self._terms}
        self.kv_share = kv_projection_share(self.model)
        if HIDDEN_TERM not in names and "non_attention" in names and self.kv_share is not None:
            self._terms += (hidden_recompute_term(names["non_attention"], self.kv_share),)
        self._hidden_missing = all(t.name != HIDDEN_TERM for t in self._terms)
        self.name = f"{self.family}:{self.gpu}/{self.model}/tp{self.tp}"
        self._compiled = tuple((t.active_if, tuple(_compile_piece(p) for p in t.pieces)) for t in self._terms)
        self._time_s = _generate_batch_time(self._compiled, self._hidden_missing, self.model)
        check_positive_batch_times(self, source, {f"terms[{i}].pieces[{j}].intercept_s": p.intercept_s
                                                  for i, t in enumerate(self._terms) for j, p in enumerate(t.pieces)
                                                  if t.name != HIDDEN_TERM})

    @classmethod
    def from_terms(cls, terms: tuple[CostTerm, ...], *, family: str, gpu: str, model: str, tp: int,
                   fit: dict | None = None) -> "PiecewiseCostModel":
        """A model from ``CostTerm``s (``fit``: provenance and error tables kept in the document)."""
        doc = {"kind": KIND, "version": VERSION, "family": family, "gpu": gpu, "model": model, "tp": tp,
               "terms": terms_document(terms), "fit": fit or {}}
        return cls(doc, source=f"{family} model")

    def batch_time_s(self, features: BatchFeatures) -> float:
        """Batch time in seconds (scalar hot path, a generated function: ``_generate_batch_time``; equals
        ``terms_time_s`` up to rounding: a piece's steps are summed as one prefix sum)."""
        return self._time_s(features)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_time_s"]  # generated code does not pickle; rebuilt from ``_compiled``
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._time_s = _generate_batch_time(self._compiled, self._hidden_missing, self.model)

    def predict_s(self, table: pd.DataFrame) -> np.ndarray:
        """Batch times in seconds for every row of a ``features_frame`` table (vectorised)."""
        if self._hidden_missing and (table["hidden_recompute_tokens"].to_numpy() > 0).any():
            raise no_share_error(self.model)
        return terms_time_table(self._terms, table)

    def milp_terms(self) -> tuple[CostTerm, ...]:
        """The model's terms, exactly (see ``CostTerm``)."""
        return self._terms

    def __repr__(self) -> str:
        return f"PiecewiseCostModel({self.name!r})"
