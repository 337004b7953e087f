"""Apt-Serve study: effective throughput vs vLLM and Sarathi, and the paper's two ablations.

Run from the repository root::

    PYTHONPATH=. python experiments/aptserve_study.py                   # prints the tables, writes nothing
    PYTHONPATH=. python experiments/aptserve_study.py --out experiments # regenerates aptserve_results.{json,md}

Setting (every run): the default profile (A100, Llama-2-7B, TP 1, ``--cost-model auto``), C = 4096,
block size 16 and at most 256 running requests (vLLM's defaults), Sarathi's P = 512; 1,000 requests
per run (as the paper), one seed (0). Two memory settings: the repository default M = 100,000 tokens
and M = 48,024 (Llama-2-7B on a 40 GB A100 at 0.9 utilisation, the paper's GPU). Lengths and SLOs:
``infermax.workload.DATASETS`` (our approximations of the paper's datasets; SLOs from its Table 3).

1. Effective throughput at 90% and 60% attainment, Poisson arrivals, per dataset and scheduler
   (``infermax.capacity.search_capacity``: bracketing from a start rate, bisection to 5%).
2. Ablations (the paper's Tables 4 and 5): SLO attainment of Apt-Serve (hybrid, adaptive) vs its
   KV-only and FCFS variants on ShareGPT and LongBench, Gamma arrivals with CV 1/5/10, at two rates
   per dataset: Apt-Serve's own Poisson effective throughput at 90% and at 60% (the paper likewise
   picked rates where Apt-Serve attains ~99% and ~67%).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.progress import Progress

from infermax.capacity import attainment_at, search_capacity
from infermax.config import RunConfig

DATASETS = {"sharegpt": 8.0, "humaneval": 16.0, "longbench": 4.0}  # dataset -> start rate (req/s)
SCHEDULERS = ("vllm", "sarathi", "aptserve")
ABLATION = ("aptserve", "aptserve-kv", "aptserve-fcfs")
MEMORY = {"M=100K (default)": 100_000, "M=48K (40 GB A100)": 48_024}
THRESHOLDS = (0.9, 0.6)
BASE = dict(B=1000, C=4096, block_size=16, Rmax=256, seed=0)


def config(scheduler: str, dataset: str, M: int, arrival: str = "poisson", cv: float | None = None) -> RunConfig:
    return RunConfig(scheduler=scheduler, dataset=dataset, slo=dataset, M=M, arrival=arrival, cv=cv, rate=1.0, **BASE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="directory for aptserve_results.{json,md} (default: print the Markdown, "
                    "write nothing; `--out experiments` regenerates the committed results)")
    out = ap.parse_args().out
    started = time.time()
    results: dict = {"setting": {**BASE, "memory": MEMORY, "thresholds": THRESHOLDS}, "capacity": {}, "ablation": {}}
    with Progress() as bar:
        task = bar.add_task("capacity searches", total=len(MEMORY) * len(DATASETS) * len(SCHEDULERS))
        for mem_name, M in MEMORY.items():
            for dataset, start in DATASETS.items():
                for scheduler in SCHEDULERS:
                    cfg = config(scheduler, dataset, M)
                    res = search_capacity(lambda r: attainment_at(cfg, r, [0]), THRESHOLDS, start_rate=start)
                    results["capacity"].setdefault(mem_name, {}).setdefault(dataset, {})[scheduler] = {
                        "rates": {str(t): r for t, r in res.rates.items()},
                        "evaluations": {str(r): a for r, a in sorted(res.evaluations.items())}}
                    bar.advance(task)
        task = bar.add_task("ablation runs", total=len(MEMORY) * 2 * 2 * 3 * len(ABLATION))
        for mem_name, M in MEMORY.items():
            for dataset in ("sharegpt", "longbench"):
                apt = results["capacity"][mem_name][dataset]["aptserve"]["rates"]
                for label, rate in (("r90", apt["0.9"]), ("r60", apt["0.6"])):
                    for cv in (1.0, 5.0, 10.0):
                        row = {}
                        for scheduler in ABLATION:
                            cfg = config(scheduler, dataset, M, "gamma", cv)
                            summary = RunConfig(**{**cfg.to_dict(), "rate": rate}).simulate().summary
                            row[scheduler] = {k: summary[k] for k in (
                                "slo_attainment", "ttft_attainment", "tbt_attainment", "hidden_item_share", "evictions")}
                            bar.advance(task)
                        results["ablation"].setdefault(mem_name, {}).setdefault(dataset, {}).setdefault(
                            f"{label}={rate:.3g}", {})[str(cv)] = row
    results["wall_s"] = round(time.time() - started, 1)
    if out is None:
        print(markdown(results))
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "aptserve_results.json").write_text(json.dumps(results, indent=1))
        (out / "aptserve_results.md").write_text(markdown(results))
    print(f"done in {results['wall_s']} s", file=sys.stderr)


def markdown(results: dict) -> str:
    lines = ["# Apt-Serve study: results", "",
             "Generated by `PYTHONPATH=. python experiments/aptserve_study.py --out experiments` (setting in its docstring); "
             f"whole study {results['wall_s']} s on the 2-core development machine.", ""]
    for mem_name, by_dataset in results["capacity"].items():
        lines += [f"## Effective throughput (req/s), Poisson arrivals, {mem_name}", "",
                  "| dataset | attainment | vLLM | Sarathi | Apt-Serve | Apt-Serve / vLLM | Apt-Serve / Sarathi |",
                  "|---|---|---|---|---|---|---|"]
        for dataset, by_sched in by_dataset.items():
            for t in THRESHOLDS:
                r = {s: by_sched[s]["rates"][str(t)] for s in SCHEDULERS}
                ratio = [("-" if not r[b] or r["aptserve"] is None else f"{r['aptserve'] / r[b]:.2f}x")
                         for b in ("vllm", "sarathi")]
                cells = ["-" if v is None else f"{v:.3g}" for v in r.values()]
                lines.append(f"| {dataset} | {t:.0%} | " + " | ".join(cells + ratio) + " |")
        lines.append("")
    for mem_name, by_dataset in results["ablation"].items():
        lines += [f"## Ablations: SLO attainment (%), Gamma arrivals, {mem_name}", "",
                  "| dataset | rate (req/s) | CV | KV only | hybrid (Apt-Serve) | FCFS (hybrid) | hidden share of items |",
                  "|---|---|---|---|---|---|---|"]
        for dataset, by_rate in by_dataset.items():
            for rate, by_cv in by_rate.items():
                for cv, row in by_cv.items():
                    att = {s: 100 * row[s]["slo_attainment"] for s in ABLATION}
                    lines.append(f"| {dataset} | {rate} | {float(cv):g} | {att['aptserve-kv']:.1f} | {att['aptserve']:.1f} "
                                 f"| {att['aptserve-fcfs']:.1f} | {row['aptserve']['hidden_item_share']:.4f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
