"""Reference BROS for the equivalence tests: the scheduler and block manager as of commit fc1abe4
(straightforward: every RT request sorted every iteration, one KV slot per allocation step, victim lists
rebuilt per request), with one change: where that code took "the first block" of a candidate set in
Python's set iteration order (an interpreter detail), it takes the lowest block id, the tie rule the
production manager documents; and strict mode's BE loop stops at Rmax KV holders on an empty batch too (it admitted
one more, a batch the replayer rejects: fixed in both on 2026-11-28). Kept verbatim otherwise; do not optimise it."""

from __future__ import annotations

import math
from collections import Counter

from infermax.costmodel.base import BatchFeatures, CostModel
from infermax.limits import Limits
from infermax.replay import RequestState
from infermax.schedule import ScheduledBatch
from infermax.schedulers.base import InfeasibleRequestError, NoProgressError, Scheduler, SchedulerError
from infermax.schedulers.bros import BrosOptions


RT, BE = 0, 1


class BlockError(RuntimeError):
    """An internal inconsistency of the block manager (a bug, never a scheduling outcome)."""


class RefBlockManager:
    """Two-owner KV blocks; see the module docstring. ``cls[rid]`` is ``RT`` or ``BE``."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.rt_owner: list[int | None] = [None] * num_blocks
        self.be_owner: list[int | None] = [None] * num_blocks
        self.rt_n = [0] * num_blocks
        self.be_n = [0] * num_blocks
        self.blocks: dict[int, list[int]] = {}  # request -> its blocks in fill order
        self.gpu: dict[int, int] = {}  # request -> GPU-resident tokens
        self.cls: dict[int, int] = {}
        # Candidate sets, kept in step with the block state by _file():
        self.free: set[int] = set(range(num_blocks))  # no owner at all
        self.rt_only = [set() for _ in range(block_size + 1)]  # by empty slots: RT owner, no BE owner
        self.be_only = [set() for _ in range(block_size + 1)]  # by empty slots: BE owner, no RT owner
        self._where: list[set | None] = [self.free] * num_blocks
        # Per iteration:
        self.checkpointed: dict[int, int] = {}  # BE request -> tokens checkpointed (overwritten) this iteration
        self.dropped: dict[int, int] = {}  # request -> tokens swapped out by a drop this iteration
        self._touched: set[int] = set()

    # --- bookkeeping ----------------------------------------------------------------------------

    def register(self, rid: int, cls: int) -> None:
        self.cls[rid] = cls
        self.blocks.setdefault(rid, [])
        self.gpu.setdefault(rid, 0)

    def empty_slots(self, blk: int) -> int:
        return self.block_size - self.rt_n[blk] - self.be_n[blk]

    def _target(self, blk: int) -> set | None:
        """The candidate set ``blk`` belongs in (None: shared by an RT and a BE owner)."""
        rt, be = self.rt_owner[blk], self.be_owner[blk]
        if rt is None and be is None:
            return self.free
        if be is None:
            return self.rt_only[self.empty_slots(blk)]
        if rt is None:
            return self.be_only[self.empty_slots(blk)]
        return None

    def _file(self, blk: int) -> None:
        """Move ``blk`` to the candidate set matching its owners and empty slots."""
        target = self._target(blk)
        old = self._where[blk]
        if old is not target:
            if old is not None:
                old.discard(blk)
            if target is not None:
                target.add(blk)
            self._where[blk] = target
        self._touched.add(blk)

    def _take(self, blk: int, rid: int, side: int) -> None:
        if side == RT:
            self.rt_owner[blk] = rid
        else:
            self.be_owner[blk] = rid
        self.blocks[rid].append(blk)

    def last_block(self, rid: int, side: int) -> int | None:
        """The request's last block if it still owns that block's ``side``."""
        own = self.blocks.get(rid)
        if not own:
            return None
        blk = own[-1]
        return blk if (self.rt_owner if side == RT else self.be_owner)[blk] == rid else None

    # --- allocation -----------------------------------------------------------------------------

    def be_capacity(self, rid: int) -> int:
        """Empty slots a BE request could get now (its last block's plus every block without a BE owner)."""
        total = len(self.free) * self.block_size + sum(e * len(s) for e, s in enumerate(self.rt_only))
        last = self.last_block(rid, BE)
        return total + (self.empty_slots(last) if last is not None else 0)

    def alloc_be(self, rid: int, n: int, own_blocks: bool = False) -> bool:
        """Give BE request ``rid`` ``n`` slots from empty slots; all or nothing (False: not enough). ``own_blocks``
        (added with BROS decision 16, not in fc1abe4): after its last block, its earlier blocks' empty slots, latest
        first."""
        earlier = [b for b in reversed(self.blocks.get(rid, [])[:-1])
                   if self.be_owner[b] == rid and self.empty_slots(b)] if own_blocks else []
        if n > self.be_capacity(rid) + sum(self.empty_slots(b) for b in earlier):
            return False
        left = n
        blk = self.last_block(rid, BE)
        for b in ([blk] if blk is not None else []) + earlier:
            k = min(left, self.empty_slots(b))
            self.be_n[b] += k
            left -= k
            self._file(b)
        blk = None
        while left:
            if blk is None or self.empty_slots(blk) == 0:
                blk = self._most_empty_without_be()
                self._take(blk, rid, BE)
            k = min(left, self.empty_slots(blk))
            self.be_n[blk] += k
            left -= k
            self._file(blk)
        self.gpu[rid] += n
        return True

    def _most_empty_without_be(self) -> int:
        if self.free:
            return min(self.free)
        for e in range(self.block_size - 1, 0, -1):
            if self.rt_only[e]:
                return min(self.rt_only[e])
        raise BlockError("no block without a BE owner has an empty slot (capacity was checked)")

    def alloc_rt(self, rid: int, n: int, protected: set[int] | frozenset = frozenset()) -> list | None:
        """Give RT request ``rid`` ``n`` slots (rules 1–4); return the receipt, or None (nothing changed)."""
        receipt: list[tuple] = []
        for _ in range(n):
            step = self._rt_slot(rid, protected)
            if step is None:
                self.undo_rt(rid, receipt)
                return None
            receipt.append(step)
        return receipt

    def _rt_slot(self, rid: int, protected) -> tuple | None:
        S = self.block_size
        last = self.last_block(rid, RT)
        if last is not None and self.empty_slots(last):  # (1) own last block
            return self._rt_put(rid, last, new=False)
        if self.free:  # (2) a wholly free block
            return self._rt_put(rid, min(self.free), new=True)
        if last is not None and self.be_n[last] and self.be_owner[last] not in protected:  # (3) overwrite the peer
            return self._rt_overwrite(rid, last, new=False)
        for e in range(S, -1, -1):  # (4) a BE-only block, most empty slots first
            for blk in sorted(self.be_only[e]):
                if self.be_owner[blk] not in protected:
                    if e:
                        return self._rt_put(rid, blk, new=True)
                    return self._rt_overwrite(rid, blk, new=True)
        return None

    def _rt_put(self, rid: int, blk: int, new: bool) -> tuple:
        if new:
            self._take(blk, rid, RT)
        self.rt_n[blk] += 1
        self.gpu[rid] += 1
        self._file(blk)
        return ("put", blk, new, None)

    def _rt_overwrite(self, rid: int, blk: int, new: bool) -> tuple:
        be = self.be_owner[blk]
        if new:
            self._take(blk, rid, RT)
        self.be_n[blk] -= 1
        self.gpu[be] -= 1
        self.checkpointed[be] = self.checkpointed.get(be, 0) + 1
        self.rt_n[blk] += 1
        self.gpu[rid] += 1
        self._file(blk)
        return ("overwrite", blk, new, be)

    def undo_rt(self, rid: int, receipt: list) -> None:
        """Reverse ``alloc_rt``'s receipt (latest step first)."""
        for kind, blk, new, be in reversed(receipt):
            self.rt_n[blk] -= 1
            self.gpu[rid] -= 1
            if kind == "overwrite" and be not in self.dropped:
                self.be_n[blk] += 1
                self.gpu[be] += 1
                self.checkpointed[be] -= 1
                if not self.checkpointed[be]:
                    del self.checkpointed[be]
            if new:
                if self.blocks[rid][-1] != blk or self.rt_n[blk]:
                    raise BlockError(f"undo of request {rid}'s block {blk} out of order")
                self.blocks[rid].pop()
                self.rt_owner[blk] = None
            self._file(blk)
        receipt.clear()

    def drop(self, rid: int) -> int:
        """Swap out all of ``rid``'s GPU tokens (its slots become empty); return how many."""
        side_n = self.rt_n if self.cls[rid] == RT else self.be_n
        owner = self.rt_owner if self.cls[rid] == RT else self.be_owner
        moved = self.gpu[rid]
        for blk in self.blocks[rid]:
            if owner[blk] == rid:
                side_n[blk] = 0
                owner[blk] = None
                self._file(blk)
        self.blocks[rid] = []
        self.gpu[rid] = 0
        if moved:
            self.dropped[rid] = self.dropped.get(rid, 0) + moved
        return moved

    def release(self, rid: int) -> None:
        """Free a finished request's slots and forget it."""
        side_n = self.rt_n if self.cls[rid] == RT else self.be_n
        owner = self.rt_owner if self.cls[rid] == RT else self.be_owner
        for blk in self.blocks.pop(rid, []):
            if owner[blk] == rid:
                side_n[blk] = 0
                owner[blk] = None
                self._file(blk)
        self.gpu.pop(rid, None)
        self.cls.pop(rid, None)

    def end_iteration(self) -> dict[int, int]:
        """Close the iteration: clear owners left with no slot; return ``{request: tokens swapped out}``."""
        for blk in self._touched:
            for owner, count in ((self.rt_owner, self.rt_n), (self.be_owner, self.be_n)):
                rid = owner[blk]
                if rid is not None and not count[blk]:
                    owner[blk] = None
                    self.blocks[rid].remove(blk)
            self._file(blk)
        self._touched = set()
        out = dict(self.checkpointed)
        for rid, n in self.dropped.items():
            out[rid] = out.get(rid, 0) + n
        self.checkpointed, self.dropped = {}, {}
        return out

    # --- checks (tests) ---------------------------------------------------------------------------

    def check(self) -> None:
        """Raise BlockError unless every invariant holds (owners, counts, candidate sets)."""
        S = self.block_size
        counted: dict[int, int] = {rid: 0 for rid in self.gpu}
        for blk in range(self.num_blocks):
            r, b = self.rt_n[blk], self.be_n[blk]
            if r < 0 or b < 0 or r + b > S:
                raise BlockError(f"block {blk}: {r} RT + {b} BE slots of {S}")
            for owner, n, side in ((self.rt_owner[blk], r, RT), (self.be_owner[blk], b, BE)):
                if owner is None:
                    if n:
                        raise BlockError(f"block {blk}: {n} slots without an owner")
                    continue
                if self.cls.get(owner) != side:
                    raise BlockError(f"block {blk}: request {owner} owns the wrong side")
                if blk not in self.blocks[owner]:
                    raise BlockError(f"block {blk} missing from request {owner}'s block list")
                counted[owner] += n
        for rid, own in self.blocks.items():
            side_owner = self.rt_owner if self.cls[rid] == RT else self.be_owner
            if len(set(own)) != len(own) or any(side_owner[blk] != rid for blk in own):
                raise BlockError(f"request {rid}'s block list {own} disagrees with the owners")
        for rid, n in counted.items():
            if n != self.gpu[rid]:
                raise BlockError(f"request {rid}: {n} slots in blocks, {self.gpu[rid]} recorded")
        for blk in range(self.num_blocks):
            target = self._target(blk)
            if self._where[blk] is not target or (target is not None and blk not in target):
                raise BlockError(f"block {blk} filed in the wrong candidate set")

    def used_slots(self) -> int:
        return sum(self.rt_n) + sum(self.be_n)





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


class RefBrosScheduler(Scheduler):
    """BROS; see the module docstring. ``limits.M // block_size`` bidirectional blocks."""

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, options: BrosOptions = BrosOptions(),
                 name: str = "bros"):
        super().__init__(limits, cost_model)
        if cost_model is None:
            raise ValueError("BROS needs a cost model (its batch-time estimator)")
        self.options, self.name = options, name
        self.S = options.block_size or limits.block_size
        self.mgr = RefBlockManager(limits.M // self.S, self.S)
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
                raise self.prefill_too_long(  # (the engine's hint on the longest prompt, as the scheduler's)
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
            if new_holder and lim.Rmax is not None and holders >= lim.Rmax and (rt_ready or be_ready or opts.strict):
                break  # FindBlock: no room for another KV holder
            batch.add(s, c, swap_in)
            if self._fits(batch, budget):  # packing
                alloc = lambda s=s, n=swap_in + c: mgr.alloc_be(s.id, n)  # noqa: E731
                if rt_ready or be_ready or opts.strict:
                    ok = alloc()
                    holders += ok and new_holder
                else:  # guard: an otherwise empty batch drops BE requests ranked after it (BE-only deadlock)
                    ok, holders = self._make_room(alloc, new_holder, holders, candidates[:k:-1])
                    if not ok and not new_holder:  # every BE holder ranked after it dropped: its own earlier blocks
                        ok = mgr.alloc_be(s.id, swap_in + c, own_blocks=True)
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
