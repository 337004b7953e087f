"""``infermax optimize`` (optimal schedule by MILP) and ``infermax better`` (can any schedule beat a
scheduler by a margin?). Both validate every solution by replay; see solvers/ and docs/design.md."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..jsonio import nan_to_null
from .common import (out_dir, progress_line, ArrivalOpt, BlockSizeOpt, BOpt, CostModelKindOpt, CostModelPathOpt, COpt, CvOpt, GpuMemUtilOpt,
                     GpuOpt, InputDistOpt, IOpt, JsonOpt, MixOpt, ModelOpt, MOpt, OOpt, OutputDistOpt, POpt, RateOpt,
                     RmaxOpt, SeedOpt, TimeScaleOpt, TpOpt, TraceLimitOpt, TraceOpt, app, at_least, config_header,
                     console, fail, flag, run_config, scheduler_name, summary_table)

_RUN_KEYS = ("model", "gpu", "tp", "cost_model", "costmodel", "I", "O", "B", "mix", "input_dist", "output_dist", "trace",
             "trace_limit", "arrival", "rate", "cv", "time_scale", "C", "P", "M", "gpu_mem_util", "Rmax", "block_size",
             "seed")
ObjectiveOpt = typer.Option("makespan", help="makespan (total latency) | latency (sum) | ttft (mean) | e.g. makespan=1,ttft=0.5")
SolverOpt = typer.Option("highs", help="highs | cbc | gurobi")
TimeLimitOpt = typer.Option(60.0, help="Time limit in seconds for the whole command: building the workload, bound, search, model building and solving.")
GapOpt = typer.Option(1e-6, help="Relative MIP gap at which the solver stops.")
ThreadsOpt = typer.Option(None, help="Solver threads (default: the solver's).", callback=at_least(1))
NoHybridOpt = Annotated[bool, flag("--no-hybrid", help="Force: no batch mixes prefill and decode items.")]
NoChunkOpt = Annotated[bool, flag("--no-chunked-prefill", help="Force: every prefill completes in one batch.")]
EvictionFreeOpt = Annotated[bool, flag("--eviction-free", help="Force: no evictions.")]


def _setup(scheduler: str, options: dict, objective: str, solver: str, time_limit: float, gap: float,
           threads: Optional[int], no_hybrid: bool, no_chunked_prefill: bool, eviction_free: bool, quiet: bool):
    """The run's configuration, workload, limits, cost model, objective, policies and solver options. A workload whose
    size is known before it is built (not a trace) and too large to build and bound within --time-limit is refused
    before it is built (`solvers.scale.startup_refusal`); a trace is refused once read."""
    from solvers import BACKENDS, Objective, Policies, SolveOptions
    from solvers.scale import startup_refusal

    if solver not in BACKENDS:
        fail(f"unknown solver {solver!r}; choose one of {', '.join(BACKENDS)}")
    if not (0 < time_limit < math.inf) or not 0 <= gap < 1:  # (a NaN fails both comparisons)
        fail("--time-limit must be a finite number > 0 and --gap in [0, 1)")
    try:
        obj = Objective.parse(objective)
        config = run_config(scheduler, **{k: options[k] for k in _RUN_KEYS})
        if not config.trace and (too_big := startup_refusal(config.B, time_limit)):
            fail(too_big)
        requests, limits, cost = config.requests(), config.limits(), config.cost()
        if config.trace and (too_big := startup_refusal(len(requests), time_limit)):  # its size, now known
            fail(too_big)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))

    def show(p):
        progress_line(f"{p.time_s:7.1f}s  incumbent {p.incumbent / 1e3:.6g} s  bound {p.bound / 1e3:.6g} s  "
                      f"gap {p.gap:.2%}  nodes {p.nodes}")

    opts = SolveOptions(solver, time_limit, gap, threads, on_progress=None if quiet else show)
    return config, requests, limits, cost, obj, Policies(no_hybrid, no_chunked_prefill, eviction_free), opts


def _display(summary: dict) -> dict:
    """Rows worth printing: no empty values, booleans as yes/no."""
    return {k: ("yes" if v else "no") if isinstance(v, bool) else v for k, v in summary.items()
            if v is not None and not (isinstance(v, float) and math.isnan(v))}


def _run(fn):
    from solvers import SolutionRejected, SolverFailed, SolverUnavailable
    from infermax.engine import SimulationTimeout
    from infermax.schedulers import InfeasibleRequestError, SchedulerError

    try:
        return fn()
    except SimulationTimeout as exc:
        fail(str(exc), code=1)
    except SolverUnavailable as exc:
        fail(str(exc))
    except SolutionRejected as exc:
        fail(f"solution rejected: {exc}", code=1)
    except SolverFailed as exc:
        fail(f"solver failure: {exc}", code=1)
    except (ValueError, InfeasibleRequestError, SchedulerError) as exc:
        fail(str(exc))


@app.command()
def optimize(
    model: ModelOpt = "llama-2-7b", gpu: GpuOpt = "a100", tp: TpOpt = 1, cost_model: CostModelKindOpt = "auto",
    costmodel: CostModelPathOpt = None, I: IOpt = 16, O: OOpt = 4, B: BOpt = 4, mix: MixOpt = None,
    input_dist: InputDistOpt = None, output_dist: OutputDistOpt = None, trace: TraceOpt = None,
    trace_limit: TraceLimitOpt = None, arrival: ArrivalOpt = None, rate: RateOpt = None, cv: CvOpt = None,
    time_scale: TimeScaleOpt = 1.0, C: COpt = 4096, P: POpt = None, M: MOpt = None,
    gpu_mem_util: GpuMemUtilOpt = None, Rmax: RmaxOpt = None, block_size: BlockSizeOpt = 1, seed: SeedOpt = 0,
    objective: str = ObjectiveOpt, solver: str = SolverOpt, time_limit: float = TimeLimitOpt, gap: float = GapOpt,
    threads: Optional[int] = ThreadsOpt, no_hybrid: NoHybridOpt = False, no_chunked_prefill: NoChunkOpt = False,
    eviction_free: EvictionFreeOpt = False,
    warm_start: str = typer.Option("auto", help="Scheduler whose schedule seeds the solver and bounds the slots ('auto': "
                                   "vllm, or sarathi when a prompt is longer than vLLM's min(C, P); 'none': no seed)."),
    slots: Optional[int] = typer.Option(None, help="Batch slots (default: the bound derived from the warm start)."),
    out: Optional[Path] = typer.Option(None, help="Write schedule.json and summary.json here.", callback=out_dir),
    as_json: JsonOpt = False,
) -> None:
    """Best schedule and lower bound for an objective, with the certified gap, at any size.

    The exact MILP where its estimated size fits the time and memory, the search and the lower bound everywhere.

    Every schedule is validated by replay; --time-limit covers everything."""
    started_s = time.perf_counter()  # --time-limit covers importing the solvers and building the workload too
    from solvers.analyse import analyse

    config, requests, limits, cost, obj, policies, opts = _setup(
        "vllm", locals(), objective, solver, time_limit, gap, threads, no_hybrid, no_chunked_prefill, eviction_free, as_json)
    if slots is not None and slots < 1:
        fail("--slots must be >= 1")
    say = None if as_json else progress_line
    res = _run(lambda: analyse(requests, limits, cost, obj, policies, warm_start=None if warm_start == "none" else warm_start,
                               slots=slots, options=opts, time_limit_s=time_limit, progress=say,
                               started_s=started_s))
    summary = nan_to_null(_with_mean_latencies(res.summary(), obj, len(requests), ("objective_s", "lower_bound_s")))
    if out is not None:  # (created by `out_dir` when the option was read)
        if res.schedule is not None:
            _save_schedule(res.schedule, config, out / "schedule.json")
        (out / "summary.json").write_text(json.dumps({"summary": summary, "config": config.to_dict()}, indent=2))
    if as_json:
        print(json.dumps(summary))
        return
    console.print(config_header(config, limits).replace("vllm |", "optimize |", 1), highlight=False, soft_wrap=True)
    console.print(summary_table(_display({k: v for k, v in summary.items() if k != "differences"}), "optimize"))
    if res.differences is not None:
        console.print(_differences_table(res.differences, f"{res.details['warm_start']} (warm start)"))
    if out is not None:
        console.print(f"results written to {out}")


def _save_schedule(schedule, config, path: Path) -> None:
    """Write ``schedule`` with the run's configuration in its meta, as `simulate --out` does, so that `validate`
    replays it on the cost model that timed it (without it, a schedule found on the linear model was re-timed on
    the default piecewise one: 0.0359 s reported, 0.0615 s on replay)."""
    replace(schedule, meta={**schedule.meta, "config": config.to_dict()}).save(path)


@app.command()
def better(
    scheduler: str = typer.Option("vllm", "--scheduler", "-s", help="The scheduler to beat.", callback=scheduler_name),
    margin: float = typer.Option(0.1, help="Required improvement: a schedule with objective <= (1 - margin) x the scheduler's."),
    model: ModelOpt = "llama-2-7b", gpu: GpuOpt = "a100", tp: TpOpt = 1, cost_model: CostModelKindOpt = "auto",
    costmodel: CostModelPathOpt = None, I: IOpt = 16, O: OOpt = 4, B: BOpt = 4, mix: MixOpt = None,
    input_dist: InputDistOpt = None, output_dist: OutputDistOpt = None, trace: TraceOpt = None,
    trace_limit: TraceLimitOpt = None, arrival: ArrivalOpt = None, rate: RateOpt = None, cv: CvOpt = None,
    time_scale: TimeScaleOpt = 1.0, C: COpt = 4096, P: POpt = None, M: MOpt = None,
    gpu_mem_util: GpuMemUtilOpt = None, Rmax: RmaxOpt = None, block_size: BlockSizeOpt = 1, seed: SeedOpt = 0,
    objective: str = ObjectiveOpt, solver: str = SolverOpt, time_limit: float = TimeLimitOpt, gap: float = GapOpt,
    threads: Optional[int] = ThreadsOpt, no_hybrid: NoHybridOpt = False, no_chunked_prefill: NoChunkOpt = False,
    eviction_free: EvictionFreeOpt = False,
    out: Optional[Path] = typer.Option(None, help="Write the better schedule (if found) and the answer here.", callback=out_dir),
    as_json: JsonOpt = False,
) -> None:
    """Is there a schedule at least MARGIN better than SCHEDULER's? Answers yes / no / unknown.

    Exit 0 with the answer; exit 1 when SCHEDULER's own run, which sets the target, outlasts --time-limit."""
    started_s = time.perf_counter()  # --time-limit covers importing the solvers and building the workload too
    from solvers.better import better as ask

    if not 0 < margin < 1:
        fail("--margin must be in (0, 1)")
    config, requests, limits, cost, obj, policies, opts = _setup(
        scheduler, locals(), objective, solver, time_limit, gap, threads, no_hybrid, no_chunked_prefill, eviction_free, as_json)
    say = None if as_json else progress_line
    ans = _run(lambda: ask(requests, limits, cost, scheduler, margin, obj, policies, opts, time_limit_s=time_limit,
                           progress=say, swap_cost=config.swap_cost(), started_s=started_s))
    answer = nan_to_null(_with_mean_latencies(ans.to_dict(), obj, len(requests),
                                              ("scheduler_objective_s", "target_s", "found_s", "bound_s")))
    if out is not None:  # (created by `out_dir` when the option was read)
        if ans.schedule is not None:
            _save_schedule(ans.schedule, config, out / "schedule.json")
        (out / "answer.json").write_text(json.dumps(answer, indent=2))
    if as_json:
        print(json.dumps(answer))
        return
    console.print(f"[bold]{ans.answer}[/]: {escape(ans.explanation)}", markup=True, highlight=False, soft_wrap=True)
    if "scheduler_objective_mean_latency_s" in answer:
        means = [f"{answer['scheduler_objective_mean_latency_s']:.4g} s ({scheduler})"] + [
            f"{answer[k]:.4g} s ({label})" for k, label in (("found_mean_latency_s", "found"),
                                                           ("bound_mean_latency_s", "lower bound")) if k in answer]
        console.print(f"mean latency per request: {', '.join(means)}", markup=False, highlight=False, soft_wrap=True)
    console.print(summary_table(_display({k: v for k, v in answer.items()
                                          if k not in ("answer", "explanation", "differences")}), "better"))
    if ans.differences is not None:
        console.print(_differences_table(ans.differences, scheduler))


