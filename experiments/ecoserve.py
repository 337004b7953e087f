"""EcoServe vs vLLM vs Sarathi, and the ablation ladder, on the default profile (writes ecoserve_results.md).

Default profile: Llama-2-7B on one A100 (``load_cost_model("a100", "llama-2-7b", 1)``), M from
``kv_capacity_tokens`` at 0.9 (121,752 tokens), C = 4,096 (EcoServe's TFS), block size 1.
Workloads: ``ecoserve_workload`` (Alpaca- and ShareGPT-like, Table 2 statistics), ``N`` requests,
Poisson arrivals (common random numbers: one draw scaled by 1/rate). EcoServe variants get the
dataset's padding / reserve / buffer (10% / 1.2% / 15% Alpaca; 15% / 3% / 15% ShareGPT) and the
calibrated noisy predictor (``predicted_output_tokens`` filled for every scheduler; only EcoServe
reads it); the Oracle has no padding.

Sustainable rate: the highest rate whose mean normalized latency (latency / O) stays within
``LAT_FACTOR`` × vLLM's at a light load (1 req/s), by bracketing and bisection to 10%
(``search_capacity``). SSR (JCT ≤ 2·(t_p + t_g·O)) and the JCT decomposition are reported at one
common rate per dataset: vLLM's sustainable rate. Run: ``python experiments/ecoserve.py`` (~3-5 min
on 2 cores; prints the tables and writes nothing); ``--out=DIR`` also writes ``DIR/ecoserve_results_raw.md``
(``--out=experiments`` regenerates the committed one); ``--quick`` for a smoke run; ``--M=14592`` for the paper's
KV pressure (OPT-13B's 12 GB KVC in tokens, specs §4) instead of the default profile's M.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infermax.capacity import search_capacity
from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.ecoserve_eval import ecoserve_metrics, ecoserve_workload, slo_params
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.models import kv_capacity_tokens
from infermax.predictor import PADDING, make_predictor, with_predictions
from infermax.schedulers import make_scheduler
from infermax.schedulers.ecoserve import EcoServeOptions, EcoServeScheduler
from infermax.workload import with_arrivals

QUICK = "--quick" in sys.argv
N = 120 if QUICK else 300
LAT_FACTOR = 2.0
RESERVE = {"alpaca": 0.012, "sharegpt": 0.03}
COST = load_cost_model("a100", "llama-2-7b", 1)
SWAP = SwapCost.for_system("a100", "llama-2-7b")
M_ARG = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--M=")), None)  # e.g. --M=14592 (paper's OPT-13B KVC)
OUT_ARG = next((Path(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--out=")), None)  # None: write nothing
LIMITS = Limits(C=4096, M=M_ARG or kv_capacity_tokens("llama-2-7b", "a100", 0.9))
LADDER = {
    "ecoserve-d": dict(sync=False, ordering=False, pipelining=False),
    "ecoserve-sd": dict(ordering=False, pipelining=False),
    "ecoserve-sdo": dict(pipelining=False),
    "ecoserve": {},
    "ecoserve-oracle": dict(oracle=True, padding=0.0),
    "ecoserve+free+queue": dict(admit_on="free", pt_kv="queue"),
}
SCHEDULERS = ["vllm", "sarathi", *LADDER]


def make(name: str, dataset: str):
    if name not in LADDER:
        return make_scheduler(name, LIMITS, COST)[0]
    opts = dict(padding=PADDING[dataset], reserve=RESERVE[dataset], buffer=0.15, predictor="noisy", predictor_seed=1)
    opts.update(LADDER[name])
    return EcoServeScheduler(LIMITS, COST, EcoServeOptions(**opts), name=name)


def run(name: str, base, dataset: str, rate: float):
    reqs = [replace(r, arrival_s=r.arrival_s / rate) for r in base]
    sch = make(name, dataset)
    return simulate(reqs, sch, LIMITS, COST, swap_cost=SWAP), sch


def main() -> None:
    rows, at_rate, notes = [], [], []
    t0 = time.time()
    for dataset in ("alpaca", "sharegpt"):
        base = with_predictions(ecoserve_workload(dataset, N, seed=0), make_predictor("noisy", seed=1, dataset=dataset))
        base = with_arrivals(base, "poisson", rate_per_s=1.0, seed=0)
        t_p, t_g = slo_params(base, COST)
        light, _ = run("vllm", base, dataset, 1.0)
        threshold = LAT_FACTOR * float((light.requests.latency_s / light.requests.output_tokens).mean())
        notes.append(f"{dataset}: t_p = {t_p * 1e3:.2f} ms, t_g = {t_g * 1e3:.2f} ms; normalized-latency bound "
                     f"{threshold * 1e3:.2f} ms/token (2 x vLLM at 1 req/s)")
        rates = {}
        for name in SCHEDULERS:
            def ok(rate, name=name):
                res, _ = run(name, base, dataset, rate)
                return float((res.requests.latency_s / res.requests.output_tokens).mean() <= threshold)

            found = search_capacity(ok, [1.0], start_rate=8.0, rel_tol=0.1, min_rate=0.25, max_rate=512)
            rates[name] = found.rates[1.0]
            print(f"{dataset} {name}: sustainable {rates[name]} req/s ({time.time() - t0:.0f}s)", flush=True)
        common = rates["vllm"]
        for name in SCHEDULERS:
            res, sch = run(name, base, dataset, common)
            m = ecoserve_metrics(res, t_p, t_g, scheduler=sch if name in LADDER else None)
            at_rate.append((dataset, name, common, m))
            rows.append((dataset, name, rates[name], rates[name] / rates["vllm"] if rates[name] else float("nan")))
    write(rows, at_rate, notes, time.time() - t0)


def write(rows, at_rate, notes, wall) -> None:
    out = [f"# EcoServe study (generated by `python experiments/ecoserve.py --out=experiments{' --quick' if QUICK else ''}"
           f"{f' --M={M_ARG}' if M_ARG else ''}`; {wall:.0f} s)", "",
           f"Llama-2-7B / A100 linear-or-auto cost model, M = {LIMITS.M:,} tokens, C = {LIMITS.C}, {N} requests per "
           "run, Poisson arrivals. " + "; ".join(notes) + ".", "",
           "## Sustainable request rate (normalized latency within the bound; bisection to 10%)", "",
           "| dataset | scheduler | rate (req/s) | x vLLM |", "|---|---|---|---|"]
    out += [f"| {d} | {n} | {r if r is not None else 'n/a'} | {x:.2f} |" for d, n, r, x in rows]
    keys = ["normalized_latency_s", "ssr", "mean_jct_s", "jct_waiting_s", "jct_execution_s", "jct_gt_queue_s",
            "jct_preemption_s", "allocation_failure_share", "mean_forward_size", "mean_kv_used", "mean_kv_allocated",
            "swapped_out_tokens", "evictions", "decision_time_per_iteration_us"]
    out += ["", "## At vLLM's sustainable rate", "", "| dataset | scheduler | rate | " + " | ".join(keys) + " |",
            "|" + "---|" * (len(keys) + 3)]
    for d, n, rate, m in at_rate:
        cells = [("n/a" if k not in m else (f"{m[k]:.4g}" if isinstance(m[k], float) else str(m[k]))) for k in keys]
        out.append(f"| {d} | {n} | {rate:.3g} | " + " | ".join(cells) + " |")
    suffix = f"_M{M_ARG}" if M_ARG else ""
    if OUT_ARG is not None:
        OUT_ARG.mkdir(parents=True, exist_ok=True)
        (OUT_ARG / f"ecoserve_results_raw{suffix}.md").write_text("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
