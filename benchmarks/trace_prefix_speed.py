"""Loop CPU per simulated batch on the first N requests of a workload, under `engine_scale.py`'s limits (M =
475,136, Rmax = 512, block size 1, the default system's swap link), with sha256 prefixes of the schedule JSON
and the summary, so two trees can be checked for identical results and timed in one go:

    PYTHONPATH=TREE python benchmarks/trace_prefix_speed.py azure-conv 3000 bros --C 14088   # 0: every request

Prints one JSON line: batches, loop CPU / wall seconds of the ``simulate()`` call alone, µs of CPU per batch,
mean items per batch, mean requests a batch touches (its items, evictions and swaps: distinct ids) and µs of CPU
per touched request, mean tokens swapped out per batch, and the two hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace, sampled, with_arrivals


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def workload(name: str, n: int, C: int):
    """(requests, limits, swap cost) of ``engine_scale.py``'s workload ``name`` (its first ``n`` requests; 0: all)
    at chunk budget ``C``."""
    if name == "long-prompt":
        requests = with_arrivals(sampled(2000, "lognormal:2500:0.3:4000", "lognormal:200:1.0:3900", seed=0),
                                 "poisson", rate_per_s=2.0, seed=0)
    else:
        requests = with_arrivals(load_trace(name), "trace")
    requests = requests[:n] if n else requests
    return requests, Limits(C=C, P=None, M=475_136, Rmax=512, block_size=1), SwapCost.for_system("a100", "llama-2-7b", 1)


def workload_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the arguments `workload` takes (the workload, its first N requests, C) and the scheduler."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("workload", help="azure-conv, azure-code or long-prompt (engine_scale.py's)")
    ap.add_argument("n", type=int, help="first N requests (0: all)")
    ap.add_argument("scheduler")
    ap.add_argument("--C", type=int, default=4096)
    return ap


def main() -> None:
    ap = workload_arguments(__doc__.splitlines()[0])
    ap.add_argument("--warm", action="store_true",
                    help="simulate the first 50 requests once before timing, so that the modules the scheduler imports "
                         "on first use (EcoServe's length predictor, say) are loaded outside the timed run")
    a = ap.parse_args()
    requests, limits, swap = workload(a.workload, a.n, a.C)
    cost = load_cost_model()
    if a.warm:
        simulate(requests[:50], a.scheduler, limits, cost, swap_cost=swap)
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(requests, a.scheduler, limits, cost, swap_cost=swap)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    batches = result.schedule.batches
    touched = sum(len({rid for rid, _ in b.items} | set(b.evict) | {rid for rid, _ in b.swap_out}
                      | {rid for rid, _ in b.swap_in}) for b in batches)
    summary = {k: (None if isinstance(v, float) and v != v else v) for k, v in result.summary.items()}
    print(json.dumps({
        "workload": a.workload, "n": a.n, "scheduler": a.scheduler, "C": a.C, "warm": a.warm, "batches": len(batches),
        "loop_cpu_s": round(cpu, 3), "loop_wall_s": round(wall, 3), "us_per_batch": round(1e6 * cpu / len(batches), 2),
        "mean_items": round(sum(len(b.items) for b in batches) / len(batches), 2),
        "mean_touched": round(touched / len(batches), 2), "us_per_touched": round(1e6 * cpu / touched, 2),
        "mean_swap_out_tokens": round(sum(n for b in batches for _, n in b.swap_out) / len(batches), 1),
        "schedule_sha": _sha(result.schedule.to_json()), "summary_sha": _sha(summary)}))


if __name__ == "__main__":
    main()
