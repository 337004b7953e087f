"""Caching x preemption (issue 19): does automatic prefix caching change what the paper found about evictions?

Run from the repository root (a few minutes on a 2-core machine)::

    PYTHONPATH=. python experiments/prefix_caching.py --out experiments/results/prefix_caching

It refuses to write into a directory that already holds results unless ``--force``, so a rerun never
rewrites the committed ones silently; ``--report DIR`` redraws ``summary.md`` and the figures from a
saved ``results.parquet``.

Two grids, every point one simulation (the paper's linear A100 Llama-2-7B model, C = 4,096):

1. **Fig. 9 with a shared system prompt** (`system-prompt` workload): B = 1,024 requests at t = 0,
   prompt I tokens of which a share ``s`` ∈ {0, 1/4, 1/2, 3/4, 15/16} is one system prompt shared by
   every request (the rest the request's own), O = 32 (the paper's Fig. 9). Two accountings: vLLM's
   paging (block 16, I ∈ {64, 256}, M ∈ {100, 1K, 4K, 10K, 100K}) and the paper's (block 1: caching
   per token; I ∈ {4, 16, 64}, M ∈ {100, 1K, 10K, 100K}, where Fig. 9's eviction gains were found).
   Points where a request cannot fit M are left out. Schedulers: `vllm-v1` and `vllm-v1-ef` with caching off and on, the paper's `vllm`,
   `vllm-ef`, `sarathi`, `sarathi-ef` (no caching).
2. **Multi-turn conversations** (`multiturn`, LMSYS-Chat-1M lengths): 2,000 turns, conversations
   starting as a Poisson process at 8 per second (enough to load the GPU), mean turns ∈ {1, 2, 4}, M ∈ {10K, 100K}:
   `vllm-v1` off/on, `vllm`, `sarathi`.

Per point: TPS, mean TTFT / TPOT / latency, makespan, evictions, prefill tokens computed, refill
tokens (re-entered after evictions) and how many of them were computed rather than hit, the hit rate
(tokens, blocks), cached blocks evicted.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/findings.py

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import with_arrivals
from infermax.workloads_prefix import multiturn, shared_prefix_fraction, system_prompt

TURN_BLOCK = 16
C = 4096
SYSTEM_GRID = dict(B=1024, O=32, shares=(0.0, 0.25, 0.5, 0.75, 0.9375))
SYSTEM_ACCOUNTINGS = ((16, (64, 256), (100, 1_000, 4_000, 10_000, 100_000)),  # (block, I values, M values)
                      (1, (4, 16, 64), (100, 1_000, 10_000, 100_000)))
SYSTEM_CONFIGS = (("vllm-v1", False), ("vllm-v1", True), ("vllm-v1-ef", False), ("vllm-v1-ef", True),
                  ("vllm", False), ("vllm-ef", False), ("sarathi", False), ("sarathi-ef", False))
TURN_GRID = dict(B=2000, rate=8.0, turns=(1.0, 2.0, 4.0), M=(10_000, 100_000))
TURN_CONFIGS = (("vllm-v1", False), ("vllm-v1", True), ("vllm", False), ("sarathi", False))
METRICS = ("tps", "makespan_s", "mean_ttft_s", "mean_tpot_s", "mean_latency_s", "evictions")


@dataclass(frozen=True)
class Point:
    grid: str
    scheduler: str
    caching: bool
    M: int
    share: float  # system-prompt share of the prompt (grid 1) or mean turns (grid 2)
    I: int = 0  # prompt tokens (grid 1)
    block: int = TURN_BLOCK

    @property
    def label(self) -> str:
        return f"{self.scheduler}{' +cache' if self.caching else ''}"


def points() -> list[Point]:
    g = SYSTEM_GRID
    out = [Point("system-prompt", s, c, M, share, I, block) for block, Is, Ms in SYSTEM_ACCOUNTINGS for I in Is
           for M in Ms if I + g["O"] - 1 <= M - M % block for share in g["shares"] for s, c in SYSTEM_CONFIGS]
    out += [Point("multiturn", s, c, M, turns) for M in TURN_GRID["M"] for turns in TURN_GRID["turns"]
            for s, c in TURN_CONFIGS]
    return out


def workload(p: Point):
    if p.grid == "system-prompt":
        g = SYSTEM_GRID
        shared = min(round(p.share * p.I), p.I - 1)  # at least one token of its own
        if shared == 0:
            return system_prompt(g["B"], system_tokens=1, prefix_share=0.0, message_dist=f"const:{p.I}",
                                 output_dist=f"const:{g['O']}")
        return system_prompt(g["B"], system_tokens=shared, message_dist=f"const:{p.I - shared}",
                             output_dist=f"const:{g['O']}")
    return multiturn(TURN_GRID["B"], turns_mean=p.share, arrival="poisson", rate_per_s=TURN_GRID["rate"], seed=0)


def run_point(p: Point, cost) -> dict:
    requests = workload(p)
    limits = Limits(C=C, M=p.M, block_size=p.block, prefix_caching=p.caching)
    t = time.perf_counter()
    res = simulate(requests, p.scheduler, limits, cost)
    wall = time.perf_counter() - t
    s, q = res.summary, res.requests
    hits_after_eviction = s.get("prefix_hit_tokens_after_eviction", 0)
    row = {"grid": p.grid, "scheduler": p.scheduler, "caching": p.caching, "config": p.label, "block": p.block, "I": p.I,
           "M": p.M, "share": p.share, "shared_fraction": shared_prefix_fraction(requests, p.block),
           **{k: s[k] for k in METRICS},
           "prefill_computed_tokens": int((q.prompt_tokens + q.refilled_tokens).sum()) - s.get("prefix_hit_tokens", 0),
           "refilled_tokens": s["refilled_tokens"],
           "refill_computed_tokens": s["refilled_tokens"] - hits_after_eviction,
           "prefix_hit_tokens": s.get("prefix_hit_tokens", 0),
           "prefix_hit_rate_tokens": s.get("prefix_hit_rate_tokens", math.nan),
           "prefix_hit_rate_blocks": s.get("prefix_hit_rate_blocks", math.nan),
           "cached_blocks_evicted": s.get("cached_blocks_evicted", 0),
           "num_batches": s["num_batches"], "sim_wall_s": wall}
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="results directory (results.parquet, summary.md, figures/)")
    ap.add_argument("--force", action="store_true", help="overwrite results already in --out")
    ap.add_argument("--report", type=Path, help="only redraw summary.md and figures from DIR/results.parquet")
    args = ap.parse_args(argv)
    if args.report:
        report(args.report)
        return
    if args.out is None:
        ap.error("give --out DIR (or --report DIR)")
    if (args.out / "results.parquet").exists() and not args.force:
        sys.exit(f"error: {args.out / 'results.parquet'} exists; pass --force to recompute and overwrite it")
    from rich.progress import Progress

    cost = load_cost_model(kind="linear")
    rows = []
    todo = points()
    with Progress() as bar:
        task = bar.add_task("simulating", total=len(todo))
        for p in todo:
            rows.append(run_point(p, cost))
            bar.advance(task)
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(args.out / "results.parquet", index=False)
    report(args.out)


def md(frame: pd.DataFrame) -> str:
    """A DataFrame (index included) as a Markdown table."""
    frame = frame.reset_index()
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
    head = [str(c) for c in frame.columns]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in cells])


def _ratio_table(df: pd.DataFrame, num: str, den: str, metric: str = "tps") -> pd.DataFrame:
    """``metric`` of config ``num`` ÷ that of ``den`` per (M, share)."""
    a = df[df.config == num].set_index(["block", "I", "M", "share"])[metric]
    b = df[df.config == den].set_index(["block", "I", "M", "share"])[metric]
    return (a / b).unstack("share")


def findings(df: pd.DataFrame) -> list:
    """The paper's Fig. 9 eviction findings, checked for vLLM V1 with prefix caching (`experiments/findings.py`)."""
    from findings import Finding

    sp = df[df.grid == "system-prompt"]
    with_cache = _ratio_table(sp, "vllm-v1 +cache", "vllm-v1-ef +cache").stack()
    without = _ratio_table(sp, "vllm-v1", "vllm-v1-ef").stack()
    out = []
    for M, paper, claim_up in ((100, 2.2, True), (1000, 1.2, True), (10000, 1.5, False)):
        ours = with_cache[with_cache.index.get_level_values("M") == M]
        if ours.empty:
            continue
        plain = without[without.index.get_level_values("M") == M]
        best = ours.idxmax() if claim_up else ours.idxmin()
        value = float(ours[best])
        block, I, _, share = best
        verb = "raise" if claim_up else "lower"
        out.append(Finding(
            "9 (+cache)", f"M={M}: evictions {verb} TPS by up to {paper}x",
            f"vllm-v1 +cache vs vllm-v1-ef +cache: up to {value if claim_up else 1 / value:.2f}x (block {block}, "
            f"I={I}, shared share {share:g}); without caching up to "
            f"{plain.max() if claim_up else 1 / plain.min():.2f}x",
            value > 1 if claim_up else value < 1, paper_factor=paper, our_factor=value if claim_up else 1 / value))
    return out


