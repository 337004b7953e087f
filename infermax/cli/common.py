"""Shared pieces of the command line: the app, error exit, summary printing and the run options.

The workload/system/cost-model options are declared once here (``Annotated`` aliases) and used by
every command that builds a ``RunConfig``, so ``simulate`` and the commands that share its flags
cannot drift apart.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..config import RunConfig
from ..jsonio import nan_to_null

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Simulate LLM inference schedulers on cost models fitted to GPU profiles.")
console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` to stderr and exit with ``code`` (2: bad input, 1: invalid schedule)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def summary_table(summary: dict, title: str) -> Table:
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


def report(result, out: Path | None, as_json: bool, header: str) -> None:
    """Save the result if asked, then print its summary as JSON or as a table under ``header``."""
    if out is not None:
        result.save(out)
    extra = result.meta.get("scheduler_summary")
    if as_json:
        print(json.dumps(nan_to_null({**result.summary, **({"scheduler_summary": extra} if extra else {})})))
        return
    console.print(header, highlight=False, soft_wrap=True)
    console.print(summary_table(result.summary, "summary"))
    if extra:
        console.print(summary_table(extra, f"{result.meta.get('scheduler', 'scheduler')} (its own bookkeeping)"))
    from ..metrics import class_summary

    for cls, row in class_summary(result).items():
        console.print(summary_table(row, f"class {cls}"))
    if out is not None:
        console.print(f"results written to {out}")


# Options shared by every command that builds a RunConfig (defaults are RunConfig's).
ModelOpt = Annotated[str, typer.Option(help="Model (see `infermax models`).")]
GpuOpt = Annotated[str, typer.Option(help="GPU whose profile times the batches.")]
TpOpt = Annotated[int, typer.Option(help="Tensor-parallel degree.")]
CostModelKindOpt = Annotated[str, typer.Option("--cost-model", help="Cost-model family: auto (the more accurate fit of the profile), linear (the paper's), piecewise (convex piecewise-linear) or roofline (datasheet estimate, no profile needed).")]
CostModelPathOpt = Annotated[Optional[Path], typer.Option("--cost-model-file", help="Explicit cost-model JSON (overrides --gpu/--model/--tp).")]
IOpt = Annotated[int, typer.Option("--I", help="Prompt tokens per request (fixed workload).")]
OOpt = Annotated[int, typer.Option("--O", help="Output tokens per request (fixed workload).")]
BOpt = Annotated[int, typer.Option("--B", help="Number of requests (fixed, mix or sampled workload).")]
MixOpt = Annotated[Optional[str], typer.Option(help="Heterogeneous mix of SISO/SILO/LISO/LILO groups, e.g. LILO+SILO.")]
DatasetOpt = Annotated[Optional[str], typer.Option(help="ShareGPT-, HumanEval- or LongBench-like lengths: sharegpt | humaneval | longbench.")]
SloOpt = Annotated[Optional[str], typer.Option(help="Latency targets of a dataset (Apt-Serve's Table 3): sharegpt | humaneval | longbench.")]
SloTtftOpt = Annotated[Optional[float], typer.Option("--slo-ttft", help="TTFT target in seconds (overrides --slo).")]
SloTbtOpt = Annotated[Optional[float], typer.Option("--slo-tbt", help="P99 time-between-tokens target in seconds (overrides --slo).")]
InputDistOpt = Annotated[Optional[str], typer.Option(help="Prompt length distribution, e.g. uniform:16:1024, lognormal:512:1.0.")]
OutputDistOpt = Annotated[Optional[str], typer.Option(help="Output length distribution (same forms).")]
TraceOpt = Annotated[Optional[str], typer.Option(help="Trace CSV (arrived_at,num_prefill_tokens,num_decode_tokens) or azure-code / azure-conv.")]
TraceLimitOpt = Annotated[Optional[int], typer.Option(help="Use only the trace's first N requests.")]
ArrivalOpt = Annotated[Optional[str], typer.Option(help="offline | poisson | gamma | trace (default: trace for --trace, else offline).")]
RateOpt = Annotated[Optional[float], typer.Option(help="Arrival rate (requests/s) for poisson and gamma.")]
CvOpt = Annotated[Optional[float], typer.Option(help="Coefficient of variation of gamma inter-arrivals.")]
TimeScaleOpt = Annotated[float, typer.Option(help="Multiply trace timestamps (0.5 = twice as fast).")]
COpt = Annotated[int, typer.Option("--C", help="Token budget per batch.")]
POpt = Annotated[Optional[int], typer.Option("--P", help="Prefill tokens per batch (default: the scheduler's, else C).")]
MOpt = Annotated[Optional[int], typer.Option("--M", help="KV-cache capacity in tokens (default 100000 unless --gpu-mem-util).")]
GpuMemUtilOpt = Annotated[Optional[float], typer.Option(help="Derive M from GPU memory x this fraction minus the weights.")]
RmaxOpt = Annotated[Optional[int], typer.Option("--Rmax", help="Max requests holding KV (default unlimited).")]
BlockSizeOpt = Annotated[int, typer.Option(help="KV block size in tokens (1 = the paper's accounting, 16 = vLLM paging).")]
SeedOpt = Annotated[int, typer.Option(help="Seed for generated workloads and arrivals.")]
RtDatasetOpt = Annotated[Optional[str], typer.Option(help="Hybrid RT/BE workload (BROS): RT lengths like sharegpt | lmsys (BROS Table 2), with closed-loop BE batches.")]
RtRateOpt = Annotated[Optional[float], typer.Option(help="Hybrid workload: RT Poisson arrival rate (requests/s).")]
BeBatchOpt = Annotated[int, typer.Option(help="Hybrid workload: BE requests per closed-loop batch.")]
DurationOpt = Annotated[float, typer.Option("--duration", help="Hybrid workload: seconds of RT arrivals and BE submission.")]
OutOpt = Annotated[Optional[Path], typer.Option(help="Write summary.json, requests/batches Parquet and schedule.json here.")]
PredictorOpt = Annotated[Optional[str], typer.Option(help="Predicted output lengths for every request: noisy (calibrated log-normal error), noisy:MU:SIGMA or oracle. EcoServe predicts unpredicted requests itself (noisy).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of a table.")]


def run_config(scheduler: str, **options) -> RunConfig:
    """A ``RunConfig`` from a command's option values (``costmodel`` is the explicit JSON path)."""
    path = options.pop("costmodel")
    return RunConfig(scheduler=scheduler, costmodel_path=None if path is None else str(path), **options)


def config_header(config: RunConfig, limits) -> str:
    """One line naming the scheduler, model, GPU and limits of a run."""
    return (f"{config.scheduler} | {config.model} on {config.gpu} | C={limits.C} P={limits.prefill_budget} "
            f"M={limits.M} Rmax={limits.Rmax or 'inf'} block={limits.block_size}")
