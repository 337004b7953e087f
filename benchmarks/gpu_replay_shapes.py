"""How much of a gpu-replay's error sits in batches whose attention shapes the run had not seen before (issue 20).

PyTorch picks cuDNN's fused attention for our SDPA calls on an H100/H200, and cuDNN builds an execution plan for
every new shape, once per process. `gpu_replay_breakdown.py` measured a 64-sequence Llama-3-8B decode batch at 29 ms
warm against 100 ms the first time its shape ran (2026-11-27, H200). A serving engine's paged-attention kernels
(FlashAttention, FlashInfer) build nothing per shape, and the operator profile's warm-up runs absorb the build, so a
first-seen shape is an artefact of our replayer, not a cost the cost model should predict.

For each replay folder (``sim/schedule.json``, ``replay/batches.csv``, ``score-<family>/batches.csv``) this lays the
schedule out as `gpu-replay` does (prefill chunks of ``c`` tokens over ``m + c`` keys, decodes padded to a multiple
of 8 keys), marks a batch *cold* when one of its attention shapes is new to the run (the untimed warm-up batches'
shapes count as seen), and prints per-batch MAPE over the warm and the cold batches, with the time the cold ones
took beyond their prediction, the run's end-to-end latency error, and the busy-time error over all and over the
warm batches (sum of predicted over sum of measured batch times, minus one).

    python benchmarks/gpu_replay_shapes.py profiles/h200/replays/2026-11-27a profiles/h200/replays/2026-11-27b

Reads only committed files; needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from infermax.costmodel import load_cost_model
from infermax.profiling.layers import DECODE_ALIGN
from infermax.replay import Replayer
from infermax.schedule import Schedule

WARMUP_BATCHES = 8  # gpu-replay's default until these runs: the first 8 batches ran once, untimed, before timing


def attention_shapes(schedule: Schedule) -> list[set[tuple]]:
    """Per batch, the attention calls' shapes as gpu-replay issues them: ('prefill', c, m + c) per chunk,
    ('decode', b, L) for the batch's decodes (``L``: longest key count rounded up to ``DECODE_ALIGN``)."""
    shapes = []
    for chunks, decode_lengths in batch_layouts(schedule):
        keys = {("prefill", c, m + c) for m, c in chunks}
        if decode_lengths:
            keys.add(("decode", len(decode_lengths), -(-max(decode_lengths) // DECODE_ALIGN) * DECODE_ALIGN))
        shapes.append(keys)
    return shapes


def batch_layouts(schedule: Schedule) -> list[tuple[list[tuple[int, int]], list[int]]]:
    """Per batch, as gpu-replay lays it out: its prefill chunks ``(m, c)`` (``c`` tokens after ``m`` cached ones)
    and its decodes' key counts ``m + 1``, in batch order (applied through a ``Replayer``, as gpu-replay does)."""
    rp = Replayer(schedule.requests, schedule.limits, load_cost_model(kind="roofline"))  # times unused (no profile needed)
    out = []
    for batch in schedule.batches:
        before = {rid: (rp.states[rid].m, rp.states[rid].input_tokens) for rid, _ in batch.items}
        rp.apply(batch)
        chunks, decode_lengths = [], []
        for rid, c in batch.items:
            m, icur = before[rid]
            if m < icur:
                chunks.append((m, c))
            else:
                decode_lengths.append(m + 1)
        out.append((chunks, decode_lengths))
    return out


def cold_batches(shapes: list[set[tuple]], warmup: int = WARMUP_BATCHES) -> np.ndarray:
    seen = set().union(*shapes[:warmup]) if shapes[:warmup] else set()
    cold = np.zeros(len(shapes), dtype=bool)
    for j, keys in enumerate(shapes):
        cold[j] = bool(keys - seen)
        seen |= keys
    return cold


def case_cold(folder: Path) -> np.ndarray:
    """Per batch of the replay in ``folder`` (``sim/schedule.json``): whether it met a first-seen attention shape."""
    return cold_batches(attention_shapes(Schedule.load(folder / "sim" / "schedule.json")))


def case_rows(folder: Path) -> list[dict]:
    cold = case_cold(folder)
    rows = []
    for score in sorted(folder.glob("score-*/batches.csv")):
        b = pd.read_csv(score)
        if len(b) != len(cold):
            raise ValueError(f"{score}: {len(b)} batches, the schedule has {len(cold)}")
        err = (b.predicted_s - b.measured_s).abs() / b.measured_s * 100
        summary = json.loads((score.parent / "summary.json").read_text())
        rows.append({"case": f"{folder.parent.name}/{folder.name}", "cost model": score.parent.name[len("score-"):],
                     "batches": len(b), "cold": int(cold.sum()), "MAPE all %": err.mean(),
                     "MAPE warm %": err[~cold].mean(), "MAPE cold %": err[cold].mean() if cold.any() else np.nan,
                     "cold excess s": float((b.measured_s - b.predicted_s)[cold].sum()),
                     "e2e latency error %": summary["e2e_latency_error_pct"],
                     "busy error %": 100 * (b.predicted_s.sum() / b.measured_s.sum() - 1),
                     "busy error warm %": 100 * (b.predicted_s[~cold].sum() / b.measured_s[~cold].sum() - 1)})
    return rows


def plot(cases: list[Path], out: Path) -> None:
    """Measured and predicted (piecewise fit) time of every batch, cold batches marked, one panel per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 2.6 * len(cases)), squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        cold = case_cold(case)
        b = pd.read_csv(case / "score-piecewise" / "batches.csv")
        ax.plot(b.batch, b.measured_s * 1e3, lw=0.7, color="0.35", label="measured")
        ax.plot(b.batch, b.predicted_s * 1e3, lw=0.9, color="tab:blue", label="predicted (piecewise fit)")
        ax.scatter(b.batch[cold], b.measured_s[cold] * 1e3, s=7, color="tab:red", zorder=3,
                   label="measured, first-seen attention shape")
        ax.set_title(f"{case.parent.name} / {case.name}", fontsize=9)
        ax.set_ylabel("batch time (ms)")
    axes[-1, 0].set_xlabel("batch")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="folders holding <model>/<case>/ replay folders")
    ap.add_argument("--plot", type=Path, help="also draw the replays with a piecewise score into this PNG")
    ap.add_argument("--plot-cases", default="", help="comma-separated <model>/<case> to draw (default: every one)")
    args = ap.parse_args()
    rows = []
    for run in map(Path, args.runs):
        cases = sorted(p.parent.parent for p in run.glob("*/*/sim/schedule.json"))
        if not cases:
            sys.exit(f"{run}: no <model>/<case>/sim/schedule.json")
        rows += [dict(r, run=run.name) for case in cases for r in case_rows(case)]
    table = pd.DataFrame(rows).set_index(["run", "case", "cost model"])
    if args.plot:
        wanted = {w for w in args.plot_cases.split(",") if w}
        cases = [p.parent.parent for run in map(Path, args.runs) for p in sorted(run.glob("*/*/sim/schedule.json"))]
        plot([c for c in cases if (c / "score-piecewise" / "batches.csv").exists()
              and (not wanted or f"{c.parent.name}/{c.name}" in wanted)], args.plot)
    with pd.option_context("display.width", 200):
        print(table.round(1).to_string())


if __name__ == "__main__":
    main()
