"""BROS vs vLLM vs round-robin on hybrid RT/BE workloads (issue 6; BROS paper §7.2, Figs. 10-11).

A100-80GB / Llama-2-7B (TP 1), fitted linear cost model, M from 0.9 of GPU memory (121,752 tokens),
KV blocks of 16 for every system. RT: Poisson at each rate over ``DURATION_S`` seconds with
ShareGPT-like or LMSYS-like lengths (BROS Table 2 moments), TTFT 0.4 s / TPOT 0.2 s. BE: closed-loop
batches of ``BE_BATCH`` requests (prompts U(512,1024), outputs U(32,128)) submitted until the RT
trace ends. The paper runs 10-minute traces; we run ``DURATION_S`` = 120 s, over ``SEEDS`` (3
workload seeds), to keep the whole study to a few minutes; tables report the mean over seeds and the
plot the per-seed spread.

Systems: ``bros`` (guards on, no token budget: C = M), ``vllm`` (FCFS over both classes,
prefill-first, recompute, C = 4096), ``roundrobin`` (alternating RT/BE iterations, recompute,
C = 4096); ``Rmax`` = 256 for all (vLLM's max_num_seqs; BROS's B_curr cap). KV swaps: PCIe 4
x16 at 0.8 efficiency (`SwapCost.for_system`).

Run: ``python experiments/bros.py`` prints the Markdown tables and writes nothing; ``--out DIR`` also writes
``DIR/bros_results.json`` and ``DIR/bros_results.png`` (``--out experiments`` regenerates the committed ones).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.progress import track

from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.metrics import class_summary
from infermax.models import get_gpu, get_model, kv_capacity_tokens
from infermax.schedulers import make_scheduler
from infermax.workloads_hybrid import hybrid

DATASETS = ("sharegpt", "lmsys")
RATES = (2.0, 4.0, 8.0, 12.0)
SYSTEMS = ("bros", "vllm", "roundrobin")
DURATION_S = 120.0
BE_BATCH = 256
SEEDS = (0, 1, 2)
METRICS = ("rt_norm_latency_s", "ttft_attainment", "tpot_attainment", "tpot_gap_attainment", "be_rps", "be_tps",
           "be_requests", "swapped_out_tokens", "evictions")


def run_point(dataset: str, rate: float, system: str, seed: int, cost, M: int, swap) -> dict:
    reqs = hybrid(dataset, rate, DURATION_S, BE_BATCH, seed=seed)
    limits = Limits(C=M if system == "bros" else 4096, M=M, Rmax=256, block_size=16)
    sched, resolved = make_scheduler(system, limits, cost)
    t0 = time.perf_counter()
    res = simulate(reqs, sched, resolved, cost, swap_cost=swap, closed_loop_until_s=DURATION_S)
    wall = time.perf_counter() - t0
    cs = class_summary(res)
    rt, be = cs["rt"], cs["be"]
    return {
        "dataset": dataset, "rate": rate, "system": system, "seed": seed,
        "rt_requests": rt["num_requests"], "rt_norm_latency_s": rt["mean_normalized_latency_s"],
        "rt_mean_ttft_s": rt["mean_ttft_s"], "ttft_attainment": rt["ttft_attainment"],
        "tpot_attainment": rt["tpot_attainment"], "tpot_gap_attainment": rt["tpot_gap_attainment"],
        "be_requests": be["num_requests"], "be_rps": be["throughput_rps"], "be_tps": be["throughput_tps"],
        "swapped_out_tokens": res.summary["swapped_out_tokens"], "evictions": res.summary["evictions"],
        "wall_s": wall,
    }


def seed_means(rows: list[dict]) -> list[dict]:
    """One row per (dataset, rate, system): every metric averaged over the seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["rate"], r["system"]), []).append(r)
    return [{"dataset": d, "rate": rate, "system": s, **{k: sum(r[k] for r in g) / len(g) for k in METRICS}}
            for (d, rate, s), g in groups.items()]


