"""How much of a gpu-replay's error sits in decode batches that the replayer pads far beyond their KV (issue 20).

`gpu-replay` (up to 2026-11-29) ran a batch's decode attention as one SDPA call over the sequences' keys gathered into
a padded ``[b, L]`` block, ``L`` the longest KV length rounded up to 8 (``layers.decode_index``). The attention work is
then about ``b · max`` keys, not their sum. The operator profile's decode batches spread lengths over ±25% of their
mean (``operators.decode_lengths``), so the cost model, fitted on the sum, has seen padding up to about 1.25×. On a
fixed I/O grid every sequence has nearly the same length; on a trace slice a batch can hold a 4,000-token
conversation beside thirty 400-token ones, and the replayer reads four to six times the keys a paged-attention server
would.

For each replay folder (``<model>/<case>/score-<family>/batches.csv``) this prints, per padding band (``b · max /
sum`` of the decode KV lengths), the batches, their median signed error (predicted − measured, relative to measured),
their per-batch MAPE and their share of the measured busy time; then per case the per-batch MAPE and the busy-time
error over all batches and over the batches padded at most ``--ratio`` times. Optionally draws signed error against
padding. ``--keys`` also lays each replayed schedule (``sim/schedule.json``) out as `gpu-replay` does and counts the
keys its decode attention reads: their sum, as one padded call per batch (the replays measured here), and in the
groups of ``layers.decode_groups`` (gpu-replay's default since), with the calls per decode batch.

    python benchmarks/gpu_replay_padding.py profiles/h200-graphs/replays/2026-11-29 profiles/h200/replays/2026-11-29

Reads only committed files; needs no GPU (``--keys`` imports PyTorch for ``layers``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

BANDS = [0, 1.5, 2, 3, 4, 6, np.inf]


def padding_ratio(batches: pd.DataFrame) -> pd.Series:
    """``b · max / sum`` of a batch's decode KV lengths (1 for a batch without decodes)."""
    padded = batches.n_decode_seqs * batches.decode_kv_max
    return (padded / batches.decode_kv_tokens.where(batches.decode_kv_tokens > 0)).fillna(1.0)


def load(run: Path, family: str) -> pd.DataFrame:
    frames = []
    for path in sorted(run.glob(f"*/*/score-{family}/batches.csv")):
        d = pd.read_csv(path)
        d["case"] = f"{path.parts[-4]}/{path.parts[-3]}"
        d["run"] = str(run)
        frames.append(d)
    if not frames:
        raise SystemExit(f"{run}: no */*/score-{family}/batches.csv")
    d = pd.concat(frames, ignore_index=True)
    d["signed_pct"] = 100 * (d.predicted_s - d.measured_s) / d.measured_s
    d["padding"] = padding_ratio(d)
    return d


def summary(d: pd.DataFrame, ratio: float) -> pd.DataFrame:
    rows = []
    for (run, case), g in d.groupby(["run", "case"], sort=True):
        kept = g[g.padding <= ratio]
        rows.append({"run": Path(run).parent.parent.name + "/" + Path(run).name, "case": case, "batches": len(g),
                     f"padded > {ratio:g}x": len(g) - len(kept),
                     "their share of busy time %": 100 * (1 - kept.measured_s.sum() / g.measured_s.sum()),
                     "MAPE all %": g.signed_pct.abs().mean(),
                     "busy error all %": 100 * (g.predicted_s.sum() / g.measured_s.sum() - 1),
                     f"MAPE <= {ratio:g}x %": kept.signed_pct.abs().mean(),
                     f"busy error <= {ratio:g}x %": 100 * (kept.predicted_s.sum() / kept.measured_s.sum() - 1)})
    return pd.DataFrame(rows)


