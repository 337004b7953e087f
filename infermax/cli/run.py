"""``infermax simulate`` and ``infermax validate``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import (ArrivalOpt, BeBatchOpt, DurationOpt, RtDatasetOpt, RtRateOpt, BlockSizeOpt, BOpt, CostModelKindOpt, CostModelPathOpt, COpt, CvOpt, DatasetOpt, GpuMemUtilOpt,
                     GpuOpt, InputDistOpt, IOpt, JsonOpt, PredictorOpt, MixOpt, ModelOpt, MOpt, OOpt, OutOpt, OutputDistOpt, POpt, PrefixCachingOpt,
                     ProgressOpt, RateOpt, RmaxOpt, SchedulerOpt, SeedOpt, SloOpt, SloTbtOpt, SloTtftOpt, TimeScaleOpt, TpOpt, TraceLimitOpt, TraceOpt, app, config_header, fail,
                     report, run_config)


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
    out: OutOpt = None, progress: ProgressOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Simulate a workload through a scheduler and print the summary."""
    from ..schedulers import InfeasibleRequestError, SchedulerError

    options = {k: v for k, v in locals().items() if k not in ("scheduler", "out", "progress", "as_json", "slo_ttft",
                                                               "slo_tbt", "duration", "InfeasibleRequestError", "SchedulerError")}
    try:
        config = run_config(scheduler, slo_ttft_s=slo_ttft, slo_tbt_s=slo_tbt, duration_s=duration, **options)
        result = config.simulate(progress=progress and not as_json)
    except (ValueError, FileNotFoundError, InfeasibleRequestError, SchedulerError) as exc:
        fail(str(exc))
    report(result, out, as_json, config_header(config, result.schedule.limits))


@app.command()
def validate(
    schedule: Path = typer.Argument(..., help="Schedule JSON (as written by `simulate --out`)."),
    model: ModelOpt = "llama-2-7b", gpu: GpuOpt = "a100", tp: TpOpt = 1, cost_model: CostModelKindOpt = "auto",
    costmodel: CostModelPathOpt = None,
    out: Optional[Path] = typer.Option(None, help="Write the recomputed metrics here."),
    as_json: JsonOpt = False,
) -> None:
    """Replay a Schedule: check every rule of the semantics and limits, recompute all metrics."""
    from ..costmodel import load_cost_model
    from ..replay import ScheduleViolation, replay
    from ..schedule import Schedule

    try:
        sched = Schedule.load(schedule)
        cost = load_cost_model(gpu, model, tp, path=costmodel, kind=cost_model)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    try:
        result = replay(sched, cost)
    except ScheduleViolation as exc:
        fail(f"invalid schedule: {exc}", code=1)
    report(result, out, as_json, f"valid: {len(sched.batches)} batches, {len(sched.requests)} requests "
           f"(replay of {schedule})")