def report(out: Path) -> None:
    df = pd.read_parquet(out / "results.parquet")
    lines = ["# Caching x preemption (issue 19)", "",
             "Produced by `experiments/prefix_caching.py` (see its docstring for the grids and the command).", ""]
    sp = df[df.grid == "system-prompt"]
    lines += ["## Shared system prompt (B = 1,024, O = 32): TPS (block = KV block size)", "",
              md(sp.pivot_table(index=["block", "I", "M", "share"], columns="config", values="tps")), ""]
    lines += ["## Hit rate (tokens) and prefill tokens computed, vllm-v1 +cache", "",
              md(sp[sp.config == "vllm-v1 +cache"].set_index(["block", "I", "M", "share"])[
                  ["shared_fraction", "prefix_hit_rate_tokens", "prefill_computed_tokens", "evictions",
                   "refilled_tokens", "refill_computed_tokens", "cached_blocks_evicted"]]), ""]
    for label, num, den in (("vllm-v1 (no cache)", "vllm-v1", "vllm-v1-ef"),
                            ("vllm-v1 +cache", "vllm-v1 +cache", "vllm-v1-ef +cache"),
                            ("paper's vllm", "vllm", "vllm-ef"), ("paper's sarathi", "sarathi", "sarathi-ef")):
        lines += [f"## Evicting ÷ eviction-free TPS, {label} (rows block, I, M; columns: shared share)", "",
                  md(_ratio_table(sp, num, den)), ""]
    lines += ["## Caching speed-up of vllm-v1 (TPS with ÷ without)", "",
              md(_ratio_table(sp, "vllm-v1 +cache", "vllm-v1")), ""]
    mt = df[df.grid == "multiturn"]
    if len(mt):
        lines += ["## Multi-turn conversations (2,000 turns, Poisson 8 conversations/s)", "",
                  md(mt.set_index(["M", "share", "config"])[
                      ["shared_fraction", "tps", "mean_ttft_s", "mean_tpot_s", "evictions", "prefix_hit_rate_tokens",
                       "refill_computed_tokens"]]), ""]
    from findings import show

    lines += ["## The paper's eviction findings with caching", "", show(findings(df)), ""]
    (out / "summary.md").write_text("\n".join(lines))
    figure(sp, out / "figures")


