"""Objectives the solver minimises, defined once on a replayed `SimResult` so solver and replayer agree.

``makespan`` is the paper's total latency (last batch end − first arrival); ``latency`` the sum of
request latencies (finish − arrival); ``ttft`` the mean time to first token. An `Objective` is a
non-negative linear combination of the three (all are non-decreasing in every batch time, which is
what lets the MILP bound batch times from below only, see docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPONENTS = ("makespan", "latency", "ttft")


@dataclass(frozen=True)
class Objective:
    """``w_makespan·makespan_s + w_latency·Σ latency_s + w_ttft·mean TTFT_s`` (seconds)."""

    makespan: float = 0.0
    latency: float = 0.0
    ttft: float = 0.0

    def __post_init__(self) -> None:
        for name in COMPONENTS:
            w = getattr(self, name)
            if not (isinstance(w, (int, float)) and w >= 0 and w == w and w != float("inf")):
                raise ValueError(f"objective weight {name}={w!r} must be a finite number >= 0")
        if not any(getattr(self, n) for n in COMPONENTS):
            raise ValueError("objective has no positive weight; give at least one of " + ", ".join(COMPONENTS))

    @classmethod
    def parse(cls, text: str) -> "Objective":
        """``makespan`` | ``latency`` | ``ttft`` | a combination such as ``makespan=1,ttft=0.5``."""
        weights: dict[str, float] = {}
        for part in text.replace(" ", "").split(","):
            if not part:
                continue
            name, _, w = part.partition("=")
            if name not in COMPONENTS:
                raise ValueError(f"unknown objective component {name!r}; choose from {', '.join(COMPONENTS)}")
            try:
                weights[name] = weights.get(name, 0.0) + (float(w) if w else 1.0)
            except ValueError:
                raise ValueError(f"objective weight for {name!r} is not a number: {w!r}") from None
        return cls(**weights)

    def weights(self) -> dict[str, float]:
        return {n: getattr(self, n) for n in COMPONENTS if getattr(self, n)}

    def __str__(self) -> str:
        w = self.weights()
        if len(w) == 1 and next(iter(w.values())) == 1:
            return next(iter(w))
        return ",".join(f"{n}={v:g}" for n, v in w.items())

    def components(self, result) -> dict[str, float]:
        """The three metrics (seconds) of a replayed `SimResult`."""
        return {
            "makespan": float(result.summary["makespan_s"]),
            "latency": float(result.requests["latency_s"].sum()),
            "ttft": float(result.requests["ttft_s"].mean()),
        }

    def value(self, result) -> float:
        """The objective of a replayed `SimResult` (seconds)."""
        comp = self.components(result)
        return sum(w * comp[n] for n, w in self.weights().items())

    def mean_latency_s(self, value_s: float | None, requests: int) -> float | None:
        """The mean latency per request that ``value_s`` of a sum-of-latencies objective (its only component, any
        weight) stands for: what users read off a latency sum of tens of thousands of seconds; None for any other
        objective or value."""
        w = self.weights()
        if value_s is None or requests < 1 or set(w) != {"latency"}:
            return None
        return value_s / (w["latency"] * requests)
