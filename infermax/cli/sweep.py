"""``infermax sweep``: run a declarative sweep spec into one Parquet table (and its figures)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import ProgressOpt, app, at_least, console, err_console, fail, flag, out_dir


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="Sweep spec (TOML): a base configuration, the axes to sweep, optional plots."),
    out: Optional[Path] = typer.Option(None, help="Results directory (default: results/<name> next to the spec).", callback=out_dir),
    backend: str = typer.Option("local", help="local (processes on this machine) or ray."),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (ray backend; default: a local instance)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel workers (default: every core).",
                                       callback=at_least(1)),
    plots: Annotated[bool, flag("--plots/--no-plots", help="Draw the spec's plot figures into <out>/figures.")] = True,
    dry_run: Annotated[bool, flag("--dry-run", help="Validate the spec and count its points; run nothing.")] = False,
    progress: ProgressOpt = True,
    retry_errors: Annotated[bool, flag("--retry-errors",
                                       help="Compute again the points stored as errors (kept on resume otherwise).")] = False,
) -> None:
    """Run every point of a sweep spec; rerun to resume (finished points are kept, never recomputed).

    Points already in OUT's results table (computed from the same inputs) count as finished, so the committed
    results under experiments/results/ are not recomputed; the table and figures are rewritten only when a
    point was computed (or a figure is missing)."""
    from ..sweep import SpecError, load_spec, run_sweep

    try:
        parsed = load_spec(spec)
    except SpecError as exc:
        fail(str(exc))
    n_points = len(parsed.points())
    if dry_run:
        console.print(f"{parsed.name}: {n_points} {parsed.kind} points over "
                      f"{' x '.join(f'{k} ({len(v)})' for k, v in parsed.axes.items()) or 'no axes'}", highlight=False)
        return
    out_dir = out or parsed.default_out_dir()
    try:
        report = run_sweep(parsed, out_dir, backend=backend, jobs=jobs, address=address, progress=progress,
                           retry_errors=retry_errors)
    except (ValueError, RuntimeError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        # Finished points are already stored; a rerun skips them (the store is per point).
        err_console.print("interrupted; rerun the same command to resume", highlight=False)
        raise typer.Exit(130) from None
    console.print(f"{parsed.name}: {report.points} points ({report.cached} already done, {report.computed} computed, "
                  f"{report.errors} errors) in {report.wall_s:.1f} s wall, {report.compute_s:.1f} s of point compute; "
                  f"table {report.table}", highlight=False, soft_wrap=True)
    figures = Path(out_dir) / "figures"
    if plots and parsed.plots and (report.table_written or not all((figures / p.get("file", "")).is_file()
                                                                    for p in parsed.plots)):
        import matplotlib

        matplotlib.use("Agg")
        from ..plot import plot_from_spec

        try:
            paths = plot_from_spec(report.table, parsed.plots, figures)
        except ValueError as exc:  # e.g. a metric no point reported: the results are stored, only the figure failed
            fail(f"{exc}\nthe results are stored in {report.table}; fix the [[plot]] table and rerun (finished points "
                 f"are kept), or draw it with `infermax plot`")
        for path in paths:
            console.print(f"figure {os.fspath(path)}", highlight=False)