def table(rows: list[dict]) -> str:
    head = ("| RT | rate | system | RT norm. latency (s/token) | TTFT att. | TPOT att. | on-time gaps | "
            "BE req/s | BE tok/s | BE done | swapped-out tok | evictions |")
    lines = [head, "|" + "---|" * 12]
    for r in seed_means(rows):
        lines.append(f"| {r['dataset']} | {r['rate']:g} | {r['system']} | {r['rt_norm_latency_s']:.4f} | "
                     f"{r['ttft_attainment']:.1%} | {r['tpot_attainment']:.1%} | {r['tpot_gap_attainment']:.1%} | "
                     f"{r['be_rps']:.2f} | {r['be_tps']:.0f} | {r['be_requests']:.0f} | {r['swapped_out_tokens']:.0f} | "
                     f"{r['evictions']:.0f} |")
    return "\n".join(lines)


def paper_comparison(rows: list[dict]) -> str:
    """Means over the rates (and seeds) per dataset and system, and BROS's relative changes (paper §7.2)."""
    rows = seed_means(rows)
    lines = ["| RT | system | mean RT norm. latency | mean TTFT att. | mean TPOT att. | mean BE req/s | "
             "BROS latency change | BROS BE req/s change |", "|" + "---|" * 8]
    for d in DATASETS:
        mean = {s: {k: sum(r[k] for r in rows if r["dataset"] == d and r["system"] == s) / len(RATES)
                    for k in ("rt_norm_latency_s", "ttft_attainment", "tpot_attainment", "be_rps")} for s in SYSTEMS}
        for s in SYSTEMS:
            m, b = mean[s], mean["bros"]
            change = ("" if s == "bros" else
                      f"{b['rt_norm_latency_s'] / m['rt_norm_latency_s'] - 1:+.1%} | {b['be_rps'] / m['be_rps'] - 1:+.1%}")
            lines.append(f"| {d} | {s} | {m['rt_norm_latency_s']:.4f} | {m['ttft_attainment']:.1%} | "
                         f"{m['tpot_attainment']:.1%} | {m['be_rps']:.2f} | {change or ' | '} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """RT normalized latency, TTFT attainment and BE throughput against the RT rate; one dot per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("rt_norm_latency_s", "RT normalized latency (s/token)"), ("ttft_attainment", "RT TTFT attainment"),
              ("tpot_gap_attainment", "RT on-time token gaps"), ("be_rps", "BE throughput (req/s)"))
    fig, axes = plt.subplots(len(DATASETS), len(panels), figsize=(4 * len(panels), 3.2 * len(DATASETS)),
                             squeeze=False)
    means = seed_means(rows)
    for i, d in enumerate(DATASETS):
        for j, (key, label) in enumerate(panels):
            ax = axes[i][j]
            for s in SYSTEMS:
                pts = [r for r in means if r["dataset"] == d and r["system"] == s]
                line, = ax.plot([r["rate"] for r in pts], [r[key] for r in pts], marker="o", label=s)
                seeds = [r for r in rows if r["dataset"] == d and r["system"] == s]
                ax.scatter([r["rate"] for r in seeds], [r[key] for r in seeds], s=8, color=line.get_color(), alpha=0.4)
            ax.set_xlabel(f"RT rate (req/s), {d}-like RT")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="directory for bros_results.json and bros_results.png (default: write "
                    "nothing; `--out experiments` regenerates the committed results)")
    args = ap.parse_args()
    cost = load_cost_model("a100", "llama-2-7b", 1, kind="linear")
    M = kv_capacity_tokens(get_model("llama-2-7b"), get_gpu("a100"), 0.9, 1)
    swap = SwapCost.for_system("a100", "llama-2-7b", 1)
    points = [(d, r, s, seed) for d in DATASETS for r in RATES for s in SYSTEMS for seed in SEEDS]
    rows = [run_point(d, r, s, seed, cost, M, swap) for d, r, s, seed in track(points, description="bros study")]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / "bros_results.json"
        out.write_text(json.dumps({"M": M, "duration_s": DURATION_S, "be_batch": BE_BATCH, "seeds": SEEDS,
                                   "rows": rows}, indent=1))
        plot(rows, out.with_suffix(".png"))
    sys.stdout.write(table(rows) + "\n\n" + paper_comparison(rows) + "\n")


if __name__ == "__main__":
    main()
