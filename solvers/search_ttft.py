"""A first-token-first scheduler for the schedule search: the candidate that targets mean TTFT.

Mean TTFT counts only when each request's first token appears; what happens to a request afterwards
does not change it. So every batch first prefills requests that have no token yet, shortest remaining
prompt first (shortest-processing-time order minimises the sum of completion times on one server), and
when their KV does not fit it *evicts* running requests that already have their first token (the one
with the most output left first: it finishes last anyway, and its refill is then charged to a later
batch that no first token waits for). The rest of the batch's budget goes to the running decodes (FCFS),
then to the refills of evicted requests (shortest first). None of the registered schedulers lets a
waiting request evict a running one, which is why they cannot reach this (docs/design.md, "Schedule
search"). It is not registered: it exists for `solvers/search.py`.
"""

from __future__ import annotations

from infermax.replay import RequestState
from infermax.schedule import ScheduledBatch
from infermax.schedulers.base import Scheduler


class FirstTokenScheduler(Scheduler):
    name = "first-token-first"

    def __init__(self, limits, cost_model=None):
        super().__init__(limits, cost_model)
        self.active: dict[int, RequestState] = {}

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            self.active[s.id] = s

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        for s in finished:
            self.active.pop(s.id, None)

    def describe_state(self) -> str:
        waiting = sum(1 for s in self.active.values() if s.generated == 0)
        return f"{len(self.active)} active, {waiting} without a first token"

    def next_batch(self, now_s: float) -> ScheduledBatch:
        lim = self.limits
        blocks = lim.blocks
        states = list(self.active.values())
        kv = sum(blocks(s.m) for s in states if s.m > 0)
        holders = sum(1 for s in states if s.m > 0)
        tokens = prefill = 0
        items: list[tuple[int, int]] = []
        chosen: set[int] = set()
        evicted: set[int] = set()
        # victims: running requests with a first token, most output left first (then latest arrival)
        victims = sorted((s for s in states if s.generated > 0 and s.m > 0),
                         key=lambda s: (s.req.output_tokens - s.generated, s.req.arrival_s, s.id))

        def free_kv(need: int, needs_holder: bool, me: int) -> bool:
            nonlocal kv, holders
            while (kv + need > lim.M or (needs_holder and lim.Rmax is not None and holders + 1 > lim.Rmax)) and victims:
                v = victims.pop()
                if v.id in chosen or v.id == me:
                    continue
                evicted.add(v.id)
                kv -= blocks(v.m)
                holders -= 1
            return kv + need <= lim.M and not (needs_holder and lim.Rmax is not None and holders + 1 > lim.Rmax)

        def add(s: RequestState, c: int, may_evict: bool) -> bool:
            nonlocal kv, holders, tokens, prefill
            if s.id in evicted:  # evicted earlier in this batch: not processed in it
                return False
            is_prefill = s.m < s.input_tokens
            need = blocks(s.m + c) - blocks(s.m)
            new_holder = s.m == 0
            fits = kv + need <= lim.M and not (new_holder and lim.Rmax is not None and holders + 1 > lim.Rmax)
            if not fits and not (may_evict and free_kv(need, new_holder, s.id)):
                return False
            items.append((s.id, c))
            chosen.add(s.id)
            kv += need
            holders += new_holder
            tokens += c
            prefill += c if is_prefill else 0
            return True

        first = sorted((s for s in states if s.generated == 0),
                       key=lambda s: (s.input_tokens - s.m, s.req.arrival_s, s.id))
        for s in first:
            c = min(s.input_tokens - s.m, lim.C - tokens, lim.prefill_budget - prefill)
            if c <= 0:
                break
            add(s, c, may_evict=True)
        decodes = sorted((s for s in states if s.generated > 0 and s.m >= s.input_tokens),
                         key=lambda s: (s.req.arrival_s, s.id))
        for s in decodes:
            if tokens >= lim.C:
                break
            add(s, 1, may_evict=not items)  # a lone decode may evict others so the batch is never empty
        refills = sorted((s for s in states if s.generated > 0 and s.m < s.input_tokens),
                         key=lambda s: (s.input_tokens - s.m, s.req.arrival_s, s.id))
        for s in refills:
            c = min(s.input_tokens - s.m, lim.C - tokens, lim.prefill_budget - prefill)
            if c <= 0:
                break
            add(s, c, may_evict=not items)
        return ScheduledBatch(items, sorted(evicted))
