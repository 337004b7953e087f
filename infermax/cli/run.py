"""``infermax simulate`` and ``infermax validate``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import (out_dir, ArrivalOpt, BeBatchOpt, DurationOpt, RtDatasetOpt, RtRateOpt, BlockSizeOpt, BOpt, CostModelKindOpt, CostModelPathOpt, COpt, CvOpt, DatasetOpt, GpuMemUtilOpt,
                     GpuOpt, InputDistOpt, IOpt, JsonOpt, PredictorOpt, MixOpt, ModelOpt, MOpt, OOpt, OutOpt, OutputDistOpt, POpt, PrefixCachingOpt,
                     ProgressOpt, RateOpt, RmaxOpt, SchedulerOpt, SeedOpt, SloOpt, SloTbtOpt, SloTtftOpt, TimeScaleOpt, TpOpt, TraceLimitOpt, TraceOpt, app, config_header, fail,
                     report, run_config, PrefixesOpt, PrefixShareOpt, ShotsOpt, SystemTokensOpt, ThinkTimeOpt, TurnsOpt, err_console,
                     WorkloadOpt)


@app.command()
def simulate(
    scheduler: SchedulerOpt = "vllm",
    model: ModelOpt = "llama-2-7b", gpu: GpuOpt = "a100", tp: TpOpt = 1, cost_model: CostModelKindOpt = "auto",
    costmodel: CostModelPathOpt = None, I: IOpt = 512, O: OOpt = 128, B: BOpt = 1024, mix: MixOpt = None,
    dataset: DatasetOpt = None, input_dist: InputDistOpt = None, output_dist: OutputDistOpt = None, trace: TraceOpt = None,
    trace_limit: TraceLimitOpt = None, arrival: ArrivalOpt = None, rate: RateOpt = None, cv: CvOpt = None,
    time_scale: TimeScaleOpt = 1.0, C: COpt = 4096, P: POpt = None, M: MOpt = None,
    gpu_mem_util: GpuMemUtilOpt = None, Rmax: RmaxOpt = None, block_size: BlockSizeOpt = 1, prefix_caching: PrefixCachingOpt = False,
    seed: SeedOpt = 0, slo: SloOpt = None, slo_ttft: SloTtftOpt = None, slo_tbt: SloTbtOpt = None,
    rt_dataset: RtDatasetOpt = None, rt_rate: RtRateOpt = None, be_batch: BeBatchOpt = 256, duration: DurationOpt = 60.0,
    predictor: PredictorOpt = None,
    workload: WorkloadOpt = None, turns: TurnsOpt = None, think_time: ThinkTimeOpt = None,
    system_tokens: SystemTokensOpt = None, shots: ShotsOpt = None, prefixes: PrefixesOpt = None,
    prefix_share: PrefixShareOpt = None,
    out: OutOpt = None, progress: ProgressOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Simulate a workload through a scheduler and print the summary."""
    from ..schedulers import InfeasibleRequestError, SchedulerError

    options = {k: v for k, v in locals().items() if k not in ("scheduler", "out", "progress", "as_json", "slo_ttft",
                                                               "slo_tbt", "duration", "think_time", "InfeasibleRequestError",
                                                               "SchedulerError")}
    try:
        config = run_config(scheduler, slo_ttft_s=slo_ttft, slo_tbt_s=slo_tbt, duration_s=duration,
                            think_time_s=think_time, **options)
        result = config.simulate(progress=progress and not as_json)
    except (ValueError, FileNotFoundError, InfeasibleRequestError, SchedulerError) as exc:
        fail(str(exc))
    report(result, out, as_json, config_header(config, result.schedule.limits))


# The RunConfig fields that choose a cost model: `validate` takes them from its options, else from the schedule.
_COST_KEYS = ("model", "gpu", "tp", "cost_model", "costmodel_path")


def _recorded_cost_fields(config: dict, schedule: Path) -> dict:
    """The cost-model fields a schedule's ``meta.config`` records, type-checked: a hand-edited schedule with, say, a
    list for its model is refused with a message (found by a fuzz of `validate`, 2026-12-01)."""
    recorded = {}
    for key in _COST_KEYS:
        if key not in config:
            continue
        value = config[key]
        if key == "tp":
            ok, want = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1), \
                "an integer >= 1"
        else:
            ok, want = value is None or isinstance(value, str), "a string"
        if not ok:
            raise ValueError(f"{schedule}: malformed schedule: meta.config.{key} must be {want} or null, got {value!r}")
        if key == "costmodel_path" and value is not None and not Path(value).is_file():
            raise ValueError(f"{schedule}: meta.config.costmodel_path {value!r}: "
                             + ("is a directory, not a file" if Path(value).is_dir() else "no such file"))
        recorded[key] = value
    return recorded


@app.command()
def validate(
    schedule: Path = typer.Argument(..., help="Schedule JSON (as written by `simulate --out`)."),
    model: Optional[str] = typer.Option(None, help="Model; with none of --model/--gpu/--tp/--cost-model/"
                                        "--cost-model-file, the cost model the schedule records (else llama-2-7b)."),
    gpu: Optional[str] = typer.Option(None, help="GPU (default: the schedule's, else a100)."),
    tp: Optional[int] = typer.Option(None, min=1, help="Tensor-parallel degree (default: the schedule's, else 1)."),
    cost_model: Optional[str] = typer.Option(None, "--cost-model", help="Cost-model family (default: the "
                                             "schedule's, else auto)."),
    costmodel: CostModelPathOpt = None,
    out: Optional[Path] = typer.Option(None, help="Write the recomputed metrics here.", callback=out_dir),
    as_json: JsonOpt = False,
) -> None:
    """Replay a Schedule: check every rule of the semantics and limits, recompute all metrics.

    The batches are timed by the cost model the schedule records (`simulate --out` writes it) unless one is given."""
    from ..config import RunConfig
    from ..replay import BatchTimeOverflow, ScheduleViolation, replay
    from ..schedule import Schedule

    try:
        sched = Schedule.load(schedule)
        given = {k: v for k, v in zip(_COST_KEYS, (model, gpu, tp, cost_model, costmodel)) if v is not None}
        config = sched.meta.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{schedule}: malformed schedule: meta.config must be an object, got "
                             f"{type(config).__name__}")
        # RunConfig's defaults fill what neither names
        cost = RunConfig(**(given or _recorded_cost_fields(config, schedule))).cost()
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    was = sched.meta.get("cost_model")
    if was and was != cost.name and not as_json:  # re-timing on another model is allowed; say so
        err_console.print(f"note: the schedule was timed with {was}; these metrics use {cost.name}", highlight=False)
    try:
        result = replay(sched, cost)
    except ScheduleViolation as exc:
        fail(f"invalid schedule: {exc}", code=1)
    except BatchTimeOverflow as exc:
        fail(str(exc))
    report(result, out, as_json, f"valid: {len(sched.batches)} batches, {len(sched.requests)} requests "
           f"(replay of {schedule})")
