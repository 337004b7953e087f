"""Batch features and the cost-model interface shared by the engine, validator and solver."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd


@dataclass(slots=True)
class BatchFeatures:
    """What a batch's time depends on (never request identities).

    Per processed item with ``c`` tokens and ``m`` cached tokens before the batch:
    a *prefill* chunk adds ``c`` to ``n_tokens`` and ``prefill_tokens``, ``c*c`` to
    ``prefill_sq_tokens`` and ``c*m`` to ``prefill_ctx_tokens``; a *decode* item adds
    1 to ``n_tokens`` and ``m + 1`` to ``decode_kv_tokens`` (the KV it reads,
    including its own new token).
    """

    n_tokens: int = 0
    prefill_tokens: int = 0
    prefill_sq_tokens: int = 0
    prefill_ctx_tokens: int = 0
    n_prefill_seqs: int = 0
    n_decode_seqs: int = 0
    decode_kv_tokens: int = 0
    swap_tokens: int = 0
    hidden_recompute_tokens: int = 0

    def add_prefill(self, c: int, m_before: int) -> None:
        self.n_tokens += c
        self.prefill_tokens += c
        self.prefill_sq_tokens += c * c
        self.prefill_ctx_tokens += c * m_before
        self.n_prefill_seqs += 1

    def add_decode(self, m_before: int) -> None:
        self.n_tokens += 1
        self.decode_kv_tokens += m_before + 1
        self.n_decode_seqs += 1

    @property
    def empty(self) -> bool:
        return self.n_tokens == 0 and self.swap_tokens == 0


FEATURE_COLUMNS = tuple(f.name for f in fields(BatchFeatures))


def features_frame(features: list[BatchFeatures]) -> pd.DataFrame:
    """A DataFrame with one row per batch and one column per feature."""
    return pd.DataFrame([[getattr(f, c) for c in FEATURE_COLUMNS] for f in features], columns=list(FEATURE_COLUMNS))


@runtime_checkable
class CostModel(Protocol):
    """Predicts batch execution time in seconds from batch features.

    ``batch_time_s`` is the engine's per-batch call (scalar, hot path); ``predict_s``
    is the vectorised form over a feature table (``features_frame``). An empty
    batch costs nothing.
    """

    name: str

    def batch_time_s(self, features: BatchFeatures) -> float: ...

    def predict_s(self, table: pd.DataFrame) -> np.ndarray: ...
