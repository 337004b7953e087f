"""Scalar hot-path cost: piecewise and roofline ``batch_time_s`` relative to the linear model's, one run.

Usage: ``PYTHONPATH=. python benchmarks/costmodel_speed.py`` (A100 Llama-2-7B TP=1 profile; 200,000 random batches).
"""

from __future__ import annotations

import time

import numpy as np

from infermax.costmodel import BatchFeatures, load_cost_model


def batches(count: int, seed: int = 0) -> list[BatchFeatures]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        f = BatchFeatures()
        if rng.random() < 0.3:
            f.add_prefill(int(rng.integers(1, 4096)), int(rng.integers(0, 4096)))
        for m in rng.integers(0, 4096, rng.integers(0, 64)):
            f.add_decode(int(m))
        out.append(f)
    return out


def seconds(model, work: list[BatchFeatures]) -> float:
    start = time.perf_counter()
    for f in work:
        model.batch_time_s(f)
    return time.perf_counter() - start


def main() -> None:
    work = batches(200_000)
    base = seconds(load_cost_model(kind="linear"), work)
    print(f"linear: {base:.3f} s ({len(work) / base:,.0f} batches/s)")
    for kind in ("piecewise", "roofline"):
        t = seconds(load_cost_model(kind=kind), work)
        print(f"{kind}: {t:.3f} s, {t / base:.2f}x linear")


if __name__ == "__main__":
    main()
