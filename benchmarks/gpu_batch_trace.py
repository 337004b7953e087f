"""Kernel traces of a few batches' CUDA-graph replays: where a batch's measured time goes (issue 20).

On an H200 (2026-11-30) decode batches of few sequences took 0.9 ms (Llama-3-8B) to 2.1 ms (Llama-2-7B) longer
than the graph-timed profile's operators add up to, while 64-decode batches were within 0.4 ms
(profiles/README.md, "What limits the error now", item 2). The profile times each operator as 8 identical calls in
one graph; a batch is one graph of ~400 different kernels. Inside a graph the host cannot tell them apart; a kernel
trace can. This replays a schedule as ``gpu-replay --cuda-graphs`` does (every batch up to the last picked one run
eagerly and captured, then replayed in order) and, for each picked batch, times its graph replay (median of
``--reps`` untraced replays, as gpu-replay measures) and traces one more replay with ``torch.profiler``: every
kernel's name, start and duration. Per batch it reports the kernels' summed time, the span from the first kernel's
start to the last one's end, the idle time inside that span (span − union of the kernels), the time by kind of
kernel (GEMM, attention, gather/copy, other), and the cost model's prediction.

    python benchmarks/gpu_batch_trace.py runs/gpu_check/h200-graphs/llama-3-8b/vllm-azure/sim/schedule.json \\
        --model llama-3-8b --cost-model-file profiles/h200-graphs/llama-3-8b/tp1/infermax_piecewise.json \\
        --out $OUT/trace                                         (on the GPU; --batches to pick them by hand)
    python benchmarks/gpu_batch_trace.py SCHEDULE --model llama-3-8b --tiny --device cpu --out DIR   (CPU smoke:
        eager forwards traced with CPU activity, operators in place of kernels)

By default it picks, among the first ``--within`` batches, the earliest of each kind: decode-only with the fewest
decodes, decode-only with the most decodes, decode-only with the most decode groups (``--decode-kernel sdpa``),
prefill-only, prefill-only with the most prompts (where that is more than one: each chunk is an attention call and a
K/V write per layer with ``--prefill-kernel sdpa``, one call for all of them with ``varlen``), mixed.
Writes ``kernels.csv`` (one row per kernel) and ``batches.csv`` (one row per picked batch) into ``--out``.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

import pandas as pd

from infermax.costmodel import load_cost_model
from infermax.profiling import execute as E
from infermax.profiling import layers as L
from infermax.profiling.runner import resolve_device
from infermax.schedule import Schedule

torch = L.torch
KINDS = (("gemm", r"gemm|cutlass|xmma|nvjet|cublas|matmul|\bmm\b|addmm|linear"),
         ("attention", r"flash|fmha|attention|sdpa|softmax"),
         ("gather/copy", r"index|gather|scatter|copy|cat"))


def kernel_kind(name: str) -> str:
    """A kernel's kind by its name (the first of ``KINDS`` whose pattern it matches), else "other"."""
    low = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, low)), "other")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def pick_batches(schedule: Schedule, decode_kernel: str, within: int) -> dict[str, int]:
    """The earliest batch of each kind among the first ``within`` (see the module's docstring), labels joined where
    one batch is the pick of several kinds; kinds those batches lack are left out."""
    from gpu_replay_shapes import batch_layouts  # (benchmarks/, the running script's folder)

    decode_only, prefill_only, picks = [], [], {}
    for j, (chunks, lengths) in enumerate(batch_layouts(schedule)[:within]):
        if lengths and not chunks:
            groups = 1 if decode_kernel == "varlen" else len(L.decode_groups(sorted(lengths, reverse=True)))
            decode_only.append((j, len(lengths), groups))
        elif chunks and not lengths:
            picks.setdefault("prefill", j)
            prefill_only.append((j, len(chunks)))
        elif chunks:
            picks.setdefault("mixed", j)
    most_chunks = min(prefill_only, key=lambda t: (-t[1], t[0]), default=(None, 1))
    if most_chunks[1] > 1:
        picks["most prompts"] = most_chunks[0]
    if decode_only:
        picks["fewest decodes"] = min(decode_only, key=lambda t: (t[1], t[0]))[0]
        picks["most decodes"] = min(decode_only, key=lambda t: (-t[1], t[0]))[0]
        most_groups = min(decode_only, key=lambda t: (-t[2], t[0]))
        if most_groups[2] > 1:
            picks["most decode groups"] = most_groups[0]
    labels: dict[int, list[str]] = {}
    for label, j in picks.items():
        labels.setdefault(j, []).append(label)
    return {", ".join(names): j for j, names in labels.items()}


class _Traced:
    """BatchGraphs whose timed pass, at the picked batches, also times ``reps`` replays and traces one."""

    def __init__(self, picked: set[int], reps: int, cuda: bool):
        super().__init__()
        self.picked, self.reps, self.cuda, self.traces = picked, reps, cuda, {}

    def replay(self, plan, watch):
        j = self._next
        if j not in self.picked:
            return super().replay(plan, watch)
        graph = self._graphs[j][0]
        picks = super().replay(plan, watch)  # copies plan's index values in and times one replay
        times = [watch.elapsed_ms()]
        for _ in range(self.reps - 1):
            watch.start()
            graph.replay()
            watch.stop()
            times.append(watch.elapsed_ms())
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=activities) as prof:
            graph.replay()
            if self.cuda:
                torch.cuda.synchronize()
        wanted = "CUDA" if self.cuda else "CPU"
        events = [e for e in prof.events() if e.device_type.name == wanted and (self.cuda or e.cpu_parent is None)]
        self.traces[j] = (statistics.median(times), [(e.name, e.time_range.start, e.time_range.end) for e in events])
        return picks


