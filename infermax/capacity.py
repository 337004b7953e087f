"""Effective throughput: the highest request rate whose SLO attainment stays at or above a threshold.

``attainment(rate)`` simulates the ``RunConfig`` with ``rate`` (Poisson or Gamma arrivals) for each
seed and averages the runs' ``slo_attainment``. Within one seed every rate sees the same requests
and the same arrival draws scaled by ``1/rate`` (NumPy's exponential and gamma samplers scale one
standard draw), so attainment differs between rates only through the load: common random numbers.

The search (``search_capacity``) is deterministic: bracketing from ``start_rate`` by doubling (while
the threshold holds) or halving (while it does not), then bisection until ``hi − lo ≤ rel_tol·hi``;
it returns ``lo``, the highest rate evaluated that meets the threshold with a rate above it that
does not. Attainment need not be monotone in the rate; the search then finds one such boundary, not
necessarily the highest. Results are memoised per rate, so several thresholds share evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from .config import RunConfig


@dataclass
class CapacityResult:
    """Per threshold the rate found (None: even ``min_rate`` misses it; ``max_rate`` if never missed)."""

    rates: dict[float, float | None]
    evaluations: dict[float, float] = field(default_factory=dict)  # rate -> mean attainment
    capped: dict[float, bool] = field(default_factory=dict)  # threshold met even at max_rate


def attainment_at(config: RunConfig, rate: float, seeds: Sequence[int]) -> float:
    """Mean ``slo_attainment`` over ``seeds`` of ``config`` at ``rate`` requests/s."""
    if config.arrival not in ("poisson", "gamma"):
        raise ValueError(f"capacity search needs Poisson or Gamma arrivals, got {config.arrival!r}")
    total = 0.0
    for seed in seeds:
        summary = replace(config, rate=rate, seed=seed).simulate().summary
        if "slo_attainment" not in summary:
            raise ValueError("the workload has no latency targets: set slo, a dataset preset (--slo), or slo_ttft_s / "
                             "slo_tbt_s (--slo-ttft / --slo-tbt)")
        total += summary["slo_attainment"]
    return total / len(seeds)


def search_capacity(attainment: Callable[[float], float], thresholds: Sequence[float], start_rate: float = 1.0,
                    rel_tol: float = 0.05, min_rate: float = 1e-3, max_rate: float = 1e4,
                    on_eval: Callable[[float, float], None] | None = None) -> CapacityResult:
    """Highest rate with ``attainment(rate) >= threshold`` for each threshold (see the module docstring)."""
    for t in thresholds:
        if not 0 < t <= 1:
            raise ValueError(f"attainment thresholds are fractions in (0, 1], got {t}")
    if not 0 < rel_tol < 1:
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol}")
    if not 0 < min_rate <= start_rate <= max_rate:
        raise ValueError(f"need 0 < min_rate <= start_rate <= max_rate, got {min_rate}, {start_rate}, {max_rate}")
    memo: dict[float, float] = {}

    def att(rate: float) -> float:
        if rate not in memo:
            memo[rate] = attainment(rate)
            if on_eval is not None:
                on_eval(rate, memo[rate])
        return memo[rate]

    result = CapacityResult({}, memo)
    for threshold in sorted(thresholds, reverse=True):
        lo, hi = None, None
        rate = start_rate
        if att(rate) >= threshold:
            lo = rate
            while hi is None:
                if rate >= max_rate:
                    break
                rate = min(rate * 2, max_rate)
                if att(rate) >= threshold:
                    lo = rate
                else:
                    hi = rate
        else:
            hi = rate
            while lo is None and rate > min_rate:
                rate = max(rate / 2, min_rate)
                if att(rate) >= threshold:
                    lo = rate
                else:
                    hi = rate
        if lo is None or hi is None:
            result.rates[threshold] = lo
            result.capped[threshold] = hi is None
            continue
        while hi - lo > rel_tol * hi:
            mid = (lo + hi) / 2
            if att(mid) >= threshold:
                lo = mid
            else:
                hi = mid
        result.rates[threshold] = lo
        result.capped[threshold] = False
    return result
