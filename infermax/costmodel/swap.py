"""Time to move KV between GPU and host memory (swap/checkpoint), a linear bandwidth model.

``time_s(n) = fixed_s + n · per_token_s`` for ``n > 0`` tokens (0 for none), with
``per_token_s = kv_bytes_per_token(tp) / (host_link_gbps · 1e9 · efficiency)``: each GPU moves its
own KV shard over its own host link in parallel. The replayer overlaps swaps with compute, as
BROS and vLLM's asynchronous copy streams do: a batch lasts ``max(compute, time_s(swap-in),
time_s(swap-out))`` (the link is full duplex, so the two directions overlap too).

Defaults (assumptions, not measurements — ``infermax profile`` measures the real link): efficiency
0.8 of the link's per-direction datasheet rate, and ``fixed_s`` = 10 µs per batch that swaps (one
batched copy launch).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

DEFAULT_LINK_EFFICIENCY = 0.8
DEFAULT_FIXED_S = 10e-6


@dataclass(frozen=True)
class SwapCost:
    """Linear host↔GPU copy time per direction: ``fixed_s + tokens · per_token_s``."""

    per_token_s: float
    fixed_s: float = DEFAULT_FIXED_S

    def __post_init__(self) -> None:
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf
                   for x in (self.per_token_s, self.fixed_s)):
            raise ValueError(f"swap cost must be finite non-negative numbers, got per_token_s={self.per_token_s!r}, "
                             f"fixed_s={self.fixed_s!r}")

    @classmethod
    def from_dict(cls, d) -> "SwapCost":
        """From `to_dict`'s form, as a schedule's ``meta["swap_cost"]`` records it; anything else (a hand-edited
        schedule) raises a ValueError saying what is wrong."""
        if not isinstance(d, dict) or "per_token_s" not in d or not set(d) <= {"per_token_s", "fixed_s"}:
            raise ValueError(f"swap cost must be an object with per_token_s (and fixed_s), got {d!r}")
        return cls(**d)

    def time_s(self, tokens: int) -> float:
        """Seconds to copy ``tokens`` tokens' KV in one direction (0 for none)."""
        return self.fixed_s + tokens * self.per_token_s if tokens > 0 else 0.0

    @classmethod
    def for_system(cls, gpu: str, model: str, tp: int = 1, host_link_gbps: float | None = None,
                   efficiency: float = DEFAULT_LINK_EFFICIENCY) -> "SwapCost":
        """From the model's KV bytes per token and the GPU's host link (``host_link_gbps`` overrides it)."""
        from ..models import get_gpu, get_model

        gbps = get_gpu(gpu).host_link_gbps if host_link_gbps is None else host_link_gbps
        if not gbps > 0 or not 0 < efficiency <= 1:
            raise ValueError(f"host link bandwidth must be > 0 and efficiency in (0, 1], got {gbps}, {efficiency}")
        return cls(get_model(model).kv_bytes_per_token(tp) / (gbps * 1e9 * efficiency))

    def to_dict(self) -> dict:
        return asdict(self)
