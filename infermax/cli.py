"""The ``infermax`` command line: simulate, validate a schedule, list schedulers and models."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .jsonio import nan_to_null

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Simulate LLM inference schedulers on cost models fitted to GPU profiles.")
console = Console()
err_console = Console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _summary_table(summary: dict, title: str) -> Table:
    table = Table(title=title, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, float):
            text = "n/a" if math.isnan(value) else (f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}")
        else:
            text = f"{value:,}" if isinstance(value, int) else str(value)
        table.add_row(key, text)
    return table


def _report(result, out: Path | None, as_json: bool, header: str) -> None:
    """Save the result if asked, then print its summary as JSON or as a table under ``header``."""
    if out is not None:
        result.save(out)
    if as_json:
        print(json.dumps(nan_to_null(result.summary)))
        return
    console.print(header, highlight=False, soft_wrap=True)
    console.print(_summary_table(result.summary, "summary"))
    if out is not None:
        console.print(f"results written to {out}")


def _build_workload(I, O, B, mix, input_dist, output_dist, trace, trace_limit, arrival, rate, cv, time_scale, seed):
    from . import workload

    sources = [name for name, given in (("--trace", trace), ("--mix", mix), ("--input-dist/--output-dist",
                                         input_dist or output_dist)) if given]
    if len(sources) > 1:
        raise ValueError(f"choose one workload source, got {' and '.join(sources)}")
    if trace:
        requests = workload.load_trace(trace, limit=trace_limit)
        arrival = arrival or "trace"
    elif mix:
        requests = workload.heterogeneous_mix(mix, B, seed=seed)
    elif input_dist or output_dist:
        if not (input_dist and output_dist):
            raise ValueError("--input-dist and --output-dist go together")
        requests = workload.sampled(B, input_dist, output_dist, seed=seed)
    else:
        requests = workload.fixed(I, O, B)
    arrival = arrival or "offline"
    if arrival == "trace" and not trace:
        raise ValueError("--arrival trace needs --trace")
    return workload.with_arrivals(requests, arrival, rate_per_s=rate, cv=cv,
                                  time_scale=time_scale if arrival == "trace" else 1.0, seed=seed)


@app.command()
def simulate(
    scheduler: str = typer.Option("vllm", "--scheduler", "-s", help="Registered scheduler (see `infermax schedulers`)."),
    model: str = typer.Option("llama-2-7b", help="Model (see `infermax models`)."),
    gpu: str = typer.Option("a100", help="GPU whose profile times the batches."),
    tp: int = typer.Option(1, help="Tensor-parallel degree."),
    costmodel: Optional[Path] = typer.Option(None, help="Explicit cost-model JSON (overrides --gpu/--model)."),
    I: int = typer.Option(512, "--I", help="Prompt tokens per request (fixed workload)."),
    O: int = typer.Option(128, "--O", help="Output tokens per request (fixed workload)."),
    B: int = typer.Option(1024, "--B", help="Number of requests (fixed, mix or sampled workload)."),
    mix: Optional[str] = typer.Option(None, help="Heterogeneous mix of SISO/SILO/LISO/LILO groups, e.g. LILO+SILO."),
    input_dist: Optional[str] = typer.Option(None, help="Prompt length distribution, e.g. uniform:16:1024, lognormal:512:1.0."),
    output_dist: Optional[str] = typer.Option(None, help="Output length distribution (same forms)."),
    trace: Optional[str] = typer.Option(None, help="Trace CSV (arrived_at,num_prefill_tokens,num_decode_tokens) or azure-code / azure-conv."),
    trace_limit: Optional[int] = typer.Option(None, help="Use only the trace's first N requests."),
    arrival: Optional[str] = typer.Option(None, help="offline | poisson | gamma | trace (default: trace for --trace, else offline)."),
    rate: Optional[float] = typer.Option(None, help="Arrival rate (requests/s) for poisson and gamma."),
    cv: Optional[float] = typer.Option(None, help="Coefficient of variation of gamma inter-arrivals."),
    time_scale: float = typer.Option(1.0, help="Multiply trace timestamps (0.5 = twice as fast)."),
    C: int = typer.Option(4096, "--C", help="Token budget per batch."),
    P: Optional[int] = typer.Option(None, "--P", help="Prefill tokens per batch (default: the scheduler's, else C)."),
    M: Optional[int] = typer.Option(None, "--M", help="KV-cache capacity in tokens (default 100000 unless --gpu-mem-util)."),
    gpu_mem_util: Optional[float] = typer.Option(None, help="Derive M from GPU memory x this fraction minus the weights."),
    Rmax: Optional[int] = typer.Option(None, "--Rmax", help="Max requests holding KV (default unlimited)."),
    block_size: int = typer.Option(1, help="KV block size in tokens (1 = the paper's accounting, 16 = vLLM paging)."),
    seed: int = typer.Option(0, help="Seed for generated workloads and arrivals."),
    out: Optional[Path] = typer.Option(None, help="Write summary.json, requests/batches Parquet and schedule.json here."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of a table."),
) -> None:
    """Simulate a workload through a scheduler and print the summary."""
    from .costmodel import load_cost_model
    from .engine import simulate as run
    from .limits import Limits
    from .models import get_gpu, get_model, kv_capacity_tokens
    from .schedulers import InfeasibleRequestError, SchedulerError

    try:
        model_spec, gpu_spec = get_model(model), get_gpu(gpu)
        if M is not None and gpu_mem_util is not None:
            raise ValueError("give either --M or --gpu-mem-util, not both")
        kv_tokens = kv_capacity_tokens(model_spec, gpu_spec, gpu_mem_util, tp) if gpu_mem_util is not None else (M or 100_000)
        limits = Limits(C=C, P=P, M=kv_tokens, Rmax=Rmax, block_size=block_size)
        cost = load_cost_model(gpu_spec.name, model_spec.name, tp, path=costmodel)
        requests = _build_workload(I, O, B, mix, input_dist, output_dist, trace, trace_limit, arrival, rate, cv,
                                   time_scale, seed)
        config = {"scheduler": scheduler, "model": model_spec.name, "gpu": gpu_spec.name, "tp": tp,
                  "costmodel": str(costmodel) if costmodel else None, "I": I, "O": O, "B": B, "mix": mix,
                  "input_dist": input_dist, "output_dist": output_dist, "trace": trace, "trace_limit": trace_limit,
                  "arrival": arrival, "rate": rate, "cv": cv, "time_scale": time_scale, "seed": seed,
                  "limits": limits.to_dict()}
        result = run(requests, scheduler, limits, cost, progress=progress and not as_json, meta={"config": config})
    except (ValueError, FileNotFoundError, InfeasibleRequestError, SchedulerError) as exc:
        _fail(str(exc))
    lim = result.schedule.limits
    _report(result, out, as_json, f"{scheduler} | {model_spec.name} on {gpu_spec.name} | C={lim.C} "
            f"P={lim.prefill_budget} M={lim.M} Rmax={lim.Rmax or 'inf'} block={lim.block_size}")


@app.command()
def validate(
    schedule: Path = typer.Argument(..., help="Schedule JSON (as written by `simulate --out`)."),
    model: str = typer.Option("llama-2-7b", help="Model whose cost model times the batches."),
    gpu: str = typer.Option("a100", help="GPU whose profile times the batches."),
    tp: int = typer.Option(1, help="Tensor-parallel degree."),
    costmodel: Optional[Path] = typer.Option(None, help="Explicit cost-model JSON."),
    out: Optional[Path] = typer.Option(None, help="Write the recomputed metrics here."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Replay a Schedule: check every rule of the semantics and limits, recompute all metrics."""
    from .costmodel import load_cost_model
    from .replay import ScheduleViolation, replay
    from .schedule import Schedule

    try:
        sched = Schedule.load(schedule)
        cost = load_cost_model(gpu, model, tp, path=costmodel)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    try:
        result = replay(sched, cost)
    except ScheduleViolation as exc:
        _fail(f"invalid schedule: {exc}", code=1)
    _report(result, out, as_json, f"valid: {len(sched.batches)} batches, {len(sched.requests)} requests "
            f"(replay of {schedule})")