def _with_mean_latencies(summary: dict, objective, requests: int, names: tuple[str, ...]) -> dict:
    """``summary`` with, for a sum-of-latencies objective, each value named in ``names`` followed by the mean latency
    per request it stands for (`Objective.mean_latency_s`; the name with ``_mean_latency_s`` in place of ``_s``): a sum
    of tens of thousands of seconds is not what a user compares. Unchanged for any other objective; an infinite value
    ("no schedule") gets no mean."""
    out = {}
    for key, value in summary.items():
        out[key] = value
        mean_s = objective.mean_latency_s(value, requests) if key in names else None
        if mean_s is not None and math.isfinite(mean_s):
            out[key.removesuffix("_s") + "_mean_latency_s"] = mean_s
    return out


def _differences_table(differences: dict, scheduler: str):
    """What the schedule found does differently from ``scheduler``'s (`solvers.differences`; ``scheduler`` names the
    column), one row per statistic."""
    from rich.table import Table

    table = Table(title="what the schedule found does differently", show_header=True)
    for name, justify in (("statistic", "left"), (scheduler, "right"), ("found", "right")):
        table.add_column(name, justify=justify)
    for key, values in differences.items():
        table.add_row(key.replace("_", " "), *(f"{v:,}" if isinstance(v, int) else f"{v:.3g}" for v in values))
    return table
