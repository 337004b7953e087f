"""Where a replayed batch's time goes on a GPU: kernels, or the host launching them (issue 20's diagnosis).

`infermax gpu-replay` times each batch with CUDA events around the model's forward pass, as a server would see it.
The profile (`infermax profile`) times each operator on its own, many repetitions enqueued back to back. Each chosen
batch is run once untimed (so that kernels that plan per shape are warm), then read three ways:

- ``replay_ms``: the events around one forward pass, as gpu-replay measures it (``host_wall_ms``: the host's clock
  around the same, synchronised);
- ``pipelined_ms``: the same batch's forward pass repeated ``--reps`` times back to back, events around each, no
  synchronisation between them (how the profile times an operator): the host's launch work overlaps the GPU's;
- ``kernel_ms``: the sum of what ``torch.profiler`` reports with a device time for one forward pass, with the
  count and the five largest entries.

On an H200 (2026-11-27) this showed that a 64-sequence Llama-3-8B decode batch, 100 ms in the replay when its shape
was new, ran in 31 to 32 ms warm with about 11 ms of kernels: the replay had timed cuDNN's per-shape plan building,
and the warm batch is launch-bound (`profiles/README.md`, "Measured on an H200").

    python benchmarks/gpu_replay_breakdown.py SCHEDULE.json --model llama-3-8b --batches 0,8,20,60,120 --out DIR

Writes ``DIR/breakdown.csv`` (one row per batch) and ``DIR/kernels.csv`` (per batch and kernel name: calls and
total microseconds; on the CPU of ``--smoke``, operators' self CPU time) and prints the first. Needs a CUDA GPU;
the schedule's other batches run untimed to reach the chosen ones (the KV cache must hold what they read).
``torch.profiler`` lists CUDA runtime calls (``cudaLaunchKernel`` and the like, host time) beside the kernels, so
``kernel_ms`` counts both; ``kernels.csv`` tells them apart by name.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from infermax.costmodel import load_cost_model
from infermax.profiling import layers as L
from infermax.profiling.execute import Executor, Transformer, pool_rows_for
from infermax.profiling.timer import Stopwatch, measure
from infermax.replay import Replayer
from infermax.schedule import Schedule

torch = L.torch


def kernel_table(prof) -> pd.DataFrame:
    """GPU kernels of a ``torch.profiler`` run: name, calls, total microseconds."""
    rows = [(e.key, e.count, e.device_time_total or e.self_cpu_time_total) for e in prof.key_averages()
            if (e.device_time_total or e.self_cpu_time_total) > 0]
    return pd.DataFrame(rows, columns=["kernel", "calls", "total_us"]).sort_values("total_us", ascending=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("schedule")
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--batches", default="0,8,20,60,120", help="comma-separated batch numbers to analyse")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="runs/gpu_breakdown")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU (checks the script, measures nothing)")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --smoke)")
    activity = torch.profiler.ProfilerActivity.CPU if args.smoke else torch.profiler.ProfilerActivity.CUDA
    schedule = Schedule.load(args.schedule)
    chosen = sorted({int(b) for b in args.batches.split(",") if int(b) < len(schedule.batches)})
    shapes = L.shard_shapes(args.model, 1, tiny=args.smoke)
    dtype = L.DTYPES["fp32" if args.smoke else "bf16"]
    net = Transformer(shapes, device, dtype, pool_rows_for(schedule, shapes, device, dtype))
    ex = Executor(net, schedule)
    rp = Replayer(schedule.requests, schedule.limits, load_cost_model())  # its times are not used
    watch = Stopwatch(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows, kernels = [], []
    with torch.inference_mode():
        for j, batch in enumerate(schedule.batches[:chosen[-1] + 1]):
            before = {rid: (rp.states[rid].m, rp.states[rid].input_tokens) for rid, _ in batch.items}
            finished = rp.apply(batch)
            for rid in batch.evict:
                ex._drop(rid)
            plan = ex.plan(batch.items, before)
            if j not in chosen:
                picks = net.forward(plan).argmax(-1).tolist()
            else:
                # K/V writes of repeated passes land in rows this batch owns, so later batches read what they would.
                net.forward(plan).argmax(-1).tolist()  # warm this shape
                sync()
                t0 = time.perf_counter()
                watch.start()
                picks = net.forward(plan).argmax(-1)
                watch.stop()
                replay_ms = watch.elapsed_ms()
                host_ms = (time.perf_counter() - t0) * 1e3
                picks = picks.tolist()
                pipelined = measure(lambda: net.forward(plan).argmax(-1), device, warmup=1, reps=args.reps)
                with torch.profiler.profile(activities=[activity]) as prof:
                    net.forward(plan).argmax(-1)
                    sync()
                k = kernel_table(prof)
                kernels.append(k.assign(batch=j))
                rows.append({"batch": j, "prefill_tokens": sum(c for _, _, c in plan.prefills),
                             "decodes": len(plan.decodes), "replay_ms": replay_ms, "host_wall_ms": host_ms,
                             "pipelined_ms": pipelined.median_ms, "kernel_ms": k.total_us.sum() / 1e3,
                             "kernels": int(k.calls.sum()),
                             "top": "; ".join(f"{n[:40]} {t / 1e3:.2f}" for n, t in zip(k.kernel[:5], k.total_us[:5]))})
            for rid, token in zip(plan.gen_ids, picks):
                ex.tokens[rid].append(token)
            for s in finished:  # as Executor.run does: a finished request's pool rows are free again
                ex._drop(s.id)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "breakdown.csv", index=False)
    pd.concat(kernels).to_csv(out / "kernels.csv", index=False)
    with pd.option_context("display.width", 250, "display.max_colwidth", 120):
        print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
