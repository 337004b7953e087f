"""The semantics of `design.md`, applied batch by batch: state, validation, timing.

`Replayer` is the single implementation of what a batch does to requests. The
engine feeds it every batch a scheduler plans (so a scheduler cannot break a rule
unnoticed) and `replay` feeds it a saved Schedule; both therefore compute metrics
with the same code.
"""

from __future__ import annotations

from typing import Iterable

from .costmodel.base import BatchFeatures, CostModel
from .limits import Limits
from .request import Request
from .schedule import Schedule, ScheduledBatch


class ScheduleViolation(ValueError):
    """A batch breaks a rule; names the batch, the request (if any) and the rule."""

    def __init__(self, batch: int, request: int | None, rule: str, detail: str):
        self.batch, self.request, self.rule = batch, request, rule
        who = f", request {request}" if request is not None else ""
        super().__init__(f"batch {batch}{who}: [{rule}] {detail}")


class RequestState:
    """Mutable progress of one request (the Semantics' ``m``, ``Icur``, ``g``)."""

    __slots__ = (
        "req", "id", "m", "input_tokens", "generated", "evictions",
        "prefill_processed", "first_token_s", "finish_s",
    )

    def __init__(self, req: Request):
        self.req = req
        self.id = req.id
        self.m = 0  # tokens whose KV is cached
        self.input_tokens = req.prompt_tokens  # Icur: grows when evicted in decode phase
        self.generated = 0  # g
        self.evictions = 0
        self.prefill_processed = 0  # prefill tokens processed, refills included
        self.first_token_s: float | None = None
        self.finish_s: float | None = None

    @property
    def in_prefill(self) -> bool:
        return self.m < self.input_tokens

    @property
    def finished(self) -> bool:
        return self.finish_s is not None

    @property
    def remaining_prefill(self) -> int:
        return self.input_tokens - self.m


BATCH_COLUMNS = (
    "batch", "start_s", "duration_s", "end_s", "num_requests", "num_prefill_seqs", "num_decode_seqs",
    "prefill_tokens", "decode_tokens", "generated_tokens", "evictions",
    "kv_tokens_peak", "kv_tokens", "running_peak", "running",
)