def bands(d: pd.DataFrame) -> pd.DataFrame:
    d = d[d.n_decode_seqs > 0].assign(band=pd.cut(d.padding, BANDS))
    total = d.groupby("run").measured_s.sum()
    out = d.groupby(["run", "band"], observed=True).agg(
        batches=("signed_pct", "size"), median_signed_pct=("signed_pct", "median"),
        mape_pct=("signed_pct", lambda x: x.abs().mean()), measured_s=("measured_s", "sum"),
        median_decodes=("n_decode_seqs", "median"), median_kv_max=("decode_kv_max", "median")).reset_index()
    out["busy_share_pct"] = 100 * out.measured_s / out.run.map(total)
    out["run"] = out.run.map(lambda r: Path(r).parent.parent.name + "/" + Path(r).name)
    return out.drop(columns="measured_s")


def keys_read(runs: list[Path]) -> pd.DataFrame:
    """Per replayed schedule: decode keys summed, read as one padded call per batch, read in decode groups."""
    from gpu_replay_shapes import batch_layouts  # (benchmarks/, the running script's folder)

    from infermax.profiling.layers import DECODE_ALIGN, decode_groups
    from infermax.schedule import Schedule

    def padded(lengths: list[int]) -> int:
        return len(lengths) * -(-lengths[0] // DECODE_ALIGN) * DECODE_ALIGN

    rows = []
    for run in runs:
        for path in sorted(run.glob("*/*/sim/schedule.json")):
            total = single = grouped = calls = batches = most = 0
            for _, lengths in batch_layouts(Schedule.load(path)):
                if not lengths:
                    continue
                lengths = sorted(lengths, reverse=True)  # gpu-replay runs them longest first
                sizes, first = decode_groups(lengths), 0
                for size in sizes:
                    grouped += padded(lengths[first:first + size])
                    first += size
                total, single, batches = total + sum(lengths), single + padded(lengths), batches + 1
                calls, most = calls + len(sizes), max(most, len(sizes))
            rows.append({"run": run.parent.parent.name + "/" + run.name, "case": f"{path.parts[-4]}/{path.parts[-3]}",
                         "decode batches": batches, "keys (sum)": total, "one call: keys read / sum": single / total,
                         "groups: keys read / sum": grouped / total, "groups: calls per batch": calls / batches,
                         "most calls": most})
    return pd.DataFrame(rows)


def with_groups(d: pd.DataFrame) -> pd.DataFrame:
    """``d`` with each batch's decode-group count (``layers.decode_groups`` over its decodes, longest first, as
    gpu-replay runs them since 2026-11-29; 1 for a replay with the "varlen" decode kernel) and its residual,
    measured − predicted, in ms."""
    from gpu_replay_shapes import batch_layouts  # (benchmarks/, the running script's folder)

    from infermax.profiling.layers import decode_groups
    from infermax.schedule import Schedule

    frames = []
    for (run, case), g in d.groupby(["run", "case"], sort=False):
        layouts = batch_layouts(Schedule.load(Path(run) / case / "sim" / "schedule.json"))
        if len(layouts) != len(g):
            raise SystemExit(f"{run}/{case}: {len(layouts)} scheduled batches, {len(g)} scored")
        summary = Path(run) / case / "replay" / "summary.json"
        one_call = summary.is_file() and json.loads(summary.read_text()).get("decode_kernel") == "varlen"
        frames.append(g.assign(groups=[(1 if one_call else len(decode_groups(sorted(lengths, reverse=True))))
                                       if lengths else 0 for _, lengths in layouts]))
    out = pd.concat(frames, ignore_index=True)
    out["residual_ms"] = 1e3 * (out.measured_s - out.predicted_s)
    out["model"] = out.case.str.split("/").str[0]
    return out


def by_groups(d: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Decode batches per (run, model, group count): median residual and signed error; and per (run, model) the
    least-squares residual ``a + b·(groups − 1) + c·decodes`` in ms, ``b`` the time one more group costs a batch."""
    dec = d[d.groups > 0]
    table = dec.groupby(["run", "model", "groups"]).agg(
        batches=("residual_ms", "size"), median_residual_ms=("residual_ms", "median"),
        median_signed_pct=("signed_pct", "median"), median_decodes=("n_decode_seqs", "median")).reset_index()
    rows = []
    for (run, model), g in dec.groupby(["run", "model"]):
        x = np.column_stack([np.ones(len(g)), g.groups - 1, g.n_decode_seqs])
        (a, b, c), *_ = np.linalg.lstsq(x, g.residual_ms, rcond=None)
        rows.append({"run": run, "model": model, "decode batches": len(g), "a (ms)": a,
                     "b: per extra group (ms)": b, "c: per decode (ms)": c})
    for frame in (table, fit := pd.DataFrame(rows)):
        frame["run"] = frame.run.map(lambda r: Path(r).parent.parent.name + "/" + Path(r).name)
    return table, fit


def groups_figure(d: pd.DataFrame):
    """Box plots of the residual per decode-group count, one panel per (run, model) of ``with_groups``'s frame."""
    import matplotlib.pyplot as plt
    dec = d[d.groups > 0]
    panels = sorted(set(zip(dec.run, dec.model)))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), sharey=True, squeeze=False)
    for ax, (run, model) in zip(axes[0], panels):
        g = dec[(dec.run == run) & (dec.model == model)]
        counts = sorted(g.groups.unique())
        ax.boxplot([g.residual_ms[g.groups == k] for k in counts], positions=counts, widths=0.6, showfliers=False)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel("decode groups in the batch (attention calls per layer)")
        ax.set_title(f"{Path(run).name}: {model}", fontsize=9)
    axes[0][0].set_ylabel("measured − predicted per batch (ms)")
    fig.tight_layout()
    return fig


