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

The running requests of each class are counted. When every running request is of the class being
served, its running group is Algorithm 1's decode list itself (the same requests in the same order:
whole prefills leave no running request in prefill phase), so the decode fast path and the replayer's
lazy decode cohort apply; a turn whose class has nothing running or waiting is passed at once (its plan
would be empty). Decisions are unchanged (`tests/test_bros_equivalence.py` compares with the
straightforward version).
"""

from __future__ import annotations

from bisect import bisect_left, insort

from ..costmodel.base import CostModel
from ..limits import Limits
from ..schedule import ScheduledBatch
from .algorithm1 import Algorithm1Policy, Algorithm1Scheduler

RR_POLICY = Algorithm1Policy("rank", hybrid=True, chunked_prefill=False, evict_for="running", rank_by="arrival")


class RoundRobinScheduler(Algorithm1Scheduler):
    """Alternating RT-only and BE-only iterations; see the module docstring. A class's plan with no item passes
    the turn to the other class (not Algorithm 1's re-planning, `replan_after_evictions`); Algorithm 1 drops the
    evictions of a plan with no item, as the engine did before it refused eviction-only batches, so every
    round-robin run plans as before."""

    replan_after_evictions = False

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, name: str = "roundrobin"):
        super().__init__(limits, RR_POLICY, cost_model, name=name)
        self.turn_be = False  # the class whose turn it is
        self._waiting_by_class: dict[bool, list[tuple[float, int]]] = {False: [], True: []}  # (arrival, id)
        self._running_by_class: dict[bool, int] = {False: 0, True: 0}  # how many running requests are BE / not
        # Decoders' state is read only through Algorithm 1's synced paths (`_groups` reads request classes).
        self.lazy_decode_ok = True
        self._waiting_group = None  # the waiting group of the current plan (holds no running request)

    @staticmethod
    def _is_be(s) -> bool:
        return s.req.request_class == "be"

    @staticmethod
    def _key(s) -> tuple[float, int]:
        return (s.req.arrival_s, s.id)

    def _waiting_list(self, s) -> list[tuple[float, int]]:
        return self._waiting_by_class[self._is_be(s)]

    def add_arrivals(self, arrived) -> None:
        super().add_arrivals(arrived)
        for s in arrived:
            insort(self._waiting_list(s), self._key(s))

    def _groups(self):
        be = self.turn_be
        if self._running_by_class[be] == len(self.running):  # every running request is of this class
            running = self._decoding if not self._prefilling else self.running
        else:
            running = [s for s in self.running if self._is_be(s) == be]
        by_id = self._by_id
        self._waiting_group = (by_id[rid] for _, rid in self._waiting_by_class[be])
        return [(running, True), (self._waiting_group, True)], self.running

    def _may_hold_decoders(self, candidates) -> bool:
        return candidates is not self._waiting_group and super()._may_hold_decoders(candidates)

    def _idle_class(self, be: bool) -> bool:
        """Nothing of this class is running or waiting (its plan would be empty)."""
        return not self._running_by_class[be] and not self._waiting_by_class[be]

    def next_batch(self, now_s: float) -> ScheduledBatch:
        if self._idle_class(self.turn_be):
            self.turn_be = not self.turn_be
            self.served_be = self.turn_be
            return super().next_batch(now_s)
        batch = super().next_batch(now_s)
        if not batch.items:  # nothing of this class can run: serve the other class
            self.turn_be = not self.turn_be
            batch = super().next_batch(now_s)
        self.served_be = self.turn_be
        return batch

    def batch_done(self, batch: ScheduledBatch, finished) -> None:
        planned = self._planned
        if planned is not None and planned[0] is batch:
            admitted = planned[1]
        else:
            admitted = [self._by_id[rid] for rid, _ in batch.items if rid not in self._running_ids]
        super().batch_done(batch, finished)
        count = self._running_by_class
        for s in admitted:
            lst = self._waiting_list(s)
            del lst[bisect_left(lst, self._key(s))]
            count[self._is_be(s)] += 1
        for rid in batch.evict:
            s = self._by_id[rid]
            insort(self._waiting_list(s), self._key(s))
            count[self._is_be(s)] -= 1
        for s in finished:
            count[self._is_be(s)] -= 1
        self.turn_be = not self.served_be

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        return False
