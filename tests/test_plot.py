"""Figures from a results table: what is drawn where, and clear errors."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from infermax import plot  # noqa: E402
from infermax.cli import app  # noqa: E402

runner = CliRunner()


@pytest.fixture
def table():
    rows = []
    for s, k in (("vllm", 1.0), ("sarathi", 2.0)):
        for o in (8, 32):
            for i in (1, 4, 16):
                for b in (32, 1024):
                    rows.append({"scheduler": s, "I": i, "O": o, "B": b, "Rmax": None, "tps": k * 1000 + 10 * i + o + b,
                                 "evictions": i * o})
    return pd.DataFrame(rows)


def test_lines_panel_per_metric_and_column_line_per_hue(table):
    fig = plot.lines(table, ["tps", "evictions"], x="I", col="O", hue="scheduler", where={"B": 1024})
    axes = np.array(fig.axes).reshape(2, 2)
    assert [ax.get_title() for ax in axes[0]] == ["O=8", "O=32"]
    line = axes[0][1].get_lines()[1]  # tps, O=32, second scheduler in table order (sarathi)
    assert line.get_label() == "sarathi"
    assert list(line.get_xdata()) == [1, 4, 16] and list(line.get_ydata()) == [2000 + 10 * i + 32 + 1024 for i in (1, 4, 16)]
    assert list(axes[1][0].get_lines()[0].get_ydata()) == [8, 32, 128]
    plot.plt.close(fig)


def test_one_metric_by_name_and_a_table_that_is_not_a_dataframe(table, tmp_path):
    """Found by probing the Python API (2026-12-02): ``lines(table, "tps")`` looked for columns "t", "p" and "s", and a
    path or dict in place of the table ended in "has no attribute 'columns'"."""
    by_name = plot.lines(table, "tps", where={"B": 1024})
    by_list = plot.lines(table, ["tps"], where={"B": 1024})
    assert [list(line.get_ydata()) for ax in by_name.axes for line in ax.get_lines()] == \
        [list(line.get_ydata()) for ax in by_list.axes for line in ax.get_lines()] != []
    plot.plt.close(by_name)
    plot.plt.close(by_list)
    for not_a_table in (str(tmp_path / "results.parquet"), {"tps": [1]}):
        for draw in (lambda: plot.lines(not_a_table, "tps"), lambda: plot.heatmap(not_a_table, "tps")):
            with pytest.raises(TypeError, match="table must be a pandas DataFrame"):
                draw()


def test_heatmap_cells_hold_the_metric(table):
    fig = plot.heatmap(table, "tps", x="I", y="O", facet="scheduler", where={"B": 32})
    image = fig.axes[0].get_images()[0].get_array()
    assert image.shape == (2, 3)  # rows: O = 8, 32; columns: I = 1, 4, 16
    assert image[1, 2] == 1000 + 160 + 32 + 32
    plot.plt.close(fig)


def test_ambiguous_cells_name_the_varying_column(table):
    with pytest.raises(ValueError, match=r"several rows per \(O, scheduler, I\); other varying column\(s\): B"):
        plot.lines(table, ["tps"])
    with pytest.raises(ValueError, match="no column"):
        plot.lines(table, ["throughput"], where={"B": 32})
    with pytest.raises(ValueError, match="no rows match"):
        plot.lines(table, ["tps"], where={"B": 7})
    with pytest.raises(ValueError, match="where: no column 'batch'"):
        plot.lines(table, ["tps"], where={"batch": 7})


def test_where_none_selects_missing_values(table):
    assert len(plot.select(table, {"Rmax": "none", "B": 32})) == 12


def test_save_formats(table, tmp_path):
    fig = plot.lines(table, ["tps"], where={"B": 32})
    assert plot.save(fig, tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="figure format must be one of .png, .svg, .pdf"):
        plot.save(plot.lines(table, ["tps"], where={"B": 32}), tmp_path / "f.jpg")


def test_cli_plot(table, tmp_path):
    path = tmp_path / "results.parquet"
    table.to_parquet(path)
    out = tmp_path / "fig.svg"
    result = runner.invoke(app, ["plot", str(path), "--metric", "tps", "--where", "B=1024", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "<svg" in out.read_text()
    result = runner.invoke(app, ["plot", str(path), "--kind", "heatmap", "--metric", "tps", "--where", "B=32",
                                 "--out", str(tmp_path / "h.png")])
    assert result.exit_code == 0 and (tmp_path / "h.png").exists()
    result = runner.invoke(app, ["plot", str(path), "--metric", "tps", "--out", str(out)])
    assert result.exit_code == 2 and "other varying column(s): B" in result.output
    result = runner.invoke(app, ["plot", str(tmp_path / "none.parquet"), "--out", str(out)])
    assert result.exit_code == 2 and "no such results table" in result.output
    result = runner.invoke(app, ["plot", str(path), "--where", "B", "--out", str(out)])
    assert result.exit_code == 2 and "--where takes KEY=VALUE" in result.output


# Issue 18: "makespan (s)" (not "latency (s)"), the Fig. 5 grid's 11 O panels wrapped into rows of at most 4 with
# readable text, and an all-undefined panel (TPOT with O = 1) marked instead of drawn as an empty axis.
@pytest.fixture
def fig5_like():
    os_ = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    rows = [{"scheduler": s, "I": i, "O": o, "makespan_s": i + o + k, "mean_tpot_s": None if o == 1 else 0.01 * o}
            for k, s in enumerate(("vllm", "sarathi")) for o in os_ for i in (1, 16, 256)]
    return pd.DataFrame(rows)


def test_lines_wrap_into_rows_of_four_with_makespan_label(fig5_like):
    fig = plot.lines(fig5_like, ["makespan_s", "mean_tpot_s"], x="I", col="O", hue="scheduler")
    grid = np.array(fig.axes).reshape(6, 4)  # 2 metrics x 3 rows of (4, 4, 3) panels
    assert [ax.get_title() for ax in grid[0]] == ["O=1", "O=2", "O=4", "O=8"]
    assert [ax.get_title() for ax in grid[2][:3]] == ["O=256", "O=512", "O=1024"]
    assert not grid[2][3].axison and not grid[5][3].axison  # the unused place of each metric's last row
    assert {grid[r][0].get_ylabel() for r in range(3)} == {"makespan (s)"}
    assert {grid[r][0].get_ylabel() for r in range(3, 6)} == {"TPOT (s)"}
    assert list(grid[2][2].get_lines()[1].get_ydata()) == [1 + 1024 + 1, 16 + 1024 + 1, 256 + 1024 + 1]
    width_px = fig.get_size_inches()[0] * 110  # plot.save's dpi
    assert width_px < 1600
    assert min(t.get_fontsize() for t in grid[0][0].get_xticklabels() + grid[0][0].get_yticklabels()) >= 9
    plot.plt.close(fig)


def test_a_panel_with_an_undefined_metric_says_so(fig5_like):
    fig = plot.lines(fig5_like, ["mean_tpot_s"], x="I", col="O", hue="scheduler")
    first, second = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in first.texts] == ["undefined (O = 1)"] and not first.get_lines()
    assert not second.texts and len(second.get_lines()) == 2
    plot.plt.close(fig)


def test_wrap_is_a_plot_key_and_checked(fig5_like):
    fig = plot.draw(fig5_like, {"kind": "lines", "metrics": ["makespan_s"], "wrap": 11})
    assert len(fig.axes) == 11 and len({round(ax.get_position().y0, 3) for ax in fig.axes}) == 1
    plot.plt.close(fig)
    with pytest.raises(ValueError, match="wrap must be an integer >= 1"):
        plot.lines(fig5_like, ["makespan_s"], wrap=0)


# Found by probing `infermax plot` by hand (2026-12-02): a metric undefined at every point (TPOT where every O is 1)
# ended in a StopIteration traceback looking for a line to take the legend from; a column of strings as the metric
# ended inside matplotlib; repeated identical rows were reported as varying in column '?'.
def test_a_metric_undefined_everywhere_draws_its_panels_without_a_legend(fig5_like):
    only_o1 = fig5_like[fig5_like["O"] == 1]
    fig = plot.lines(only_o1, ["mean_tpot_s"], x="I", col="O", hue="scheduler")
    assert [t.get_text() for t in fig.axes[0].texts] == ["undefined (O = 1)"] and not fig.legends
    plot.plt.close(fig)
    with pytest.raises(ValueError, match="'mean_tpot_s' is undefined at every selected point"):
        plot.heatmap(only_o1, "mean_tpot_s", x="I", y="O")


def test_a_metric_that_is_not_numeric_is_refused(table, tmp_path):
    with pytest.raises(ValueError, match=r"metric 'scheduler' holds values that are not numbers \(e.g. 'vllm'\)"):
        plot.lines(table, ["scheduler"], where={"B": 32})
    with pytest.raises(ValueError, match="metric 'scheduler' holds values that are not numbers"):
        plot.heatmap(table, "scheduler", where={"B": 32})
    path = tmp_path / "results.parquet"
    table.to_parquet(path)
    result = runner.invoke(app, ["plot", str(path), "-m", "scheduler", "--where", "B=32", "--out",
                                 str(tmp_path / "f.png")])
    assert result.exit_code == 2 and "not numbers" in result.output


def test_repeated_rows_are_named_as_such(table):
    twice = pd.concat([table, table])
    with pytest.raises(ValueError, match=r"with the same configuration \(repeated runs\?\); keep one row per point"):
        plot.lines(twice, ["tps"], where={"B": 32})
