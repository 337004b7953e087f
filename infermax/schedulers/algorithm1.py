"""The InferMax paper's Algorithm 1 as one template; vLLM, Sarathi and the ranking
schedulers are `Algorithm1Policy` values, not separate code.

Per batch: ``GroupRequests`` orders the waiting (``Rw``) and running (``Rr``)
requests into groups; each candidate passes ``CheckHybridBatching`` (skip a phase
other than the batch's when hybrid batching is off) and ``CanAllocate`` (token
budget ``C``, prefill budget ``P`` — a chunked prefill shrinks to fit —, running
size ``Rmax``, KV ``M``: one token for a decode, the chunk for a prefill, or
``I + O − 1`` reserved at admission for eviction-free variants). On failure
because of ``M`` a candidate allowed to evict takes victims from the
lowest-priority end of the running requests after it, and finally evicts itself;
any other failure moves on (to the next group for the FCFS groups, to the next
candidate in a ranking's single group).

Decisions where the paper is silent, following Vidur (which the paper extends):
running requests are prioritised by arrival; evicted requests go to the *front*
of ``Rw``; a failed candidate ends its FCFS group (head-of-line blocking, as vLLM).
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from dataclasses import dataclass, replace
from itertools import islice

from ..costmodel.base import CostModel
from ..limits import Limits
from ..replay import RequestState
from ..schedule import ScheduledBatch
from .base import InfeasibleRequestError, Scheduler, split_finished_prefills

GROUPINGS = ("prefill_first", "decode_first", "rank")
EVICTORS = ("running", "running_decode", "none")
RANK_KEYS = ("arrival", "prompt", "output")


@dataclass(frozen=True)
class Algorithm1Policy:
    """One row of the paper's Table 1 (or a ranking scheduler of appendix A.3).

    ``grouping``: ``prefill_first`` = [Rw, Rr] (vLLM); ``decode_first`` =
    [Rr decode, Rr prefill, Rw] (Sarathi); ``rank`` = one group, Rw ∪ Rr sorted by
    ``rank_by`` (arrival, prompt length I or output length O).
    ``evict_for``: which candidates may evict on an ``M`` failure.
    ``default_P``: the scheduler's prefill budget when the user sets none (None: C).
    """

    grouping: str
    hybrid: bool
    chunked_prefill: bool
    evict_for: str
    eviction_free: bool = False
    rank_by: str = "arrival"
    default_P: int | None = None

    def __post_init__(self) -> None:
        if self.grouping not in GROUPINGS:
            raise ValueError(f"grouping must be one of {GROUPINGS}, got {self.grouping!r}")
        if self.evict_for not in EVICTORS:
            raise ValueError(f"evict_for must be one of {EVICTORS}, got {self.evict_for!r}")
        if self.rank_by not in RANK_KEYS:
            raise ValueError(f"rank_by must be one of {RANK_KEYS}, got {self.rank_by!r}")

    def eviction_free_variant(self) -> "Algorithm1Policy":
        """The same policy reserving ``I + O − 1`` at admission and never evicting."""
        return replace(self, eviction_free=True, evict_for="none")


def _arrival_key(s: RequestState):
    return (s.req.arrival_s, s.id)


_RANK_KEY = {
    "arrival": _arrival_key,
    "prompt": lambda s: (s.req.prompt_tokens, s.req.arrival_s, s.id),
    "output": lambda s: (s.req.output_tokens, s.req.arrival_s, s.id),
}


def _insert_ranked(states: list[RequestState], keys: list, s: RequestState, key) -> None:
    """Insert ``s`` under ``key`` into the parallel sorted lists (keys are unique: they end with the id)."""
    i = bisect.bisect_right(keys, key)
    keys.insert(i, key)
    states.insert(i, s)


def _remove_ranked(states: list[RequestState], keys: list, s: RequestState, key) -> None:
    i = bisect.bisect_left(keys, key)
    if i < len(keys) and states[i] is s:
        del states[i], keys[i]


class Algorithm1Scheduler(Scheduler):
    """Algorithm 1 of the InferMax paper, configured by an `Algorithm1Policy`.

    ``repeats_full_decode``: after a batch that decoded every running request (running = KV
    holders) and evicted nothing, the next call sees the same groups in the same order (ranks are
    static; every running request stays in decode phase) and the same token, prefill and ``Rmax``
    budgets at every candidate's turn; only the free KV changes, and it shrinks (eviction-free: it
    is constant). So each decode still succeeds while the batch's KV fits ``M``, and each waiting
    candidate that failed or was skipped before fails or is skipped again (its need is unchanged,
    its budget is not larger); nobody is evicted, and ``batch_done`` of such a batch changes
    nothing. After an eviction the victims head the waiting queue, so the FCFS groups check the
    head's ``CanAllocate`` at the next batch's budgets (it is the only waiting candidate tried
    before its group stops); the ranking group, which tries every waiting candidate, does not
    repeat after an eviction.
    """

    # Decision 11 of docs/design.md ("Algorithm 1 template"): a plan with no item is made again after evictions,
    # or with running prefills allowed to evict in a deadlock. Round robin turns the other class's way instead.
    replan_after_evictions = True
    # A candidate holding no KV that certainly fails CanAllocate (C, Rmax, or M: an eviction-free reservation, or the
    # first chunk otherwise) is skipped without the call (`next_batch`); False runs every CanAllocate (the tests'
    # reference).
    skip_certain_failures = True

    def __init__(self, limits: Limits, policy: Algorithm1Policy, cost_model: CostModel | None = None,
                 name: str = "algorithm1"):
        super().__init__(limits, cost_model)
        self.policy = policy
        self.name = name
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []  # by priority (arrival order)
        self._running_ids: set[int] = set()
        self._by_id: dict[int, RequestState] = {}
        self._reserved: dict[int, int] = {}  # eviction-free reservations (KV tokens)
        self._reserved_total = 0
        # Kept incrementally by `batch_done` (see "Engine" in docs/design.md), so that a batch costs
        # O(events) plus C-level list copies rather than Python work per running request:
        self._decoding: list[RequestState] = []  # running requests in decode phase, by priority
        self._decode_items: list[tuple[int, int]] = []  # (id, 1) of each of _decoding, same order
        self._prefilling: list[RequestState] = []  # running requests in prefill phase, by priority
        self._kv_used = 0  # Σ blocks(m) over the running requests (not kept for eviction-free variants)
        self._planned: tuple | None = None  # (batch, admitted states, KV used after it) of the last plan
        self._breaking_deadlock = False  # a pass in which running prefills may evict too (`next_batch`)
        # Decoders' state is read only where `sync_states` / `cached_tokens` / `cohort_block_openers` is
        # used (below). The FCFS groupings plan from the decode list, which the replayer's lazy cohort
        # matches; a ranking (or a subclass's own grouping) reads every candidate each batch, so it
        # gets current states instead.
        self.lazy_decode_ok = type(self) is Algorithm1Scheduler and policy.grouping != "rank"
        # The ranking group, Rr ∪ Rw by rank, kept sorted as requests arrive and finish (ranks are static, and an
        # eviction only moves a request between Rr and Rw): ``_ranked`` and its keys, same order.
        self._ranked: list[RequestState] = []
        self._ranked_keys: list = []
        self._rank_key_fn = None  # `_rank_key()`, taken at the first arrival (a subclass's key may need its fields)
        # The running requests by rank (``_ranked`` less the waiting ones) and, for a ranking with chunked
        # prefills, a heap of (`_waiting_need`, id, Icur) over the waiting requests, stale entries (admitted,
        # finished, or evicted since with a longer Icur) dropped when met: `_groups` leaves the waiting requests
        # out of a plan in which none can be admitted (`_waiting_closed`). Where requests may be evicted, that plan
        # is made again with them if it evicts (``_left_waiting_out``, ``_keep_waiting``).
        self._ranked_running: list[RequestState] = []
        self._ranked_running_keys: list = []
        self._waiting_needs: list[tuple[int, int, int]] = []
        self._left_waiting_out = False
        self._keep_waiting = False

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            self._by_id[s.id] = s
            self.waiting.append(s)
        if self.policy.grouping == "rank" and arrived:
            key = self._rank_key_fn = self._rank_key_fn or self._rank_key()
            for s in arrived:
                _insert_ranked(self._ranked, self._ranked_keys, s, key(s))
            if self._closes_waiting():
                for s in arrived:
                    self._push_waiting_need(s)

    # GroupRequests: [(candidates, stop_group_on_failure)] and running requests by priority.
    def _groups(self):
        g = self.policy.grouping
        if g == "prefill_first":
            # Without running prefills the running list is the decode list (same requests, same order).
            return [(self.waiting, True), (self.running if self._prefilling else self._decoding, True)], self.running
        if g == "decode_first":  # (priority None: the decode list then the prefill list, built if needed)
            return [(self._decoding, True), (self._prefilling, True), (self.waiting, True)], None
        if not self._keep_waiting and self._closes_waiting() and self._waiting_closed():
            self._left_waiting_out = not self.policy.eviction_free
            return [(self._ranked_running, False)], None
        return [(self._ranked, False)], None  # the running requests by rank: `_priority`, at the first eviction

    def _closes_waiting(self) -> bool:
        """Whether `_waiting_closed` applies: a ranking with chunked prefills (no prompt is refused for its size,
        which CanAllocate would raise at the candidate's turn) that skips certain failures."""
        return self.policy.grouping == "rank" and self.policy.chunked_prefill and self.skip_certain_failures

    def _waiting_need(self, s: RequestState) -> int:
        """The least KV a waiting request takes at admission: its reservation ``blocks(I + O − 1)`` (eviction-free),
        else its ``Icur``, which its first chunk takes unless a budget cuts it."""
        return self.limits.blocks(s.req.peak_kv_tokens) if self.policy.eviction_free else s.input_tokens

    def _push_waiting_need(self, s: RequestState) -> None:
        heapq.heappush(self._waiting_needs, (self._waiting_need(s), s.id, s.input_tokens))

    def _waiting_closed(self) -> bool:
        """Whether no waiting request can pass CanAllocate in this plan, evictions aside: ``Rmax`` holders already,
        or the free KV below every waiting request's least need at admission.

        Until a candidate evicts, within a plan the free KV and the budgets only shrink and the KV holders only grow,
        and each waiting candidate (holding no KV, so it evicts nobody) fails at its turn with no other effect;
        leaving them out of the ranking group keeps the running ones in the same order, so the plan is the same.
        Eviction-free, the least need is the least reservation. Otherwise it is ``blocks(c)`` for the first chunk
        ``c = min(Icur, tokens left, prefill tokens left)``: before the first admission only running candidates
        take tokens (a decode one, a running prefill at most its remaining prefill), so both budgets stay at least
        ``C`` (``P``) less what they can take, and ``c`` at least the smaller of that and the least ``Icur``. A plan
        that would evict may free KV a waiting request could take, so it is made again with them at its first
        eviction (`_plan_with_waiting`)."""
        lim, heap, by_id = self.limits, self._waiting_needs, self._by_id
        if lim.Rmax is not None and len(self.running) >= lim.Rmax:
            return True
        while heap:
            _, rid, icur = heap[0]
            s = by_id[rid]
            if s.m == 0 and not s.finished and s.input_tokens == icur:
                break
            heapq.heappop(heap)  # admitted (holding KV), finished, or evicted since (a newer entry holds it)
        if not heap:
            return True
        if self.policy.eviction_free:
            return heap[0][0] > lim.M - self._reserved_total
        prefill = sum(s.input_tokens - s.m for s in self._prefilling)
        budget = min(lim.C - len(self._decoding) - prefill, lim.prefill_budget - prefill)
        return budget >= 1 and lim.blocks(min(heap[0][0], budget)) > lim.M - self._kv_used

    def _priority(self) -> list[RequestState]:
        """The running requests by priority, for a group list that gave none: by rank in the ranking group, else the
        decode list then the prefill list (Sarathi's)."""
        if self.policy.grouping == "rank":
            return list(self._ranked_running)
        return self._decoding + self._prefilling

    def _rank_key(self):
        """The ranking group's sort key (``rank_by``); the schedule search's `WorkRankedScheduler` gives its own."""
        return _RANK_KEY[self.policy.rank_by]

    def next_batch(self, now_s: float) -> ScheduledBatch:
        lim, pol = self.limits, self.policy
        blocks = lim.blocks
        self._left_waiting_out = False
        groups, priority = self._groups()
        position: dict[int, int] | None = None  # built on the first eviction only
        victim_ptr = None  # into priority, set at the first eviction
        tokens_left, prefill_left = lim.C, lim.prefill_budget
        prefill_cap, rmax, skip_failures = min(lim.C, lim.prefill_budget), lim.Rmax, self.skip_certain_failures
        unit_blocks = lim.block_size == 1
        kv_free = lim.M - (self._reserved_total if pol.eviction_free else self._kv_used)
        holders = len(self.running)
        items: list[tuple[int, int]] = []
        evict: list[int] = []
        taken: set[int] = set()  # ids in the batch or evicted; those taken by the decode fast path join at
        admitted: list[RequestState] = []  # the first eviction (only victims and later groups could meet them)
        batch_is_prefill = None

        while True:  # a pass over the groups; another only after a pass that evicted and planned nothing
            evicted_before = len(evict)
            for candidates, stop_on_failure in groups:
                if candidates is self._decoding and not evict:
                    # Every candidate decodes and none is taken. CheckHybridBatching skips all of them in a
                    # non-hybrid prefill batch; otherwise all pass CanAllocate iff they fit together.
                    if not pol.hybrid and batch_is_prefill:
                        continue
                    need = self._decode_list_need(tokens_left, kv_free)
                    if need is not None:
                        n = len(candidates)
                        items += self._decode_items
                        tokens_left -= n
                        kv_free -= need
                        if n and batch_is_prefill is None:
                            batch_is_prefill = False
                        continue
                elif (not pol.hybrid and batch_is_prefill is False
                      and (candidates is self.waiting or candidates is self._prefilling)):
                    continue  # all in prefill phase: CheckHybridBatching skips every one in a decode batch
                if self._may_hold_decoders(candidates):
                    self.sync_states()  # running decoders' m is read below (and victims are running requests)
                # The ranking group with its waiting requests (they may fit, or the plan is made again at its first
                # eviction): a run of waiting candidates that all certainly fail is passed in one step
                # (`_waiting_all_fail`).
                jumps = candidates is self._ranked and self._closes_waiting()
                start = 0
                while start is not None:
                    segment, start = candidates if not start else islice(candidates, start, None), None
                    for s in segment:
                        if s.id in taken:
                            continue
                        m = s.m
                        is_prefill = m < s.input_tokens
                        if not pol.hybrid and items and is_prefill != batch_is_prefill:
                            continue  # CheckHybridBatching
                        if not is_prefill and tokens_left >= 1:
                            # A decode's CanAllocate inline (the common case): one token, never a new holder.
                            need = 0 if pol.eviction_free else (1 if unit_blocks else blocks(m + 1) - blocks(m))
                            if need <= kv_free:
                                items.append((s.id, 1))
                                taken.add(s.id)
                                tokens_left -= 1
                                kv_free -= need
                                if batch_is_prefill is None:
                                    batch_is_prefill = False
                                continue
                        if m == 0 and skip_failures and (pol.chunked_prefill or s.input_tokens <= prefill_cap) and (
                                tokens_left < 1 or prefill_left < 1 or (rmax is not None and holders >= rmax)
                                or blocks(s.req.peak_kv_tokens if pol.eviction_free else
                                          min(s.input_tokens, tokens_left, prefill_left)) > kv_free):
                            # a request holding no KV that fails CanAllocate on C, P, Rmax or M (reserving its peak,
                            # or taking its first chunk: the whole prompt without chunking, where a prompt over the
                            # token or prefill budget fails on C or P first, failing all the same), as `_can_allocate`
                            # finds (it raises only for a prompt above min(C, P) without chunking); it holds no KV, so
                            # it is not running and cannot evict, and the failure has no other effect: the common case
                            # of a long ranking group
                            if stop_on_failure:
                                break
                            if jumps and self._waiting_all_fail(tokens_left, prefill_left, kv_free, holders):
                                start = self._next_running_rank(s)  # None: no running request ranks after s
                                break
                            continue
                        while True:  # CanAllocate, evicting on M failures where allowed
                            failure, c, need = self._can_allocate(s, is_prefill, tokens_left, prefill_left, kv_free,
                                                                  holders)
                            if failure is None:
                                items.append((s.id, c))
                                taken.add(s.id)
                                tokens_left -= c
                                if is_prefill:
                                    prefill_left -= c
                                if s.m == 0:  # only waiting requests hold no KV
                                    holders += 1
                                    admitted.append(s)
                                kv_free -= need
                                if batch_is_prefill is None:
                                    batch_is_prefill = is_prefill
                                break
                            if failure != "M" or not self._may_evict(s, is_prefill):
                                break
                            if position is None:
                                if priority is None:
                                    priority = self._priority()
                                position = {r.id: i for i, r in enumerate(priority)}
                                victim_ptr = len(priority) - 1
                                taken.update(rid for rid, _ in items)
                            victim = None
                            while victim_ptr > position[s.id]:
                                v = priority[victim_ptr]
                                victim_ptr -= 1
                                if v.id not in taken:
                                    victim = v
                                    break
                            if self._left_waiting_out:  # the KV this frees may admit a waiting request
                                return self._plan_with_waiting(now_s)
                            target = victim or s
                            evict.append(target.id)
                            taken.add(target.id)
                            kv_free += blocks(target.m)
                            holders -= 1
                            if victim is None:
                                failure = None  # the candidate evicted itself; go on with the next one
                                break
                        if failure is not None and stop_on_failure:
                            break
            if not self._plan_again(items, len(evict) > evicted_before):
                break
        self._breaking_deadlock = False
        if not items and evict:  # still nothing to run: plan nothing (no one is evicted; the engine idles or stops)
            evict = []
        batch = ScheduledBatch(items=items, evict=evict)
        self._planned = (batch, admitted, lim.M - kv_free)
        return batch

    def _plan_with_waiting(self, now_s: float) -> ScheduledBatch:
        """The plan made again from the start with the waiting requests in the ranking group, abandoning one made
        without them (`_waiting_closed`) at its first eviction."""
        self._breaking_deadlock = False
        self._keep_waiting = True
        try:
            return self.next_batch(now_s)
        finally:
            self._keep_waiting = False

    def _plan_again(self, items: list, evicted: bool) -> bool:
        """After a pass over the groups: whether to make another (docs/design.md, Algorithm 1 decision 11). Only
        when the pass planned no item, since a batch carrying only evictions cannot run (the engine refuses it):
        if the pass ``evicted`` (a candidate may have evicted itself), the KV it freed may let the candidates that
        failed before it in; otherwise, with KV held and only decodes allowed to evict, the running prefills are
        deadlocked in ``M``, and one more pass lets them evict (as ``evict_for="running"`` does). Each pass after
        the first evicts someone or is the single deadlock pass, so this ends. Every such state used to end the
        run with `NoProgressError`, so runs that finished plan as before."""
        if items or not self.replan_after_evictions:
            return False
        if evicted:
            return True
        if self._breaking_deadlock or not self.running or self.policy.evict_for != "running_decode":
            return False
        self._breaking_deadlock = True
        return True

    def _may_hold_decoders(self, candidates) -> bool:
        """Whether a group may list running decoders, whose state the lazy cohort lets lag (a group of waiting
        requests or running prefills does not; victims are running requests, evicted only for running ones)."""
        return candidates is not self.waiting and candidates is not self._prefilling

    def _decode_list_need(self, tokens_left: int, kv_free: int) -> int | None:
        """The KV tokens the whole decode list takes when its tokens fit ``tokens_left`` and its KV ``kv_free``, else
        None: each member passes CanAllocate iff all do (needs are ≥ 0, so every prefix fits too), as the
        per-candidate loop would find."""
        n = len(self._decoding)
        if n > tokens_left:
            return None
        if self.policy.eviction_free:
            need = 0
        elif self.limits.block_size == 1:
            need = n
        else:  # a decode from m to m + 1 opens a block when m % b == 0
            b = self.limits.block_size
            openers = self.cohort_block_openers(self._decode_items)
            if openers is None:
                self.sync_states()
                openers = sum(1 for s in self._decoding if not s.m % b)
            need = b * openers
        return need if need <= kv_free else None

    def _waiting_all_fail(self, tokens_left: int, prefill_left: int, kv_free: int, holders: int) -> bool:
        """Whether every waiting request certainly fails CanAllocate at these budgets: the test `next_batch` makes
        per waiting candidate, with the least need at admission of any waiting request (the top of `_waiting_needs`:
        the least reservation eviction-free, else the least ``Icur``; its stale entries are no larger than a current
        one's). While waiting candidates fail nothing changes, so every one of them up to the next running candidate
        fails at its turn too."""
        lim = self.limits
        if tokens_left < 1 or prefill_left < 1 or (lim.Rmax is not None and holders >= lim.Rmax):
            return True
        heap = self._waiting_needs
        if not heap:
            return True
        return (heap[0][0] if self.policy.eviction_free else lim.blocks(min(heap[0][0], tokens_left, prefill_left))
                ) > kv_free

    def _next_running_rank(self, s: RequestState) -> int | None:
        """The position in ``_ranked`` of the first running request ranked after ``s`` (None if there is none)."""
        key = self._rank_key_fn(s)
        j = bisect.bisect_right(self._ranked_running_keys, key)
        if j == len(self._ranked_running_keys):
            return None
        return bisect.bisect_left(self._ranked_keys, self._ranked_running_keys[j])

    def _can_allocate(self, s: RequestState, is_prefill: bool, tokens_left: int, prefill_left: int,
                      kv_free: int, holders: int):
        """(failure reason or None, tokens c, KV tokens needed)."""
        lim, pol = self.limits, self.policy
        if is_prefill:
            remaining = s.input_tokens - s.m
            if pol.chunked_prefill:
                c = min(remaining, tokens_left, prefill_left)
                if c < 1:
                    return ("C" if tokens_left < 1 else "P"), 0, 0
            else:
                cap = min(lim.C, lim.prefill_budget)
                if remaining > cap:
                    kind = "prompt" if s.input_tokens == s.req.prompt_tokens else "refill after eviction"
                    raise self.prefill_too_long(
                        f"request {s.id}: its {remaining}-token prefill ({kind}) exceeds min(C, P) = {cap}, and "
                        f"scheduler '{self.name}' does not chunk prefills; raise C/P or use a chunked-prefill scheduler")
                c = remaining
                if c > tokens_left:
                    return "C", 0, 0
                if c > prefill_left:
                    return "P", 0, 0
        else:
            c = 1
            if tokens_left < 1:
                return "C", 0, 0
        new_holder = s.m == 0
        if new_holder and lim.Rmax is not None and holders >= lim.Rmax:
            return "Rmax", 0, 0
        if pol.eviction_free:
            need = lim.blocks(s.req.peak_kv_tokens) if new_holder else 0
        else:
            need = lim.blocks(s.m + c) - lim.blocks(s.m)
        if need > kv_free:
            return "M", 0, 0
        return None, c, need

    def _may_evict(self, s: RequestState, is_prefill: bool) -> bool:
        mode = self.policy.evict_for
        if mode == "none" or s.id not in self._running_ids:
            return False
        return mode == "running" or not is_prefill or self._breaking_deadlock

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        """Evicted requests go to the front of ``Rw``, admitted ones join ``Rr``, finished ones leave it.

        Incremental: the batch's admissions and the KV it leaves in use are those `next_batch`
        planned for it (a batch planned elsewhere is examined item by item instead); running prefills
        that completed move to the decode list. A finished request held ``blocks(I + O − 1)``: its
        last token is generated from ``I + O − 1`` cached tokens, evicted or not."""
        planned, self._planned = self._planned, None
        blocks = self.limits.blocks
        if planned is not None and planned[0] is batch:
            admitted, kv_used = planned[1], planned[2]
        else:
            admitted = [self._by_id[rid] for rid, _ in batch.items if rid not in self._running_ids]
            kv_used = None
        for rid in batch.evict:
            s = self._by_id[rid]
            self._leave_running(s)
            self.waiting.appendleft(s)
            if self._closes_waiting():
                self._push_waiting_need(s)
        self._prefilling, done = split_finished_prefills(self._prefilling)
        for s in done:
            self._join_decoding(s)
        for s in admitted:
            if self.waiting and self.waiting[0] is s:
                self.waiting.popleft()
            else:
                self.waiting.remove(s)
            bisect.insort(self.running, s, key=_arrival_key)
            self._running_ids.add(s.id)
            if self.policy.grouping == "rank":
                _insert_ranked(self._ranked_running, self._ranked_running_keys, s, self._rank_key_fn(s))
            if s.m >= s.input_tokens:
                self._join_decoding(s)
            else:  # (a request finished in this batch has m = 0 and leaves again below)
                bisect.insort(self._prefilling, s, key=_arrival_key)
            if self.policy.eviction_free:
                self._reserved[s.id] = blocks(s.req.peak_kv_tokens)
                self._reserved_total += self._reserved[s.id]
        for s in finished:
            self._leave_running(s)
        if self.policy.grouping == "rank":
            key = self._rank_key_fn
            for s in finished:
                _remove_ranked(self._ranked, self._ranked_keys, s, key(s))
        if self.policy.eviction_free:
            return
        if kv_used is None:
            self._kv_used = sum(blocks(s.m) for s in self.running)
        else:
            self._kv_used = kv_used - sum(blocks(s.req.peak_kv_tokens) for s in finished)

    def repeated_full_decode(self, batch: ScheduledBatch, copies: int) -> None:
        if not self.policy.eviction_free:  # every running request decoded ``copies`` more tokens
            self.sync_states()
            blocks = self.limits.blocks
            self._kv_used = sum(blocks(s.m) for s in self.running)

    def _join_decoding(self, s: RequestState) -> None:
        i = bisect.bisect_right(self._decoding, _arrival_key(s), key=_arrival_key)
        self._decoding.insert(i, s)
        self._decode_items.insert(i, (s.id, 1))

    def _leave_running(self, s: RequestState) -> None:
        self.running.remove(s)
        if self.policy.grouping == "rank":
            _remove_ranked(self._ranked_running, self._ranked_running_keys, s, self._rank_key_fn(s))
        self._running_ids.discard(s.id)
        self._reserved_total -= self._reserved.pop(s.id, 0)
        i = bisect.bisect_left(self._decoding, _arrival_key(s), key=_arrival_key)
        if i < len(self._decoding) and self._decoding[i] is s:
            del self._decoding[i], self._decode_items[i]
        else:
            self._prefilling.remove(s)

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        if not batch.evict:
            return True
        self.sync_states()
        pol, lim = self.policy, self.limits
        if pol.grouping == "rank":
            return False
        if pol.grouping == "decode_first" and not pol.hybrid:
            return True  # after the decodes, CheckHybridBatching skips every (prefill) waiting request
        blocks, n = lim.blocks, len(self.running)
        if pol.grouping == "decode_first":  # the head is tried after every running request decoded
            tokens_left = lim.C - n
            kv_free = lim.M - (self._reserved_total if pol.eviction_free else sum(blocks(s.m + 1) for s in self.running))
        else:  # prefill_first: the head is tried first, with the whole budget
            tokens_left = lim.C
            kv_free = lim.M - (self._reserved_total if pol.eviction_free else self._kv_used)
        try:
            failure, _, _ = self._can_allocate(self.waiting[0], True, tokens_left, lim.prefill_budget, kv_free, n)
        except InfeasibleRequestError:
            return False  # let the next planned batch raise it
        return failure is not None

    def describe_state(self) -> str:
        self.sync_states()
        lim = self.limits
        used = self._reserved_total if self.policy.eviction_free else sum(lim.blocks(s.m) for s in self.running)
        return f"waiting={len(self.waiting)}, running={len(self.running)}, KV {'reserved' if self.policy.eviction_free else 'used'}={used}/{lim.M}"
