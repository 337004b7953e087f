"""``infermax capacity``: effective throughput (highest rate meeting an SLO-attainment threshold)."""

from __future__ import annotations

import json
from typing import Annotated, List

import typer
from rich.table import Table

from .common import (OUTPUT_PANEL, BlockSizeOpt, BOpt, CostModelKindOpt, CostModelPathOpt, COpt, CvOpt, DatasetOpt,
                     GpuMemUtilOpt, GpuOpt, InputDistOpt, IOpt, MixOpt, ModelOpt, MOpt, OOpt, OutputDistOpt, POpt,
                     ProgressOpt, RmaxOpt, SchedulerOpt, SloOpt, SloTbtOpt, SloTtftOpt, TpOpt, app, at_least,
                     config_header, console, fail, flag, run_config)



@app.command()
def capacity(
    scheduler: SchedulerOpt = "vllm",
    model: ModelOpt = "llama-2-7b", gpu: GpuOpt = "a100", tp: TpOpt = 1, cost_model: CostModelKindOpt = "auto",
    costmodel: CostModelPathOpt = None, I: IOpt = 512, O: OOpt = 128, B: BOpt = 300, mix: MixOpt = None,
    dataset: DatasetOpt = None, input_dist: InputDistOpt = None, output_dist: OutputDistOpt = None,
    arrival: str = typer.Option("poisson", help="poisson | gamma."), cv: CvOpt = None,
    C: COpt = 4096, P: POpt = None, M: MOpt = None, gpu_mem_util: GpuMemUtilOpt = None, Rmax: RmaxOpt = None,
    block_size: BlockSizeOpt = 1, slo: SloOpt = None, slo_ttft: SloTtftOpt = None, slo_tbt: SloTbtOpt = None,
    attainment: List[float] = typer.Option([0.9], "--attainment", help="Attainment threshold(s), fractions (repeatable)."),
    seeds: int = typer.Option(1, help="Seeds 0..N-1 per rate; attainment is their mean.", callback=at_least(1)),
    start_rate: float = typer.Option(1.0, help="First rate tried (requests/s); the search brackets from it."),
    rel_tol: float = typer.Option(0.05, help="Bisect until (hi - lo) <= rel_tol * hi."),
    max_rate: float = typer.Option(1e4, help="Stop doubling here."),
    progress: ProgressOpt = True,
    as_json: Annotated[bool, flag("--json", help="Print the result as JSON.", panel=OUTPUT_PANEL)] = False,
) -> None:
    """Effective throughput: the highest request rate whose SLO attainment stays >= each threshold.

    Every rate runs the same requests with the same arrival draws scaled to the rate (per seed);
    bracketing by doubling/halving from --start-rate, then bisection to --rel-tol. Deterministic.
    """
    from ..capacity import attainment_at, search_capacity
    from ..schedulers import InfeasibleRequestError, SchedulerError

    options = {k: v for k, v in locals().items() if k in (
        "model", "gpu", "tp", "cost_model", "costmodel", "I", "O", "B", "mix", "dataset", "input_dist", "output_dist",
        "arrival", "cv", "C", "P", "M", "gpu_mem_util", "Rmax", "block_size", "slo")}
    if not 0 < rel_tol < 1:
        fail(f"--rel-tol must be in (0, 1), got {rel_tol:g}")
    if not 0 < start_rate <= max_rate:
        fail(f"need 0 < --start-rate <= --max-rate, got {start_rate:g} and {max_rate:g}")
    try:
        config = run_config(scheduler, rate=start_rate, slo_ttft_s=slo_ttft, slo_tbt_s=slo_tbt, **options)
        limits = config.limits()
        bar = _progress(progress and not as_json)
        with bar:
            task = bar.add_task(f"{scheduler}: searching", total=None)

            def on_eval(rate: float, value: float) -> None:
                bar.update(task, advance=1, description=f"{scheduler}: rate {rate:.4g}/s -> attainment {value:.3f}")

            result = search_capacity(lambda r: attainment_at(config, r, range(seeds)), attainment,
                                     start_rate=start_rate, rel_tol=rel_tol, max_rate=max_rate, on_eval=on_eval)
    except (ValueError, FileNotFoundError, InfeasibleRequestError, SchedulerError) as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps({"scheduler": scheduler, "effective_rate": {str(t): r for t, r in result.rates.items()},
                          "capped": {str(t): c for t, c in result.capped.items()},
                          "evaluations": {str(r): a for r, a in sorted(result.evaluations.items())}}))
        return
    console.print(config_header(config, limits), highlight=False, soft_wrap=True)
    table = Table(title="effective throughput (requests/s)")
    for col in ("attainment >=", "highest rate", "note"):
        table.add_column(col)
    for t, r in sorted(result.rates.items(), reverse=True):
        note = "met even at --max-rate" if result.capped.get(t) else ("missed at the lowest rate" if r is None else "")
        table.add_row(f"{t:.0%}", "-" if r is None else f"{r:.4g}", note)
    console.print(table)
    evals = Table(title="rates evaluated")
    evals.add_column("rate (req/s)", justify="right")
    evals.add_column("attainment", justify="right")
    for r, a in sorted(result.evaluations.items()):
        evals.add_row(f"{r:.4g}", f"{a:.3f}")
    console.print(evals)


def _progress(enabled: bool):
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("({task.completed} runs)"),
                    TimeElapsedColumn(), transient=True, disable=not enabled)
