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
from collections import Counter
from dataclasses import dataclass

from ..costmodel.base import BatchFeatures, CostModel
from ..limits import Limits
from ..replay import RequestState
from ..schedule import ScheduledBatch
from .base import InfeasibleRequestError, NoProgressError, Scheduler, SchedulerError
from .bros_blocks import BE, RT, BiBlockManager


@dataclass(frozen=True)
class BrosOptions:
    """BROS's knobs. ``block_size``: slots per bidirectional block (None: the limits' block size).
    ``max_batch``: cap on ``B_curr`` (None: ``Rmax``, else 1024). RT requests without a TTFT / TPOT
    target get ``ttft_slo_s`` / ``tpot_slo_s`` (the paper's 0.4 s / 0.2 s). ``check``: verify the
    block manager against the replayer every iteration (tests)."""

    strict: bool = False
    block_size: int | None = None
    base_batch: int = 128
    max_batch: int | None = None
    ttft_slo_s: float = 0.4
    tpot_slo_s: float = 0.2
    check: bool = False


def is_best_effort(s: RequestState) -> bool:
    """BE = ``request_class == "be"``; every other request is real-time."""
    return s.req.request_class == "be"


class _Batch:
    """The batch being built: items and the feature sums ``C(batch)`` needs."""

    __slots__ = ("n", "tokens", "prefill", "prefill_sq", "n_prefill", "n_decode", "decode_kv", "decode_reads", "swap_in")

    def __init__(self):
        self.n = self.tokens = self.prefill = self.prefill_sq = 0
        self.n_prefill = self.n_decode = self.decode_kv = self.swap_in = 0
        self.decode_reads: Counter[int] = Counter()  # decode KV reads in the batch (for decode_kv_max)

    def add(self, s: RequestState, c: int, swap_in: int, sign: int = 1) -> None:
        self.n += sign
        self.tokens += sign * c
        self.swap_in += sign * swap_in
        if s.m < s.input_tokens:
            self.prefill += sign * c
            self.prefill_sq += sign * c * c
            self.n_prefill += sign
        else:
            self.n_decode += sign
            self.decode_kv += sign * (s.m + 1)
            self.decode_reads[s.m + 1] += sign

    def features(self) -> BatchFeatures:
        # BROS prefills start from an empty cache (m = 0): no Σc·m term.
        return BatchFeatures(n_tokens=self.tokens, prefill_tokens=self.prefill, prefill_sq_tokens=self.prefill_sq,
                             n_prefill_seqs=self.n_prefill, n_decode_seqs=self.n_decode,
                             decode_kv_tokens=self.decode_kv,
                             decode_kv_max=max((kv for kv, count in self.decode_reads.items() if count), default=0))


