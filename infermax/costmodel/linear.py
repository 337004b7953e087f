"""The InferMax paper's linear batch-time model (section 3.2), per layer and summed over layers.

For a non-empty batch (``n_tokens > 0``)::

    t = L * (a0 + a1 * n_tokens)                                          non-attention operators
      + [n_prefill_seqs > 0] * L * (b0 + b1 * sum(c^2) + b2 * sum(c*m)
                                    + b3 * prefill_tokens)                prefill attention + KV save
      + [n_decode_seqs > 0]  * L * (d0 + d1 * decode_kv_tokens)           decode attention
      + e0 + e1 * n_tokens                                                once per batch (0 in our fits: see a0)

``L`` is the number of layers and ``prefill_tokens = sum(c)``. The paper's model has ``b2 = 0``;
``b2`` is our extension for chunks processed after earlier chunks of the same prompt (attention
over ``m`` cached tokens). ``b3`` is the KV-cache write of prefill chunks (per prefill token per
layer); it is charged to prefill tokens only. Decode tokens' KV writes (a few microseconds per
whole decode batch per layer) are in ``d0, d1`` where the profile measured them (``attn_decode_kv_save``,
since 2026-11-30), so the non-attention line
``a0 + a1 * n_tokens`` is the operators, plus (in our fits, divided by ``L``) the embedding and, where the profile
timed it, the LM head's one-row time, both once per batch (``fitting.lm_head_floor_ms``). See ``fitting`` for how
``b3`` is fitted.
An empty batch costs 0. Swap tokens are not part of this model. Hidden-cache recompute tokens
(``H``, Apt-Serve's hybrid cache) add ``[H > 0] * share * L * (a0 + a1 * H)``, the K/V-projection
share of the non-attention operators (``hidden.py`` derives ``share`` from the model's shapes); its ``a0`` carries
that share of the per-batch embedding and LM head too (about 0.01 ms for Llama-2-7B and Llama-3-8B on an H200).

Coefficients are stored in milliseconds in a JSON file; the model returns seconds.
JSON schema (``kind`` ``"infermax-linear"``, ``version`` 1)::

    {"kind": "infermax-linear", "version": 1, "gpu": "a100", "model": "llama-2-7b", "tp": 1,
     "num_layers": 32,
     "per_layer_ms": {"non_attention": {"intercept": a0, "per_token": a1},
                      "prefill_attention": {"intercept": b0, "per_c2": b1, "per_c_ctx": b2,
                                            "per_token": b3},
                      "decode_attention": {"intercept": d0, "per_kv_token": d1}},
     "per_batch_ms": {"intercept": e0, "per_token": e1},
     "fit": {...free-form provenance: sources, scaling notes, held-out error table...}}
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

from .base import AffinePiece, BatchFeatures, CostTerm, JsonDocumentModel, check_positive_batch_times, check_slope
from .hidden import HIDDEN_FEATURE, HIDDEN_TERM, kv_projection_share, no_share_error

KIND = "infermax-linear"
VERSION = 1
COEFFICIENT_KEYS: dict[str, tuple[str, ...]] = {
    "per_layer_ms.non_attention": ("intercept", "per_token"),
    "per_layer_ms.prefill_attention": ("intercept", "per_c2", "per_c_ctx", "per_token"),
    "per_layer_ms.decode_attention": ("intercept", "per_kv_token"),
    "per_batch_ms": ("intercept", "per_token"),
}


def _lookup(doc: dict, dotted: str, source: str) -> Any:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{source}: missing key '{dotted}'")
        node = node[part]
    return node


def _finite(doc: dict, dotted: str, source: str) -> float:
    value = _lookup(doc, dotted, source)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{source}: key '{dotted}' must be a finite number, got {value!r}")
    return float(value)


class LinearCostModel(JsonDocumentModel):
    """Linear batch-time model; see the module docstring for the formula and the JSON schema."""

    def __init__(self, doc: dict, source: str = "<dict>"):
        """Build from a parsed JSON document, validating it; errors name ``source`` and the key."""
        if _lookup(doc, "kind", source) != KIND:
            raise ValueError(f"{source}: key 'kind' must be {KIND!r}, got {doc['kind']!r}")
        if _lookup(doc, "version", source) != VERSION:
            raise ValueError(f"{source}: key 'version' must be {VERSION}, got {doc['version']!r}")
        for key in ("num_layers", "tp"):
            value = _lookup(doc, key, source)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{source}: key '{key}' must be a positive integer, got {value!r}")
        for key in ("gpu", "model"):
            if not isinstance(_lookup(doc, key, source), str):
                raise ValueError(f"{source}: key '{key}' must be a string")
        ms = {f"{group}.{k}": _finite(doc, f"{group}.{k}", source) for group, keys in COEFFICIENT_KEYS.items() for k in keys}
        for key, value in ms.items():
            if not key.endswith(".intercept"):
                check_slope(value, f"{source}: key '{key}'")
        self.doc = json.loads(json.dumps(doc))  # private deep copy, JSON-clean
        self.gpu, self.model, self.tp = doc["gpu"], doc["model"], doc["tp"]
        self.num_layers = doc["num_layers"]
        self.name = f"{KIND}:{self.gpu}/{self.model}/tp{self.tp}"
        # Precomputed seconds for the scalar hot path.
        layers_s = self.num_layers / 1000.0
        self._base_s = layers_s * ms["per_layer_ms.non_attention.intercept"] + ms["per_batch_ms.intercept"] / 1000.0
        self._per_token_s = layers_s * ms["per_layer_ms.non_attention.per_token"] + ms["per_batch_ms.per_token"] / 1000.0
        self._prefill_s = layers_s * ms["per_layer_ms.prefill_attention.intercept"]
        self._per_c2_s = layers_s * ms["per_layer_ms.prefill_attention.per_c2"]
        self._per_c_ctx_s = layers_s * ms["per_layer_ms.prefill_attention.per_c_ctx"]
        self._per_prefill_token_s = layers_s * ms["per_layer_ms.prefill_attention.per_token"]
        self._decode_s = layers_s * ms["per_layer_ms.decode_attention.intercept"]
        self._per_kv_token_s = layers_s * ms["per_layer_ms.decode_attention.per_kv_token"]
        self.kv_share = kv_projection_share(self.model)
        share = self.kv_share or 0.0
        self._hidden_s = share * layers_s * ms["per_layer_ms.non_attention.intercept"]
        self._per_hidden_token_s = share * layers_s * ms["per_layer_ms.non_attention.per_token"]
        check_positive_batch_times(self, source, {k: v for k, v in ms.items() if k.endswith(".intercept")})

    def coefficient_ms(self, dotted: str) -> float:
        """One stored coefficient in ms, e.g. ``"per_layer_ms.decode_attention.per_kv_token"``."""
        return _finite(self.doc, dotted, self.name)

    def batch_time_s(self, features: BatchFeatures) -> float:
        """Batch time in seconds (scalar hot path: plain float arithmetic)."""
        n_tokens = features.n_tokens
        if n_tokens == 0:
            return 0.0
        t_s = self._base_s + self._per_token_s * n_tokens
        if features.n_prefill_seqs:
            t_s += (self._prefill_s + self._per_c2_s * features.prefill_sq_tokens
                    + self._per_c_ctx_s * features.prefill_ctx_tokens + self._per_prefill_token_s * features.prefill_tokens)
        if features.n_decode_seqs:
            t_s += self._decode_s + self._per_kv_token_s * features.decode_kv_tokens
        if features.hidden_recompute_tokens > 0:
            if self.kv_share is None:
                raise no_share_error(self.model)
            t_s += self._hidden_s + self._per_hidden_token_s * features.hidden_recompute_tokens
        return t_s

    def predict_s(self, table: pd.DataFrame) -> np.ndarray:
        """Batch times in seconds for every row of a ``features_frame`` table (vectorised)."""
        import numpy as np

        col = {c: table[c].to_numpy(dtype=float) for c in
               ("n_tokens", "prefill_tokens", "prefill_sq_tokens", "prefill_ctx_tokens", "n_prefill_seqs", "n_decode_seqs",
                "decode_kv_tokens", "hidden_recompute_tokens")}
        t_s = self._base_s + self._per_token_s * col["n_tokens"]
        t_s += (col["n_prefill_seqs"] > 0) * (self._prefill_s + self._per_c2_s * col["prefill_sq_tokens"]
                                              + self._per_c_ctx_s * col["prefill_ctx_tokens"]
                                              + self._per_prefill_token_s * col["prefill_tokens"])
        t_s += (col["n_decode_seqs"] > 0) * (self._decode_s + self._per_kv_token_s * col["decode_kv_tokens"])
        if self.kv_share is None and (col["hidden_recompute_tokens"] > 0).any():
            raise no_share_error(self.model)
        t_s += (col["hidden_recompute_tokens"] > 0) * (self._hidden_s + self._per_hidden_token_s
                                                       * col["hidden_recompute_tokens"])
        return np.where(col["n_tokens"] > 0, t_s, 0.0)

    def milp_terms(self) -> tuple[CostTerm, ...]:
        """The model as gated single-piece terms (see ``CostTerm``); the hidden-recompute term needs a
        registered model (its K/V share)."""
        terms = (
            CostTerm("non_attention", "n_tokens", (AffinePiece(self._base_s, {"n_tokens": self._per_token_s}),)),
            CostTerm("prefill_attention", "n_prefill_seqs", (AffinePiece(self._prefill_s, {
                "prefill_sq_tokens": self._per_c2_s, "prefill_ctx_tokens": self._per_c_ctx_s,
                "prefill_tokens": self._per_prefill_token_s}),)),
            CostTerm("decode_attention", "n_decode_seqs",
                     (AffinePiece(self._decode_s, {"decode_kv_tokens": self._per_kv_token_s}),)),
        )
        if self.kv_share is None:
            return terms
        return terms + (CostTerm(HIDDEN_TERM, HIDDEN_FEATURE, (
            AffinePiece(self._hidden_s, {HIDDEN_FEATURE: self._per_hidden_token_s}),)),)

    def __repr__(self) -> str:
        return f"LinearCostModel({self.name!r})"