def plot_groups(d: pd.DataFrame, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    groups_figure(d).savefig(path, dpi=130)
    print(f"wrote {path}")


def plot(d: pd.DataFrame, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = list(dict.fromkeys(d.run))
    colors = {case: f"C{i % 10}" for i, case in enumerate(sorted(set(d.case)))}  # one colour per case in every panel
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.2), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        g = d[(d.run == run) & (d.n_decode_seqs > 0)]
        for case, h in g.groupby("case"):
            ax.scatter(h.padding, h.signed_pct, s=6, alpha=0.5, color=colors[case], label=case)
        ax.axhline(0, color="k", lw=0.6)
        ax.axvline(1.25, color="grey", ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("decode padding: batch × longest KV / sum of KV")
        ax.set_title(Path(run).parent.parent.name + "/" + Path(run).name, fontsize=9)
    axes[0][0].set_ylabel("predicted − measured, % of measured")
    handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=case) for case, c in colors.items()]
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=min(5, len(handles)))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="folders holding <model>/<case>/score-<family>/ folders")
    ap.add_argument("--family", default="piecewise", help="the fit whose scores are read (default piecewise)")
    ap.add_argument("--ratio", type=float, default=3.0, help="padding above which a batch is set apart (default 3)")
    ap.add_argument("--plot", help="also draw signed error against padding into this PNG")
    ap.add_argument("--keys", action="store_true", help="also count the decode keys read, one call against groups")
    ap.add_argument("--groups", action="store_true",
                    help="also split the decode batches' residual by their decode-group count (replays since 2026-11-30)")
    ap.add_argument("--groups-plot", help="also draw the residual per decode-group count into this PNG")
    args = ap.parse_args()
    d = pd.concat([load(run, args.family) for run in args.runs], ignore_index=True)
    pd.set_option("display.width", 200)
    print(bands(d).round(1).to_string(index=False))
    print()
    print(summary(d, args.ratio).round(1).to_string(index=False))
    if args.keys:
        print()
        print(keys_read(args.runs).round(2).to_string(index=False))
    if args.plot:
        plot(d, args.plot)
    if args.groups or args.groups_plot:
        g = with_groups(d)
        table, fit = by_groups(g)
        print()
        print(table.round(2).to_string(index=False))
        print()
        print(fit.round(3).to_string(index=False))
        if args.groups_plot:
            plot_groups(g, args.groups_plot)


if __name__ == "__main__":
    main()
