"""Hashes of every Apt-Serve variant's outputs on small workloads, to diff two trees (issue 17's check that
a faster scheduler makes the same decisions).

    PYTHONPATH=<tree> python benchmarks/aptserve_identity.py [WORKLOADS] [VARIANTS] > tree.txt

Run it under the old and the new tree and compare the first six columns (``cut -c1-110``; the CPU time
at the end differs). Per workload and variant: SHA-256 prefixes of the Schedule JSON, the request rows,
the batch rows and the summary, the batch count and the CPU seconds of ``simulate()``. WORKLOADS
(comma-separated, default all): ``conv`` (azure-conv's first 3,000 requests, C = 14,088 so that every
prefill fits), ``code`` (azure-code's first 300), ``long`` (300 long-prompt requests, Poisson 2 req/s),
``slo`` (azure-conv's first 1,500 with TTFT 1 s / TBT 0.15 s targets, M = 200,000, Rmax = 256, block 16),
``tight`` (the first 1,500, targets on two thirds, M = 60,000, Rmax = 128; slow for the hybrid variants),
``grid-m`` and ``grid-rmax`` (offline grid points, many identical requests waiting: 400 × (500, 40) with M = 3,000, where only hidden
forms fit and their values fall below 0; 400 × (16, 40) with Rmax = 2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import replace

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed, load_trace, sampled, with_arrivals

VARIANTS = ["aptserve", "aptserve-kv", "aptserve-fcfs", "aptserve-decay", "aptserve-authors-rho", "aptserve-code",
            "aptserve-paper"]
WORKLOADS = ["conv", "code", "long", "slo", "tight", "grid-m", "grid-rmax"]


def workload(name: str):
    if name == "conv":
        return with_arrivals(load_trace("azure-conv")[:3000], "trace"), Limits(C=14088, M=475136, Rmax=512)
    if name == "code":
        return with_arrivals(load_trace("azure-code")[:300], "trace"), Limits(C=8192, M=475136, Rmax=512)
    if name == "long":
        reqs = sampled(300, "lognormal:2500:0.3:4000", "lognormal:200:1.0:3900", seed=0)
        return with_arrivals(reqs, "poisson", rate_per_s=2.0, seed=0), Limits(C=8192, M=475136, Rmax=512)
    if name == "grid-m":
        return fixed(500, 40, 400), Limits(C=4096, M=3000)
    if name == "grid-rmax":
        return fixed(16, 40, 400), Limits(C=4096, M=100_000, Rmax=2)
    reqs = with_arrivals(load_trace("azure-conv")[:1500], "trace")
    if name == "slo":
        return ([replace(r, ttft_slo_s=1.0, tbt_slo_s=0.15) for r in reqs],
                Limits(C=14088, M=200000, Rmax=256, block_size=16))
    if name == "tight":
        return ([replace(r, ttft_slo_s=2.0, tbt_slo_s=0.3) if r.id % 3 else r for r in reqs],
                Limits(C=14088, M=60000, Rmax=128))
    raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Hashes of every Apt-Serve variant's outputs on small workloads, to diff two trees.",
        epilog="Compare the outputs of two trees with cut -c1-110 (the CPU time differs).")
    ap.add_argument("workloads", nargs="?", default=",".join(WORKLOADS),
                    help=f"comma-separated, of {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument("variants", nargs="?", default=",".join(VARIANTS), help="comma-separated (default: every variant)")
    args = ap.parse_args()
    workloads, variants = args.workloads.split(","), args.variants.split(",")
    cost = load_cost_model()
    for w in workloads:
        reqs, limits = workload(w)
        for name in variants:
            start = time.process_time()
            try:
                res = simulate(reqs, name, limits, cost)
            except Exception as exc:  # noqa: BLE001 - an error is a result row here
                print(f"{w:6s} {name:22s} ERROR {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            cpu = time.process_time() - start
            print(f"{w:6s} {name:22s} {digest(json.dumps(res.schedule.to_json(), sort_keys=True))} "
                  f"{digest(repr(res.request_rows.rows) + repr(res.request_rows.slo))} {digest(repr(res.batch_rows))} "
                  f"{digest(repr(sorted(res.summary.items())))} batches={res.summary['num_batches']} cpu={cpu:.2f}s",
                  flush=True)


if __name__ == "__main__":
    main()
