"""Fit ``LinearCostModel`` coefficients from Vidur-format operator profiles.

Usage: ``python -m infermax.costmodel.fitting profiles/<gpu>/<model>`` reads ``vidur_mlp.csv`` and
one ``vidur_attention*.csv`` in that folder and writes ``infermax_linear.json`` next to them.

Operator groups, each an ordinary least-squares line (scikit-learn ``LinearRegression``) on
per-layer median times in ms, TP=1 rows only:

* **non-attention** (``mlp.csv``): per-layer sum of input_layernorm, attn_pre_proj, attn_rope,
  attn_post_proj, post_attention_layernorm, mlp_up_proj, mlp_act, mlp_down_proj and ``add``
  counted twice (a Llama layer has two residual adds; Vidur profiles one) vs ``num_tokens``.
* **embedding** (``emb`` in ``mlp.csv``): once per batch, not per layer, vs ``num_tokens``.
* **prefill attention** (attention prefill rows, batch_size 1): vs ``c^2`` and ``c*m`` where
  ``c`` = prefill_chunk_size and ``m`` = kv_cache_size (cached tokens before the chunk).
* **decode attention** (decode rows): vs KV read = ``batch_size * kv_cache_size``. The engine's
  feature is ``sum(m_before + 1)``; the +1 (the new token) is at most 1/32 of the sampled KV
  lengths, so we fit on the profile's ``kv_cache_size`` as given.
* **KV-cache save** (attn_kv_cache_save), **prefill rows only**: vs chunk size ``c``. Its slope
  becomes ``prefill_attention.per_token`` (charged per prefill token) and its intercept is added
  to the ``prefill_attention`` intercept. Decode rows are left out of the model: there a whole
  decode batch's KV write costs a few microseconds per layer (0.002-0.005 ms on the shipped
  sample for batch 1-512, nearly flat in batch size; at batch 512 ~0.008 us/token, ~70x less
  than a prefill chunk's ~0.55 us/token), so one per-token line over both would over-charge
  decode tokens. Their magnitude (min / median / max ms per layer, and the median per-batch
  total over all layers) is recorded in the JSON's ``fit.kv_cache_save.decode_rows_not_modelled``
  so the omission stays visible. The non-attention line is the operators alone.

Scaling between models. The attention profile may come from another model than the target
(the shipped sample is Llama-3-8B: 32 query heads, 8 KV heads, head_dim 128; Llama-2-7B has
32 query heads, 32 KV heads, head_dim 128). Prefill attention is compute-bound, FLOPs
proportional to query heads * head_dim * c * (c + m): its coefficients are multiplied by
``q_scale`` = (target q heads * head_dim) / (source q heads * head_dim) (1 for Llama-2-7B).
Decode attention is memory-bound, bytes proportional to KV heads * head_dim * KV tokens: the
per-KV-token slope is multiplied by ``kv_scale`` = (target KV heads * head_dim) / (source KV
heads * head_dim) (4 for Llama-2-7B), the intercept is kept. The prefill KV-cache save is **not**
scaled (scale 1): on the sample it writes 2 * 8 KV heads * 128 * 2 bytes = 4 KiB per token per
layer in ~0.55 us, i.e. ~7 GB/s, far from the A100's ~2 TB/s HBM bandwidth, so it is per-token
overhead rather than bandwidth-bound, and multiplying it by the ratio of KV-head bytes is not
justified (doing so made a 4096-token Llama-2-7B prefill predict ~583 ms; unscaled it predicts
~367 ms, of which the save is ~72 ms, matching the measured composition of ~368 ms).
The achieved write rate is recorded in ``fit.scaling.kv_cache_save_source_gb_per_s``.

Held-out error: every group is scored by 5-fold cross-validation (shuffled, fixed seed); each
row is predicted by a line fitted without it. MAPE (%) is reported overall and per token range
(non-attention and embedding by num_tokens; prefill attention and KV save by chunk size; decode
by batch size). The KV-save error is that of the prefill-row fit on prefill rows. Attention errors
are on the source-model data (before scaling). The shipped coefficients are then fitted on all
rows of each group.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression
from sklearn.metrics import mean_absolute_percentage_error
from sklearn.model_selection import KFold, cross_val_predict

from .linear import KIND, VERSION, LinearCostModel

NON_ATTENTION_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
                     "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
ADDS_PER_LAYER = 2
KV_BYTES_PER_ELEMENT = 2  # fp16/bf16 KV cache, used only to report the save's achieved write rate
TOKEN_RANGES = ((1, 16), (17, 128), (129, 1024), (1025, 4096), (4097, 16384))
CV_FOLDS, CV_SEED = 5, 0
KNOWN_NUM_LAYERS = {"llama-2-7b": 32, "llama-2-70b": 80, "codellama-34b-instruct": 48}


@dataclass(frozen=True)
class HeadShape:
    """Attention shape of a model: query heads, KV heads and head dimension."""

    model: str
    q_heads: int
    kv_heads: int
    head_dim: int


LLAMA3_8B = HeadShape("Meta-Llama-3-8B", q_heads=32, kv_heads=8, head_dim=128)


@dataclass(frozen=True)
class LineFit:
    """One fitted group: ``y_ms = intercept_ms + sum(slopes_ms * x)``, its held-out predictions and error table."""

    intercept_ms: float
    slopes_ms: tuple[float, ...]
    heldout_ms: np.ndarray
    heldout_mape: dict


def fit_line(x: np.ndarray, y_ms: np.ndarray, tokens: np.ndarray) -> LineFit:
    """OLS fit of ``y_ms`` on the columns of ``x``; held-out MAPE grouped by ``tokens`` ranges."""
    x = np.asarray(x, dtype=float).reshape(len(y_ms), -1)
    y_ms = np.asarray(y_ms, dtype=float)
    held_out = cross_val_predict(LinearRegression(), x, y_ms, cv=KFold(CV_FOLDS, shuffle=True, random_state=CV_SEED))
    fitted = LinearRegression().fit(x, y_ms)
    slopes = tuple(float(s) for s in fitted.coef_)
    return LineFit(float(fitted.intercept_), slopes, held_out, mape_table(y_ms, held_out, tokens))


def mape_table(y_ms: np.ndarray, pred_ms: np.ndarray, tokens: np.ndarray) -> dict:
    """``{"all": {...}, "1-16": {"rows": n, "mape_pct": p}, ...}``; ``mape_pct`` is None for an empty range."""
    tokens = np.asarray(tokens)

    def cell(mask: np.ndarray) -> dict:
        if not mask.any():
            return {"rows": 0, "mape_pct": None}
        return {"rows": int(mask.sum()), "mape_pct": round(100 * mean_absolute_percentage_error(y_ms[mask], pred_ms[mask]), 2)}

    table = {"all": cell(np.ones(len(tokens), dtype=bool))}
    for lo, hi in TOKEN_RANGES:
        table[f"{lo}-{hi}"] = cell((tokens >= lo) & (tokens <= hi))
    return table


def load_vidur_mlp(path: str | Path, tp: int = 1) -> pd.DataFrame:
    """Vidur ``mlp.csv`` rows for one TP degree, one row per ``num_tokens`` (first kept), sorted."""
    table = pd.read_csv(path)
    table = table[table["num_tensor_parallel_workers"] == tp].drop_duplicates("num_tokens")
    if table.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    return table.sort_values("num_tokens").reset_index(drop=True)


def non_attention_ms(mlp: pd.DataFrame) -> pd.Series:
    """Per-layer non-attention time (ms): the median of each operator, ``add`` counted twice."""
    total = sum(mlp[f"time_stats.{op}.median"] for op in NON_ATTENTION_OPS)
    return total + (ADDS_PER_LAYER - 1) * mlp["time_stats.add.median"]


def fit_non_attention(mlp: pd.DataFrame) -> LineFit:
    """Per-layer non-attention ms vs num_tokens."""
    return fit_line(mlp["num_tokens"].to_numpy(), non_attention_ms(mlp).to_numpy(), mlp["num_tokens"].to_numpy())


def fit_embedding(mlp: pd.DataFrame) -> LineFit:
    """Once-per-batch embedding ms vs num_tokens."""
    return fit_line(mlp["num_tokens"].to_numpy(), mlp["time_stats.emb.median"].to_numpy(), mlp["num_tokens"].to_numpy())


def load_attention(path: str | Path, tp: int = 1) -> pd.DataFrame:
    """Vidur-format attention rows (``*_median_ms`` columns) for one TP degree."""
    table = pd.read_csv(path)
    table = table[table["num_tensor_parallel_workers"] == tp].reset_index(drop=True)
    if table.empty:
        raise ValueError(f"{path}: no rows with num_tensor_parallel_workers == {tp}")
    return table


def fit_prefill_attention(attention: pd.DataFrame) -> LineFit:
    """Per-layer prefill attention ms vs (c^2, c*m) on prefill rows; c = chunk, m = kv_cache_size."""
    rows = attention[attention["is_prefill"]]
    c, m = rows["prefill_chunk_size"].to_numpy(float), rows["kv_cache_size"].to_numpy(float)
    return fit_line(np.column_stack([c * c, c * m]), rows["attn_prefill_median_ms"].to_numpy(), c)


def fit_decode_attention(attention: pd.DataFrame) -> LineFit:
    """Per-layer decode attention ms vs KV read = batch_size * kv_cache_size on decode rows."""
    rows = attention[~attention["is_prefill"]]
    batch = rows["batch_size"].to_numpy(float)
    return fit_line(batch * rows["kv_cache_size"].to_numpy(float), rows["attn_decode_median_ms"].to_numpy(), batch)


def fit_kv_cache_save(attention: pd.DataFrame) -> LineFit:
    """Per-layer KV-cache write ms vs chunk size on prefill rows only (decode rows are not modelled)."""
    rows = attention[attention["is_prefill"]]
    c = rows["prefill_chunk_size"].to_numpy(float)
    return fit_line(c, rows["attn_kv_cache_save_median_ms"].to_numpy(), c)


def decode_kv_cache_save_ms(attention: pd.DataFrame, num_layers: int) -> dict:
    """Magnitude of the decode rows' KV-cache writes, which the model leaves out (ms per layer per batch)."""
    rows = attention[~attention["is_prefill"]]
    save = rows["attn_kv_cache_save_median_ms"].to_numpy(float)
    median = float(np.median(save))
    return {"rows": len(rows), "batch_size_range": [int(rows["batch_size"].min()), int(rows["batch_size"].max())],
            "min_ms_per_layer": float(save.min()), "median_ms_per_layer": median, "max_ms_per_layer": float(save.max()),
            "median_ms_per_batch_all_layers": median * num_layers}


