"""The InferMax paper's findings, checked against our sweep results.

Run ``python experiments/findings.py`` after the sweeps (``experiments/README.md``) to print every
check as a Markdown table row: the paper's claim, our number, and whether it reproduces. Each check
is a function of one results table, so the notebooks run the same checks on their reduced grids.
A claim "reproduces" (yes) when the stated comparison holds in our results and, where the paper
gives a magnitude ("up to 2.2x", "up to 6.9%"), ours is within a factor of 2 of it, compared on the
excess over parity (2.2x -> 1.2, 6.9% -> 0.069); "direction only" when the comparison holds but the
magnitude is off by more; "no" when the comparison does not hold. Nothing is tuned to match.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

EXPERIMENTS = Path(__file__).resolve().parent
RESULTS = EXPERIMENTS / "results"


@dataclass(frozen=True)
class Finding:
    """One claim of the paper and what our table says about it."""

    figure: str
    claim: str
    ours: str
    holds: bool | None  # the stated comparison holds; None: this table cannot decide it
    paper_factor: float | None = None  # the paper's magnitude as a factor (6.9% -> 1.069, 2.2x -> 2.2)
    our_factor: float | None = None

    @property
    def verdict(self) -> str:
        if self.holds is None:
            return "n/a"
        if not self.holds:
            return "**no**"
        if self.paper_factor is None or self.our_factor is None:
            return "yes"
        paper, ours = self.paper_factor - 1, self.our_factor - 1
        return "yes" if paper > 0 and ours > 0 and max(paper / ours, ours / paper) <= 2 else "direction only"

    def row(self) -> str:
        return f"| {self.figure} | {self.claim} | {self.ours} | {self.verdict} |"


def ok(table: pd.DataFrame) -> pd.DataFrame:
    return table[table.status == "ok"]


def paired(table: pd.DataFrame, a: str, b: str, metric: str, keys: list[str]) -> pd.DataFrame:
    """Rows of schedulers ``a`` and ``b`` side by side on ``keys`` (columns ``a`` and ``b`` hold ``metric``)."""
    t = ok(table)
    left = t[t.scheduler == a].set_index(keys)[metric].rename(a)
    right = t[t.scheduler == b].set_index(keys)[metric].rename(b)
    return pd.concat([left, right], axis=1, join="inner").reset_index()


def _max_ratio(df: pd.DataFrame, num: str, den: str, keys: list[str]) -> tuple[float, str]:
    ratio = df[num] / df[den]
    if ratio.empty or ratio.isna().all():
        return float("nan"), "no points"
    i = ratio.idxmax()
    return float(ratio[i]), ", ".join(f"{k}={df.loc[i, k]}" for k in keys)


def _share_best(t: pd.DataFrame, metric: str, keys: list[str], name: str, lowest: bool) -> float:
    """Share of points where ``name`` has the best value of ``metric`` (ties included)."""
    best = t.groupby(keys)[metric].transform("min" if lowest else "max")
    mine = t.scheduler == name
    return float((t[metric][mine] == best[mine]).mean())


def _share_near_best(t: pd.DataFrame, metric: str, keys: list[str], name: str, lowest: bool, within: float) -> float:
    best = t.groupby(keys)[metric].transform("min" if lowest else "max")
    mine = t.scheduler == name
    gap = (t[metric][mine] / best[mine] - 1).abs()
    return float((gap <= within).mean())


def fig5(table: pd.DataFrame) -> list[Finding]:
    keys = ["I", "O"]
    t = ok(table)
    out = []
    names = list(dict.fromkeys(t.scheduler))
    low_o = t[t.O <= 64]
    vllm_low_o = _share_best(low_o, "tps", keys, "vllm", lowest=False) if len(low_o) else None
    out.append(Finding("5", "vLLM has the highest TPS, except at high O (frequent evictions)",
                       "highest TPS (ties included) at the share of (I, O) points: " + ", ".join(
                           f"{s} {_share_best(t, 'tps', keys, s, lowest=False):.0%}" for s in names)
                       + (f"; at O <= 64 vLLM {vllm_low_o:.0%}, within 1% of the highest at "
                          f"{_share_near_best(low_o, 'tps', keys, 'vllm', False, 0.01):.0%}" if vllm_low_o is not None else ""),
                       None if vllm_low_o is None else vllm_low_o > 0.5))
    p = paired(table, "vllm", "sarathi", "tps", keys)
    r, at = _max_ratio(p.assign(gap=1 - p.sarathi / p.vllm, one=1.0), "gap", "one", keys)
    out.append(Finding("5", "Sarathi TPS up to 40.9% below vLLM", f"up to {r:.1%} below ({at})", r > 0,
                       1.409, 1 + r))
    p = paired(table, "vllm", "sarathi", "mean_tpot_s", keys)
    r, at = _max_ratio(p, "vllm", "sarathi", keys)
    out.append(Finding("5", "Sarathi TPOT up to 5x lower than vLLM", f"up to {r:.1f}x lower ({at})", r > 1, 5.0, r))
    p = paired(table, "sarathi", "vllm", "mean_ttft_s", keys)
    q = paired(table, "sarathi", "vllm", "mean_tpot_s", keys)
    ttft_lower = (p.vllm < p.sarathi).mean()
    tpot_higher = (q.vllm > q.sarathi).mean()
    out.append(Finding("5", "vLLM: lower TTFT but higher TPOT than Sarathi (the TTFT-TPOT trade-off)",
                       f"vLLM TTFT lower at {ttft_lower:.0%} of points, TPOT higher at {tpot_higher:.0%}",
                       bool(ttft_lower > 0.5 and tpot_higher > 0.5)))
    ev = t.groupby(["scheduler", "O"]).evictions.sum().unstack("O")
    monotone = {s: bool(row.is_monotonic_increasing) for s, row in ev.iterrows()}
    out.append(Finding("5", "Evictions increase with O",
                       "total evictions over I per O: " + "; ".join(
                           f"{s}: {', '.join(str(int(v)) for v in row)}" for s, row in ev.iterrows()),
                       all(monotone.values())))
    falls = []
    for (s, o), g in t.groupby(["scheduler", "O"]):
        g = g.sort_values("I")
        falls.append(g.tps.iloc[-1] < g.tps.iloc[0])
    out.append(Finding("5/6", "TPS declines as I increases", f"TPS at the largest I below TPS at the smallest I in "
                       f"{sum(falls)}/{len(falls)} (scheduler, O) lines", sum(falls) > len(falls) / 2))
    peak_o = t.loc[t.groupby(["scheduler", "I"]).tps.idxmax()]
    interior = ((peak_o.O > t.O.min()) & (peak_o.O < t.O.max())).mean()
    out.append(Finding("6", "TPS peaks at an intermediate O (prefill-dominated at small O, heavy decodes at large O)",
                       f"TPS-maximising O is strictly inside the O range for {interior:.0%} of (scheduler, I); "
                       f"median best O = {int(peak_o.O.median())}", bool(interior > 0.5)))
    o1 = t[(t.O == 1) & (t.I == t.I.max())].set_index("scheduler").mean_kv_util
    if len(o1):
        others = o1.drop("sarathi", errors="ignore")
        out.append(Finding("5", "At O = 1, only Sarathi holds KV (at I = 1024, P = 512 < I)",
                           ", ".join(f"{s} {v:.3f}" for s, v in o1.items()),
                           bool(o1.get("sarathi", 0) > 0 and (others == 0).all())))
    big = t[(t.O == t.O.max()) & (t.scheduler == "sarathi")]
    if len(big):
        out.append(Finding("5", "Sarathi at O = 1024 occupies more than 90% of the KV cache",
                           f"mean KV use {big.mean_kv_util.min():.0%}-{big.mean_kv_util.max():.0%} over I "
                           f"(peak {big.peak_kv_util.max():.0%})", bool(big.mean_kv_util.max() > 0.9)))
    return out


EF_PAIRS = (("vllm", "vLLM", ("6.9%", 1.069), ("1800x", 1800.0), ("13x", 13.0)),
            ("sarathi", "Sarathi", ("1.7%", 1.017), ("91.7%", 1.917), ("6.5x", 6.5)),
            ("sarathi-pc", "Sarathi P=C", ("3.1%", 1.031), None, None))


def fig8(table: pd.DataFrame) -> list[Finding]:
    keys = ["I"]
    out = []
    for name, label, tps_gain, ttft_up, tpot_down in EF_PAIRS:
        p = paired(table, name, f"{name}-ef", "tps", keys)
        r, at = _max_ratio(p, f"{name}-ef", name, keys)
        out.append(Finding("8", f"{label}-ef TPS up to {tps_gain[0]} above {label}", f"up to {r - 1:+.1%} ({at}); "
                           f"ef better at {(p[f'{name}-ef'] > p[name]).mean():.0%} of I", r > 1, tps_gain[1], r))
        if ttft_up:
            p = paired(table, name, f"{name}-ef", "mean_ttft_s", keys)
            r, at = _max_ratio(p, f"{name}-ef", name, keys)
            out.append(Finding("8", f"{label}-ef TTFT up to {ttft_up[0]} higher", f"up to {r:.2f}x ({at})", r > 1,
                               ttft_up[1], r))
            p = paired(table, name, f"{name}-ef", "mean_tpot_s", keys)
            r, at = _max_ratio(p, name, f"{name}-ef", keys)
            out.append(Finding("8", f"{label}-ef TPOT up to {tpot_down[0]} lower", f"up to {r:.2f}x lower ({at})", r > 1,
                               tpot_down[1], r))
    t = ok(table)
    ef = t[t.scheduler.str.endswith("-ef")]
    for i, paper in ((t.I.min(), "98 (I = 1)"), (t.I.max(), "49 (I = 1024)")):
        rows = ef[ef.I == i]
        expected = rows.limit_M / (i + rows.O)  # this table's M/(I+O)
        out.append(Finding("8", f"eviction-free mean running size ~ M/(I+O), paper: {paper}",
                           f"I = {i}, M/(I+O) = {expected.iloc[0]:.1f}: " + ", ".join(
                               f"{s} {v:.1f}" for s, v in zip(rows.scheduler, rows.mean_running)),
                           bool(((rows.mean_running - expected).abs() <= 0.15 * expected).all())))
    return out


def fig9(table: pd.DataFrame) -> list[Finding]:
    keys = ["M", "I"]
    out = []
    claims = {100: ("gain", "2.2x", "2.3x"), 1000: ("gain", "1.2x", "1.3x"), 10000: ("loss", "1.5x", "1.3x")}
    for M, (kind, v_paper, s_paper) in claims.items():
        for name, paper in (("vllm", v_paper), ("sarathi", s_paper)):
            p = paired(table[table.M == M], name, f"{name}-ef", "tps", keys)
            if p.empty:
                continue
            if kind == "gain":
                r, at = _max_ratio(p, name, f"{name}-ef", keys)
                claim = f"M={M}: evictions raise {name} TPS by up to {paper}"
            else:
                r, at = _max_ratio(p, f"{name}-ef", name, keys)
                claim = f"M={M}: evictions lower {name} TPS by up to {paper}"
            out.append(Finding("9", claim, f"up to {r:.2f}x ({at})", r > 1, float(paper[:-1]), r))
    t = ok(table)
    small, large = t.M.min(), t.M.max()
    for M, want in ((small, "sarathi"), (large, "vllm")):
        p = paired(table[table.M == M], "vllm", "sarathi", "tps", keys)
        p = p[p.I <= 16]
        if len(p):
            share = ((p.sarathi > p.vllm) if want == "sarathi" else (p.vllm > p.sarathi)).mean()
            label = "Sarathi beats vLLM at small M" if want == "sarathi" else "vLLM beats Sarathi at large M"
            out.append(Finding("9", f"at small I (<= 16), {label}",
                               f"M={M}: TPS vLLM / Sarathi = " + ", ".join(
                                   f"{v / q:.2f} (I={i})" for i, v, q in zip(p.I, p.vllm, p.sarathi)),
                               bool(share > 0.5)))
    top = t[(t.M == large) & t.scheduler.isin(["sarathi", "sarathi-pc"])]
    if len(top):
        out.append(Finding("9", f"even at M = {large:,}, Sarathi and Sarathi P=C use < 20% of M on average",
                           f"mean KV use at most {top.mean_kv_util.max():.1%}", bool(top.mean_kv_util.max() < 0.2)))
    v = t[t.scheduler == "vllm"]
    if len(v.M.unique()) >= 2:
        lo, hi = sorted(v.M.unique())[-2:]
        a, b = v[v.M == hi].set_index("I").mean_tpot_s.sort_index(), v[v.M == lo].set_index("I").mean_tpot_s
        common = a.index.intersection(b.index)
        grows_i = bool(a.iloc[-1] > a.iloc[0])
        not_below = bool((a[common] >= b[common]).all())
        out.append(Finding("9", "vLLM TPOT grows with M and with I at large M",
                           f"M={hi}: TPOT {a.iloc[0] * 1e3:.0f} ms at I={a.index[0]} -> {a.iloc[-1] * 1e3:.0f} ms at "
                           f"I={a.index[-1]}; above M={lo} at {(a[common] > b[common]).mean():.0%} of I, below at "
                           f"{(a[common] < b[common]).mean():.0%}", grows_i and not_below))
    return out


def fig11(table: pd.DataFrame) -> list[Finding]:
    t = ok(table)
    out = []
    for O in sorted(t.O.unique()):
        part = t[t.O == O]
        best = part.loc[part.groupby(["scheduler", "I"]).tps.idxmax()]
        counts = best.Rmax.value_counts().sort_index()
        text = "TPS-maximising Rmax over (scheduler, I): " + ", ".join(f"{int(k)}: {v}" for k, v in counts.items())
        if O == t.O.min():
            share = (best.Rmax == part.Rmax.max()).mean()
            out.append(Finding("11", f"O = {O}: TPS keeps increasing with Rmax", f"{text} (largest Rmax best at {share:.0%})",
                               bool(share > 0.5)))
        else:
            mode = counts.idxmax()
            out.append(Finding("11", f"O = {O}: TPS peaks at Rmax = 128", f"{text}; most often {int(mode)}", mode == 128))
    return out


def fig12(table: pd.DataFrame) -> list[Finding]:
    t = ok(table)
    out = [Finding("12", "no evictions at B = 32", f"total evictions {int(t.evictions.sum())}", t.evictions.sum() == 0)]
    keys = ["I", "O"]
    share = _share_best(t, "makespan_s", keys, "vllm", lowest=True)
    out.append(Finding("12", "vLLM has the lowest latency",
                       "lowest latency (ties included) at the share of (I, O) points: " + ", ".join(
                           f"{s} {_share_best(t, 'makespan_s', keys, s, lowest=True):.0%}" for s in dict.fromkeys(t.scheduler))
                       + f"; vLLM within 1% of the lowest at {_share_near_best(t, 'makespan_s', keys, 'vllm', True, 0.01):.0%}",
                       share > 0.5))
    p = paired(table, "vllm", "sarathi-nohy", "makespan_s", ["I", "O"])
    by_i = (p["sarathi-nohy"] / p.vllm).groupby(p.I).mean()
    out.append(Finding("12", "Sarathi-nohy latency grows relative to the others as I increases",
                       f"mean latency ratio Sarathi-nohy/vLLM: {by_i.iloc[0]:.2f}x at I={by_i.index[0]}, "
                       f"{by_i.iloc[-1]:.2f}x at I={by_i.index[-1]}", bool(by_i.iloc[-1] > by_i.iloc[0])))
    return out


def a3(table: pd.DataFrame) -> list[Finding]:
    keys = ["mix", "B"]
    out = []
    for metric, label, paper in (("makespan_s", "latency", (1.3, 1.4)), ("mean_ttft_s", "TTFT", (3.0, 2.0)),
                                 ("mean_tpot_s", "TPOT", (1.3, 1.3))):
        for other, factor in zip(("rank-o", "rank-org"), paper):
            p = paired(table, "rank-i", other, metric, keys)
            r, at = _max_ratio(p, other, "rank-i", keys)
            share = (p["rank-i"] < p[other]).mean()
            out.append(Finding("A.3", f"Rank_I {label} up to {factor:g}x lower than {other}",
                               f"up to {r:.2f}x lower ({at}); lower at {share:.0%} of (mix, B)", r > 1, factor, r))
    p = paired(table[table.mix == "LILO+LISO"], "rank-o", "rank-i", "mean_ttft_s", keys)
    if len(p):
        r, at = _max_ratio(p, "rank-i", "rank-o", keys)
        out.append(Finding("A.3", "LILO+LISO: Rank_O has the lowest TTFT (up to 1.6x below Rank_I)",
                           f"Rank_O below Rank_I at {(p['rank-o'] < p['rank-i']).mean():.0%} of B, up to {r:.2f}x ({at})",
                           bool((p["rank-o"] < p["rank-i"]).mean() > 0.5), 1.6, r))
    return out


def results(name: str, reduced: dict | None = None, out_dir: str | Path | None = None) -> pd.DataFrame:
    """The results table of ``experiments/<name>.toml``.

    ``reduced``: ``{"base": {...}, "axes": {...}}`` overrides giving a small grid, swept into
    ``out_dir`` (the notebooks' CI mode); otherwise the saved table, swept first if missing.
    """
    from infermax.sweep import load_spec, parse_spec, run_sweep

    spec_path = EXPERIMENTS / f"{name}.toml"
    if reduced is None:
        saved = RESULTS / name / "results.parquet"
        if not saved.exists():
            run_sweep(load_spec(spec_path), progress=True)
        return pd.read_parquet(saved)
    from infermax.sweep.spec import tomllib

    doc = tomllib.loads(spec_path.read_text())
    base = {**doc.get("base", {}), **reduced.get("base", {})}
    axes = {**doc.get("axes", {}), **reduced.get("axes", {})}
    for key in reduced.get("axes", {}):
        base.pop(key, None)
    for key in reduced.get("base", {}):
        axes.pop(key, None)
    doc.update(base=base, axes=axes)
    doc.pop("plot", None)
    spec = parse_spec(doc, source=spec_path)
    return pd.read_parquet(run_sweep(spec, out_dir or RESULTS / f"{name}-reduced").table)


def show(findings: list[Finding]) -> str:
    """Findings as a Markdown table."""
    return "\n".join(["| fig. | the paper says | our result | reproduced |", "|---|---|---|---|",
                      *(f.row() for f in findings)])


CHECKS = {"fig5_6": fig5, "fig8": fig8, "fig9": fig9, "fig11": fig11, "fig12": fig12, "a3_mixes": a3}


def main(names: list[str]) -> None:
    found = []
    for name in names or CHECKS:
        path = RESULTS / name / "results.parquet"
        if not path.exists():
            raise SystemExit(f"no results for {name}: run `python -m infermax sweep experiments/{name}.toml`")
        found += CHECKS[name](pd.read_parquet(path))
    print(show(found))


if __name__ == "__main__":
    main(sys.argv[1:])
