"""The InferMax paper's figure styles drawn from a sweep's results table.

- ``lines``: one panel per value of ``col`` (the paper's O) and metric, the metric against ``x`` (I)
  with one line per ``hue`` (scheduler): Figs. 5, 8, 9, 11, 12. A metric's panels wrap into rows of at
  most ``wrap`` (4) columns, so a figure stays readable at its default size; a panel whose metric is
  undefined for every point (TPOT with O = 1: no token after the first) says so instead of an empty axis.
- ``heatmap``: a metric over two axes (``x`` by ``y``), one panel per ``facet`` value: Fig. 6.

Both select rows with ``where`` (``{"B": 1024}``) and refuse a table in which a plotted cell would
mix several rows (another column varies): the error names the columns to fix with ``where``. A metric must hold
numbers (missing values are drawn as undefined); a heatmap with nothing defined is refused.
The module draws with pyplot's current backend (inline in a notebook); the CLI selects Agg.
"""

from __future__ import annotations

import math
from pathlib import Path, PureWindowsPath
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

KINDS = ("lines", "heatmap")
FORMATS = (".png", ".svg", ".pdf")
LABELS = {
    "makespan_s": "makespan (s)", "tps": "TPS (tokens/s)", "mean_ttft_s": "TTFT (s)", "mean_tpot_s": "TPOT (s)",
    "mean_latency_s": "mean latency (s)", "evictions": "evictions", "mean_batch_size": "batch size",
    "mean_running": "running size", "mean_kv_util": "KV usage (fraction of M)", "peak_kv_util": "peak KV usage",
}


def select(table: pd.DataFrame, where: dict | None) -> pd.DataFrame:
    """Rows whose columns equal ``where``'s values (``"none"`` matches a missing value)."""
    for key, value in (where or {}).items():
        if key not in table.columns:
            raise ValueError(f"where: no column {key!r}; columns: {', '.join(table.columns)}")
        column = table[key]
        if value is None or value == "none":
            table = table[column.isna()]
        else:
            table = table[column.astype(str) == str(value)] if column.dtype == object else table[column == value]
    if table.empty:
        raise ValueError(f"no rows match where={where}")
    return table


