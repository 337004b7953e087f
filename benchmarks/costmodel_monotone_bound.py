"""Lowest MAPE any non-decreasing function of the token count reaches on each token range of the
A100/H100 Llama-2-7B TP1 non-attention rows (an in-sample LP, HiGHS): a floor for every monotone model.

Usage: ``PYTHONPATH=. python benchmarks/costmodel_monotone_bound.py``
"""

from __future__ import annotations

import numpy as np
import pulp

from infermax.costmodel import profile_folder
from infermax.costmodel.fitting import TOKEN_RANGES, ProfileSpec, build_groups
from infermax.costmodel.measurements import read_measurements


def monotone_mape_floor(y: np.ndarray) -> float:
    """min over non-decreasing f of mean |f_i − y_i| / y_i, in percent (``y`` sorted by token count)."""
    prob = pulp.LpProblem("monotone_floor", pulp.LpMinimize)
    f = [pulp.LpVariable(f"f{i}") for i in range(len(y))]
    e = [pulp.LpVariable(f"e{i}", 0) for i in range(len(y))]
    for i, yi in enumerate(y):
        prob += e[i] >= (f[i] - yi) / yi
        prob += e[i] >= (yi - f[i]) / yi
        if i:
            prob += f[i] >= f[i - 1]
    prob += pulp.lpSum(e) * (100 / len(y))
    prob.solve(pulp.HiGHS(msg=False))
    return pulp.value(prob.objective)


def main() -> None:
    for gpu in ("a100", "h100"):
        folder = profile_folder(gpu, "llama-2-7b", 1)
        groups = build_groups(read_measurements(folder / "measurements.csv"), ProfileSpec.read(folder))
        group = next(g for g in groups if g.name == "non_attention")
        cells = []
        for lo, hi in TOKEN_RANGES:
            mask = (group.tokens >= lo) & (group.tokens <= hi)
            if mask.any():
                y = group.y_ms[mask][np.argsort(group.tokens[mask], kind="stable")]
                cells.append(f"{lo}-{hi}: {monotone_mape_floor(y):.2f}%")
        print(f"{gpu}: lowest in-range MAPE of any non-decreasing f(n):", ", ".join(cells))


if __name__ == "__main__":
    main()