class Replayer:
    """Applies batches to request states under limits, timing each with a cost model.

    Per batch: evictions first, then each ``(id, c)``; checks the Semantics and the
    limits (``Σc ≤ C``, prefill tokens ``≤ P``, KV ``≤ M`` and KV holders ``≤ Rmax``
    counting requests that finish in the batch); then frees finished requests.
    """

    def __init__(self, requests: Iterable[Request], limits: Limits, cost_model: CostModel):
        self.limits = limits
        self.cost_model = cost_model
        self.states: dict[int, RequestState] = {}
        for r in requests:
            if r.id in self.states:
                raise ValueError(f"duplicate request id {r.id}")
            self.states[r.id] = RequestState(r)
        self.clock_s = 0.0
        self.kv_tokens = 0  # block-rounded KV of holders
        self.holders = 0  # requests with m > 0
        self.unfinished = len(self.states)
        self.last_generated = 0
        self.batch_rows: list[tuple] = []
        self.batches: list[ScheduledBatch] = []

    def apply(self, batch: ScheduledBatch) -> list[RequestState]:
        """Apply one batch; return the requests it finished. Raises ScheduleViolation."""
        j = len(self.batch_rows)
        lim, states, blocks = self.limits, self.states, self.limits.blocks
        if not batch.items:
            raise ScheduleViolation(j, None, "empty", "a batch must process at least one token")
        evicted = set()
        for rid in batch.evict:
            s = self._state(j, rid)
            if rid in evicted:
                raise ScheduleViolation(j, rid, "evict-twice", "evicted twice in one batch")
            if s.m == 0:
                raise ScheduleViolation(j, rid, "evict-no-kv", "evicted but holds no KV")
            evicted.add(rid)
        # Evictions (recompute): drop KV; in decode phase the generated tokens join the input.
        for rid in batch.evict:
            s = states[rid]
            if s.m >= s.input_tokens:
                s.input_tokens = s.req.prompt_tokens + s.generated
            self.kv_tokens -= blocks(s.m)
            self.holders -= 1
            s.m = 0
            s.evictions += 1

        start = self.clock_s if batch.not_before_s is None else max(self.clock_s, batch.not_before_s)
        feats = BatchFeatures()
        generators: list[RequestState] = []
        seen: set[int] = set()
        for rid, c in batch.items:
            s = self._state(j, rid)
            if rid in seen:
                raise ScheduleViolation(j, rid, "duplicate", "appears twice in the batch")
            if rid in evicted:
                raise ScheduleViolation(j, rid, "evict-and-process", "evicted and processed in the same batch")
            seen.add(rid)
            if s.req.arrival_s > start:
                start = s.req.arrival_s
            m0 = s.m
            if m0 < s.input_tokens:
                if not 1 <= c <= s.input_tokens - m0:
                    raise ScheduleViolation(
                        j, rid, "chunk", f"prefill chunk c={c} outside 1..{s.input_tokens - m0} (m={m0}, Icur={s.input_tokens})")
                feats.add_prefill(c, m0)
                s.prefill_processed += c
                if m0 + c == s.input_tokens:
                    generators.append(s)
            else:
                if c != 1:
                    raise ScheduleViolation(j, rid, "decode", f"decode phase processes exactly 1 token, got c={c}")
                feats.add_decode(m0)
                generators.append(s)
            if m0 == 0:
                self.holders += 1
            self.kv_tokens += blocks(m0 + c) - blocks(m0)
            s.m = m0 + c

        if feats.n_tokens > lim.C:
            raise ScheduleViolation(j, None, "C", f"{feats.n_tokens} tokens > C={lim.C}")
        if feats.prefill_tokens > lim.prefill_budget:
            raise ScheduleViolation(j, None, "P", f"{feats.prefill_tokens} prefill tokens > P={lim.prefill_budget}")
        if self.kv_tokens > lim.M:
            raise ScheduleViolation(j, None, "M", f"KV {self.kv_tokens} tokens > M={lim.M}")
        if lim.Rmax is not None and self.holders > lim.Rmax:
            raise ScheduleViolation(j, None, "Rmax", f"{self.holders} requests hold KV > Rmax={lim.Rmax}")

        duration = self.cost_model.batch_time_s(feats)
        end = start + duration
        kv_peak, holders_peak = self.kv_tokens, self.holders
        finished = []
        for s in generators:
            s.generated += 1
            if s.first_token_s is None:
                s.first_token_s = end
            if s.generated == s.req.output_tokens:
                s.finish_s = end
                self.kv_tokens -= blocks(s.m)
                self.holders -= 1
                s.m = 0
                finished.append(s)
        self.unfinished -= len(finished)
        self.clock_s = end
        self.last_generated = len(generators)
        self.batches.append(batch)
        self.batch_rows.append((
            j, start, duration, end, len(batch.items), feats.n_prefill_seqs, feats.n_decode_seqs,
            feats.prefill_tokens, feats.n_decode_seqs, len(generators), len(batch.evict),
            kv_peak, self.kv_tokens, holders_peak, self.holders,
        ))
        return finished

    def _state(self, j: int, rid: int) -> RequestState:
        s = self.states.get(rid)
        if s is None:
            raise ScheduleViolation(j, rid, "unknown-request", "no such request in the workload")
        if s.finish_s is not None:
            raise ScheduleViolation(j, rid, "finished", f"already finished at {s.finish_s:.6g}s")
        return s

    def check_complete(self) -> None:
        """Raise unless every request generated all its output tokens."""
        if self.unfinished:
            left = [s for s in self.states.values() if s.finish_s is None]
            s = left[0]
            raise ScheduleViolation(
                len(self.batch_rows), s.id, "incomplete",
                f"{len(left)} request(s) unfinished at the end of the schedule; request {s.id} generated "
                f"{s.generated}/{s.req.output_tokens} tokens")


def replay(schedule: Schedule, cost_model: CostModel, limits: Limits | None = None):
    """Validate a Schedule and recompute all metrics; returns a `SimResult`."""
    from .metrics import SimResult

    rp = Replayer(schedule.requests, limits or schedule.limits, cost_model)
    for batch in schedule.batches:
        rp.apply(batch)
    rp.check_complete()
    return SimResult.from_replayer(rp, meta={**schedule.meta, "replayed": True})