@app.command()
def schedulers() -> None:
    """List the registered schedulers."""
    from .schedulers import available, get_spec

    table = Table(title="registered schedulers")
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    for name in available():
        table.add_row(name, get_spec(name).description)
    console.print(table)


@app.command()
def models() -> None:
    """List the known models, GPUs and fitted cost-model profiles."""
    from .costmodel import available_profiles
    from .models import GPUS, MODELS

    table = Table(title="models")
    table.add_column("name", no_wrap=True)
    for col in ("layers", "hidden", "heads", "kv heads", "ffn", "params (B)", "KV KiB/token"):
        table.add_column(col)
    for m in MODELS.values():
        table.add_row(m.name, str(m.num_layers), str(m.hidden_size), str(m.num_heads), str(m.num_kv_heads),
                      str(m.ffn_size), f"{m.num_params / 1e9:.2f}", f"{m.kv_bytes_per_token() / 1024:.0f}")
    console.print(table)
    gpus = Table(title="GPUs")
    for col in ("name", "memory GiB", "fp16 TFLOP/s", "GB/s"):
        gpus.add_column(col)
    for g in GPUS.values():
        gpus.add_row(g.name, f"{g.memory_bytes / 2**30:.0f}", f"{g.peak_fp16_tflops:g}", f"{g.memory_bandwidth_gbps:g}")
    console.print(gpus)
    console.print("fitted cost models (gpu/model): " + (", ".join(f"{g}/{m}" for g, m in available_profiles()) or "none"))