def head_scales(target: HeadShape, source: HeadShape) -> tuple[float, float]:
    """``(q_scale, kv_scale)``: target/source ratios of query-head and KV-head widths (heads * head_dim)."""
    return (target.q_heads * target.head_dim / (source.q_heads * source.head_dim),
            target.kv_heads * target.head_dim / (source.kv_heads * source.head_dim))


def target_shape(mlp: pd.DataFrame, model: str) -> HeadShape:
    """The target model's attention shape from the ``n_head, n_kv_head, n_embd`` columns of ``mlp.csv``."""
    row = mlp.iloc[0]
    return HeadShape(model, int(row["n_head"]), int(row["n_kv_head"]), int(row["n_embd"]) // int(row["n_head"]))


def _file_info(path: Path) -> dict:
    return {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def fit_linear_model(mlp_path: str | Path, attention_path: str | Path, *, gpu: str, model: str, num_layers: int,
                     attention_source: HeadShape = LLAMA3_8B) -> LinearCostModel:
    """Fit every group, scale attention from ``attention_source`` to the target model and build the model."""
    mlp_path, attention_path = Path(mlp_path), Path(attention_path)
    mlp, attention = load_vidur_mlp(mlp_path), load_attention(attention_path)
    target = target_shape(mlp, model)
    q_scale, kv_scale = head_scales(target, attention_source)
    ops, emb = fit_non_attention(mlp), fit_embedding(mlp)
    prefill, decode, save = fit_prefill_attention(attention), fit_decode_attention(attention), fit_kv_cache_save(attention)
    save_gb_per_s = 2 * attention_source.kv_heads * attention_source.head_dim * KV_BYTES_PER_ELEMENT / (save.slopes_ms[0] * 1e6)
    doc = {
        "kind": KIND, "version": VERSION, "gpu": gpu, "model": model, "tp": 1, "num_layers": num_layers,
        "per_layer_ms": {
            "non_attention": {"intercept": ops.intercept_ms, "per_token": ops.slopes_ms[0]},
            "prefill_attention": {"intercept": q_scale * prefill.intercept_ms + save.intercept_ms,
                                  "per_c2": q_scale * prefill.slopes_ms[0], "per_c_ctx": q_scale * prefill.slopes_ms[1],
                                  "per_token": save.slopes_ms[0]},
            "decode_attention": {"intercept": decode.intercept_ms, "per_kv_token": kv_scale * decode.slopes_ms[0]},
        },
        "per_batch_ms": {"intercept": emb.intercept_ms, "per_token": emb.slopes_ms[0]},
        "fit": {
            "method": "ordinary least squares (sklearn LinearRegression) per operator group on per-layer median ms, TP=1 rows",
            "sources": {
                "non_attention": {**_file_info(mlp_path), "model": target.model, "rows": len(mlp),
                                  "origin": "Microsoft Vidur data/profiling/compute (MIT License)"},
                "attention": {**_file_info(attention_path), "model": attention_source.model, "rows": len(attention),
                              "origin": "Vidur-format attention profile (FlashInfer); see README.md"},
            },
            "non_attention_operators": list(NON_ATTENTION_OPS),
            "adds_per_layer": ADDS_PER_LAYER,
            "decode_kv_feature": "batch_size * kv_cache_size (KV tokens read; engine uses sum(m_before + 1))",
            "kv_cache_save": {
                "fit": "prefill rows only, vs prefill_chunk_size; slope (unscaled) -> per_layer_ms.prefill_attention."
                       "per_token, intercept added to per_layer_ms.prefill_attention.intercept",
                "decode_rows_not_modelled": {
                    **decode_kv_cache_save_ms(attention, num_layers),
                    "note": "a whole decode batch's KV write costs a few us per layer (rising only slowly with batch "
                            "size); it is dropped from the model (decode tokens are charged no KV save), so decode "
                            "batches are under-predicted by about median_ms_per_batch_all_layers",
                },
            },
            "scaling": {
                "source": asdict(attention_source), "target": asdict(target), "q_scale": q_scale, "kv_scale": kv_scale,
                "kv_cache_save_scale": 1.0,
                "kv_cache_save_source_gb_per_s": save_gb_per_s,
                "note": "prefill attention is compute-bound (FLOPs ~ q_heads*head_dim*c*(c+m)): coefficients x q_scale; "
                        "decode attention is memory-bound (bytes ~ kv_heads*head_dim*KV tokens): per-KV-token slope "
                        "x kv_scale, intercept kept; prefill KV-cache save: not scaled (scale 1) - on the source it "
                        f"writes 2*kv_heads*head_dim*{KV_BYTES_PER_ELEMENT} bytes per token per layer at only "
                        "kv_cache_save_source_gb_per_s (A100 HBM ~2000 GB/s), so it is per-token overhead, not "
                        "bandwidth-bound, and scaling it by KV-head bytes is not justified",
            },
            "unscaled_fits_ms": {
                "non_attention_ops": {"intercept": ops.intercept_ms, "per_token": ops.slopes_ms[0]},
                "kv_cache_save": {"intercept": save.intercept_ms, "per_token": save.slopes_ms[0]},
                "prefill_attention": {"intercept": prefill.intercept_ms, "per_c2": prefill.slopes_ms[0],
                                      "per_c_ctx": prefill.slopes_ms[1]},
                "decode_attention": {"intercept": decode.intercept_ms, "per_kv_token": decode.slopes_ms[0]},
            },
            "heldout_error": {
                "method": f"{CV_FOLDS}-fold cross-validation (KFold shuffle, random_state={CV_SEED}); MAPE in percent; "
                          "attention groups are scored on the source model's data before scaling",
                "token_count": {"non_attention_ops": "num_tokens", "embedding": "num_tokens", "prefill_attention":
                                "prefill_chunk_size", "decode_attention": "batch_size",
                                "kv_cache_save": "prefill_chunk_size (prefill rows only)"},
                "non_attention_ops": ops.heldout_mape, "embedding": emb.heldout_mape,
                "prefill_attention": prefill.heldout_mape, "decode_attention": decode.heldout_mape,
                "kv_cache_save": save.heldout_mape,
            },
        },
    }
    return LinearCostModel(doc, source=f"fit of {mlp_path.parent}")


def error_lines(model: LinearCostModel) -> list[str]:
    """The held-out MAPE table as fixed-width text lines (one per group)."""
    table = model.doc["fit"]["heldout_error"]
    groups = [g for g in table if isinstance(table[g], dict) and "all" in table[g]]
    ranges = list(table[groups[0]])
    lines = [f"{'group':<28}" + "".join(f"{r:>12}" for r in ranges)]
    for g in groups:
        cells = [table[g][r]["mape_pct"] for r in ranges]
        lines.append(f"{g:<28}" + "".join(f"{'-' if c is None else f'{c:.1f}%':>12}" for c in cells))
    return lines


def main(argv: list[str] | None = None) -> None:
    """CLI: fit the profile folder ``profiles/<gpu>/<model>`` and write its ``infermax_linear.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="profiles/<gpu>/<model> with vidur_mlp.csv and vidur_attention*.csv")
    parser.add_argument("--num-layers", type=int, help=f"layers of the target model (known: {KNOWN_NUM_LAYERS})")
    parser.add_argument("--source-model", default=LLAMA3_8B.model, help="model the attention profile was measured on")
    parser.add_argument("--source-q-heads", type=int, default=LLAMA3_8B.q_heads)
    parser.add_argument("--source-kv-heads", type=int, default=LLAMA3_8B.kv_heads)
    parser.add_argument("--source-head-dim", type=int, default=LLAMA3_8B.head_dim)
    args = parser.parse_args(argv)
    folder = args.folder
    model, gpu = folder.resolve().name, folder.resolve().parent.name
    num_layers = args.num_layers or KNOWN_NUM_LAYERS.get(model)
    if num_layers is None:
        parser.error(f"unknown model {model!r}: pass --num-layers")
    attention_files = sorted(folder.glob("vidur_attention*.csv"))
    if len(attention_files) != 1:
        parser.error(f"{folder}: expected exactly one vidur_attention*.csv, found {[p.name for p in attention_files]}")
    source = HeadShape(args.source_model, args.source_q_heads, args.source_kv_heads, args.source_head_dim)
    fitted = fit_linear_model(folder / "vidur_mlp.csv", attention_files[0], gpu=gpu, model=model,
                              num_layers=num_layers, attention_source=source)
    out = folder / "infermax_linear.json"
    fitted.save(out)
    print(f"wrote {out}")
    print(json.dumps({k: fitted.doc[k] for k in ("per_layer_ms", "per_batch_ms")}, indent=2))
    print("\n".join(error_lines(fitted)))


if __name__ == "__main__":
    main()
