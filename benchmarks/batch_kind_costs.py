"""Where a scheduler's loop time goes, by kind of batch: for each kind (prefill items only, decode items only, both;
with evictions or swaps), how many batches, their mean items and evictions, and the wall µs per batch of the
scheduler's planning (`next_batch`), its bookkeeping (`batch_done`) and the replayer's `apply`, under
`trace_prefix_speed.py`'s workloads and limits. Batches the engine fast-forwards are counted apart (no plan, no
apply of their own). The timers wrap the three calls, so the totals run a little above an unwrapped loop; the shares
are what to read.

    PYTHONPATH=. python benchmarks/batch_kind_costs.py azure-conv 0 aptserve-kv --C 14088

An item of one token counts as a decode (a one-token prefill chunk would too: rare on these workloads).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.engine import simulate  # noqa: E402
from infermax.replay import Replayer  # noqa: E402
from infermax.schedulers import make_scheduler  # noqa: E402
from trace_prefix_speed import workload, workload_arguments  # noqa: E402

PHASES = ("next_batch", "batch_done", "apply")


def kind(batch) -> str:
    """``P`` (prefill items), ``D`` (decode items), both, then ``E`` with evictions and ``S`` with swaps."""
    prefill = any(c > 1 for _, c in batch.items)
    decode = any(c == 1 for _, c in batch.items)
    return (("P" if prefill else "") + ("D" if decode else "") + ("E" if batch.evict else "")
            + ("S" if batch.swap_out or batch.swap_in else "")) or "empty"


def main() -> None:
    a = workload_arguments(__doc__.splitlines()[0]).parse_args()
    requests, limits, swap = workload(a.workload, a.n, a.C)
    cost = load_cost_model()
    scheduler, limits = make_scheduler(a.scheduler, limits, cost)
    spent: dict = defaultdict(float)
    planned: Counter = Counter()
    plan, done = scheduler.next_batch, scheduler.batch_done

    def timed_plan(now_s):
        t = time.perf_counter()
        batch = plan(now_s)
        spent["next_batch", kind(batch)] += time.perf_counter() - t
        planned[kind(batch)] += 1
        return batch

    def timed_done(batch, *args, **kwargs):
        t = time.perf_counter()
        out = done(batch, *args, **kwargs)
        spent["batch_done", kind(batch)] += time.perf_counter() - t
        return out

    apply = Replayer.apply

    def timed_apply(self, batch, *args, **kwargs):
        t = time.perf_counter()
        out = apply(self, batch, *args, **kwargs)
        spent["apply", kind(batch)] += time.perf_counter() - t
        return out

    scheduler.next_batch, scheduler.batch_done = timed_plan, timed_done
    Replayer.apply = timed_apply
    try:
        started = time.perf_counter()
        result = simulate(requests, scheduler, limits, cost, swap_cost=swap)
        loop_s = time.perf_counter() - started
    finally:
        Replayer.apply = apply
    batches = result.schedule.batches
    every: Counter = Counter(kind(b) for b in batches)
    items, evicted = Counter(), Counter()
    for b in batches:
        items[kind(b)] += len(b.items)
        evicted[kind(b)] += len(b.evict)
    print(json.dumps({"workload": a.workload, "n": a.n, "scheduler": a.scheduler, "C": a.C, "batches": len(batches),
                      "loop_wall_s": round(loop_s, 3)}))
    for k in sorted(every, key=lambda k: -every[k]):
        row = {"kind": k, "batches": every[k], "fast_forwarded": every[k] - planned[k],
               "mean_items": round(items[k] / every[k], 1), "mean_evictions": round(evicted[k] / every[k], 2)}
        for phase in PHASES:
            row[f"{phase}_us"] = round(1e6 * spent[phase, k] / planned[k], 1) if planned[k] else None
        row["share_of_loop"] = round(sum(spent[p, k] for p in PHASES) / loop_s, 3)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