class TracedGraphs(_Traced, E.BatchGraphs):
    """CUDA graphs, traced with CUDA activity."""


class TracedEagerGraphs(_Traced, E.EagerBatchGraphs):
    """The CPU smoke: each "replay" reruns the eager forward, traced with CPU activity (operators, not kernels)."""


def run(schedule: Schedule, model: str, cost_model, picks: dict[str, int], device: str, dtype: str, tiny: bool,
        decode_kernel: str, reps: int, prefill_kernel: str = "sdpa") -> tuple[pd.DataFrame, pd.DataFrame]:
    shapes = L.shard_shapes(model, 1, tiny)
    E.check_positions(schedule, shapes)
    cuda = torch.device(device).type == "cuda"
    last = max(picks.values()) + 1
    prefix = Schedule(schedule.requests, schedule.limits, schedule.batches[:last], dict(schedule.meta))
    net = E.Transformer(shapes, device, L.DTYPES[dtype], E.pool_rows_for(prefix, shapes, device, L.DTYPES[dtype]))
    graphs = (TracedGraphs if cuda else TracedEagerGraphs)(set(picks.values()), reps, cuda)
    kernels = dict(decode_kernel=decode_kernel, prefill_kernel=prefill_kernel)
    E.Executor(net, prefix, **kernels).run(cost_model, graphs=graphs)
    graphs.capturing = False
    _, rec = E.Executor(net, prefix, **kernels).run(cost_model, graphs=graphs)
    kernels, rows = [], []
    for label, j in sorted(picks.items(), key=lambda kv: kv[1]):
        measured_ms, events = graphs.traces[j]
        first = min((a for _, a, _ in events), default=0.0)
        for name, a, b in events:
            kernels.append({"batch": j, "name": name, "kind": kernel_kind(name), "start_us": a - first, "dur_us": b - a})
        f = rec.features[j]
        span_us = max((b for _, _, b in events), default=first) - first
        union_us = busy_us([(a, b) for _, a, b in events])
        row = {"pick": label, "batch": j, "decodes": f.n_decode_seqs, "prefills": f.n_prefill_seqs, "tokens": f.n_tokens,
               "decode_kv_tokens": f.decode_kv_tokens, "measured_ms": measured_ms,
               "predicted_ms": 1e3 * cost_model.batch_time_s(f), "kernels": len(events),
               "kernel_sum_ms": sum(b - a for _, a, b in events) / 1e3, "span_ms": span_us / 1e3,
               "idle_in_span_ms": (span_us - union_us) / 1e3}
        for kind in [k for k, _ in KINDS] + ["other"]:
            row[f"{kind}_ms"] = sum(b - a for n, a, b in events if kernel_kind(n) == kind) / 1e3
        rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(kernels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("schedule", type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cost-model-file", type=Path, help="the fit to compare with (default: the roofline model)")
    ap.add_argument("--batches", help="comma-separated batch indices (default: the earliest of each kind)")
    ap.add_argument("--within", type=int, default=300,
                    help="pick among the first this many batches (default 300): every batch up to the last pick is "
                         "run and captured first")
    ap.add_argument("--device"), ap.add_argument("--dtype", default="bf16"), ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--decode-kernel", default="sdpa", choices=L.DECODE_KERNELS)
    ap.add_argument("--prefill-kernel", default="sdpa", choices=L.PREFILL_KERNELS)
    ap.add_argument("--reps", type=int, default=5, help="untraced replays timed per picked batch (default 5)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    schedule = Schedule.load(args.schedule)
    if args.batches:
        picks = {f"batch {j}": int(j) for j in args.batches.split(",")}
        bad = [j for j in picks.values() if not 0 <= j < len(schedule.batches)]
        if bad:
            ap.error(f"batches {bad} are not in the schedule's {len(schedule.batches)} batches")
    else:
        picks = pick_batches(schedule, args.decode_kernel, args.within)
    device = resolve_device(args.device)
    L.check_decode_kernel(args.decode_kernel, device)
    L.check_prefill_kernel(args.prefill_kernel, device)
    cost = (load_cost_model(path=args.cost_model_file) if args.cost_model_file else
            load_cost_model("h200", args.model, 1, kind="roofline"))
    with torch.inference_mode():
        batches, kernels = run(schedule, args.model, cost, picks, device, args.dtype, args.tiny, args.decode_kernel,
                               args.reps, args.prefill_kernel)
    args.out.mkdir(parents=True, exist_ok=True)
    batches.to_csv(args.out / "batches.csv", index=False)
    kernels.to_csv(args.out / "kernels.csv", index=False)
    pd.set_option("display.width", 220)
    print(batches.round(3).to_string(index=False))
    print(f"wrote {args.out / 'batches.csv'} and {args.out / 'kernels.csv'}")


if __name__ == "__main__":
    main()