class BrosScheduler(Scheduler):
    """BROS; see the module docstring. ``limits.M // block_size`` bidirectional blocks."""

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
        cap = options.max_batch or limits.Rmax or 1024
        self.max_batch = max(cap, 1)
        self.b_curr = min(options.base_batch, self.max_batch)
        self.last_budget_s = math.inf  # T_min^res of the last planned batch (inspection, tests)

    # --- queues -----------------------------------------------------------------------------

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        cap = min(self.limits.C, self.limits.prefill_budget)
        for s in arrived:
            if s.req.peak_kv_tokens > self.capacity:
                raise InfeasibleRequestError(
                    f"request {s.id} needs {s.req.peak_kv_tokens} KV slots, more than BROS's {self.mgr.num_blocks} "
                    f"blocks of {self.S} ({self.capacity} slots)")
            if s.req.prompt_tokens > cap:
                raise InfeasibleRequestError(
                    f"request {s.id}: its {s.req.prompt_tokens}-token prompt exceeds min(C, P) = {cap} and BROS does "
                    f"not chunk prefills; raise C/P")
            be = is_best_effort(s)
            (self.be if be else self.rt)[s.id] = s
            self.mgr.register(s.id, BE if be else RT)

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        for s in finished:
            self.mgr.release(s.id)
            (self.be if is_best_effort(s) else self.rt).pop(s.id)

    # --- cost and priority ----------------------------------------------------------------------

    def _cost(self, b: _Batch) -> float:
        t = self.cost_model.batch_time_s(b.features())
        if b.swap_in and self.swap_cost is not None:
            t = max(t, self.swap_cost.time_s(b.swap_in))
        return t

    def slack(self, s: RequestState, now_s: float) -> float:
        """``T_SLO − t_i``: time left to the deadline of the request's next token."""
        if s.generated == 0:
            target = s.req.ttft_slo_s if s.req.ttft_slo_s is not None else self.options.ttft_slo_s
            return target - (now_s - s.req.arrival_s)
        target = s.req.tpot_slo_s if s.req.tpot_slo_s is not None else self.options.tpot_slo_s
        return target - (now_s - s.last_token_s)

    @staticmethod
    def _step(s: RequestState) -> int:
        """Tokens the request processes if selected: its whole (remaining) prompt, or 1."""
        return s.input_tokens - s.m if s.m < s.input_tokens else 1

    def _solo_cost(self, s: RequestState) -> float:
        b = _Batch()
        b.add(s, self._step(s), s.cpu_tokens)
        return self._cost(b)

    def budget(self, ranked: list[tuple[float, RequestState]]) -> float:
        """``T_min^res``: the head's slack (strict), else the smallest slack of an RT request that can
        still make its deadline alone (``slack ≥ C({i})``), else infinity."""
        if not ranked:
            return math.inf
        if self.options.strict:
            return ranked[0][0]
        for slack, s in ranked:
            if slack >= self._solo_cost(s):
                return slack
        return math.inf

    def _fits(self, b: _Batch, budget: float) -> bool:
        lim = self.limits
        return (b.n <= self.b_curr and b.tokens <= lim.C and b.prefill <= lim.prefill_budget
                and self._cost(b) <= budget)

    # --- one iteration --------------------------------------------------------------------------

    def next_batch(self, now_s: float) -> ScheduledBatch:
        mgr, opts, lim = self.mgr, self.options, self.limits
        if opts.check:
            self._check_against_states()
        ranked = sorted(((self.slack(s, now_s), s.req.arrival_s, s.id, s) for s in self.rt.values()),
                        key=lambda t: t[:3])
        ranked = [(t[0], t[3]) for t in ranked]
        budget = self.budget(ranked)
        self.last_budget_s = budget
        holders = sum(1 for n in mgr.gpu.values() if n)
        batch = _Batch()
        rt_ready: list[tuple[RequestState, list, int]] = []
        early_return = False

        # RT loop (Algorithm 1 lines 5-14).
        for pos, (slack, s) in enumerate(ranked):
            if len(rt_ready) == self.b_curr:
                break
            if s.id in mgr.dropped:
                continue  # swapped out for a more urgent request in this iteration
            c, swap_in = self._step(s), s.cpu_tokens
            batch.add(s, c, swap_in)
            head_guard = not opts.strict and not rt_ready
            lim_ok = batch.tokens <= lim.C and batch.prefill <= lim.prefill_budget
            if not lim_ok or (not head_guard and self._cost(batch) > budget):
                batch.add(s, c, swap_in, -1)
                early_return = lim_ok  # lines 11-12 (a C/P overflow is not a budget break)
                break
            new_holder = mgr.gpu[s.id] == 0
            receipt, holders = self._find_preempt_block(s, swap_in + c, new_holder, holders, ranked[pos + 1:])
            if receipt is None:
                batch.add(s, c, swap_in, -1)
                break
            rt_ready.append((s, receipt, c))

        # BE loop (lines 15-33).
        be_ready: list[tuple[RequestState, int]] = []
        candidates = sorted((s for s in self.be.values() if s.id not in mgr.checkpointed and s.id not in mgr.dropped),
                            key=lambda s: (-(-s.cpu_tokens // self.S), s.req.arrival_s, s.id))
        for k, s in enumerate(candidates):
            if s.id in mgr.dropped:
                continue
            c, swap_in = self._step(s), s.cpu_tokens
            new_holder = mgr.gpu[s.id] == 0
            if new_holder and lim.Rmax is not None and holders >= lim.Rmax and (rt_ready or be_ready):
                break  # FindBlock: no room for another KV holder
            batch.add(s, c, swap_in)
            if self._fits(batch, budget):  # packing
                alloc = lambda s=s, n=swap_in + c: mgr.alloc_be(s.id, n)  # noqa: E731
                if rt_ready or be_ready or opts.strict:
                    ok = alloc()
                    holders += ok and new_holder
                else:  # guard: an otherwise empty batch drops BE requests ranked after it (BE-only deadlock)
                    ok, holders = self._make_room(alloc, new_holder, holders, candidates[:k:-1])
                if not ok:
                    batch.add(s, c, swap_in, -1)
                    break
                be_ready.append((s, c))
                continue
            # Replacement of the least urgent selected RT request.
            if not rt_ready or (len(rt_ready) == 1 and not opts.strict):
                batch.add(s, c, swap_in, -1)
                break
            victim, receipt, vc = rt_ready[-1]
            batch.add(victim, vc, victim.cpu_tokens, -1)
            if self._fits(batch, budget) and mgr.alloc_be(s.id, swap_in + c):
                rt_ready.pop()
                victim_was_new = mgr.gpu[victim.id] == len(receipt)
                mgr.undo_rt(victim.id, receipt)
                holders += new_holder - victim_was_new
                be_ready.append((s, c))
                continue
            batch.add(victim, vc, victim.cpu_tokens)
            batch.add(s, c, swap_in, -1)
            break

        self.b_curr = opts.base_batch if early_return else min(2 * self.b_curr, self.max_batch)
        self.b_curr = min(self.b_curr, self.max_batch)
        swapped_out = mgr.end_iteration()
        items = [(s.id, c) for s, _, c in rt_ready] + [(s.id, c) for s, c in be_ready]
        swap_in = [(s.id, s.cpu_tokens) for s, _, _ in rt_ready if s.cpu_tokens]
        swap_in += [(s.id, s.cpu_tokens) for s, _ in be_ready if s.cpu_tokens]
        swap_out = sorted(swapped_out.items())
        if (swap_in or swap_out) and self.swap_cost is None:
            raise SchedulerError(f"scheduler '{self.name}' must swap KV but the simulation has no swap cost model "
                                 f"(pass swap_cost to simulate)")
        if not items:
            if swap_out:
                raise SchedulerError(f"scheduler '{self.name}' swapped requests out for an empty batch (a bug)")
            if opts.strict and (self.rt or self.be):
                head = ranked[0] if ranked else None
                detail = (f"; the most urgent RT request {head[1].id} has slack {head[0]:.4g}s, below the time of "
                          f"running it alone ({self._solo_cost(head[1]):.4g}s)" if head else "")
                raise NoProgressError(
                    f"strict BROS (Algorithm 1 as printed) returned an empty batch at t={now_s:.6g}s with "
                    f"{len(self.rt)} RT and {len(self.be)} BE requests queued{detail}; use the default guards")
        return ScheduledBatch(items=items, swap_out=swap_out, swap_in=swap_in)

    def _find_preempt_block(self, s: RequestState, need: int, new_holder: bool, holders: int,
                            later: list[tuple[float, RequestState]]):
        """FindPreemptBlock: slots for RT request ``s`` (bidirectional rules), dropping BE requests (most
        checkpointed first, then latest arrival), then RT requests ranked after it (most slack first),
        until it fits. Returns (receipt or None, holders)."""
        mgr = self.mgr
        be = sorted((v for v in self.be.values() if mgr.gpu[v.id]),
                    key=lambda v: (v.cpu_tokens + mgr.checkpointed.get(v.id, 0), v.req.arrival_s, v.id), reverse=True)
        victims = be + [v for _, v in reversed(later)]
        return self._make_room(lambda: mgr.alloc_rt(s.id, need), new_holder, holders, victims)

    def _make_room(self, alloc, new_holder: bool, holders: int, victims: list[RequestState]):
        """Try ``alloc()``; on failure drop (swap out) ``victims`` in order until it succeeds.
        Returns (``alloc``'s result or None, holders)."""
        mgr, rmax = self.mgr, self.limits.Rmax
        victims = victims[::-1]  # pop() from the end takes them in the given order
        while True:
            if not new_holder or rmax is None or holders < rmax:
                got = alloc()
                if got is not None and got is not False:
                    return got, holders + new_holder
            while victims and not mgr.gpu[victims[-1].id]:
                victims.pop()
            if not victims:
                return None, holders
            mgr.drop(victims.pop().id)
            holders -= 1

    # --- checks -----------------------------------------------------------------------------------

    def _check_against_states(self) -> None:
        """Block invariants, and every request's GPU tokens equal to the replayer's."""
        self.mgr.check()
        for s in (*self.rt.values(), *self.be.values()):
            if self.mgr.gpu[s.id] != s.gpu_tokens:
                raise SchedulerError(f"BROS block manager holds {self.mgr.gpu[s.id]} GPU tokens of request {s.id}, "
                                     f"the replayer {s.gpu_tokens}")

    def describe_state(self) -> str:
        return (f"RT queued={len(self.rt)}, BE queued={len(self.be)}, slots used={self.mgr.used_slots()}/"
                f"{self.capacity}, B_curr={self.b_curr}")
