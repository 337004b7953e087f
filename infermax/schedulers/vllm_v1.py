"""vLLM's V1 engine scheduler, as in vLLM 0.33.0 (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``).

One step, as V1 plans it (line numbers of the 0.33.0 wheel, ``vllm._version`` commit ``g4ba787ec9``):

1. **One token budget** ``max_num_batched_tokens`` (our ``C``) shared by every request of the step;
   there is no separate prefill budget (``P`` is not used: registered with ``P = C``). V1 has no
   prefill or decode phase: a request has ``num_computed_tokens`` (our ``m``) and wants the rest of
   its tokens (``Icur − m`` in prefill, 1 in decode), L701-710.
2. **Running requests first**, in the running list's order (admission order, not arrival), each
   getting ``min(want, long_prefill_token_threshold if set, budget left)`` tokens, while budget is
   left (L795-1036; tokens L836-850). Chunked prefill is always on.
3. **Recompute preemption** when a running request's KV blocks cannot be allocated (L911-980): the
   lowest-priority running request is preempted — FCFS: the last of the running list; priority:
   the running request with the largest ``(priority, arrival)`` — its blocks freed, ``m = 0``, and it
   goes back to the *front* of the waiting queue (FCFS; the priority queue re-sorts it), L1799-1843.
   This repeats until the allocation fits or the request preempted itself; then FCFS stops the
   running loop, priority goes on with the next running request (L982-994). A priority victim
   already scheduled in this step gives its tokens back (L944-968).
4. **Waiting requests** are admitted only if nothing was preempted in the step (L1050), in queue
   order while budget is left, stopping at the first that does not fit (head-of-line blocking): at
   ``max_num_seqs`` running requests (our ``Rmax``, L1071-1074) or when its KV does not fit. A new
   request's chunk starts after its prefix-cache hit (L1110-1130, L1306), capped at ``Icur − 1`` tokens
   (``kv_cache_manager.py`` L294-302; allocation L1435-1458). With ``scheduler_reserve_full_isl`` (default True,
   ``config/scheduler.py`` L190) admission requires the blocks of its whole current input
   ``blocks(Icur) − hit + cached-unreferenced hit blocks`` free, not only its first chunk's
   (``kv_cache_manager.py`` L531-548); only the chunk is allocated.
5. ``long_prefill_token_threshold`` (default 0: off) caps any request's tokens in a step, but only
   when more than one request is running or waiting (L754-763).

Where the source is silent for us (no speculative decoding, LoRA, encoder inputs, KV connectors,
pipeline parallelism, watermark 0, ``max_num_active_seqs`` unset): those paths are left out.
V1 has no prefill budget; a ``P`` the user sets anyway also caps each step's prefill tokens (a
running prefill that meets an exhausted ``P`` is skipped, as V1 skips a request given no tokens,
L891-906; a waiting one stops admission). Unset, ``P = C`` and that cap never binds.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from ..costmodel.base import CostModel
from ..limits import Limits
from ..replay import RequestState
from ..schedule import ScheduledBatch
from .base import Scheduler, split_finished_prefills

POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class V1Options:
    """Settings of V1's scheduler that change its decisions.

    ``policy``: ``fcfs`` or ``priority`` (``SchedulerConfig.policy``; priority orders the waiting queue
    by ``(Request.priority, arrival, id)``, lower first, and preempts the largest).
    ``long_prefill_token_threshold``: tokens per request per step when others are present (0: off).
    ``reserve_full_isl``: ``scheduler_reserve_full_isl`` (admission needs the whole input's blocks).
    ``eviction_free``: ours, not a vLLM setting: the paper's eviction-free transformation (Table 1's
    unlisted variants) applied to V1. A waiting request is admitted only if the free KV at the start of
    the step covers every running request's remaining growth (``blocks(I + O − 1) − blocks(m)``: a
    request's peak, with its tail blocks its own) plus the peak of every request admitted so far in
    the step and its own (``blocks(I + O − 1) − hit`` plus the cached hit blocks it takes). Then no
    allocation of a running request can fail, so it never preempts.
    """

    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    reserve_full_isl: bool = True
    eviction_free: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}")


def _priority_key(s: RequestState) -> tuple:
    """V1's ``Request.__lt__`` (``vllm/v1/request.py`` L357-367): priority (unset: 0, vLLM's default),
    then arrival, then id. It orders the waiting heap, and its maximum is the preemption victim: V1
    takes ``max(running, key=(priority, arrival_time))`` (L932-936), whose arrival times (clock
    readings) never tie; ours can (an offline batch arrives at 0), and then the later id is the
    victim, as the waiting queue would order them."""
    p = s.req.priority
    return (0 if p is None else p, s.req.arrival_s, s.id)


class VllmV1Scheduler(Scheduler):
    """vLLM V1's ``Scheduler.schedule`` (module docstring), configured by `V1Options`.

    State: ``running`` in V1's order (admission order; victims of FCFS come off its end), the waiting
    queue (a deque with preempted requests in front, or a heap by `_priority_key`), and, to plan a
    step in time proportional to what changes, the running requests split into ``_decoding`` (in the
    order they entered decode phase, with their ``(id, 1)`` items) and ``_prefilling`` (running
    order), and the KV in use.

    The running loop has a **fast path**: when every running request's want fits the budget and
    their KV need fits the free KV, V1's loop schedules each of them in full whatever the order
    (no request meets an exhausted budget or a failed allocation), so the plan is the decode items
    plus the prefill chunks, computed from the decode list's size and the replayer's count of
    decoders opening a block. Otherwise `_walk_running` follows V1's loop request by request.
    Items list the scheduled decoders first (decode-entry order), then the other items in V1's
    order: the order of items has no effect on a batch, and this keeps the replayer's lazy decode
    cohort intact.

    Prefix caching (``supports_prefix_caching``): the engine sets ``prefix_cache``; a waiting
    request's chunk then starts after ``hit_tokens`` (recorded in the batch's ``cache_hits``), and
    the KV in use is read from the cache (``M − free_tokens()``) instead of being summed.
    """

    supports_prefix_caching = True
    prefix_cache = None

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, options: V1Options | None = None,
                 name: str = "vllm-v1"):
        super().__init__(limits, cost_model)
        self.options = options or V1Options()
        self.name = name
        self._priority = self.options.policy == "priority"
        self.waiting: deque[RequestState] | list = [] if self._priority else deque()
        self.running: list[RequestState] = []
        self._running_ids: set[int] = set()
        self._by_id: dict[int, RequestState] = {}
        self._decoding: list[RequestState] = []
        self._decode_items: list[tuple[int, int]] = []
        self._prefilling: list[RequestState] = []
        self._kv_used = 0  # Σ blocks(m) over running requests (without prefix caching)
        self._planned: tuple | None = None  # (batch, admitted states, KV used after it)
        self.always_walk = False  # tests: plan every step with `_walk_running` (no fast path)
        # Fast-forward throttle (`repeats_full_decode`): eligible offers left to decline, and whether the
        # last offer is still unanswered by `repeated_full_decode` (then it gave no copy).
        self._ff_skip = 0
        self._ff_offered = False
        self.lazy_decode_ok = True  # decoders' m is read only via cohort_block_openers or after sync_states

    # -- queues ---------------------------------------------------------------------------------

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            self._by_id[s.id] = s
            self._enqueue(s, front=False)

    def _enqueue(self, s: RequestState, front: bool) -> None:
        """FCFS: ``add_request`` appends, ``prepend_request`` (preemption) puts it in front; priority:
        both push onto the heap (``request_queue.py``, ``PriorityRequestQueue.prepend_request``)."""
        if self._priority:
            heapq.heappush(self.waiting, (_priority_key(s), s))
        elif front:
            self.waiting.appendleft(s)
        else:
            self.waiting.append(s)

    def _waiting_in_order(self):
        """The waiting requests in V1's pop order, lazily (a heap is walked without popping it)."""
        if not self._priority:
            yield from self.waiting
            return
        heap = self.waiting
        if not heap:
            return
        frontier = [(heap[0][0], 0)]
        while frontier:
            _, i = heapq.heappop(frontier)
            yield heap[i][1]
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child][0], child))

    # -- planning -------------------------------------------------------------------------------

    def _kv_free_at_start(self) -> int:
        """Free KV tokens before the step: ``M`` less ``Σ blocks(m)``, or what the prefix cache says is
        unreferenced (cached, unreferenced blocks are evictable, so free, as in V1's block pool)."""
        cache = self.prefix_cache
        return cache.free_tokens() if cache is not None else self.limits.M - self._kv_used

    def next_batch(self, now_s: float) -> ScheduledBatch:
        lim, opts = self.limits, self.options
        blocks = lim.blocks
        budget, prefill_left = lim.C, lim.prefill_budget
        kv_free = kv_free_start = self._kv_free_at_start()
        # L754-763: the threshold applies only when another request could be starved.
        thr = opts.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        items = evict = None
        if not self.always_walk:
            items, budget, prefill_left, kv_free = self._all_running_fit(budget, prefill_left, kv_free, thr)
        if items is None:
            items, evict, budget, prefill_left, kv_free = self._walk_running(
                lim.C, lim.prefill_budget, kv_free_start, thr)
        admitted: list[RequestState] = []
        hits: list[tuple[int, int]] = []
        reserve = kv_free_start - self._future_growth() if opts.eviction_free else 0
        if not evict:  # L1050: no admission in a step that preempted
            holders = len(self.running)
            cache = self.prefix_cache
            b = lim.block_size
            for s in self._waiting_in_order():
                if budget <= 0 or prefill_left <= 0 or (lim.Rmax is not None and holders >= lim.Rmax):
                    break
                icur = s.input_tokens
                hit = cache.hit_tokens(s) if cache is not None else 0
                want = icur - hit
                if 0 < thr < want:
                    want = thr
                c = min(want, budget, prefill_left)
                taken = cache.hit_new_blocks(s, hit) * b if hit else 0  # cached blocks leaving the free pool
                need = taken + blocks(hit + c) - hit
                full_need = taken + blocks(icur) - hit if opts.reserve_full_isl else need
                if full_need > kv_free or need > kv_free:
                    break
                if opts.eviction_free:
                    peak_need = taken + blocks(s.req.prompt_tokens + s.req.output_tokens - 1) - hit
                    if peak_need > reserve:
                        break
                    reserve -= peak_need
                items.append((s.id, c))
                if hit:
                    hits.append((s.id, hit))
                admitted.append(s)
                holders += 1
                budget -= c
                prefill_left -= c
                kv_free -= need
        batch = ScheduledBatch(items=items, evict=evict or [], **({"cache_hits": hits} if hits else {}))
        self._planned = (batch, admitted, lim.M - kv_free)
        return batch

    def _future_growth(self) -> int:
        """KV the running requests will still take until they finish (eviction-free admission)."""
        blocks, m_of = self.limits.blocks, self.cached_tokens
        return sum(blocks(s.req.prompt_tokens + s.req.output_tokens - 1) - blocks(m_of(s)) for s in self.running)

    def _all_running_fit(self, budget: int, prefill_left: int, kv_free: int, thr: int):
        """(items, budget, prefill budget and KV left) when every running request's want fits them all;
        else items None."""
        blocks, b = self.limits.blocks, self.limits.block_size
        n = len(self._decoding)
        prefill_items = []
        tokens = n
        need = 0
        for s in self._prefilling:
            m = s.m
            c = s.input_tokens - m
            if 0 < thr < c:
                c = thr
            prefill_items.append((s.id, c))
            tokens += c
            need += blocks(m + c) - blocks(m)
        if tokens > budget or tokens - n > prefill_left:
            return None, budget, prefill_left, kv_free
        if b == 1:
            need += n
        elif n:
            openers = self.cohort_block_openers(self._decode_items)
            if openers is None:
                self.sync_states()
                openers = sum(1 for s in self._decoding if not s.m % b)
            need += b * openers
        if need > kv_free:
            return None, budget, prefill_left, kv_free
        return self._decode_items + prefill_items, budget - tokens, prefill_left - (tokens - n), kv_free - need

    def _walk_running(self, budget: int, prefill_left: int, kv_free: int, thr: int):
        """V1's running loop request by request (L795-1036), preempting on allocation failure.

        Returns (items, evicted ids in preemption order, budget, prefill budget and KV left)."""
        self.sync_states()
        blocks = self.limits.blocks
        order = list(self.running)
        scheduled: dict[int, tuple[int, int]] = {}  # id -> (tokens, KV taken), in scheduling order
        evict: list[int] = []
        released: dict[int, int] = {}  # prefix-cache block -> references dropped by this step's victims
        i = 0
        while i < len(order) and budget > 0:
            s = order[i]
            m = s.m
            is_prefill = m < s.input_tokens
            want = s.input_tokens - m if is_prefill else 1
            if 0 < thr < want:
                want = thr
            c = min(want, budget, prefill_left) if is_prefill else 1
            if not c:
                i += 1
                continue
            need = blocks(m + c) - blocks(m)
            preempted_self = False
            while need > kv_free:  # allocate_slots failed: preempt the lowest-priority running request
                if self._priority:
                    vi = max(range(len(order)), key=lambda k: _priority_key(order[k]))
                    victim = order.pop(vi)
                    if vi < i:
                        i -= 1
                    back = scheduled.pop(victim.id, None)
                    if back is not None:  # L944-968: a victim scheduled earlier in the step gives back
                        budget += back[0]
                        kv_free += back[1]
                        if victim.m < victim.input_tokens:
                            prefill_left += back[0]
                else:
                    victim = order.pop()
                evict.append(victim.id)
                kv_free += self._freed_kv(victim, released)
                if victim is s:
                    preempted_self = True
                    break
            if preempted_self:
                if self._priority:
                    continue  # L982-991: later requests may still fit; order[i] is the next one
                break
            scheduled[s.id] = (c, need)
            budget -= c
            if is_prefill:
                prefill_left -= c
            kv_free -= need
            i += 1
        # Scheduled decoders first, in decode-list order; then the prefill chunks in V1's order.
        items = [it for it in self._decode_items if it[0] in scheduled]
        by_id = self._by_id
        items += [(rid, c) for rid, (c, _) in scheduled.items() if by_id[rid].m < by_id[rid].input_tokens]
        return items, evict, budget, prefill_left, kv_free

    def _freed_kv(self, victim: RequestState, released: dict[int, int]) -> int:
        """KV tokens a preempted request gives back: ``blocks(m)`` without prefix caching. With it, V1
        frees only the blocks whose reference count drops to 0 (``block_pool.py`` ``free_blocks``):
        blocks the victim shares with another holder (a hit on the same registered block) stay in
        use. ``released`` counts the references this step's earlier victims dropped, so two victims
        sharing a block free it once, at the second."""
        freed = self.limits.blocks(victim.m)
        cache = self.prefix_cache
        if cache is None:
            return freed
        shared = 0
        for block, refs in cache.held_blocks(victim):
            if refs - released.get(block, 0) > 1:
                shared += 1
            released[block] = released.get(block, 0) + 1
        return freed - shared * self.limits.block_size

    # -- after the batch --------------------------------------------------------------------------

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        """Victims leave ``running`` for the waiting queue (front, FCFS), admitted requests join its
        end, finished ones leave it; prefills that completed enter the decode list in item order."""
        planned, self._planned = self._planned, None
        if planned is not None and planned[0] is batch:
            admitted, kv_used = planned[1], planned[2]
        else:  # a batch planned elsewhere: examined item by item
            admitted = [self._by_id[rid] for rid, _ in batch.items if rid not in self._running_ids]
            kv_used = None
        for rid in batch.evict:
            s = self._by_id[rid]
            self._leave_running(s)
            self._enqueue(s, front=True)
        for s in admitted:
            if self._priority:
                key = heapq.heappop(self.waiting)[1]
                assert key is s, "admitted requests are the head of the waiting queue"
            else:
                head = self.waiting.popleft()
                assert head is s, "admitted requests are the head of the waiting queue"
            self.running.append(s)
            self._running_ids.add(s.id)
            self._prefilling.append(s)
        self._prefilling, done = split_finished_prefills(self._prefilling)
        for s in done:
            self._decoding.append(s)
            self._decode_items.append((s.id, 1))
        for s in finished:
            self._leave_running(s)
        if self.prefix_cache is not None:
            return
        if kv_used is None:
            self.sync_states()
            self._kv_used = sum(self.limits.blocks(s.m) for s in self.running)
        else:
            blocks = self.limits.blocks
            self._kv_used = kv_used - sum(blocks(s.req.peak_kv_tokens) for s in finished)

    def _leave_running(self, s: RequestState) -> None:
        self.running.remove(s)
        self._running_ids.discard(s.id)
        try:
            i = self._decoding.index(s)
        except ValueError:
            self._prefilling.remove(s)
        else:
            del self._decoding[i], self._decode_items[i]

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        """A full decode batch with no preemption repeats while nothing arrives or finishes: every
        running request decodes again (same budget, same order), and the waiting head, which was
        tried and failed, fails again — on ``max_num_seqs`` or the budget (unchanged) or on KV (its
        need is unchanged, the free KV only shrinks). With prefix caching the head's hit may change
        as blocks are registered and evicted, so then only an empty waiting queue repeats.

        Throttled: a fast-forward brings every decoder up to date (O(running)), which does not pay
        when arrivals cut it after a few copies (the Azure conversation trace: most offers gave
        fewer copies than running requests / 8). After such an offer the next 16 eligible ones are
        declined (the engine then plans those batches itself; results are identical either way)."""
        if self._ff_offered:  # the last offer gave no copy
            self._ff_offered, self._ff_skip = False, 16
        if batch.evict or not self._repeats(batch):  # (a preempting step skipped admission: the next tries)
            return False
        if self._ff_skip:
            self._ff_skip -= 1
            return False
        self._ff_offered = True
        return True

    def _repeats(self, batch: ScheduledBatch) -> bool:
        lim = self.limits
        if not self.waiting or (lim.Rmax is not None and len(self.running) >= lim.Rmax):
            return True
        if lim.C - len(self.running) <= 0:
            return True
        return self.prefix_cache is None

    def repeated_full_decode(self, batch: ScheduledBatch, copies: int) -> None:
        self._ff_offered = False
        if copies * 8 < len(self.running):
            self._ff_skip = 16
        if self.prefix_cache is None:
            self.sync_states()
            blocks = self.limits.blocks
            self._kv_used = sum(blocks(s.m) for s in self.running)

    def describe_state(self) -> str:
        self.sync_states()
        used = self.limits.M - self._kv_free_at_start()
        return f"waiting={len(self.waiting)}, running={len(self.running)}, KV used={used}/{self.limits.M}"
