"""BROS's round-robin baseline (RR): RT and BE FCFS queues served in alternate iterations.

Each iteration serves one class (``request_class == "be"`` or not), alternating; when the class
whose turn it is has nothing that can run, the other class is served. Within the class the
iteration is Algorithm 1 with two FCFS groups, the class's running requests then its waiting ones
(by arrival; vLLM's order), mixing prefill and decode (the BROS engine mixes them), whole prefills
(no chunking), each group stopping at its first candidate that does not fit; a running request's
``M`` failure evicts (recompute) the latest-arrived running request of either class, else itself
(no bidirectional KV). Block size and token budget come from the
limits (the paper: block 16 for every system).

Each class's waiting requests are kept sorted by (arrival, id), updated on arrivals, admissions and
evictions, and handed to Algorithm 1 lazily: an iteration reads only the prefix it uses (the waiting
group stops at its first failure) instead of sorting the whole queue (design.md, BROS decision 13).
"""

from __future__ import annotations

from bisect import bisect_left, insort

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
        self._waiting_by_class: dict[bool, list[tuple[float, int]]] = {False: [], True: []}  # (arrival, id)

    @staticmethod
    def _key(s) -> tuple[float, int]:
        return (s.req.arrival_s, s.id)

    def _waiting_list(self, s) -> list[tuple[float, int]]:
        return self._waiting_by_class[s.req.request_class == "be"]

    def add_arrivals(self, arrived) -> None:
        super().add_arrivals(arrived)
        for s in arrived:
            insort(self._waiting_list(s), self._key(s))

    def _groups(self):
        be = self.turn_be
        running = [s for s in self.running if (s.req.request_class == "be") == be]
        by_id = self._by_id
        waiting = (by_id[rid] for _, rid in self._waiting_by_class[be])
        return [(running, True), (waiting, True)], self.running

    def next_batch(self, now_s: float) -> ScheduledBatch:
        batch = super().next_batch(now_s)
        if not batch.items:  # nothing of this class can run: serve the other class
            self.turn_be = not self.turn_be
            batch = super().next_batch(now_s)
        self.served_be = self.turn_be
        return batch

    def batch_done(self, batch: ScheduledBatch, finished) -> None:
        admitted = [self._by_id[rid] for rid, _ in batch.items if rid not in self._running_ids]
        super().batch_done(batch, finished)
        for s in admitted:
            lst = self._waiting_list(s)
            del lst[bisect_left(lst, self._key(s))]
        for rid in batch.evict:
            s = self._by_id[rid]
            insort(self._waiting_list(s), self._key(s))
        self.turn_be = not self.served_be

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        return False
