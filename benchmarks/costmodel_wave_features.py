"""Held-out MAPE of the non-attention fit with GEMM wave-quantisation features as extra candidates
(an exploration behind docs/design.md, issue-3 decision 20; the features are not adopted).

Usage: ``PYTHONPATH=. python benchmarks/costmodel_wave_features.py [--all] [--sets B,E1,E2,E3,E4] [--starts K]``
(default: A100 and H100 Llama-2-7B TP1; ``--all``: every bundled profile).

Wave work of tile ``T = (Tm, Tn)``: ``W_T(n) = Σ_g ⌈⌈n/Tm⌉·⌈N_g/Tn⌉ / SMs⌉ · 2·Tm·Tn·K_g / 1e9`` over the layer's
GEMMs ``g`` on one TP rank (QKV, O, gate+up, down; ``N_g`` output columns, ``K_g`` reduction), SMs 132 (H100
SXM) / 108 (A100). Non-decreasing in ``n`` and exact in a MILP (nested ceilings are integer variables).
Tiles: a family declared in advance (common CUTLASS fp16 shapes; cuBLAS's choice is not public), chosen by
CV. Candidate sets, the current ones first so the selection rule keeps them unless a new one is clearly
better, all nested inside the held-out scoring:

* ``B``: {n}, {n, pad64, pad128}, {n, pad32..pad256} (the candidates shipped before decision 21's steps)
* ``E1``: B + {n, W_T} for each tile; ``E2``: B + {n, all four W_T}; ``E3``: B + {n, pads, all four W_T}
* ``E4``: B + {n, the four GEMMs' wave work for one tile} for each tile
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np

from infermax.costmodel import available_combinations, maxaffine as ma, profile_folder
from infermax.costmodel.base import PADDED_FEATURES
from infermax.costmodel.fitting import TOKEN_RANGES, ProfileSpec, build_groups, mape_table
from infermax.costmodel.measurements import read_measurements
from infermax.models import get_model

SMS = {"h100": 132, "a100": 108}
TILES = ((64, 128), (128, 128), (128, 256), (256, 128))


def gemms(model: str, tp: int) -> tuple[tuple[int, int], ...]:
    """(N, K) of the per-layer GEMMs on one TP rank: column-parallel QKV and gate+up, row-parallel O and down."""
    m = get_model(model)
    head_dim = m.hidden_size // m.num_heads
    up = (2 if m.gated_mlp else 1) * m.ffn_size
    return (((m.num_heads + 2 * m.num_kv_heads) * head_dim // tp, m.hidden_size), (m.hidden_size, m.hidden_size // tp),
            (up // tp, m.hidden_size), (m.hidden_size, m.ffn_size // tp))


def wave_work(n: np.ndarray, gpu: str, model: str, tp: int, tile: tuple[int, int]) -> np.ndarray:
    """Per-GEMM wave work (GFLOP one SM does per wave × waves), one column per GEMM."""
    tm, tn = tile
    return np.column_stack([-(-(-(-n // tm) * -(-N // tn)) // SMS[gpu]) * 2.0 * tm * tn * K / 1e9 for N, K in gemms(model, tp)])


def features(gpu: str, model: str, tp: int):
    """The non-attention group and its columns: n, pad32..pad256 (0-4), W_T per tile (5-8), per-GEMM (9-24)."""
    folder = profile_folder(gpu, model, tp)
    group = next(g for g in build_groups(read_measurements(folder / "measurements.csv"), ProfileSpec.read(folder))
                 if g.name == "non_attention")
    n = group.tokens.astype(np.int64)
    per_gemm = [wave_work(n, gpu, model, tp, t) for t in TILES]
    return group, np.column_stack([group.columns(("n_tokens",) + PADDED_FEATURES)] + [w.sum(axis=1) for w in per_gemm]
                                  + per_gemm)


B = ((0,), (0, 2, 3), (0, 1, 2, 3, 4))
SETS = {"B": B,
        "E1": B + tuple((0, 5 + i) for i in range(len(TILES))),
        "E2": B + ((0, 5, 6, 7, 8),),
        "E3": B + ((0, 1, 2, 3, 4, 5, 6, 7, 8),),
        "E4": B + tuple((0,) + tuple(range(9 + 4 * i, 13 + 4 * i)) for i in range(len(TILES)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--sets", default="B,E1,E2,E3,E4")
    parser.add_argument("--starts", type=int, default=ma.RANDOM_STARTS)
    args = parser.parse_args()
    ma.RANDOM_STARTS = args.starts
    combos = available_combinations() if args.all else [("h100", "llama-2-7b", 1), ("a100", "llama-2-7b", 1)]
    print("held-out MAPE %: overall | 1-16 | 17-128 | 129-1024 | 1025-4096")
    for gpu, model, tp in combos:
        group, x = features(gpu, model, tp)
        weights = ma.range_weights(group.tokens, TOKEN_RANGES)
        for name in args.sets.split(","):
            pred = ma.heldout_predictions(x, group.y_ms, weights, partial(ma.fit_selected, candidates=SETS[name]))
            table = mape_table(group.y_ms, pred, group.tokens)
            cells = [table["all"]] + [table[f"{lo}-{hi}"] for lo, hi in TOKEN_RANGES[:4]]
            print(f"{gpu}/{model}/tp{tp} {name:3s} " + " | ".join(
                "-" if c["mape_pct"] is None else f"{c['mape_pct']:.2f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
