"""``infermax profile`` (PyTorch operator microbenchmarks) and ``infermax gpu-replay`` (real execution of a Schedule)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from .common import (CostModelKindOpt, CostModelPathOpt, GpuOpt, ModelOpt, ProgressOpt, TpOpt, app, at_least, console, fail,
                     flag, unwritable_dir_reason, writable_dir)

EXEC_PANEL = "Execution"  # where and how the model runs (profile and gpu-replay alike)
DeviceOpt = typer.Option(None, help="cuda, cuda:N or cpu (default: cuda; without a GPU the command stops unless "
                                    "you pass --device cpu).", rich_help_panel=EXEC_PANEL)
DtypeOpt = typer.Option("bf16", help="bf16, fp16 or fp32.", rich_help_panel=EXEC_PANEL)
TinyOpt = Annotated[bool, flag("--tiny", help="A 2-layer, 64-wide model with the same head ratio (CPU tests).",
                               panel=EXEC_PANEL)]
GraphsOpt = Annotated[bool, flag("--cuda-graphs", help=(
    "Time through CUDA graphs: the GPU's work without the host's launch gaps (needs CUDA; see profiles/README.md)."),
    panel=EXEC_PANEL)]
DecodeKernelOpt = typer.Option(
    "sdpa", help="Decode attention: sdpa (masked SDPA calls over padded keys, in groups of similar lengths) or varlen "
                 "(one variable-length FlashAttention call over every sequence's own keys, as a paged-attention "
                 "server makes one call; PyTorch 2.10 or later on CUDA). Profile and replay with the same.",
    rich_help_panel=EXEC_PANEL)
PrefillKernelOpt = typer.Option(
    "sdpa", help="Prefill attention: sdpa (one causal SDPA call and one K/V write per chunk) or varlen (one causal "
                 "variable-length FlashAttention call and one K/V write for every chunk of a batch, as a serving "
                 "engine makes them; PyTorch 2.10 or later on CUDA). Profile and replay with the same.",
    rich_help_panel=EXEC_PANEL)


@app.command()
def profile(
    model: ModelOpt = "llama-2-7b", tp: TpOpt = 1, dtype: str = DtypeOpt,
    out: Path = typer.Option(..., help="Model folder, e.g. profiles/h100/llama-2-7b; writes OUT/tp<N>/."),
    grid: str = typer.Option("full", help="Sizes to time: full, small or tiny (for --tiny on a CPU)."),
    tiny: TinyOpt = False, device: Optional[str] = DeviceOpt,
    gpu: Optional[str] = typer.Option(None, help="GPU name recorded in profile.json (default: from the device name)."),
    cuda_graphs: GraphsOpt = False, decode_kernel: str = DecodeKernelOpt, prefill_kernel: str = PrefillKernelOpt,
    progress: ProgressOpt = True,
) -> None:
    """Time every operator of one TP shard of MODEL at its real shapes; write a profile `infermax fit` reads."""
    reason = unwritable_dir_reason(out / f"tp{tp}") if isinstance(tp, int) and tp >= 1 else None
    if reason is not None:  # checked before the run, which can take hours on a GPU
        fail(f"--out {out}: {reason}")
    try:
        from ..profiling.runner import profile as run_profile

        folder = run_profile(model, out, tp=tp, dtype=dtype, grid=grid, tiny=tiny, device=device, gpu=gpu,
                             progress=progress, cuda_graphs=cuda_graphs, decode_kernel=decode_kernel,
                             prefill_kernel=prefill_kernel)
    except ValueError as exc:
        fail(str(exc))
    console.print(f"profile written to {folder}; fit it with: infermax fit {folder}")


@app.command("gpu-replay")
def gpu_replay(
    schedule: Path = typer.Argument(..., help="Schedule JSON (as written by `simulate --out` or `optimize`)."),
    model: ModelOpt = "llama-2-7b", gpu: GpuOpt = "a100", tp: TpOpt = 1, cost_model: CostModelKindOpt = "auto",
    costmodel: CostModelPathOpt = None, dtype: str = DtypeOpt, tiny: TinyOpt = False, device: Optional[str] = DeviceOpt,
    warmup: Optional[int] = typer.Option(
        None, help="Batches run once untimed before the timed run (default: the whole schedule, so that no timed "
                   "batch pays for a kernel plan built for a shape it is the first to meet).", callback=at_least(0),
        rich_help_panel=EXEC_PANEL),
    out: Optional[Path] = typer.Option(None, help="Write batches.csv, requests.csv and summary.json here.",
                                       callback=writable_dir),
    measured: Optional[Path] = typer.Option(
        None, help="Execute nothing: score the batch times an earlier `gpu-replay --out` of SCHEDULE measured "
                   "(that folder) against this cost model. Needs no GPU or PyTorch."),
    cuda_graphs: GraphsOpt = False, decode_kernel: str = DecodeKernelOpt, prefill_kernel: str = PrefillKernelOpt,
    decode_padding: float = typer.Option(
        1.25, help="With --decode-kernel sdpa: decodes run in groups of similar lengths, each one attention call over "
                   "keys padded to its longest, at most this many times the group's keys (the operator profile's own "
                   "spread); inf: one padded call per batch, as replays did until 2026-11-29.", rich_help_panel=EXEC_PANEL),
    progress: ProgressOpt = True,
) -> None:
    """Execute SCHEDULE with a random-weight MODEL; compare each batch's time with the cost model's prediction.

    With --measured, score an earlier run of SCHEDULE against another cost model instead (e.g. the linear and the
    piecewise fit of one profile, from a single GPU run)."""
    from ..costmodel import load_cost_model
    from ..replay import ScheduleViolation
    from ..schedule import Schedule

    if tp != 1:
        fail("gpu-replay runs one device: --tp 1 only (the cost model's --tp must match the replayed run)")
    try:
        sched = Schedule.load(schedule)
        cost = load_cost_model(gpu, model, tp, path=costmodel, kind=cost_model)
        if measured is not None:
            from ..profiling.scoring import load_measured, rescore

            check = rescore(sched, cost, *load_measured(measured))
        else:
            from ..profiling.execute import gpu_replay as run_replay

            check = run_replay(sched, model, cost, device=device, dtype=dtype, tiny=tiny, warmup_batches=warmup,
                               progress=progress, cuda_graphs=cuda_graphs, decode_padding=decode_padding,
                               decode_kernel=decode_kernel, prefill_kernel=prefill_kernel)
    except ScheduleViolation as exc:
        fail(f"invalid schedule: {exc}", code=1)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    if out is not None:
        check.save(out)
    console.print(summary_table(check.summary, f"{schedule}: measured vs {cost.name}"))
    if out is not None:
        console.print(f"results written to {out}")


def summary_table(summary: dict, title: str) -> Table:
    """The replay summary's headline numbers."""
    s = summary
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("batches", f"{s['batches']}"), ("per-batch MAPE", f"{s['per_batch_mape_pct']:.1f}%")]
    rows += [(f"  {k} batches", f"{v:.1f}%") for k, v in s["per_batch_mape_pct_by_kind"].items()]
    rows += [("busy time measured / predicted (s)", f"{s['busy_time_s']['measured']:.4g} / {s['busy_time_s']['predicted']:.4g}"),
             ("mean latency measured / simulated (s)",
              f"{s['mean_latency_s']['measured']:.4g} / {s['mean_latency_s']['simulated']:.4g}"),
             ("end-to-end latency error", f"{s['e2e_latency_error_pct']:+.1f}%"),
             ("per-request latency MAPE", f"{s['per_request_latency_mape_pct']:.1f}%"),
             ("makespan error", f"{s['makespan_error_pct']:+.1f}%")]
    for name, value in rows:
        table.add_row(name, value)
    return table