def _check_columns(table: pd.DataFrame, columns: Sequence[str]) -> None:
    if not isinstance(table, pd.DataFrame):  # (a path or a dict had ended in "has no attribute 'columns'")
        raise TypeError(f"table must be a pandas DataFrame (pandas.read_parquet reads a sweep's results.parquet), got "
                        f"{type(table).__name__} {table!r:.60}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"no column(s) {', '.join(missing)} in the table; columns: {', '.join(table.columns)}")


def _check_unique(table: pd.DataFrame, keys: list[str]) -> None:
    if table.duplicated(keys).any():
        ignore = set(keys) | {"point_id", "status", "error"}
        varying = [c for c in table.columns if c not in ignore and table[c].astype(str).nunique() > 1
                   and c in _config_columns(table)]
        if not varying:  # the same point twice (a table that concatenates repeated runs)
            raise ValueError(f"several rows per ({', '.join(keys)}) with the same configuration (repeated runs?); "
                             f"keep one row per point")
        raise ValueError(f"several rows per ({', '.join(keys)}); other varying column(s): "
                         f"{', '.join(varying)}; select one value with where")


def _check_numeric(table: pd.DataFrame, metrics: Sequence[str]) -> None:
    """A metric's present values must be numbers (a missing one is drawn as undefined); a column of strings (the
    scheduler's name, say) is refused here instead of failing inside matplotlib."""
    for metric in metrics:
        values = table[metric]
        bad = values[values.notna() & pd.to_numeric(values, errors="coerce").isna()]
        if len(bad):
            raise ValueError(f"metric {metric!r} holds values that are not numbers (e.g. {bad.iloc[0]!r})")


def _config_columns(table: pd.DataFrame) -> list[str]:
    from .config import RunConfig

    return [c for c in RunConfig.field_names() if c in table.columns]


def _sorted_values(series: pd.Series) -> list:
    values = list(dict.fromkeys(series.tolist()))
    try:
        return sorted(values)
    except TypeError:
        return values


def _pow2_axis(ax, values) -> None:
    numeric = [v for v in values if isinstance(v, (int, float, np.integer, np.floating)) and v > 0]
    if len(numeric) == len(values) and len(values) > 2 and max(numeric) / min(numeric) >= 16:
        ax.set_xscale("log", base=2 if all(math.log2(v).is_integer() for v in numeric) else 10)


WRAP = 4  # panels per row in ``lines``
FONT = {"title": 11, "label": 10, "ticks": 9, "legend": 10}


def lines(table: pd.DataFrame, metrics: Sequence[str], x: str = "I", col: str | None = "O",
          hue: str | None = "scheduler", where: dict | None = None, title: str | None = None, wrap: int = WRAP):
    """Metric vs ``x``: per metric, one panel per ``col`` value in rows of at most ``wrap`` panels, one line per ``hue``.
    ``metrics``: column names, or one name (``lines(table, "tps")`` had looked for columns "t", "p" and "s")."""
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    if not metrics:
        raise ValueError("give at least one metric")
    if isinstance(wrap, bool) or not isinstance(wrap, int) or wrap < 1:
        raise ValueError(f"wrap must be an integer >= 1, got {wrap!r}")
    _check_columns(table, [x, *metrics] + [c for c in (col, hue) if c])
    data = select(table, where)
    keys = [c for c in (col, hue, x) if c]
    _check_unique(data, keys)
    _check_numeric(data, metrics)
    cols = _sorted_values(data[col]) if col else [None]
    hues = list(dict.fromkeys(data[hue])) if hue else [None]
    ncols = min(len(cols), wrap)
    block = math.ceil(len(cols) / ncols)  # rows per metric
    fig, axes = plt.subplots(len(metrics) * block, ncols, figsize=(3.2 * ncols + 0.8, 2.6 * len(metrics) * block + 0.8),
                             squeeze=False, layout="constrained")
    for i, metric in enumerate(metrics):
        for j in range(len(cols), block * ncols):  # the unused places of this metric's last row
            axes[i * block + j // ncols][j % ncols].axis("off")
        for j, cv in enumerate(cols):
            ax = axes[i * block + j // ncols][j % ncols]
            panel = data if col is None else data[data[col] == cv]
            if pd.to_numeric(panel[metric], errors="coerce").notna().any():
                for hv in hues:
                    part = panel if hue is None else panel[panel[hue] == hv]
                    part = part.sort_values(x)
                    ax.plot(part[x], part[metric], marker="o", markersize=3, label=None if hv is None else str(hv))
                _pow2_axis(ax, _sorted_values(data[x]))
                ax.grid(alpha=0.3)
            else:
                ax.text(0.5, 0.5, "undefined" + (f" ({col} = {cv})" if col else ""), transform=ax.transAxes,
                        ha="center", va="center", fontsize=FONT["label"], color="0.4")
                ax.set_xticks([])
                ax.set_yticks([])
            if col:
                ax.set_title(f"{col}={cv}", fontsize=FONT["title"])
            if j % ncols == 0:
                ax.set_ylabel(LABELS.get(metric, metric), fontsize=FONT["label"])
            ax.set_xlabel(x, fontsize=FONT["label"])
            ax.tick_params(labelsize=FONT["ticks"])
    if title:
        fig.suptitle(title, fontsize=FONT["title"] + 1)
    drawn = next((ax for ax in axes.flat if ax.get_lines()), None)
    if hue and drawn is not None:  # (none drawn: every panel says its metric is undefined)
        handles, labels = drawn.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(hues), 6), fontsize=FONT["legend"],
                   frameon=False)
    return fig


def heatmap(table: pd.DataFrame, metric: str, x: str = "I", y: str = "O", facet: str | None = "scheduler",
            where: dict | None = None, title: str | None = None, annotate: bool = True):
    """``metric`` over ``x`` (columns) and ``y`` (rows), one panel per ``facet`` value, shared colour scale."""
    _check_columns(table, [x, y, metric] + ([facet] if facet else []))
    data = select(table, where)
    _check_unique(data, [c for c in (facet, x, y) if c])
    _check_numeric(data, [metric])
    facets = list(dict.fromkeys(data[facet])) if facet else [None]
    xs, ys = _sorted_values(data[x]), _sorted_values(data[y])
    values = pd.to_numeric(data[metric], errors="coerce")
    if values.isna().all():
        raise ValueError(f"metric {metric!r} is undefined at every selected point: nothing to colour")
    vmin, vmax = np.nanmin(values), np.nanmax(values)
    fig, axes = plt.subplots(1, len(facets), figsize=(0.45 * len(xs) * len(facets) + 1.5, 0.4 * len(ys) + 1.4),
                             squeeze=False)
    image = None
    for k, fv in enumerate(facets):
        ax = axes[0][k]
        part = data if facet is None else data[data[facet] == fv]
        grid = part.pivot(index=y, columns=x, values=metric).reindex(index=ys, columns=xs).astype(float)
        image = ax.imshow(grid.to_numpy(), origin="lower", aspect="auto", vmin=vmin, vmax=vmax, cmap="viridis")
        ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=90, fontsize=7)
        ax.set_yticks(range(len(ys)), [str(v) for v in ys], fontsize=7)
        ax.set_xlabel(x)
        if k == 0:
            ax.set_ylabel(y)
        if facet:
            ax.set_title(str(fv), fontsize=9)
        if annotate and len(xs) * len(ys) <= 144:
            for (r, c), v in np.ndenumerate(grid.to_numpy()):
                if not np.isnan(v):
                    ax.text(c, r, f"{v:.3g}" if abs(v) < 1000 else f"{v / 1000:.0f}k", ha="center", va="center",
                            fontsize=5, color="white" if v < (vmin + vmax) / 2 else "black")
    fig.colorbar(image, ax=axes[0].tolist(), label=LABELS.get(metric, metric), shrink=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def save(fig, path: str | Path) -> Path:
    """Write a figure as PNG, SVG or PDF (by the file's suffix) and close it."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"{path}: figure format must be one of {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


PLOT_KEYS = {"lines": ("kind", "file", "metrics", "x", "col", "hue", "where", "title", "wrap"),
             "heatmap": ("kind", "file", "metric", "x", "y", "facet", "where", "title", "annotate")}


def check_options(options: dict, complete: bool = True) -> str:
    """Validate one plot description's keys and their types; returns its kind. ``complete``: its required key too
    (``metrics`` for lines, ``metric`` for a heatmap)."""
    kind = options.get("kind", "lines")
    if kind not in KINDS:
        raise ValueError(f"plot kind must be one of {', '.join(KINDS)}, got {kind!r}")
    unknown = sorted(set(options) - set(PLOT_KEYS[kind]))
    if unknown:
        raise ValueError(f"unknown {kind} plot key(s) {', '.join(unknown)}; known: {', '.join(PLOT_KEYS[kind])}")
    _check_option_types(options)
    needed = "metrics" if kind == "lines" else "metric"
    if complete and needed not in options:
        raise ValueError(f"a {kind} plot needs '{needed}'")
    return kind


def _check_option_types(options: dict) -> None:
    """Each plot key's type (a spec's ``[[plot]]`` table is hand-written: a list for ``hue`` or a number among the
    ``metrics`` ended in a TypeError inside pandas, found by a fuzz of sweep specs, 2026-12-01)."""
    for key in ("x", "y", "metric", "col", "hue", "facet", "title"):
        value = options.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"'{key}' must be a string (a column name{'' if key != 'title' else ' or a title'}), "
                             f"got {value!r}")
    metrics = options.get("metrics")
    if metrics is not None and (not isinstance(metrics, (list, tuple)) or not metrics
                                or not all(isinstance(m, str) for m in metrics)):
        raise ValueError(f"'metrics' must be a non-empty list of column names, got {metrics!r}")
    where = options.get("where")
    if where is not None and (not isinstance(where, dict) or not all(
            isinstance(v, (str, int, float, bool)) or v is None for v in where.values())):
        raise ValueError(f"'where' must be a table of column = value, got {where!r}")
    if "annotate" in options and not isinstance(options["annotate"], bool):
        raise ValueError(f"'annotate' must be true or false, got {options['annotate']!r}")


def check_figure_file(file) -> str:
    """A ``[[plot]]`` table's ``file``: a relative path inside the sweep's ``figures`` folder (no absolute path, no
    ``..``: a spec must not write outside its output folder), in one of `FORMATS`."""
    if not isinstance(file, str) or not file.strip():
        raise ValueError(f"needs 'file', a figure's name such as \"fig5.png\", got {file!r}")
    path = PureWindowsPath(file)  # (splits at "/" and "\\" alike; its anchor is a drive, a root or both)
    if path.anchor or ".." in path.parts:
        raise ValueError(f"'file' must be a relative path inside the sweep's figures folder, got {file!r}")
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"'file' {file!r}: figure format must be one of {', '.join(FORMATS)}")
    return file


def draw(table: pd.DataFrame, options: dict):
    """A figure from one plot description (a spec's ``[[plot]]`` table; ``file`` is ignored)."""
    kind = check_options(options)
    kwargs = {k: v for k, v in options.items() if k not in ("kind", "file")}
    return (lines if kind == "lines" else heatmap)(table, **kwargs)


def plot_from_spec(table_path: str | Path, plots: list[dict], out_dir: str | Path) -> list[Path]:
    """Draw a sweep spec's ``[[plot]]`` figures from its results table into ``out_dir``."""
    table = pd.read_parquet(table_path)
    written = []
    for i, options in enumerate(plots):
        try:
            check_figure_file(options.get("file"))
        except ValueError as exc:
            raise ValueError(f"plot {i}: {exc}") from None
        try:
            figure = draw(table, options)
        except ValueError as exc:
            raise ValueError(f"plot {i} ({options['file']}): {exc}") from None
        written.append(save(figure, Path(out_dir) / options["file"]))
    return written
