"""The scheduler interface every scheduler implements, and the errors it raises."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..costmodel.base import CostModel
from ..limits import Limits
from ..replay import RequestState
from ..schedule import ScheduledBatch


class SchedulerError(RuntimeError):
    """A scheduler misbehaved: it planned an invalid batch or cannot make progress."""


class NoProgressError(SchedulerError):
    """The scheduler cannot make progress (it would otherwise stall or loop forever)."""


class InfeasibleRequestError(ValueError):
    """A request can never be scheduled under the given limits and policy."""


class PrefillTooLongError(InfeasibleRequestError):
    """A prefill longer than the ``min(C, P)`` tokens that a scheduler which does not chunk prefills can batch. The
    engine adds the workload's longest prompt to the message, so that the user raising C or P knows how far."""


def split_finished_prefills(prefilling: list[RequestState]) -> tuple[list[RequestState], list[RequestState]]:
    """(still prefilling, done): the requests whose prompt is now fully computed (``m >= Icur``) leave the
    prefill phase; both lists keep the given order."""
    done = [s for s in prefilling if s.m >= s.input_tokens]
    if not done:
        return prefilling, done
    return [s for s in prefilling if s.m < s.input_tokens], done


class Scheduler(ABC):
    """Plans one batch at a time over the requests that have arrived.

    The engine calls `add_arrivals` as requests arrive, `next_batch` before each
    batch, and `batch_done` after the batch was applied. Request states are owned
    by the engine's replayer; a scheduler reads them and never mutates them.
    """

    name = "scheduler"
    # The simulation's KV swap time model (`SwapCost`), set by the engine before the first batch;
    # schedulers that swap KV read it to estimate batch times (None: the run cannot swap).
    swap_cost = None

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        """Called after ``batch_done`` of a batch that decoded every KV holder with no prefill and no
        finish (evictions allowed). True promises that the next batches are that batch's items again
        (same order, no evictions) for as long as nothing arrives, nothing finishes and the KV cache
        stays within ``M``, and that ``batch_done`` of such a batch leaves the scheduler unchanged;
        the engine then applies them without asking (``Replayer.repeat_full_decode``). The default,
        False, makes the engine ask for every batch."""
        return False

    # True promises that the scheduler reads ``m``, ``generated`` and ``last_token_s`` of running
    # decode-phase requests only through `cached_tokens`, or after calling `sync_states`; the engine then
    # lets the replayer advance such requests lazily (`Replayer` "lazy decode cohort") and sets both
    # hooks. The default, False, keeps every request state current after every batch.
    lazy_decode_ok = False

    @staticmethod
    def cached_tokens(s: RequestState) -> int:
        """A request's cached tokens ``m`` (replaced by the engine when ``lazy_decode_ok``)."""
        return s.m

    @staticmethod
    def sync_states() -> None:
        """Bring every request state up to date (replaced by the engine when ``lazy_decode_ok``)."""

    @staticmethod
    def cohort_block_openers(items: list) -> int | None:
        """KV blocks opened by decoding ``items`` if the replayer can tell in O(1), else None (replaced by
        the engine when ``lazy_decode_ok``)."""
        return None

    # True: the scheduler can run with ``limits.prefix_caching`` (it plans ``cache_hits`` and counts KV
    # through the cache). The engine then sets ``prefix_cache`` to the replayer's `PrefixCache`, which
    # the scheduler reads (``hit_tokens``, ``hit_new_blocks``, ``free_tokens``) and never mutates.
    supports_prefix_caching = False
    prefix_cache = None

    def repeated_full_decode(self, batch: ScheduledBatch, copies: int) -> None:
        """Called after the engine applied ``copies`` further copies of ``batch`` on the strength of
        `repeats_full_decode` (without `next_batch` / `batch_done` for them): a scheduler that keeps
        totals of its requests' state (such as KV in use) brings them up to date. Default: nothing."""

    # The workload's longest prompt, set by the engine before a run (`simulate`), for `prefill_too_long`'s message.
    longest_prompt_tokens: int | None = None

    def prefill_too_long(self, message: str) -> PrefillTooLongError:
        """`PrefillTooLongError` with ``message`` and, when the engine set it, the workload's longest prompt: raising C
        or P to the failing request's prefill alone would stop the run again at the next longer one (azure-conv at
        C = 4,096: request 127's 4,107 tokens, the longest 14,050)."""
        if self.longest_prompt_tokens is not None:
            message += f" (this workload's longest prompt has {self.longest_prompt_tokens:,} tokens)"
        return PrefillTooLongError(message)

    def expect(self, requests) -> None:
        """Called once by the engine before the first arrival with every request the run may submit (open
        and closed-loop; ``Request`` objects). A scheduler may choose an equivalent, cheaper representation
        from it (BROS: a run without best-effort requests never depends on KV block ids). A scheduler
        driven without it must still be correct. Default: nothing."""

    def __init__(self, limits: Limits, cost_model: CostModel | None = None):
        self.limits = limits
        self.cost_model = cost_model

    @abstractmethod
    def add_arrivals(self, arrived: list[RequestState]) -> None:
        """New requests join the waiting queue."""

    @abstractmethod
    def next_batch(self, now_s: float) -> ScheduledBatch:
        """The next batch (empty ``items`` when nothing can run now)."""

    @abstractmethod
    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        """Update queues after ``batch`` ran; ``finished`` completed in it."""

    def run_summary(self, result) -> dict:
        """Scheduler-specific metrics of a finished run (a `SimResult`), for ``meta["scheduler_summary"]``.

        They may depend on the scheduler's own bookkeeping (so a replay of the Schedule does not
        reproduce them) or on wall-clock time. The default has none."""
        return {}

    def describe_state(self) -> str:
        """A one-line description of the queues, for error messages."""
        return ""
