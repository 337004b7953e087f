"""The profile measurement table (InferMax's own CSV schema) and importers for Vidur-format profiles.

A profile folder ``profiles/<gpu>/<model>/tp<N>/`` holds ``measurements.csv``: one row per measured
(or derived) operator timing, with these columns (times in milliseconds, per layer unless the
operator is ``emb``):

=====================  ==========================================================================
``operator``           ``emb`` (once per batch), a non-attention operator of one layer
                       (``input_layernorm`` ... ``add``), ``attn_prefill``, ``attn_kv_cache_save``,
                       ``attn_decode``, ``attn_decode_kv_save`` (the decodes' K/V write, ``batch_size`` rows),
                       ``lm_head``, or ``all_reduce`` (one tensor-parallel all-reduce)
``num_tokens``         tokens in the batch (non-attention operators, all-reduce: size/(2·hidden))
``batch_size``         sequences (attention rows; 1 for prefill rows)
``prefill_chunk_size`` prefill chunk ``c`` (prefill attention rows; 0 otherwise)
``kv_cache_size``      cached tokens before the chunk / per decoding sequence (attention rows)
``tp``                 tensor-parallel degree the row was measured (or derived) for
``median_ms``          median time; ``mean_ms``, ``std_ms``: mean and standard deviation (empty if
                       the source has only medians)
``device``             the GPU as the source names it
``software``           the profiler / framework (versions where the source records them)
``date``               when the source was measured or, if unknown, the source's commit date
``source``             file and repository the row comes from
``derivation``         empty for a measurement; for a row derived from another model's measurement,
                       how (e.g. head-count scaling), so derived rows are never mistaken for measured
=====================  ==========================================================================

Importers read Vidur's ``mlp.csv`` (``time_stats.<op>.<stat>`` columns), ``attention.csv``
(``time_stats.attn_<op>.<stat>`` or the sample's ``attn_<op>_median_ms`` columns) and network
``all_reduce.csv`` (``size`` in bytes, ``num_workers``, ``devices_per_node``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..jsonio import not_utf8_message
from .files import LINEAR_JSON, MEASUREMENTS_CSV, PIECEWISE_JSON, PROFILE_JSON  # noqa: F401  (re-exported)

COLUMNS = ("operator", "num_tokens", "batch_size", "prefill_chunk_size", "kv_cache_size", "tp", "median_ms", "mean_ms",
           "std_ms", "device", "software", "date", "source", "derivation")
NON_ATTENTION_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
                     "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
ATTENTION_OPS = ("attn_prefill", "attn_kv_cache_save", "attn_decode")
VIDUR_SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")


@dataclass(frozen=True)
class Provenance:
    """Where a set of rows comes from (copied into every row's provenance columns)."""

    device: str
    software: str
    date: str
    source: str
    derivation: str = ""


def _frame(rows: dict, provenance: Provenance, tp: int) -> pd.DataFrame:
    """A table in ``COLUMNS`` order from the given columns; shape columns default to 0, stats to NaN."""
    n = len(rows["operator"])
    table = pd.DataFrame({"tp": np.full(n, tp), **rows})
    for col in ("num_tokens", "batch_size", "prefill_chunk_size", "kv_cache_size"):
        table[col] = table.get(col, 0)
    for col in ("mean_ms", "std_ms"):
        table[col] = table.get(col, np.nan)
    for key in ("device", "software", "date", "source", "derivation"):
        table[key] = getattr(provenance, key)
    return table[list(COLUMNS)]


def read_csv_file(path: str | Path, **options) -> pd.DataFrame:
    """``pd.read_csv``, with a file that is not a readable CSV (a binary file, a stray quote) refused by name."""
    try:
        return pd.read_csv(path, **options)
    except UnicodeDecodeError as exc:
        raise ValueError(not_utf8_message(path, exc)) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{path}: not a readable CSV ({exc})") from None


def read_vidur_mlp(path: str | Path) -> pd.DataFrame:
    """A Vidur ``mlp.csv``, checked before anything is written from it: the model-shape columns, the TP degree and
    ``num_tokens`` present and integers >= 1 in every row, each operator's median a finite time >= 0, its mean and
    std numbers where given. (Found by probing `infermax fit` by hand, 2026-12-02: a header without rows ended in an
    IndexError traceback, another CSV in a bare "error: 'n_head'", a TP degree of −5 in a folder ``tp-5``.)"""
    table = read_csv_file(path)
    counts = [*VIDUR_SHAPE_COLUMNS, "num_tensor_parallel_workers", "num_tokens"]
    ops = ("emb",) + NON_ATTENTION_OPS
    missing = [c for c in counts + [f"time_stats.{op}.median" for op in ops] if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: not a Vidur mlp.csv: no column(s) {', '.join(missing[:4])}"
                         f"{f' and {len(missing) - 4} more' if len(missing) > 4 else ''}")
    if table.empty:
        raise ValueError(f"{path}: a header without rows")

    def refuse_first(column: str, bad: pd.Series, need: str) -> None:
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            value = table[column].iloc[i]
            value = value.item() if isinstance(value, np.generic) else value  # (-5, not np.int64(-5))
            raise ValueError(f"{path}, row {i + 1} after the header: {column} must be {need}, got {value!r}")

    for column in counts:
        values = pd.to_numeric(table[column], errors="coerce")  # (NaN where not a number: not finite)
        refuse_first(column, ~(np.isfinite(values) & (values >= 1) & (values % 1 == 0)), "an integer >= 1")
    for op in ops:
        column = f"time_stats.{op}.median"
        values = pd.to_numeric(table[column], errors="coerce")
        refuse_first(column, ~(np.isfinite(values) & (values >= 0)), "a finite time >= 0 (ms)")
        for column in (f"time_stats.{op}.mean", f"time_stats.{op}.std"):
            if column in table.columns:  # empty, or a number
                refuse_first(column, table[column].notna() & pd.to_numeric(table[column], errors="coerce").isna(),
                             "a number")
    return table


def import_vidur_mlp(path: str | Path, tp: int, provenance: Provenance) -> pd.DataFrame:
    """Rows of a Vidur ``mlp.csv`` (`read_vidur_mlp`) for one TP degree: every operator (and ``emb``) at every
    ``num_tokens``.

    Where ``num_tokens`` appears twice the first row is kept (Vidur's file repeats a few sizes).
    """
    table = read_vidur_mlp(path)
    table = table[table["num_tensor_parallel_workers"] == tp].drop_duplicates("num_tokens")
    if table.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    parts = []
    for op in ("emb",) + NON_ATTENTION_OPS:
        rows = {"operator": np.full(len(table), op), "num_tokens": table["num_tokens"].to_numpy(),
                "median_ms": table[f"time_stats.{op}.median"].to_numpy(), "mean_ms": table[f"time_stats.{op}.mean"].to_numpy(),
                "std_ms": table[f"time_stats.{op}.std"].to_numpy()}
        parts.append(_frame(rows, provenance, tp))
    return pd.concat(parts, ignore_index=True)


def vidur_tp_degrees(path: str | Path) -> list[int]:
    """The TP degrees present in a Vidur ``mlp.csv`` or ``attention.csv``."""
    return sorted(int(t) for t in read_csv_file(path, usecols=["num_tensor_parallel_workers"])
                  ["num_tensor_parallel_workers"].unique())


def vidur_model_shape(path: str | Path) -> dict:
    """The model shape columns of a Vidur ``mlp.csv`` (`read_vidur_mlp`; first row)."""
    row = read_vidur_mlp(path).iloc[0]
    return {c: int(row[c]) for c in VIDUR_SHAPE_COLUMNS}


def _attention_stat(table: pd.DataFrame, op: str, stat: str) -> np.ndarray | None:
    for col in (f"time_stats.{op}.{stat}", f"{op}_{stat}_ms"):
        if col in table:
            return table[col].to_numpy(dtype=float)
    return None


def import_vidur_attention(path: str | Path, tp: int, provenance: Provenance) -> pd.DataFrame:
    """Prefill (``attn_prefill``, ``attn_kv_cache_save``) and decode (``attn_decode``) rows of a
    Vidur-format ``attention.csv`` for one TP degree. Decode rows' KV-cache save is not imported:
    it is a few microseconds per whole batch and the cost models leave it out (see ``fitting``)."""
    table = read_csv_file(path)
    table = table[table["num_tensor_parallel_workers"] == tp]
    if table.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    prefill = table["is_prefill"].astype(str).str.lower() == "true"
    parts = []
    for op, mask in (("attn_prefill", prefill), ("attn_kv_cache_save", prefill), ("attn_decode", ~prefill)):
        rows_table = table[mask]
        median = _attention_stat(rows_table, op, "median")
        if median is None:
            raise ValueError(f"{path}: no median column for {op} (expected time_stats.{op}.median or {op}_median_ms)")
        rows = {"operator": np.full(len(rows_table), op), "batch_size": rows_table["batch_size"].to_numpy(),
                "prefill_chunk_size": rows_table["prefill_chunk_size"].to_numpy(),
                "kv_cache_size": rows_table["kv_cache_size"].to_numpy(), "median_ms": median}
        for stat in ("mean", "std"):
            values = _attention_stat(rows_table, op, stat)
            if values is not None:
                rows[f"{stat}_ms"] = values
        rows["num_tokens"] = np.where(op == "attn_decode", rows["batch_size"], rows["prefill_chunk_size"])
        parts.append(_frame(rows, provenance, tp))
    return pd.concat(parts, ignore_index=True)


def import_vidur_all_reduce(path: str | Path, tp: int, hidden_size: int, provenance: Provenance) -> pd.DataFrame:
    """All-reduce rows of a Vidur network ``all_reduce.csv`` for ``tp`` workers on one node
    (``devices_per_node == num_workers``); ``num_tokens = size_bytes / (2 · hidden_size)`` (fp16
    activations of ``hidden_size`` per token, as Vidur converts them). Repeated sizes: first kept."""
    table = read_csv_file(path)
    table = table[(table["num_workers"] == tp) & (table["devices_per_node"] == tp)].drop_duplicates("size")
    if table.empty:
        raise ValueError(f"{path}: no all-reduce rows with num_workers == devices_per_node == {tp}")
    rows = {"operator": np.full(len(table), "all_reduce"),
            "num_tokens": table["size"].to_numpy(dtype=float) / (2 * hidden_size),
            "median_ms": table["time_stats.all_reduce.median"].to_numpy(),
            "mean_ms": table["time_stats.all_reduce.mean"].to_numpy(), "std_ms": table["time_stats.all_reduce.std"].to_numpy()}
    return _frame(rows, provenance, tp)


def write_measurements(table: pd.DataFrame, path: str | Path) -> None:
    """Write a measurement table (columns ``COLUMNS``, in that order)."""
    table[list(COLUMNS)].to_csv(path, index=False, float_format="%.6g")


def read_measurements(path: str | Path) -> pd.DataFrame:
    """Read and check a ``measurements.csv``: every column present, times positive and finite."""
    table = read_csv_file(path, keep_default_na=False, na_values={"mean_ms": [""], "std_ms": [""]})
    missing = [c for c in COLUMNS if c not in table]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
    median = pd.to_numeric(table["median_ms"], errors="coerce").to_numpy()
    bad = np.flatnonzero(~(np.isfinite(median) & (median >= 0)))
    if len(bad):
        raise ValueError(f"{path}: line {bad[0] + 2}: median_ms must be a non-negative number, "
                         f"got {_cell(table, 'median_ms', bad[0])}")
    table["median_ms"] = median
    _check_rows(table, path)
    return table


KNOWN_OPS = ("emb", *NON_ATTENTION_OPS, *ATTENTION_OPS, "attn_decode_kv_save", "lm_head", "all_reduce", "swap_in",
             "swap_out")


def _cell(table: pd.DataFrame, column: str, row: int) -> str:
    value = table[column].iloc[row]
    return repr(value.item() if hasattr(value, "item") else value)


def _check_rows(table: pd.DataFrame, path) -> None:
    """The rows' operators and shapes (a hand-edited or foreign table: an unknown operator, a negative or fractional
    count, or a row of another TP degree was fitted or dropped without a word, found by probing `infermax fit`
    on 2026-12-01). Counts are non-negative integers; ``num_tokens`` of an all-reduce is the message size over
    ``2·hidden``, a fraction. One TP degree per table, as one profile folder holds one."""
    ops = table["operator"].astype(str).to_numpy()
    unknown = np.flatnonzero(~np.isin(ops, KNOWN_OPS))
    if len(unknown):
        raise ValueError(f"{path}: line {unknown[0] + 2}: unknown operator {ops[unknown[0]]!r}; known: "
                         f"{', '.join(KNOWN_OPS)}")
    for column in ("num_tokens", "batch_size", "prefill_chunk_size", "kv_cache_size", "tp"):
        values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
        whole = np.isfinite(values) & (values >= (1 if column == "tp" else 0))
        if column == "num_tokens":
            whole &= (values == np.round(values)) | (ops == "all_reduce")
        else:
            whole &= values == np.round(values)
        bad = np.flatnonzero(~whole)
        if len(bad):
            kind = "an integer >= 1" if column == "tp" else "a non-negative integer"
            raise ValueError(f"{path}: line {bad[0] + 2}: {column} must be {kind}, got {_cell(table, column, bad[0])}")
        if column == "tp" and len(set(values)) > 1:
            other = int(np.flatnonzero(values != values[0])[0])
            raise ValueError(f"{path}: line {other + 2}: tp {int(values[other])}, but line 2 has tp {int(values[0])}; "
                             f"a profile holds one TP degree (tp<N>/measurements.csv)")