PAIRS = (("vllm-v1", "vllm-v1-ef", "vllm-v1"), ("vllm-v1 +cache", "vllm-v1-ef +cache", "vllm-v1 +cache"),
         ("vllm", "vllm-ef", "paper's vllm"), ("sarathi", "sarathi-ef", "paper's sarathi"))


def figure(sp: pd.DataFrame, folder: Path) -> None:
    """Per I: TPS, TTFT and evictions against the shared share, one column per M; and the evicting ÷
    eviction-free TPS ratio against M (the paper's Fig. 9 question) per scheduler pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for (block, I), part in sp.groupby(["block", "I"]):
        Ms = sorted(part.M.unique())
        fig, axes = plt.subplots(3, len(Ms), figsize=(3.6 * len(Ms), 8.5), sharex=True, squeeze=False)
        for j, M in enumerate(Ms):
            for config, g in part[part.M == M].groupby("config"):
                g = g.sort_values("share")
                style = "-" if "+cache" in config else ("--" if config.startswith("vllm-v1") else ":")
                for i, metric in enumerate(("tps", "mean_ttft_s", "evictions")):
                    axes[i, j].plot(g.share, g[metric], style, marker="o", ms=3, label=config)
            axes[0, j].set_title(f"M = {M:,}")
            axes[1, j].set_yscale("log")
            axes[2, j].set_xlabel("system-prompt share of the prompt")
        for i, name in enumerate(("TPS (tokens/s)", "mean TTFT (s)", "evictions")):
            axes[i, 0].set_ylabel(name)
        axes[0, -1].legend(fontsize=7)
        fig.suptitle(f"Caching x preemption: shared system prompt, B = 1,024, I = {I}, O = 32, block {block} "
                     f"(linear A100 model)")
        fig.tight_layout()
        fig.savefig(folder / f"prefix_caching_b{block}_I{I}.png", dpi=100)
        plt.close(fig)
    shares = sorted(sp.share.unique())
    cases = list(sp.groupby(["block", "I"]))
    fig, axes = plt.subplots(len(cases), len(shares), figsize=(3.2 * len(shares), 2.8 * len(cases)), sharey=True,
                             squeeze=False)
    for r, ((block, I), part) in enumerate(cases):
        for j, share in enumerate(shares):
            ax = axes[r, j]
            for num, den, label in PAIRS:
                ratio = _ratio_table(part, num, den)[share].droplevel(["block", "I"]).sort_index()
                ax.plot(ratio.index, ratio.values, "-" if "+cache" in num else ":", marker="o", ms=3, label=label)
            ax.axhline(1.0, color="grey", lw=0.6)
            ax.set_xscale("log")
            ax.set_title(f"block {block}, I = {I}, shared {share:g}", fontsize=9)
            ax.set_xlabel("M (tokens)")
        axes[r, 0].set_ylabel("TPS evicting ÷ eviction-free")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle("Do evictions help at small M and hurt at large M, with prefix caching? (> 1: evictions help)")
    fig.tight_layout()
    fig.savefig(folder / "evictions_vs_M.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
