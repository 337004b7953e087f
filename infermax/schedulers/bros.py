"""BROS (Wan et al., arXiv 2504.09590): hybrid real-time (RT) / best-effort (BE) serving.

Per iteration (the paper's Algorithm 1, specs/bros.md §2):

1. RT requests (waiting and pending) are sorted by slack ``T_SLO − t_i`` (TTFT target and time
   since arrival before the first token, TPOT target and time since the last token after it;
   token group size 1, so ``k_i = 1``). The time budget ``T_min^res`` is the smallest slack.
2. RT requests are taken in that order while the batch has fewer than ``B_curr`` requests, the
   estimated batch time ``C(batch)`` stays within the budget, and ``FindPreemptBlock`` finds
   KV slots (the bidirectional block manager, `bros_blocks`, may overwrite BE tokens with lazy
   checkpointing, or drop requests: BE first, then RT with more slack).
3. BE requests, sorted by checkpointed blocks ascending (arrival order on ties), are packed while
   the batch stays within ``B_curr`` and the budget; otherwise one replaces the least urgent
   selected RT request if that fits, else the loop stops. ``FindBlock`` uses empty slots only.
4. ``B_curr`` doubles after an iteration whose RT loop did not stop on the budget, and resets to
   128 when it did.

``C(batch)`` is the simulator's cost model on the batch's features, and
``max(compute, swap-in time)`` when the batch swaps KV in (the replayer's own rule). Prefills are
never chunked; prefill and decode items mix freely. BROS never recomputes: a request whose KV was
(partly) moved to host memory lists a ``swap_in`` of those tokens in the batch it runs in.

Guards (specs §7, on by default; ``strict=True`` follows Algorithm 1 literally): (a) the most
urgent RT request is always admitted, memory permitting; (b) the budget is the smallest slack among
RT requests that can still meet their deadline (``slack_i ≥ C({i})``); (c) none: no budget;
(5) replacement never removes the most urgent selected RT request. In strict mode a late head
request empties the batch (lines 11–12): the scheduler raises `NoProgressError` instead.
Requests dropped or checkpointed in this iteration are not selected in it (a request cannot be
swapped out and in by one batch).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import partial
from heapq import merge
from itertools import chain

from ..costmodel.base import BatchFeatures, CostModel
from ..limits import Limits
from ..replay import RequestState
from ..schedule import ScheduledBatch
from .base import InfeasibleRequestError, NoProgressError, Scheduler, SchedulerError
from .bros_blocks import BE, RT, BiBlockManager
from .bros_counts import CountBlockManager
from .bros_orders import RtOrders
from .sorted_keys import SortedKeys


@dataclass(frozen=True)
class BrosOptions:
    """BROS's knobs. ``block_size``: slots per bidirectional block (None: the limits' block size).
    ``max_batch``: cap on ``B_curr`` (None: ``Rmax``, else 1024). RT requests without a TTFT / TPOT
    target get ``ttft_slo_s`` / ``tpot_slo_s`` (the paper's 0.4 s / 0.2 s). ``check``: verify the
    block manager against the replayer every iteration (tests). ``count_blocks``: when the engine says the
    run has no BE request (`Scheduler.expect`), keep KV as counts (`bros_counts`; identical results)."""

    strict: bool = False
    block_size: int | None = None
    base_batch: int = 128
    max_batch: int | None = None
    ttft_slo_s: float = 0.4
    tpot_slo_s: float = 0.2
    check: bool = False
    count_blocks: bool = True


def is_best_effort(s: RequestState) -> bool:
    """BE = ``request_class == "be"``; every other request is real-time."""
    return s.req.request_class == "be"


LAZY_RUN = 16  # keys of one reference time after which `_group_stream` finds the run's end by bisection


def _run_end(deques: list, ref: float, start: int) -> tuple[int, tuple | None]:
    """In ``deques`` read one after the other (each ascending, each ending below the next one's first key), the
    position of the first key after position ``start`` whose reference time is above ``ref``, and that key (None
    past the end)."""
    probe = (ref, math.inf, math.inf)  # above every key of reference time ``ref``
    offset = 0
    for keys in deques:
        n = len(keys)
        if start < offset + n:
            i = bisect_right(keys, probe, max(start - offset, 0))
            if i < n:
                return offset + i, keys[i]
        offset += n
    return offset, None


class _Batch:
    """The batch being built: items, and the features ``C(batch)`` needs kept in one `BatchFeatures` (updated in
    place, not rebuilt per estimate)."""

    __slots__ = ("n", "swap_in", "f", "decode_reads")

    def __init__(self):
        self.n = self.swap_in = 0
        # BROS prefills start from an empty cache (m = 0): no Σc·m terms.
        self.f = BatchFeatures()
        self.decode_reads: list[int] = []  # decode KV reads in the batch (their maximum: decode_kv_max)

    @property
    def tokens(self) -> int:
        return self.f.n_tokens

    @property
    def prefill(self) -> int:
        return self.f.prefill_tokens

    def add(self, s: RequestState, c: int, swap_in: int) -> None:
        f = self.f
        self.n += 1
        f.n_tokens += c
        self.swap_in += swap_in
        m = s.m
        if m < s.input_tokens:
            f.prefill_tokens += c
            f.prefill_sq_tokens += c * c
            f.n_prefill_seqs += 1
        else:
            f.n_decode_seqs += 1
            read = m + 1
            f.decode_kv_tokens += read
            self.decode_reads.append(read)
            if read > f.decode_kv_max:
                f.decode_kv_max = read

    def remove(self, s: RequestState, c: int, swap_in: int) -> None:
        """Undo `add` (of any item in the batch)."""
        f = self.f
        self.n -= 1
        f.n_tokens -= c
        self.swap_in -= swap_in
        if s.m < s.input_tokens:
            f.prefill_tokens -= c
            f.prefill_sq_tokens -= c * c
            f.n_prefill_seqs -= 1
        else:
            f.n_decode_seqs -= 1
            read = s.m + 1
            f.decode_kv_tokens -= read
            reads = self.decode_reads
            reads.remove(read)
            if read == f.decode_kv_max:
                f.decode_kv_max = max(reads, default=0)

    def features(self) -> BatchFeatures:
        return self.f


class BrosScheduler(Scheduler):
    """BROS; see the module docstring. ``limits.M // block_size`` bidirectional blocks.

    Per-iteration cost (design.md, BROS decision 13): the RT priority order is kept incrementally (per target,
    requests sorted by their slack reference time, updated only for the requests a batch ran: the late ones, then
    the budget's candidates, `RtOrders.rank_keys`) and merged lazily, so an iteration reads only the prefix of the
    order it uses; BE requests are kept sorted by their key (updated on swaps); drop victims are drawn from the KV
    holders only (RT: per-target holder lists read from the most-slack end, only when an allocation fails;
    decision 14); the RT orders are deques whose keys are appended and go stale instead of being removed
    (`bros_orders`, decision 18). Decision 15: without BE requests the KV is kept as counts (`bros_counts`); cost
    checks and ``slack ≥ C({i})`` look at the swap-in time first; the compute part of ``C({i})`` is cached per
    (prefill tokens | decode m)."""

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, options: BrosOptions = BrosOptions(),
                 name: str = "bros"):
        super().__init__(limits, cost_model)
        if cost_model is None:
            raise ValueError("BROS needs a cost model (its batch-time estimator)")
        self.options, self.name = options, name
        self.S = options.block_size or limits.block_size
        self.mgr = BiBlockManager(limits.M // self.S, self.S)
        self.capacity = self.mgr.num_blocks * self.S
        self.rt: dict[int, RequestState] = {}
        self.be: dict[int, RequestState] = {}
        # RT requests: per slack target T, keys (reference time, arrival, id) (slack = T − (now − ref)), in the
        # budget's candidates or found late (slack < C({i}); it stays late until a batch moves it, slack only
        # falls), and the KV holders as of the iteration's start (`bros_orders`).
        self._orders = RtOrders()
        # BE order: (−checkpointed blocks, arrival, id) ascending.
        self._be_order = SortedKeys()
        self._be_key: dict[int, tuple[int, float, int]] = {}
        self._solo: dict[int, float] = {}  # compute part of C({i}): −c for a c-token prefill, m for a decode
        self._last_now_s = -math.inf
        cap = options.max_batch or limits.Rmax or 1024
        self.max_batch = max(cap, 1)
        self.b_curr = min(options.base_batch, self.max_batch)
        self.last_budget_s = math.inf  # T_min^res of the last planned batch (inspection, tests)
        self._victims: _VictimStream | None = None

    # --- queues -----------------------------------------------------------------------------

    def expect(self, requests) -> None:
        """Without BE requests no decision depends on which blocks hold a request's KV (`bros_counts`): keep
        counts. Only before the first arrival (the manager must not hold anything yet)."""
        if self.options.count_blocks and not self.mgr.cls and all(r.request_class != "be" for r in requests):
            self.mgr = CountBlockManager(self.mgr.num_blocks, self.S)

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        cap = min(self.limits.C, self.limits.prefill_budget)
        for s in arrived:
            if s.req.peak_kv_tokens > self.capacity:
                raise InfeasibleRequestError(
                    f"request {s.id} needs {s.req.peak_kv_tokens} KV slots, more than BROS's {self.mgr.num_blocks} "
                    f"blocks of {self.S} ({self.capacity} slots)")
            if s.req.prompt_tokens > cap:
                raise self.prefill_too_long(
                    f"request {s.id}: its {s.req.prompt_tokens}-token prompt exceeds min(C, P) = {cap} and BROS does "
                    f"not chunk prefills; raise C/P")
            be = is_best_effort(s)
            (self.be if be else self.rt)[s.id] = s
            self.mgr.register(s.id, BE if be else RT)
            if be:
                self._file_be(s)
        self._file_rt([s for s in arrived if not is_best_effort(s)])

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        rt, be, orders = self.rt, self.be, self._orders
        for s in finished:
            self.mgr.release(s.id)
            if is_best_effort(s):
                be.pop(s.id)
                self._unfile_be(s.id)
            else:
                rt.pop(s.id)
                orders.forget(s.id)
        # Only the requests in the batch changed their slack reference or host tokens. (A request swapped in is one
        # of the items, `next_batch`; one swapped out is not, as the replayer checked: its host tokens would have
        # to come back first.)
        gpu = self.mgr.gpu
        for rid, _ in batch.swap_out:
            if rid in be:
                self._unfile_be(rid)
                self._file_be(be[rid])
            elif rid in rt and not gpu[rid]:
                # An RT request swapped out without running keeps its key (only a batch moves its slack
                # reference) and, if it was found late, its lateness (its C({i}) = max(compute, swap-in time) only
                # grows with its host tokens, its slack only falls); it leaves the holders once it has no GPU tokens.
                # (It held KV when the iteration started, since only the selected requests gain KV and they run;
                # the block managers swap an RT request's KV out whole, so it always leaves.)
                orders.stop_holding(rid)
        # (After the swapped-out ones leave the holders: the re-filing then pops their stale entries from the back
        # of the holder orders, where this batch's victims were.)
        self._file_rt([rt[rid] for rid, _ in batch.items if rid in rt])
        for rid, _ in (batch.items if be else ()):
            if rid in be:
                self._unfile_be(rid)
                self._file_be(be[rid])

    def _file_be(self, s: RequestState) -> None:
        """Enter BE request ``s`` in the BE order under its current key (fewest checkpointed blocks, then arrival)."""
        key = (-(-s.cpu_tokens // self.S), s.req.arrival_s, s.id)
        self._be_key[s.id] = key
        self._be_order.add(key)

    def _unfile_be(self, rid: int) -> None:
        self._be_order.remove(self._be_key.pop(rid))

    def _file_rt(self, states) -> None:
        """File RT requests under their current keys (`_rt_filings`): the budget's candidates (a request filed
        is not yet found late), and the KV holders when they hold KV; their earlier keys go stale (`bros_orders`)."""
        self._orders.file(self._rt_filings(states, self.mgr.gpu))

    def _rt_filings(self, states, gpu: dict[int, int]) -> list[tuple[float, tuple[float, float, int], bool]]:
        """Per RT request: its slack target T, its key in T's orders, (reference time, arrival, id), so that slack =
        T − (now − reference time), and whether it holds KV. Before its first token T is its TTFT target and the
        reference its arrival; after it, its TPOT target and its last token's time (the options' targets where the
        request sets none); ``gpu``: request id → its GPU tokens. (One loop: every batch re-files the requests it ran.)"""
        opts = self.options
        ttft_default, tpot_default = opts.ttft_slo_s, opts.tpot_slo_s
        filings = []
        for s in states:
            r, rid = s.req, s.id
            if s.generated == 0:
                target = r.ttft_slo_s
                filings.append((ttft_default if target is None else target, (r.arrival_s, r.arrival_s, rid),
                                gpu[rid] > 0))
            else:
                target = r.tpot_slo_s
                filings.append((tpot_default if target is None else target, (s.last_token_s, r.arrival_s, rid),
                                gpu[rid] > 0))
        return filings

    def _rt_target_key(self, s: RequestState) -> tuple[float, tuple[float, float, int]]:
        """An RT request's slack target T and its key in T's orders (`_rt_filings`)."""
        target, key, _ = self._rt_filings((s,), {s.id: 0})[0]
        return target, key

    # --- cost and priority ----------------------------------------------------------------------

    def _over(self, b: _Batch, budget: float) -> bool:
        """``C(b) > budget``. ``C`` is max(compute, swap-in), so when the swap-in time alone exceeds the budget
        the compute estimate is not needed (in the overload regime most candidates swap in thousands of
        tokens, whose copy outlasts any budget)."""
        if b.swap_in and self.swap_cost is not None and self.swap_cost.time_s(b.swap_in) > budget:
            return True
        return self.cost_model.batch_time_s(b.features()) > budget

    def slack(self, s: RequestState, now_s: float) -> float:
        """``T_SLO − t_i``: time left to the deadline of the request's next token (its target and reference time
        from `_rt_target_key`, as the priority orders keep them)."""
        target, (ref, _, _) = self._rt_target_key(s)
        return target - (now_s - ref)

    def _ranked(self, now_s: float):
        """RT requests as (slack, arrival, id, state), ascending: the order of sorting every RT request by
        (slack, arrival, id), produced lazily. Within one target the slack ``T − (now − ref)`` is
        non-decreasing in ``ref`` (floating-point subtraction is monotone), so a target's keys read in order
        (`RtOrders.rank_keys`: the late ones, then the budget's candidates) are in slack order up to runs of
        equal slack, which are re-sorted by (arrival, id)."""
        orders = self._orders
        late = orders.late
        targets = dict.fromkeys([*late, *orders.cand]) if late else orders.cand
        streams = [self._group_stream(target, orders.rank_keys(target), now_s) for target in targets]
        return streams[0] if len(streams) == 1 else merge(*streams)

    def _group_stream(self, target: float, order, now_s: float):
        """``_ranked``'s stream of one target's requests from its keys ``order`` (`RtOrders.rank_keys`: deques read
        one after the other, or one merged iterable; stale keys skipped). A run of equal slack is sorted only when
        several reference times round to it (the keys of one reference time are in (arrival, id) order already).

        A run is read whole before it is yielded, to see whether a later reference time ties with it; a run of one
        reference time that reaches `LAZY_RUN` keys (requests that arrived together, offline: one run of every
        waiting request) instead has its end found by bisection and, when the next reference time does not tie
        with it, the rest of it is yielded as read, so a batch reads only the part the RT loop takes."""
        states, live = self.rt, self._orders.key
        deques = order if isinstance(order, list) else None
        keys = chain.from_iterable(deques) if deques is not None else iter(order)
        run: list = []
        run_slack = last_ref = None
        mixed = False
        read = 0  # keys read from ``deques`` (their position in the chain)
        for key in keys:
            read += 1
            ref, arrival, rid = key
            if live.get(rid) is not key:
                continue
            if ref != last_ref:
                last_ref, slack = ref, target - (now_s - ref)
                if slack != run_slack:
                    if mixed:
                        run.sort()
                    yield from run
                    run, run_slack, mixed = [], slack, False
                else:
                    mixed = True
            run.append((slack, arrival, rid, states[rid]))
            if len(run) == LAZY_RUN and not mixed and deques is not None:
                end, after = _run_end(deques, ref, read)
                if after is None or target - (now_s - after[0]) != slack:  # no tie: the run is ref's keys alone
                    yield from run
                    run = []
                    for _ in range(end - read):
                        key = next(keys)
                        if live.get(key[2]) is key:
                            yield slack, key[1], key[2], states[key[2]]
                    read = end
        if mixed:
            run.sort()
        yield from run

    @staticmethod
    def _step(s: RequestState) -> int:
        """Tokens the request processes if selected: its whole (remaining) prompt, or 1."""
        return s.input_tokens - s.m if s.m < s.input_tokens else 1

    def _solo_compute(self, s: RequestState) -> float:
        """The compute part of ``C({i})`` (no swap-in). Its features are those of one prefill of ``c`` tokens
        from an empty cache, or of one decode reading ``m + 1`` tokens, so it is cached per (phase, c or m) over
        all requests (at most two entries per token count)."""
        m, prompt = s.m, s.input_tokens
        key = m - prompt if m < prompt else m
        cost = self._solo.get(key)
        if cost is None:
            b = _Batch()
            b.add(s, self._step(s), 0)
            cost = self._solo[key] = self.cost_model.batch_time_s(b.features())
        return cost

    def _solo_cost(self, s: RequestState) -> float:
        """``C({i})`` = max(compute, swap-in time of its host tokens)."""
        t = self._solo_compute(s)
        if s.cpu_tokens and self.swap_cost is not None:
            t = max(t, self.swap_cost.time_s(s.cpu_tokens))
        return t

    def budget(self, ranked, now_s: float) -> float:
        """``T_min^res``: the head's slack (strict), else the smallest slack of an RT request that can
        still make its deadline alone (``slack ≥ C({i})``), else infinity. ``ranked``: (slack, …, state)
        tuples in priority order (any iterable; strict mode reads its head).

        Not strict: a minimum, so each target's list is read in slack order up to its first feasible
        request; the late requests passed on the way move to the late order until their state changes
        (exact: at a later ``now`` their slack is no larger, ``C({i})`` the same), and the stale keys passed are
        dropped. ``slack ≥ C({i})`` tests the swap-in time first (no compute estimate when it alone is too long:
        most late requests in the overload regime wait with their KV in host memory)."""
        if self.options.strict:
            return next(iter(ranked), (math.inf,))[0]
        orders = self._orders
        if now_s < self._last_now_s:  # time went back (direct calls): the late marks may not hold
            orders.unmark_late()
        self._last_now_s = now_s
        best = math.inf
        rt, swap, solo_compute, live = self.rt, self.swap_cost, self._solo_compute, orders.key
        for target, cand in list(orders.cand.items()):
            late = []
            while cand:
                key = cand[0]
                ref, _, rid = key
                if live.get(rid) is not key:
                    cand.popleft()
                    continue
                slack = target - (now_s - ref)
                if slack >= best:
                    break
                s = rt[rid]
                if not (s.cpu_tokens and swap is not None and slack < swap.time_s(s.cpu_tokens)) \
                        and slack >= solo_compute(s):  # slack ≥ C({i})
                    best = slack
                    break
                late.append(cand.popleft())
            if late:
                orders.mark_late(target, late)
            if not cand:
                del orders.cand[target]
        return best

    def _fits(self, b: _Batch, budget: float) -> bool:
        lim = self.limits
        return (b.n <= self.b_curr and b.tokens <= lim.C and b.prefill <= lim.prefill_budget
                and not self._over(b, budget))

    # --- one iteration --------------------------------------------------------------------------

    def _rt_loop(self, head: tuple | None, ranked, batch: _Batch, budget: float, holders: int, now_s: float
                 ) -> tuple[list[tuple[RequestState, list, int]], int, bool]:
        """Algorithm 1 lines 5-14: RT requests in priority order (``head``, then ``ranked``) into ``batch`` while it
        has fewer than ``B_curr`` requests, fits C and P, stays within ``budget`` (not checked for the first request
        unless strict: guard (a)) and FindPreemptBlock finds its KV slots. Returns (the selected (state, receipt,
        tokens), KV holders after them, whether the loop stopped on the budget: lines 11-12, which reset ``B_curr``).

        ``C(batch) > budget`` (`_over`) and FindPreemptBlock's first allocation are written out here: this loop runs
        for every candidate of every iteration."""
        lim, mgr = self.limits, self.mgr
        C, P, b_curr, rmax = lim.C, lim.prefill_budget, self.b_curr, lim.Rmax
        dropped, gpu, alloc_rt = mgr.dropped, mgr.gpu, mgr.alloc_rt
        batch_time_s, swap = self.cost_model.batch_time_s, self.swap_cost
        guard, feats = not self.options.strict, batch.f
        rt_ready: list[tuple[RequestState, list, int]] = []
        for item in (chain((head,), ranked) if head is not None else ()):
            s = item[3]
            if len(rt_ready) == b_curr:
                break
            rid = s.id
            if rid in dropped:
                continue  # swapped out for a more urgent request in this iteration
            c, swap_in = (s.input_tokens - s.m if s.m < s.input_tokens else 1), s.cpu_tokens  # _step(s)
            batch.add(s, c, swap_in)
            if feats.n_tokens > C or feats.prefill_tokens > P:  # a C/P overflow is not a budget break
                batch.remove(s, c, swap_in)
                return rt_ready, holders, False
            if (rt_ready or not guard) and (
                    (batch.swap_in and swap is not None and swap.time_s(batch.swap_in) > budget)
                    or batch_time_s(feats) > budget):  # _over(batch, budget)
                batch.remove(s, c, swap_in)
                return rt_ready, holders, True  # lines 11-12
            new_holder = gpu[rid] == 0
            receipt = alloc_rt(rid, swap_in + c) if not new_holder or rmax is None or holders < rmax else None
            if receipt is not None:
                holders += new_holder
            else:
                receipt, holders = self._preempt_for(s, swap_in + c, new_holder, holders, item, now_s)
                if receipt is None:
                    batch.remove(s, c, swap_in)
                    break
            rt_ready.append((s, receipt, c))
        return rt_ready, holders, False

    def next_batch(self, now_s: float) -> ScheduledBatch:
        mgr, opts = self.mgr, self.options
        if opts.check:
            self._check_against_states()
        self._victims = None  # this iteration's RT victim stream, built when an allocation first fails
        if opts.strict:  # the budget is the head's slack
            ranked = self._ranked(now_s)
            head = next(ranked, None)  # the most urgent RT request, then the rest
            budget = self.budget((head,) if head is not None else (), now_s)
        else:  # the budget moves the requests it finds late between orders that `_ranked` reads: first
            budget = self.budget((), now_s)
            ranked = self._ranked(now_s)
            head = next(ranked, None)
        self.last_budget_s = budget
        holders = len(mgr.holders)
        batch = _Batch()
        rt_ready, holders, early_return = self._rt_loop(head, ranked, batch, budget, holders, now_s)
        be_ready, holders = self._be_loop(batch, budget, holders, rt_ready)
        self.b_curr = min(opts.base_batch if early_return else 2 * self.b_curr, self.max_batch)
        swapped_out = mgr.end_iteration()
        items = [(s.id, c) for s, _, c in rt_ready]
        swap_in = [(s.id, s.cpu_tokens) for s, _, _ in rt_ready if s.cpu_tokens]
        if be_ready:
            items += [(s.id, c) for s, c in be_ready]
            swap_in += [(s.id, s.cpu_tokens) for s, _ in be_ready if s.cpu_tokens]
        swap_out = sorted(swapped_out.items())
        if (swap_in or swap_out) and self.swap_cost is None:
            raise SchedulerError(f"scheduler '{self.name}' must swap KV but the simulation has no swap cost model "
                                 f"(pass swap_cost to simulate)")
        if not items:
            if swap_out:
                raise SchedulerError(f"scheduler '{self.name}' swapped requests out for an empty batch (a bug)")
            if opts.strict and (self.rt or self.be):
                detail = (f"; the most urgent RT request {head[2]} has slack {head[0]:.4g}s, below the time of "
                          f"running it alone ({self._solo_cost(head[3]):.4g}s)" if head else "")
                raise NoProgressError(
                    f"strict BROS (Algorithm 1 as printed) returned an empty batch at t={now_s:.6g}s with "
                    f"{len(self.rt)} RT and {len(self.be)} BE requests queued{detail}; use the default guards")
        return ScheduledBatch(items=items, swap_out=swap_out, swap_in=swap_in)

    def _be_loop(self, batch: _Batch, budget: float, holders: int, rt_ready: list
                 ) -> tuple[list[tuple[RequestState, int]], int]:
        """Algorithm 1 lines 15-33: BE requests by key, except those checkpointed or dropped so far in this iteration,
        packed into ``batch`` while it stays within ``B_curr``, C, P and ``budget`` (FindBlock: empty slots only);
        one that does not fit replaces the least urgent selected RT request (popped from ``rt_ready``) if it then
        fits, else the loop stops. Returns (the selected (state, tokens), KV holders after them)."""
        mgr, opts, lim = self.mgr, self.options, self.limits
        be_ready: list[tuple[RequestState, int]] = []
        if not self.be:
            return be_ready, holders
        excluded = set(mgr.checkpointed) | set(mgr.dropped)
        candidates = (key for key in self._be_order if key[2] not in excluded)
        for key in candidates:
            s = self.be[key[2]]
            if s.id in mgr.dropped:
                continue
            c, swap_in = self._step(s), s.cpu_tokens
            new_holder = mgr.gpu[s.id] == 0
            if new_holder and lim.Rmax is not None and holders >= lim.Rmax and (rt_ready or be_ready or opts.strict):
                break  # FindBlock: no room for another KV holder (only the guard below may drop holders for it)
            batch.add(s, c, swap_in)
            if self._fits(batch, budget):  # packing
                alloc = lambda s=s, n=swap_in + c: mgr.alloc_be(s.id, n)  # noqa: E731
                if rt_ready or be_ready or opts.strict:
                    ok = alloc()
                    holders += ok and new_holder
                else:  # guard: an otherwise empty batch drops BE requests ranked after it (BE-only deadlock)
                    ok, holders = self._make_room(alloc, new_holder, holders,
                                                  self._be_ranked_after(key, excluded))
                    if not ok and not new_holder:  # every BE holder ranked after it dropped: its own earlier blocks
                        ok = mgr.alloc_be(s.id, swap_in + c, own_blocks=True)
                if not ok:
                    batch.remove(s, c, swap_in)
                    break
                be_ready.append((s, c))
                continue
            # Replacement of the least urgent selected RT request.
            if not rt_ready or (len(rt_ready) == 1 and not opts.strict):
                batch.remove(s, c, swap_in)
                break
            victim, receipt, vc = rt_ready[-1]
            batch.remove(victim, vc, victim.cpu_tokens)
            if self._fits(batch, budget) and mgr.alloc_be(s.id, swap_in + c):
                rt_ready.pop()
                victim_was_new = mgr.gpu[victim.id] == sum(step[-1] for step in receipt)
                mgr.undo_rt(victim.id, receipt)
                holders += new_holder - victim_was_new
                be_ready.append((s, c))
                continue
            batch.add(victim, vc, victim.cpu_tokens)
            batch.remove(s, c, swap_in)
            break
        return be_ready, holders

    def _be_ranked_after(self, key: tuple, excluded: set[int]) -> list[int]:
        """BE KV holders among the loop's candidates ranked after ``key``, last first (the guard's victims;
        requests without GPU tokens would be skipped anyway)."""
        keys = sorted(self._be_key[rid] for rid in self.mgr.be_holders if rid not in excluded)
        return [k[2] for k in reversed(keys[bisect_right(keys, key):])]

    def _preempt_for(self, s: RequestState, need: int, new_holder: bool, holders: int, item: tuple, now_s: float):
        """FindPreemptBlock after its first allocation failed (or could not be tried: ``Rmax`` holders and ``s``
        holds nothing; `_rt_loop` makes that attempt): slots for RT request ``s`` (bidirectional rules), dropping BE
        requests (most checkpointed first, then latest arrival), then RT requests ranked after it (its rank:
        ``item[:3]``, its (slack, arrival, id); the KV holders among them, most slack first), until it fits. Returns
        (receipt or None, holders). The victims are ordered here, on the failure: a failed allocation changes
        nothing.

        The RT victims are the iteration's `_VictimStream` (built on the first call): the RT loop selects in rank
        order, so no request ranked after the one it is placing has gained KV in this iteration; those that lost
        it are skipped by ``_make_room``."""
        mgr = self.mgr
        if self._victims is None:
            self._victims = _VictimStream(self._orders.holder_groups(), now_s, self._orders.holder)
        take, rank = self._victims.take_after, item[:3]
        if mgr.be_holders:
            be = sorted(mgr.be_holders, key=lambda rid: (self.be[rid].cpu_tokens + mgr.checkpointed.get(rid, 0),
                                                         self.be[rid].req.arrival_s, rid), reverse=True)
            return self._make_room(partial(mgr.alloc_rt, s.id, need), new_holder, holders,
                                   chain(be, iter(partial(take, rank), None)), tried=True)
        # RT victims only (every RT-only run, and BE runs with no BE holder): `_make_room` written out, without the
        # iterators and partials it needs for a general victim stream (about 2 calls per batch on azure-conv). Its
        # Rmax test is always passed here: there are at most Rmax holders before a drop, so fewer after one.
        gpu, drop, alloc_rt, rid = mgr.gpu, mgr.drop, mgr.alloc_rt, s.id
        while True:
            victim = take(rank)
            while victim is not None and not gpu[victim]:
                victim = take(rank)
            if victim is None:
                return None, holders
            drop(victim)
            holders -= 1
            got = alloc_rt(rid, need)
            if got is not None and got is not False:
                return got, holders + new_holder

    def _make_room(self, alloc, new_holder: bool, holders: int, victims, tried: bool = False):
        """Try ``alloc()``; on failure drop (swap out) ``victims`` (request ids, an iterable drawn lazily) in order,
        skipping those without GPU tokens, until it succeeds. Returns (``alloc``'s result or None, holders).
        ``tried``: the caller has just tried it (a failed allocation changes nothing), so start with a victim."""
        mgr, rmax = self.mgr, self.limits.Rmax
        gpu = mgr.gpu
        victims = iter(victims)
        while True:
            if tried:
                tried = False
            elif not new_holder or rmax is None or holders < rmax:
                got = alloc()
                if got is not None and got is not False:
                    return got, holders + new_holder
            for victim in victims:
                if gpu[victim]:
                    break
            else:
                return None, holders
            mgr.drop(victim)
            holders -= 1

    # --- checks -----------------------------------------------------------------------------------

    def _check_against_states(self) -> None:
        """Block invariants, every request's GPU tokens equal to the replayer's, and the RT orders: every RT request
        under its key in its target's late order or budget candidates (not both), the holders in the holder order."""
        self.mgr.check()
        orders = self._orders
        if sorted(orders.holder) != sorted(rid for rid in orders.key if self.mgr.gpu[rid]):
            raise SchedulerError("BROS's RT KV-holder index disagrees with the block manager")
        if set(orders.key) != set(self.rt) or any((orders.target[rid], orders.key[rid]) != self._rt_target_key(s)
                                                  for rid, s in self.rt.items()):
            raise SchedulerError("BROS's RT keys disagree with the RT requests' states")
        problem = orders.check()
        if problem is not None:
            raise SchedulerError(f"BROS's RT orders: {problem}")
        for s in (*self.rt.values(), *self.be.values()):
            if self.mgr.gpu[s.id] != s.gpu_tokens:
                raise SchedulerError(f"BROS block manager holds {self.mgr.gpu[s.id]} GPU tokens of request {s.id}, "
                                     f"the replayer {s.gpu_tokens}")

    def describe_state(self) -> str:
        return (f"RT queued={len(self.rt)}, BE queued={len(self.be)}, slots used={self.mgr.used_slots()}/"
                f"{self.capacity}, B_curr={self.b_curr}")


def _group_stream_desc(target: float, group, now_s: float, live: dict | None = None):
    """The (slack, arrival, id) of ``group``'s requests (keys (ref, arrival, id), ascending), descending: read
    from the end. A run of equal slack is yielded as read when it has one reference time (its keys are then in
    (arrival, id) order), re-sorted when several reference times round to that slack. ``live``: request id → its
    live key; other keys are stale and skipped (`bros_orders`)."""
    run: list = []
    run_slack = last_ref = None
    mixed = False
    for key in reversed(group):
        ref, arrival, rid = key
        if live is not None and live.get(rid) is not key:
            continue
        if ref != last_ref:
            last_ref, slack = ref, target - (now_s - ref)
            if slack != run_slack:
                if mixed:
                    run.sort(reverse=True)
                yield from run
                run, run_slack, mixed = [], slack, False
            else:
                mixed = True
        run.append((slack, arrival, rid))
    if mixed:
        run.sort(reverse=True)
    yield from run


class _VictimStream:
    """One iteration's RT victims: every RT KV holder as of the iteration's start as (slack, arrival, id), most
    slack first, merged lazily from the per-target holder lists (`_group_stream_desc`), and shared by the
    iteration's FindPreemptBlock calls. ``take_after(rank)`` gives the id of the next item above ``rank`` not taken
    by an earlier call, taking it, or None.

    Why one stream serves every call: the RT loop places requests in rank order, so ranks only grow between
    calls, and the stream is descending, so everything above its head has been taken. A taken item above the
    current rank was dropped by the call that took it or had no GPU tokens then, and it cannot have gained
    any since (only requests ranked before the one being placed were selected), so `_make_room` would skip it
    now: leaving it out changes nothing. Each holder is read at most once per iteration instead of once per
    call (with runs of equal slack, such as every request of one batch, re-read and re-sorted per call)."""

    __slots__ = ("_it", "_head")
    _NONE = object()

    def __init__(self, groups: dict, now_s: float, live: dict | None = None):
        streams = [_group_stream_desc(target, group, now_s, live) for target, group in groups.items()]
        self._it = streams[0] if len(streams) == 1 else merge(*streams, reverse=True)
        self._head = self._NONE

    def take_after(self, rank: tuple[float, float, int]) -> int | None:
        head = self._head
        if head is self._NONE:
            head = next(self._it, None)
        if head is None or head <= rank:
            self._head = head  # not taken (None: the stream is exhausted)
            return None
        self._head = self._NONE
        return head[2]
