"""How far from optimal? For every point of the paper's grids: each scheduler's objective, the best schedule
the search finds, the aggregate lower bound, and the certified gap (best found ÷ lower bound − 1).

Grids (the committed sweep results give the registered schedulers' objectives; nothing is re-simulated for
them): ``fig5`` (B = 1,024, I, O ∈ 1..1,024), ``fig8`` (O = B = 1,024), ``fig12`` (B = 32), ``a3`` (the
appendix A.3 mixes), and ``azure`` (the first 2,000 requests of the Azure conversation trace with their
arrival times, simulated here). All with the paper's linear A100 Llama-2-7B model, C = 4,096, M = 100K.

    PYTHONPATH=. python experiments/optimality_gap.py --grid fig5 --objective makespan --search-limit 10 \
        --out runs/optimality_gap            # one grid, one objective; resumable (a file per point)
    PYTHONPATH=. python experiments/optimality_gap.py --report runs/optimality_gap   # tables + figures

Results go to ``--out`` (never to tracked files unless you point it there); the committed copy lives in
``experiments/results/optimality_gap/`` and was produced by the commands in
``experiments/results/optimality_gap/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.engine import simulate  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.workload import fixed, heterogeneous_mix, load_trace  # noqa: E402
from solvers.lower_bound import BoundUnavailable, LowerBounder  # noqa: E402
from solvers.objective import Objective  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
LIMITS = Limits(C=4096, M=100_000)
METRIC = {"makespan": "makespan_s", "latency": "mean_latency_s", "ttft": "mean_ttft_s"}
GRIDS = {"fig5": "fig5_6", "fig8": "fig8", "fig12": "fig12", "a3": "a3_mixes"}


def _points(grid: str) -> list[dict]:
    """One dict per point: its keys, the workload builder's arguments and the schedulers' committed metrics."""
    if grid == "azure":
        return [{"point": "azure-conv-2000", "trace": "azure-conv", "limit": 2000}]
    df = pd.read_parquet(RESULTS / GRIDS[grid] / "results.parquet")
    df = df[df.status == "ok"] if "status" in df else df
    keys = ["mix", "B"] if grid == "a3" else ["I", "O", "B"]
    out = []
    for values, g in df.groupby(keys, sort=True):
        point = dict(zip(keys, values))
        point["point"] = "_".join(f"{k}{v}" for k, v in point.items())
        point["schedulers"] = {row.scheduler: {m: float(getattr(row, m)) for m in METRIC.values()} for row in g.itertuples()}
        out.append(point)
    return out


def _requests(point: dict):
    if "trace" in point:
        return load_trace(point["trace"], limit=point["limit"])
    if "mix" in point:
        return heterogeneous_mix(point["mix"], int(point["B"]), seed=0)
    return fixed(int(point["I"]), int(point["O"]), int(point["B"]))


def _objective_value(metrics: dict, name: str, n: int) -> float:
    v = metrics[METRIC[name]]
    return v * n if name == "latency" else v


SEARCH_COLUMNS = ("search_s", "search_method", "search_wall_s", "search_evaluations", "search_evictions")


def run_point(grid: str, point: dict, objective: str, search_limit_s: float, cost, reuse: dict | None = None,
              rerun: bool = False) -> dict:
    """One row. ``reuse``: a previous row of the same point and objective whose search columns are kept (the
    search is not run again, only the bound is recomputed), unless ``rerun``: then the search runs and the
    better of the two is kept."""
    reqs = _requests(point)
    obj = Objective(**{objective: 1})
    schedulers = point.get("schedulers")
    if schedulers is None:  # simulate the trace slice here
        schedulers = {}
        for name in ("vllm", "sarathi", "sarathi-pc"):
            try:
                res = simulate(reqs, name, LIMITS, cost)
            except Exception as exc:  # noqa: BLE001 - recorded, e.g. a prompt vLLM cannot batch
                schedulers[name] = {"error": str(exc)}
                continue
            schedulers[name] = {m: float(res.summary[m]) for m in METRIC.values()}
    values = {s: _objective_value(m, objective, len(reqs)) for s, m in schedulers.items() if "error" not in m}
    t = time.perf_counter()
    try:
        lb = LowerBounder(reqs, LIMITS, cost).of(obj).value_s
    except BoundUnavailable as exc:
        lb = float("nan")
        print(f"  {point['point']}: {exc}", file=sys.stderr)
    bound_wall = time.perf_counter() - t
    row = {"grid": grid, "point": point["point"], "objective": objective, "requests": len(reqs),
           **{k: point[k] for k in ("I", "O", "B", "mix") if k in point},
           **{f"{s}_s": v for s, v in values.items()}, "lower_bound_s": lb, "bound_wall_s": bound_wall}
    best_name = min(values, key=values.get)
    row.update(best_registered=best_name, best_registered_s=values[best_name])
    best = values[best_name]
    reused = reuse is not None and isinstance(reuse.get("search_method"), str)
    if search_limit_s > 0 and (rerun or not reused):
        from solvers.search import search

        t = time.perf_counter()
        found = search(reqs, LIMITS, cost, obj, time_limit_s=search_limit_s)
        row.update(search_s=found.value_s, search_method=found.method, search_wall_s=time.perf_counter() - t,
                   search_evaluations=found.evaluations,
                   search_evictions=sum(len(b.evict) for b in found.schedule.batches) if found.schedule else None)
        best = min(best, found.value_s)
    if reused and not float(reuse["search_s"]) >= row.get("search_s", math.inf):  # the earlier search was better
        row.update({k: reuse[k] for k in SEARCH_COLUMNS if k in reuse}, search_reused=True,
                   search_from=reuse.get("search_from"))
        best = min(best, float(reuse["search_s"]))
    row["best_s"] = best
    row["gap_registered"] = values[best_name] / lb - 1 if lb > 0 else math.inf
    row["gap"] = best / lb - 1 if lb > 0 else math.inf
    return row


def run(grid: str, objective: str, search_limit_s: float, out: Path, reuse_from: list[Path] | None = None,
        rerun: bool = False, only: list[str] | None = None) -> None:
    cost = load_cost_model(kind="linear")
    previous: dict = {}
    for path in reuse_from or []:  # the best search result of each point over the given tables
        old = pd.read_parquet(path)
        old = old[(old.grid == grid) & (old.objective == objective) & old.search_s.notna()]
        for r in old.to_dict("records"):
            if r["point"] not in previous or r["search_s"] < previous[r["point"]]["search_s"]:
                previous[r["point"]] = {**r, "search_from": str(path)}
    folder = out / "points" / grid / objective
    folder.mkdir(parents=True, exist_ok=True)
    points = [p for p in _points(grid) if not only or p["point"] in only]
    for i, point in enumerate(points, 1):
        path = folder / f"{point['point']}.json"
        if path.exists():
            continue
        row = run_point(grid, point, objective, search_limit_s, cost, previous.get(point["point"]), rerun)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(row))
        tmp.replace(path)
        print(f"[{i}/{len(points)}] {grid} {objective} {point['point']}: registered {row['gap_registered']:.2%}, "
              f"best {row['gap']:.2%}", flush=True)


def collect(out: Path) -> pd.DataFrame:
    rows = [json.loads(p.read_text()) for p in sorted((out / "points").rglob("*.json"))]
    return pd.DataFrame(rows)


def report(out: Path) -> str:
    df = collect(out)
    if df.empty:
        return "no results"
    df.to_parquet(out / "results.parquet", index=False)
    lines = ["| grid | objective | points | median gap (registered) | median gap (best) | ≤ 5% | ≤ 10% | max gap (best) | worst point |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (grid, obj), g in df.groupby(["grid", "objective"], sort=False):
        worst = g.loc[g.gap.idxmax()]
        lines.append(f"| {grid} | {obj} | {len(g)} | {g.gap_registered.median():.2%} | {g.gap.median():.2%} | "
                     f"{(g.gap <= 0.05).mean():.0%} | {(g.gap <= 0.10).mean():.0%} | {g.gap.max():.2%} | {worst.point} |")
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    _figures(df, out)
    return table


def _figures(df: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    for obj, g in df[df.grid == "fig5"].groupby("objective"):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
        for ax, col, title in ((axes[0], "gap_registered", "best registered scheduler"), (axes[1], "gap", "best found")):
            piv = g.pivot_table(index="O", columns="I", values=col)
            im = ax.imshow(piv.values * 100, origin="lower", cmap="viridis", vmin=0,
                           vmax=max(5, float(np.nanmax(g.gap_registered.values)) * 100))
            ax.set_xticks(range(len(piv.columns)), piv.columns, rotation=90)
            ax.set_yticks(range(len(piv.index)), piv.index)
            ax.set_xlabel("I (prompt tokens)")
            ax.set_ylabel("O (output tokens)")
            ax.set_title(f"{title}: gap to the lower bound (%)")
            fig.colorbar(im, ax=ax, shrink=0.8)
        fig.suptitle(f"Fig. 5 grid (B = 1,024), {obj}: certified optimality gap")
        fig.savefig(figs / f"fig5_gap_{obj}.png", dpi=110)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for (grid, obj), g in df.groupby(["grid", "objective"]):
        xs = np.sort(g.gap.values * 100)
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=f"{grid} {obj}")
    ax.axvline(5, color="grey", ls="--", lw=0.8)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("certified gap: best found ÷ lower bound − 1 (%)")
    ax.set_ylabel("share of points")
    ax.legend(fontsize=8)
    fig.savefig(figs / "gap_distribution.png", dpi=110)
    plt.close(fig)


def findings(df: pd.DataFrame) -> list:
    """The paper's claims about optimal schedules, checked against a results table (`experiments/findings.py`)."""
    from findings import Finding

    out = []
    mk = df[df.objective == "makespan"]
    if not mk.empty:
        saving = 1 - mk.best_s / mk.best_registered_s
        worst = mk.loc[saving.idxmax()]
        s = float(saving.max())
        out.append(Finding("§1, §5", "30% of latency can still be saved over current schedulers (CSP optimum)",
                           f"best schedule found is up to {s:.1%} faster than the best scheduler the paper's figure compares "
                           f"({worst.grid} {worst.point}); certified gap there {worst.gap:.1%}", s > 0.01,
                           paper_factor=1 / 0.7, our_factor=1 / (1 - s)))
        pressured = mk[mk.gap_registered > 0.05]
        if not pressured.empty and "search_evictions" in pressured:
            evicting = int((pressured.search_evictions.fillna(0) > 0).sum())
            out.append(Finding("§1, §4.5", "under memory pressure the optimal schedule preempts (recomputes) short "
                               "requests; avoiding preemption costs up to 30% more GPU time",
                               f"at the {len(pressured)} points where the registered schedulers are > 5% above the "
                               f"bound, {evicting} of the best schedules found evict; the eviction-free ones are within "
                               f"{pressured[pressured.search_evictions.fillna(0) == 0].gap.max():.1%} of the bound "
                               "(clairvoyant admission, not preemption, closes the gap)" if evicting < len(pressured)
                               else f"all {len(pressured)} best schedules found at those points evict",
                               evicting > len(pressured) // 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", choices=[*GRIDS, "azure"], nargs="+", default=list(GRIDS))
    ap.add_argument("--objective", choices=list(METRIC), nargs="+", default=["makespan"])
    ap.add_argument("--search-limit", type=float, default=10.0, help="seconds of schedule search per point (0: none)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "optimality_gap")
    ap.add_argument("--reuse-search", type=Path, nargs="+", metavar="PARQUET",
                    help="take each point's search columns from the best search of these earlier results.parquet "
                         "files (the search is not run again there; the bound and the gaps are recomputed)")
    ap.add_argument("--points", nargs="+", metavar="NAME", help="only these points (e.g. I256_O1024_B1024)")
    ap.add_argument("--rerun-search", action="store_true",
                    help="with --reuse-search: run the search anyway and keep the better of it and the reused one")
    ap.add_argument("--report", type=Path, help="only collect the points under this folder into tables and figures")
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
        return
    for grid in args.grid:
        for obj in args.objective:
            run(grid, obj, args.search_limit, args.out, args.reuse_search, args.rerun_search, args.points)
    print(report(args.out))


if __name__ == "__main__":
    main()
