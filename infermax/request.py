"""The request: the unit of work every workload produces and every scheduler consumes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request.

    ``prompt_tokens`` is the paper's ``I``, ``output_tokens`` its ``O`` (tokens to
    generate, the first one produced by the batch that completes the prompt).
    ``ttft_slo_s`` / ``tbt_slo_s``: optional latency targets (time to first token; 99th
    percentile of the request's own times between tokens); ``None`` = no target.
    ``tpot_slo_s``: optional target on the mean time per output token (BROS's TPOT).
    ``request_class``: an optional service-class label (e.g. ``"rt"`` real-time, ``"be"``
    best-effort); schedulers may read it, metrics group by it.
    ``predicted_output_tokens``: an optional predicted ``O`` (a length predictor's output), the only
    output length a scheduler that claims not to know ``O`` may read.
    ``closed_loop_group``: closed-loop submission (e.g. BROS's best-effort batches). The requests of
    the lowest group arrive at their ``arrival_s``; each later group is submitted when every request
    of the group before it has finished, at ``max(arrival_s, that finish time)`` (the engine records
    the realised time as the request's ``arrival_s`` in its result). None: an ordinary request.
    ``content``: the prompt's token content for automatic prefix caching, as segments
    ``((segment_id, tokens), ...)`` summing to ``prompt_tokens``; two requests whose contents agree on
    their first ``k`` tokens share those tokens' KV blocks (`infermax.prefix_cache`). Segment ids are
    integers ``>= 0`` chosen by the workload (a system prompt, a conversation turn); a request's own
    output is the segment `output_segment(id)`, so a later turn can quote it. None: the prompt is a
    segment of its own (`prompt_segment(id)`), shared with nothing.
    ``priority``: an optional integer scheduling priority, lower first (vLLM's ``priority`` request
    argument, read by priority-policy schedulers such as ``vllm-v1-priority``); None: the default (0).
    """

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    tpot_slo_s: float | None = None
    request_class: str | None = None
    predicted_output_tokens: int | None = None
    closed_loop_group: int | None = None
    content: tuple[tuple[int, int], ...] | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        # Numbers from numpy or pandas (a DataFrame row's np.int64, an np.float32) are kept as plain Python numbers:
        # a request holding an np.int64 simulated, but its Schedule could not be written (not JSON serialisable).
        for name in ("id", "prompt_tokens", "output_tokens", "predicted_output_tokens", "closed_loop_group",
                     "priority"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, Integral):
                    # (4.5 tokens would be simulated as such; a schedule file's 1.5 became 1 before it was refused)
                    what = " (or None)" if name == "priority" else ""
                    raise ValueError(f"request {self.id!r}: {name} must be an integer{what}, got {value!r}")
                if type(value) is not int:
                    object.__setattr__(self, name, int(value))
        for name in ("arrival_s", "ttft_slo_s", "tbt_slo_s", "tpot_slo_s"):
            value = getattr(self, name)
            if value is not None or name == "arrival_s":
                if isinstance(value, bool) or not isinstance(value, Real):
                    raise ValueError(f"request {self.id}: {name} must be a number, got {value!r}")
                if type(value) is not float and type(value) is not int:
                    object.__setattr__(self, name, float(value))
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.id}: output_tokens must be >= 1, got {self.output_tokens}")
        if not 0 <= self.arrival_s < math.inf:
            raise ValueError(f"request {self.id}: arrival_s must be a finite number >= 0, got {self.arrival_s}")
        if self.predicted_output_tokens is not None and self.predicted_output_tokens < 1:
            raise ValueError(
                f"request {self.id}: predicted_output_tokens must be >= 1, got {self.predicted_output_tokens}")
        if self.closed_loop_group is not None and self.closed_loop_group < 0:
            raise ValueError(f"request {self.id}: closed_loop_group must be an integer >= 0, got {self.closed_loop_group!r}")
        if self.content is not None:
            object.__setattr__(self, "content", _check_content(self.id, self.content, self.prompt_tokens))
        for name in ("ttft_slo_s", "tbt_slo_s", "tpot_slo_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"request {self.id}: {name} must be > 0 (or None), got {value}")

    @property
    def has_slo(self) -> bool:
        """True if the request carries a TTFT, TBT or TPOT target."""
        return self.ttft_slo_s is not None or self.tbt_slo_s is not None or self.tpot_slo_s is not None

    @property
    def peak_kv_tokens(self) -> int:
        """KV tokens held when the last token is generated: ``I + O - 1``."""
        return self.prompt_tokens + self.output_tokens - 1


def prompt_segment(request_id: int) -> int:
    """The segment id of the prompt of a request without ``content`` (negative: never a workload's)."""
    return -2 * request_id - 1


def output_segment(request_id: int) -> int:
    """The segment id of a request's generated tokens (negative: never a workload's)."""
    return -2 * request_id - 2


def _check_content(request_id: int, content, prompt_tokens: int) -> tuple[tuple[int, int], ...]:
    """``content`` as a tuple of ``(segment_id, tokens)`` pairs, checked (JSON gives lists)."""
    try:
        pairs = tuple((int(seg), int(n)) for seg, n in content)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"request {request_id}: content must be (segment_id, tokens) pairs, got {content!r}") from exc
    if any(n < 1 for _, n in pairs):
        raise ValueError(f"request {request_id}: every content segment needs >= 1 token, got {pairs!r}")
    total = sum(n for _, n in pairs)
    if total != prompt_tokens:
        raise ValueError(f"request {request_id}: content covers {total} tokens, prompt_tokens is {prompt_tokens}")
    return pairs
