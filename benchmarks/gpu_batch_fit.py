"""Is the replays' per-batch error the cost model's form or the measurement's spread? (issue 20)

Fits the linear model's features (intercept, tokens, per-phase intercepts, prefill Σc², Σc·m, Σc, decode KV read,
sequence counts) by non-negative least squares on relative error directly to measured batch times of some replays'
warm batches (`gpu_replay_shapes.py`: no first-seen attention shape), and scores it on others. If even the training
batches stay far from their fit, no cost model of this form can predict them: what is left is spread in the
measurement itself.

    python benchmarks/gpu_batch_fit.py profiles/h200/replays/2026-11-27a llama-3-8b

Reads only committed files; needs no GPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from gpu_replay_shapes import case_cold

SPLITS = [  # (fitted on, scored on): fixed grid to trace, and one trace to the rest
    (["vllm-fixed", "sarathi-fixed", "optimize-I512-O128-B64"], ["vllm-azure", "sarathi-azure"]),
    (["vllm-azure"], ["sarathi-azure", "vllm-fixed", "sarathi-fixed"]),
]


def warm_batches(case: Path) -> pd.DataFrame:
    b = pd.read_csv(case / "score-piecewise" / "batches.csv")
    return b[~case_cold(case)]


def features(b: pd.DataFrame) -> np.ndarray:
    return np.column_stack([np.ones(len(b)), b.n_tokens, b.n_prefill_seqs > 0, b.prefill_sq_tokens,
                            b.prefill_ctx_tokens, b.prefill_tokens, b.n_decode_seqs > 0, b.decode_kv_tokens,
                            b.n_decode_seqs, b.n_prefill_seqs]).astype(float)


def mape(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - measured) / measured) * 100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a replays folder holding <model>/<case>/")
    ap.add_argument("model")
    args = ap.parse_args()
    folder = Path(args.run) / args.model
    for train, test in SPLITS:
        tr = pd.concat([warm_batches(folder / c) for c in train])
        te = pd.concat([warm_batches(folder / c) for c in test])
        w = 1 / tr.measured_s.to_numpy()
        coef, _ = nnls(features(tr) * w[:, None], tr.measured_s.to_numpy() * w)
        for name, d in (("fitted on", tr), ("scored on", te)):
            meas = d.measured_s.to_numpy()
            print(f"{name} {'+'.join(train if name == 'fitted on' else test)} ({len(d)} warm batches): "
                  f"batch-level fit {mape(features(d) @ coef, meas):.1f}%, the profile's piecewise fit "
                  f"{mape(d.predicted_s.to_numpy(), meas):.1f}% per-batch MAPE")


if __name__ == "__main__":
    main()
