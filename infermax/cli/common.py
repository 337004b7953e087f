"""Shared pieces of the command line: the app, error exit, summary printing and the run options.

The workload/system/cost-model options are declared once here (``Annotated`` aliases) and used by
every command that builds a ``RunConfig``, so ``simulate`` and the commands that share its flags
cannot drift apart.
"""

from __future__ import annotations

import json
import math
import os
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
# emoji=False and markup=False: what a user typed (a distribution 'uniform:100:10', a path 'runs/[a]/x', a spec's
# name), and the messages built from it, must print as typed: as markup, ':word:' became an emoji, '[a]' vanished and
# '[/a]' stopped the command with rich's MarkupError. The few lines styled on purpose pass markup=True and escape
# what they interpolate.
console = Console(emoji=False, markup=False)
err_console = Console(stderr=True, emoji=False, markup=False)


def progress_line(message: str) -> None:
    """One progress line of `optimize` / `better` on stderr, indented, never wrapped (a log keeps each line whole;
    a terminal wraps it on screen)."""
    err_console.print(f"  {message}", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` to stderr and exit with ``code`` (2: bad input, 1: invalid schedule)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def out_dir(value: Optional[Path]) -> Optional[Path]:
    """Option callback for an output directory: created now (with its parents), so that a path that cannot be one
    (an existing file, a read-only place) fails before any work, with the option named, not as a traceback after."""
    if value is not None:
        try:
            value.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise typer.BadParameter(f"cannot create directory {value}: {exc.strerror or exc}") from None
    return value


def unwritable_dir_reason(path: Path) -> Optional[str]:
    """Why ``path`` cannot become a folder to write into, or None; nothing is created. For the commands whose output
    comes after long work on a GPU (`profile`, `gpu-replay`): a file in the way, found only at the end, lost the run,
    and these commands leave no folder behind when they stop early."""
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} exists and is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot write in {existing}"
    return None


def writable_dir(value: Optional[Path]) -> Optional[Path]:
    """Option callback: `unwritable_dir_reason` as the option's error, before any work."""
    reason = None if value is None else unwritable_dir_reason(value)
    if reason is not None:
        raise typer.BadParameter(f"{value}: {reason}")
    return value


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


# Help panels, in the README's order of the options.
COST_PANEL, WORKLOAD_PANEL, ARRIVAL_PANEL, LIMITS_PANEL = "Cost model", "Workload", "Arrivals", "Limits"
SLO_PANEL, HYBRID_PANEL, OUTPUT_PANEL = "Latency targets", "Hybrid RT/BE workload", "Output"
PREFIX_PANEL = "Shared-prefix workload"


def at_least(minimum: int):
    """Option callback: an integer option (or its absence) must be ``>= minimum``; the error names the option."""

    def check(param: typer.CallbackParam, value: Optional[int]) -> Optional[int]:
        if value is not None and value < minimum:
            fail(f"{param.opts[0]} must be an integer >= {minimum}, got {value}")
        return value

    return check


def _length_dist(param: typer.CallbackParam, value: Optional[str]) -> Optional[str]:
    """Option callback: a length distribution must parse (its own error first, before any pairing rule)."""
    if value is not None:
        from ..workload import parse_length_dist

        try:
            parse_length_dist(value)
        except ValueError as exc:
            fail(f"{param.opts[0]}: {exc}")
    return value


def _existing_file(param: typer.CallbackParam, value: Optional[Path]) -> Optional[Path]:
    """Option callback: a path option that names an input file must name an existing file."""
    if value is not None and not value.is_file():
        fail(f"{param.opts[0]} {value}: " + ("is a directory, not a file" if value.is_dir() else "no such file"))
    return value


def scheduler_name(value: str) -> str:
    """Option callback: a registered scheduler, else an error with the closest names (difflib)."""
    import difflib

    from ..schedulers import available

    names = available()
    if value not in names:
        close = difflib.get_close_matches(value, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close[:-1])} or {close[-1]}?" if len(close) > 1 else \
            (f"; did you mean {close[0]}?" if close else "")
        fail(f"--scheduler: unknown scheduler {value!r}{hint} (`infermax schedulers` lists all {len(names)})")
    return value


def flag(*names: str, help: str, panel: Optional[str] = None):
    """A boolean flag (for ``Annotated[bool, flag(...)]``), shown as a plain flag: no ``<bool>`` type in the help."""
    return typer.Option(*names, help=help, metavar="", rich_help_panel=panel)


SchedulerOpt = Annotated[str, typer.Option("--scheduler", "-s", callback=scheduler_name,
                                           help="Registered scheduler (see `infermax schedulers`).")]
# Options shared by every command that builds a RunConfig (defaults are RunConfig's).
ModelOpt = Annotated[str, typer.Option(help="Model (see `infermax models`).", rich_help_panel=COST_PANEL)]
GpuOpt = Annotated[str, typer.Option(help="GPU whose profile times the batches.", rich_help_panel=COST_PANEL)]
TpOpt = Annotated[int, typer.Option(help="Tensor-parallel degree.", callback=at_least(1), rich_help_panel=COST_PANEL)]
CostModelKindOpt = Annotated[str, typer.Option("--cost-model", help="Cost-model family: auto (the more accurate fit of the profile), linear (the paper's), piecewise (convex piecewise-linear) or roofline (datasheet estimate, no profile needed).", rich_help_panel=COST_PANEL)]
CostModelPathOpt = Annotated[Optional[Path], typer.Option("--cost-model-file", help="Explicit cost-model JSON (overrides --gpu/--model/--tp).", callback=_existing_file, rich_help_panel=COST_PANEL)]
IOpt = Annotated[int, typer.Option("--I", help="Prompt tokens per request (fixed workload).", callback=at_least(1), rich_help_panel=WORKLOAD_PANEL)]
OOpt = Annotated[int, typer.Option("--O", help="Output tokens per request (fixed workload).", callback=at_least(1), rich_help_panel=WORKLOAD_PANEL)]
BOpt = Annotated[int, typer.Option("--B", help="Number of requests (fixed, mix or sampled workload).", callback=at_least(1), rich_help_panel=WORKLOAD_PANEL)]
MixOpt = Annotated[Optional[str], typer.Option(help="Heterogeneous mix of SISO/SILO/LISO/LILO groups, e.g. LILO+SILO.", rich_help_panel=WORKLOAD_PANEL)]
DatasetOpt = Annotated[Optional[str], typer.Option(help="ShareGPT-, HumanEval- or LongBench-like lengths: sharegpt | humaneval | longbench.", rich_help_panel=WORKLOAD_PANEL)]
SloOpt = Annotated[Optional[str], typer.Option(help="Latency targets of a dataset (Apt-Serve's Table 3): sharegpt | humaneval | longbench.", rich_help_panel=SLO_PANEL)]
SloTtftOpt = Annotated[Optional[float], typer.Option("--slo-ttft", help="TTFT target in seconds (overrides --slo).", rich_help_panel=SLO_PANEL)]
SloTbtOpt = Annotated[Optional[float], typer.Option("--slo-tbt", help="P99 time-between-tokens target in seconds (overrides --slo).", rich_help_panel=SLO_PANEL)]
InputDistOpt = Annotated[Optional[str], typer.Option(help="Prompt length distribution, e.g. uniform:16:1024, lognormal:512:1.0.", callback=_length_dist, rich_help_panel=WORKLOAD_PANEL)]
OutputDistOpt = Annotated[Optional[str], typer.Option(help="Output length distribution (same forms).", callback=_length_dist, rich_help_panel=WORKLOAD_PANEL)]
TraceOpt = Annotated[Optional[str], typer.Option(help="Trace CSV with columns num_prefill_tokens and num_decode_tokens, optionally arrived_at (seconds; other columns are ignored), or azure-code / azure-conv. A trace without arrived_at needs --arrival.", rich_help_panel=WORKLOAD_PANEL)]
TraceLimitOpt = Annotated[Optional[int], typer.Option(help="Use only the trace's first N requests.", callback=at_least(1), rich_help_panel=WORKLOAD_PANEL)]
ArrivalOpt = Annotated[Optional[str], typer.Option(help="offline | poisson | gamma | trace (default: trace for a --trace with arrived_at, else offline).", rich_help_panel=ARRIVAL_PANEL)]
RateOpt = Annotated[Optional[float], typer.Option(help="Arrival rate (requests/s) for poisson and gamma.", rich_help_panel=ARRIVAL_PANEL)]
CvOpt = Annotated[Optional[float], typer.Option(help="Coefficient of variation of gamma inter-arrivals.", rich_help_panel=ARRIVAL_PANEL)]
TimeScaleOpt = Annotated[float, typer.Option(help="Multiply trace timestamps (0.5 = twice as fast).", rich_help_panel=ARRIVAL_PANEL)]
COpt = Annotated[int, typer.Option("--C", help="Token budget per batch.", callback=at_least(1), rich_help_panel=LIMITS_PANEL)]
POpt = Annotated[Optional[int], typer.Option("--P", help="Prefill tokens per batch (default: the scheduler's, else C).", callback=at_least(1), rich_help_panel=LIMITS_PANEL)]
MOpt = Annotated[Optional[int], typer.Option("--M", help="KV-cache capacity in tokens (default 100000 unless --gpu-mem-util).", callback=at_least(1), rich_help_panel=LIMITS_PANEL)]
GpuMemUtilOpt = Annotated[Optional[float], typer.Option(help="Derive M from GPU memory x this fraction minus the weights.", rich_help_panel=LIMITS_PANEL)]
RmaxOpt = Annotated[Optional[int], typer.Option("--Rmax", help="Max requests holding KV (default unlimited).", callback=at_least(1), rich_help_panel=LIMITS_PANEL)]
BlockSizeOpt = Annotated[int, typer.Option(help="KV block size in tokens (1 = the paper's accounting, 16 = vLLM paging).", callback=at_least(1), rich_help_panel=LIMITS_PANEL)]
PrefixCachingOpt = Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching", help="Automatic prefix caching (schedulers that support it, e.g. vllm-v1; use --block-size 16).", rich_help_panel=LIMITS_PANEL)]
SeedOpt = Annotated[int, typer.Option(help="Seed for generated workloads and arrivals.", callback=at_least(0), rich_help_panel=WORKLOAD_PANEL)]
RtDatasetOpt = Annotated[Optional[str], typer.Option(help="Hybrid RT/BE workload (BROS): RT lengths like sharegpt | lmsys (BROS Table 2), with closed-loop BE batches.", rich_help_panel=HYBRID_PANEL)]
RtRateOpt = Annotated[Optional[float], typer.Option(help="Hybrid workload: RT Poisson arrival rate (requests/s).", rich_help_panel=HYBRID_PANEL)]
BeBatchOpt = Annotated[int, typer.Option(help="Hybrid workload: BE requests per closed-loop batch.", callback=at_least(1), rich_help_panel=HYBRID_PANEL)]
DurationOpt = Annotated[float, typer.Option("--duration", help="Hybrid workload: seconds of RT arrivals and BE submission.", rich_help_panel=HYBRID_PANEL)]
WorkloadOpt = Annotated[Optional[str], typer.Option(help="Shared-prefix workload: multiturn | system-prompt | few-shot (lengths calibrated to LMSYS-Chat-1M; --B counts requests; --input-dist/--output-dist override message and answer lengths).", rich_help_panel=PREFIX_PANEL)]
TurnsOpt = Annotated[Optional[float], typer.Option(help="multiturn: mean turns per conversation (default 2.0; 1 = nothing shared). --arrival/--rate start conversations.", rich_help_panel=PREFIX_PANEL)]
ThinkTimeOpt = Annotated[Optional[float], typer.Option("--think-time", help="multiturn: mean think time between turns in seconds (default 30).", rich_help_panel=PREFIX_PANEL)]
SystemTokensOpt = Annotated[Optional[int], typer.Option(help="system-prompt: tokens per system prompt (default 1024).", callback=at_least(1), rich_help_panel=PREFIX_PANEL)]
ShotsOpt = Annotated[Optional[int], typer.Option(help="few-shot: worked examples per task template (default 5).", callback=at_least(0), rich_help_panel=PREFIX_PANEL)]
PrefixesOpt = Annotated[Optional[int], typer.Option(help="system-prompt / few-shot: distinct system prompts or task templates (default 1 / 4).", callback=at_least(1), rich_help_panel=PREFIX_PANEL)]
PrefixShareOpt = Annotated[Optional[float], typer.Option(help="system-prompt / few-shot: share of requests that use one, in [0, 1] (default 1).", rich_help_panel=PREFIX_PANEL)]
OutOpt = Annotated[Optional[Path], typer.Option(help="Write summary.json, requests/batches Parquet and schedule.json here.", rich_help_panel=OUTPUT_PANEL, callback=out_dir)]
PredictorOpt = Annotated[Optional[str], typer.Option(help="Predicted output lengths for every request: noisy (calibrated log-normal error), noisy:MU:SIGMA or oracle. EcoServe predicts unpredicted requests itself (noisy).", rich_help_panel=WORKLOAD_PANEL)]
JsonOpt = Annotated[bool, flag("--json", help="Print the summary as JSON instead of a table.", panel=OUTPUT_PANEL)]
ProgressOpt = Annotated[bool, flag("--progress/--no-progress", help="Show a progress bar.", panel=OUTPUT_PANEL)]


def run_config(scheduler: str, **options) -> RunConfig:
    """A ``RunConfig`` from a command's option values (``costmodel`` is the explicit JSON path)."""
    path = options.pop("costmodel")
    return RunConfig(scheduler=scheduler, costmodel_path=None if path is None else str(path), **options)


def config_header(config: RunConfig, limits) -> str:
    """One line naming the scheduler, model, GPU and limits of a run."""
    return (f"{config.scheduler} | {config.model} on {config.gpu} | C={limits.C} P={limits.prefill_budget} "
            f"M={limits.M} Rmax={limits.Rmax or 'inf'} block={limits.block_size}"
            + (" prefix-caching" if limits.prefix_caching else ""))
