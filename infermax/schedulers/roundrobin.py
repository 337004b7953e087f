"""BROS's round-robin baseline (RR): RT and BE FCFS queues served in alternate iterations.

Each iteration serves one class (``request_class == "be"`` or not), alternating; when the class
whose turn it is has nothing that can run, the other class is served. Within the class the
iteration is Algorithm 1 with two FCFS groups, the class's running requests then its waiting ones
(by arrival; vLLM's order), mixing prefill and decode (the BROS engine mixes them), whole prefills
(no chunking), each group stopping at its first candidate that does not fit; a running request's
``M`` failure evicts (recompute) the latest-arrived running request of either class, else itself
(no bidirectional KV). Block size and token budget come from the
limits (the paper: block 16 for every system).
"""

from __future__ import annotations

from ..costmodel.base import CostModel
from ..limits import Limits
from ..schedule import ScheduledBatch
from .algorithm1 import Algorithm1Policy, Algorithm1Scheduler

RR_POLICY = Algorithm1Policy("rank", hybrid=True, chunked_prefill=False, evict_for="running", rank_by="arrival")


class RoundRobinScheduler(Algorithm1Scheduler):
    """Alternating RT-only and BE-only iterations; see the module docstring."""

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, name: str = "roundrobin"):
        super().__init__(limits, RR_POLICY, cost_model, name=name)
        self.turn_be = False  # the class whose turn it is

    def _groups(self):
        be = self.turn_be
        running = [s for s in self.running if (s.req.request_class == "be") == be]
        waiting = sorted((s for s in self.waiting if (s.req.request_class == "be") == be),
                         key=lambda s: (s.req.arrival_s, s.id))
        return [(running, True), (waiting, True)], self.running

    def next_batch(self, now_s: float) -> ScheduledBatch:
        batch = super().next_batch(now_s)
        if not batch.items:  # nothing of this class can run: serve the other class
            self.turn_be = not self.turn_be
            batch = super().next_batch(now_s)
        self.served_be = self.turn_be
        return batch

    def batch_done(self, batch: ScheduledBatch, finished) -> None:
        super().batch_done(batch, finished)
        self.turn_be = not self.served_be

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        return False
