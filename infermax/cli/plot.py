"""``infermax plot``: the paper's figure styles from a sweep's results table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .common import app, console, fail


def _parse_where(items: list[str]) -> dict:
    where = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            fail(f"--where takes KEY=VALUE, got {item!r}")
        try:
            where[key] = json.loads(text)
        except json.JSONDecodeError:
            where[key] = text
    return where


@app.command()
def plot(
    results: Path = typer.Argument(..., help="Results table (results.parquet written by `infermax sweep`)."),
    out: Path = typer.Option(..., help="Figure file: .png, .svg or .pdf."),
    metric: List[str] = typer.Option(["tps"], "--metric", "-m", help="Metric column(s); lines: one panel row each."),
    kind: str = typer.Option("lines", help="lines (metric vs --x, panel per --col, line per --hue) or heatmap."),
    x: str = typer.Option("I", help="x axis column."),
    col: Optional[str] = typer.Option("O", help="lines: one panel column per value of this column ('' for none)."),
    hue: Optional[str] = typer.Option("scheduler", help="lines: one line per value of this column ('' for none)."),
    y: str = typer.Option("O", help="heatmap: y axis column."),
    facet: Optional[str] = typer.Option("scheduler", help="heatmap: one panel per value ('' for none)."),
    where: List[str] = typer.Option([], help="Keep rows with KEY=VALUE (repeatable), e.g. --where B=1024."),
    title: Optional[str] = typer.Option(None, help="Figure title."),
) -> None:
    """Draw a figure from a sweep's results table."""
    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    from ..plot import draw, save

    if not results.is_file():
        fail(f"{results}: no such results table")
    options = {"kind": kind, "x": x, "where": _parse_where(where), "title": title}
    if kind == "heatmap":
        if len(metric) != 1:
            fail("a heatmap draws one --metric")
        options.update(metric=metric[0], y=y, facet=facet or None)
    else:
        options.update(metrics=metric, col=col or None, hue=hue or None)
    try:
        save(draw(pd.read_parquet(results), options), out)
    except ValueError as exc:
        fail(str(exc))
    console.print(f"figure {out}", highlight=False)
