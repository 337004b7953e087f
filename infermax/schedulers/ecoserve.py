"""EcoServe (Shen & Sen, arXiv 2411.06364): decoupled prompt/generation tasks, time-synced GT groups,
ordering, KV pipelining, predicted lengths. Implementation notes: ``shared/specs/ecoserve.md``.

Per iteration (``next_batch``):

1. Every running GT will write one token. A GT beyond its allocation takes back the slots it lent
   (their guests are swapped out or evicted, ``overrun``), then grows into free KV (the reserve);
   if none is left it is preempted *resident* (out of the batch, KV kept) and regrouped with a new
   predicted remaining length (``regroup``). The last running GT is never preempted: waiting
   residents are evicted (recompute) instead, so a lone request always progresses.
2. GT admission (``sync``): when a running group completed (or none runs; or every iteration with
   ``admit_on="free"``), GTs from the GT queue, in group order, are admitted while their allocation
   (padded predicted remaining length in ``alloc_block`` blocks) fits ``M − R − used``; a group that
   does not fit whole is split. Without ``sync`` (EcoServe-D) GTs are admitted one by one, every
   iteration, until the first that does not fit. With ``pipelining`` each newly admitted GT hosts
   shorter queued GTs in its allocation (``hosting_plan``).
3. PTs fill the batch to ``C`` tokens (minus the running GTs, at most ``P`` prompt tokens),
   chunking the last one, using any free KV including the reserve.

Ordering (``ordering``): both queues by (deadline bucket asc, occupied-KV bucket desc, length bucket
desc, exact length desc, arrival); otherwise FCFS. The scheduler reads ``predicted_output_tokens``
and never ``output_tokens``; a request without a prediction is predicted at arrival by
``options.predictor`` (the predictor, not the scheduler, reads the true length). Every choice the
paper leaves open is an ``EcoServeOptions`` field (docs/design.md).
"""

from __future__ import annotations

import bisect
import math
from heapq import heappop, heappush
from itertools import chain
from dataclasses import dataclass
from math import lcm
from time import perf_counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

from ..costmodel.base import CostModel
from ..ecoserve_eval import solo_decode_s, solo_prefill_s
from ..limits import Limits
from ..predictor import make_predictor
from ..replay import RequestState
from ..schedule import ScheduledBatch
from .base import Scheduler
from .ecoserve_kv import KVLedger, hosting_plan
from .ecoserve_queue import KV_BUCKET, LEN_BUCKET, SLACK_BUCKETS_S, DeadEntries, GTQueue, PromptQueue  # noqa: F401

STATES = ("waiting", "execution", "gt_queue", "preemption")


@dataclass(frozen=True)
class EcoServeOptions:
    """EcoServe's components and parameters (defaults: the paper's ShareGPT settings, specs §6).

    ``sync`` (S: groups admitted when a group completes), ``ordering`` (O), ``pipelining``;
    ``oracle`` predicts the true length (and is meant with ``padding=0``); ``predictor`` predicts
    requests that carry no ``predicted_output_tokens`` (``noisy``, ``noisy:MU:SIGMA``, ``oracle``).
    ``padding`` (allocation = ⌈pred·(1+padding)⌉), ``reserve`` (share of M kept from GT groups),
    ``buffer`` (hosted GT needs ≤ (1−buffer)·slot), ``alloc_block`` (allocation granularity).
    §6 choices: ``regroup`` = ``repredict`` (re-draw the prediction above the generated count) or
    ``pad`` (remaining = ⌈padding·original prediction⌉); ``release`` = ``eos`` (free at finish) or
    ``group`` (hold a finished GT's allocation until its group completes); ``admit_on`` = ``group``
    or ``free``; ``group_by`` = ``blocks`` (allocation blocks) or ``tokens``; ``overrun`` = ``swap``
    or ``recompute`` (a hosted GT caught by its lender); ``pt_kv`` = ``free`` (a PT chunk may use
    any free KV, reserve included) or ``queue`` (not ours: it must also leave room for the allocations
    of the GTs already queued, a back-pressure the paper does not describe).
    """

    sync: bool = True
    ordering: bool = True
    pipelining: bool = True
    oracle: bool = False
    predictor: str = "noisy"
    predictor_seed: int = 0
    padding: float = 0.15
    reserve: float = 0.03
    buffer: float = 0.15
    alloc_block: int = 32
    slo_scale: float = 2.0
    regroup: str = "repredict"
    release: str = "eos"
    admit_on: str = "group"
    group_by: str = "blocks"
    overrun: str = "swap"
    pt_kv: str = "free"

    def __post_init__(self) -> None:
        for name, value, allowed in (("regroup", self.regroup, ("repredict", "pad")), ("release", self.release, ("eos", "group")),
                                     ("admit_on", self.admit_on, ("group", "free")), ("group_by", self.group_by, ("blocks", "tokens")),
                                     ("overrun", self.overrun, ("swap", "recompute")), ("pt_kv", self.pt_kv, ("free", "queue"))):
            if value not in allowed:
                raise ValueError(f"EcoServe option {name} must be one of {allowed}, got {value!r}")
        for name in ("padding", "reserve", "buffer"):
            if not 0 <= getattr(self, name) < 1 + (name == "padding") * 9:
                raise ValueError(f"EcoServe option {name} out of range: {getattr(self, name)}")
        if self.alloc_block < 1 or self.slo_scale <= 0:
            raise ValueError("EcoServe needs alloc_block >= 1 and slo_scale > 0")


class EcoServeStats:
    """What the scheduler measured: time per request in each state, preemptions, allocated KV per
    iteration, and the wall-clock time spent deciding batches (``perf_counter``).

    Time is attributed per planning interval: the interval between two ``advance`` calls (batch plans)
    counts in the state a request holds when the second one starts. The accounting is lazy: ``set``
    closes a request's open interval only when its state changes, so a batch costs the requests whose
    state it changes, not every request in the system."""

    def __init__(self):
        self.parts: dict[str, dict[int, float]] = {k: {} for k in STATES}
        self.state: dict[int, str] = {}
        self.since: dict[int, float] = {}  # start of the time not yet added to parts[state]
        self.now = 0.0  # the last advance
        self.preemptions: dict[int, int] = {}
        self.ledger_per_iteration: list[int] = []
        self.decision_s = 0.0
        self.decisions = 0

    def arrive(self, rid: int, t: float) -> None:
        self.state[rid], self.since[rid] = "waiting", t
        for k in STATES:
            self.parts[k][rid] = 0.0

    def advance(self, now: float) -> None:
        self.now = now

    def set(self, rid: int, state: str) -> None:
        """``rid`` is in ``state`` from now on; up to the last ``advance`` it was in its old state."""
        old = self.state[rid]
        if old != state:
            self.parts[old][rid] += self.now - self.since[rid]
            self.since[rid], self.state[rid] = self.now, state

    def finish(self, rid: int, t: float) -> None:
        self.parts[self.state.pop(rid)][rid] += t - self.since.pop(rid)

    def jct_parts(self) -> pd.DataFrame:
        """Seconds per request in each state (waiting, execution, gt_queue, preemption); rows sum to the JCT
        (for requests still in the system: the time up to the last batch plan)."""
        parts = {k: dict(v) for k, v in self.parts.items()}
        for rid, state in self.state.items():
            parts[state][rid] += self.now - self.since[rid]
        import pandas as pd

        return pd.DataFrame(parts).rename_axis("id").sort_index()


class _Task:
    """Scheduler-side facts about one request."""

    __slots__ = ("s", "pred", "gen_alloc", "key", "deadline", "preempted", "group", "left_at", "run_seq", "due")

    def __init__(self, s: RequestState, pred: int, deadline: float):
        self.s, self.pred, self.deadline = s, pred, deadline
        self.gen_alloc = 0  # allocation for the remaining generation (tokens)
        self.key = 0  # group key
        self.preempted = False  # was preempted / swapped / evicted at least once
        self.group: int | None = None
        self.left_at = -1  # iteration in which it was taken out of the running set
        self.run_seq = 0  # when running: its place in the running set's order
        self.due: int | None = None  # when running: the plan at which its growth check is due (`_watch`)


class EcoServeScheduler(Scheduler):
    """EcoServe and its ablations (see the module docstring)."""

    def __init__(self, limits: Limits, cost_model: CostModel | None = None,
                 options: EcoServeOptions | None = None, name: str = "ecoserve"):
        super().__init__(limits, cost_model)
        self.opt = o = options or EcoServeOptions()
        self.name = name
        self.predictor = make_predictor("oracle" if o.oracle else o.predictor, o.predictor_seed)
        self.ledger = KVLedger(limits.M, limits.blocks, o.alloc_block)
        self.unit = lcm(o.alloc_block, limits.block_size)
        self.reserve_tokens = int(o.reserve * limits.M)
        self.tasks: dict[int, _Task] = {}
        self._solo_s: dict[int, tuple[float, float]] = {}  # prompt tokens -> (t_p, t_g) (`_solo_estimate_s`)
        self.q_p = PromptQueue(o.ordering, limits.block_size)  # kept in priority order between batches
        self.q_g = GTQueue(o.ordering or o.pipelining)  # kept in FCFS, admission and hosting order between batches
        self.holding: set[int] = set()  # requests with GPU-resident KV (the replayer's holders)
        self._prompts_prev: set[int] = set()  # the PTs of the previous batch
        self._now = 0.0
        self.running: dict[int, _Task] = {}  # insertion order = admission order
        self._run_seq = 0
        self._due: list[tuple[int, int, int]] = []  # heap of (plan a growth check is due, run_seq, id); stale kept
        self._entered: list[int] = []  # GTs that joined the running set in this plan
        self._decode_items: list[tuple[int, int]] = []  # (id, 1) per running GT, in the running set's order
        self._n_decode_items = 0  # decode items of the last plan (they lead its items)
        self.lazy_decode_ok = True  # running GTs' states are read through `cached_tokens` or after `sync_states`
        self.groups: dict[int, set[int]] = {}
        self.held: dict[int, list[int]] = {}  # release="group": finished members' ids per group
        self._next_group = 0
        self.group_completed = False
        # (id, m after) of the PT that got the first chunk of the last plan that broke a PT deadlock
        self._last_rescue: tuple[int, int] | None = None
        self.iteration = 0
        self.stats = EcoServeStats()

    # ---------------------------------------------------------------- arrivals and bookkeeping
    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            r = s.req
            pred = self.predictor.predict(r) if (self.opt.oracle or r.predicted_output_tokens is None) \
                else r.predicted_output_tokens
            t = _Task(s, pred, r.arrival_s + self.opt.slo_scale * self._solo_estimate_s(r.prompt_tokens, pred))
            self.tasks[s.id] = t
            self.q_p.add(t, self._now)
            self.stats.arrive(s.id, r.arrival_s)

    def _solo_estimate_s(self, prompt: int, pred: int) -> float:
        """t_p + t_g · RL for this request served alone (cost model; RL = predicted length). t_p and t_g depend
        on the prompt length only: kept per length (traces repeat lengths; two cost-model calls per arrival)."""
        cm = self.cost_model
        if cm is None:
            return float(pred)
        solo = self._solo_s.get(prompt)
        if solo is None:
            solo = self._solo_s[prompt] = (solo_prefill_s(cm, prompt), solo_decode_s(cm, prompt))
        return solo[0] + solo[1] * pred

    def _set_gen_alloc(self, t: _Task, remaining_pred: int) -> None:
        need = math.ceil(max(remaining_pred, 1) * (1 + self.opt.padding) - 1e-9)
        blocks = -(-need // self.opt.alloc_block)
        t.gen_alloc = blocks * self.opt.alloc_block
        t.key = blocks if self.opt.group_by == "blocks" else need

    def _to_gt_queue(self, t: _Task) -> None:
        self._regroup_if_needed(t)
        self._queue_gt(t)

    def _queue_gt(self, t: _Task) -> None:
        """Append ``t`` to the GT queue (moving it to the end if it is there)."""
        self.q_g.add(t, self._now)

    def _unqueue_gt(self, t: _Task) -> None:
        self.q_g.remove(t)

    def _regroup(self, t: _Task) -> None:
        """After an under-prediction: a new remaining length (specs §6.1)."""
        s = t.s
        if self.opt.regroup == "repredict":
            t.pred = self.predictor.repredict(s.req, s.generated)
            remaining = t.pred - s.generated
        else:
            remaining = max(1, math.ceil(self.opt.padding * t.pred))
            t.pred = s.generated + remaining
        self._set_gen_alloc(t, remaining)

    def _enter_running(self, t: _Task) -> None:
        """``t`` joins the running set (at its end) and decodes in this plan's batch."""
        self.running[t.s.id] = t
        self._run_seq += 1
        t.run_seq = self._run_seq
        self._entered.append(t.s.id)
        self._decode_items.append((t.s.id, 1))
        self._watch(t)

    def _watch(self, t: _Task) -> None:
        """Schedule the running GT's next growth check: the first plan at which ``m + 1`` may exceed its limit.
        A running GT decodes once in every batch, so with ``m`` read at plan ``k`` (before its batch) that is
        plan ``k + limit − m``, at least ``k + 1``. Called whenever its limit may have fallen (admission,
        lending) and after each check; a limit that rose makes the check early, which finds nothing to do."""
        due = max(self.iteration + self.ledger.allocs[t.s.id].limit - self.cached_tokens(t.s), self.iteration + 1)
        t.due = due
        heappush(self._due, (due, t.run_seq, t.s.id))

    def _leave_running(self, t: _Task) -> None:
        del self.running[t.s.id]
        self._decode_items.remove((t.s.id, 1))
        t.left_at = self.iteration
        members = self.groups.get(t.group)
        if members is not None:
            members.discard(t.s.id)
            if not members:
                self._group_done(t.group)
        t.group = None

    def _release_held(self) -> bool:
        """Deadlock breaking under ``release="group"`` (ours): when the lone running GT cannot grow and no
        waiting request holds KV, the allocations still held for finished members of unfinished groups are
        given back (their KV was freed when they finished; only the ledger kept it). False if none is held."""
        if not self.held:
            return False
        for ids in self.held.values():
            for rid in ids:
                self.ledger.release(rid)
        self.held.clear()
        return True

    def _group_done(self, gid: int) -> None:
        del self.groups[gid]
        for rid in self.held.pop(gid, []):
            self.ledger.release(rid)
        self.group_completed = True

    # ---------------------------------------------------------------- the iteration
    def next_batch(self, now_s: float) -> ScheduledBatch:
        t0 = perf_counter()
        self.iteration += 1
        self._now = now_s
        self.stats.advance(now_s)
        batch = ScheduledBatch()
        self._grow_running(batch)
        self._admit(batch, now_s)
        self._fill_prompts(batch, now_s)
        stats, q_p = self.stats, self.q_p.tasks
        prompts = {rid for rid, _ in batch.items}
        # A queued PT is executing iff in this batch, else waiting (preemption once preempted); only this
        # batch's and the previous batch's PTs can have changed (every other change sets the state itself).
        for rid in prompts | self._prompts_prev:
            t = q_p.get(rid)
            if t is not None:
                stats.set(rid, "execution" if rid in prompts else ("preemption" if t.preempted else "waiting"))
        self._prompts_prev = prompts
        running = self.running
        for rid in self._entered:  # a running GT stays in "execution" until it leaves the running set
            if rid in running:
                stats.set(rid, "execution")
        self._entered.clear()
        self._n_decode_items = len(self._decode_items)
        batch.items = self._decode_items + batch.items
        self.stats.ledger_per_iteration.append(self.ledger.used)
        self.stats.decision_s += perf_counter() - t0
        self.stats.decisions += 1
        return batch

    def _grow_running(self, batch: ScheduledBatch) -> None:
        """Step 1: every running GT gets room for its next token (slots taken back, reserve, preemption).

        Only the GTs whose check is due (`_watch`) are visited, in the running set's order: for the others
        ``m + 1`` is within their limit and ``need`` would change nothing."""
        heap, running, k = self._due, self.running, self.iteration
        if not heap or heap[0][0] > k:
            return
        due = []
        while heap and heap[0][0] <= k:
            d, seq, rid = heappop(heap)
            t = running.get(rid)
            if t is not None and t.due == d and t.run_seq == seq:
                t.due = None  # a duplicate entry is stale
                due.append((seq, t))
        due.sort()
        for _, t in due:
            rid = t.s.id
            if rid not in running:
                continue  # taken out by an earlier GT of this loop
            m_next = self.cached_tokens(t.s) + 1
            while True:
                ok, leaving = self.ledger.need(rid, m_next)
                for g in leaving:
                    self._vacate_guest(self.tasks[g.rid], batch)
                if ok:
                    break
                if len(self.running) > 1:
                    self._preempt(t)
                    break
                if not self._evict_one_resident(batch, keep=rid) and not self._release_held():
                    raise AssertionError(f"EcoServe: lone GT {rid} cannot grow and nothing can be evicted")
            if rid in running:
                self._watch(t)

    def _vacate_guest(self, g: _Task, batch: ScheduledBatch) -> None:
        """A lender reached a slot whose guest still holds KV there: swap out (or evict) the guest."""
        self.sync_states()  # the guest may be a running GT: its m and generated are read below
        s = g.s
        in_slot = s.m - self.ledger.allocs[s.id].m0
        if g.s.id in self.running:
            self._leave_running(g)
        else:
            self._unqueue_gt(g)
        g.preempted = True
        g.left_at = self.iteration
        self.stats.preemptions[s.id] = self.stats.preemptions.get(s.id, 0) + 1
        if self.opt.overrun == "swap" and in_slot > 0:
            batch.swap_out.append((s.id, in_slot))
            self.ledger.vacate(s.id, s.gpu_tokens - in_slot)
            self._regroup_if_needed(g)
            self._queue_gt(g)
            self.stats.set(s.id, "preemption")
        elif in_slot > 0:
            self.ledger.vacate(s.id, 0)
            self._evict(g, batch, from_queue=False)
        else:
            self.ledger.vacate(s.id, s.gpu_tokens)
            self._regroup_if_needed(g)
            self._queue_gt(g)
            self.stats.set(s.id, "preemption")

    def _regroup_if_needed(self, g: _Task) -> None:
        if g.pred - g.s.generated >= 1:
            self._set_gen_alloc(g, g.pred - g.s.generated)
        else:
            self._regroup(g)

    def _preempt(self, t: _Task) -> None:
        """Resident (offload-free) preemption after an under-prediction; regroup (specs §2.7)."""
        self.sync_states()  # a running GT: its m and generated are read below
        s = t.s
        self._leave_running(t)
        self.ledger.preempt(s.id, s.gpu_tokens)
        t.preempted = True
        self.stats.preemptions[s.id] = self.stats.preemptions.get(s.id, 0) + 1
        self._regroup(t)
        self._queue_gt(t)
        self.stats.set(s.id, "preemption")

    def _evict(self, t: _Task, batch: ScheduledBatch, from_queue: bool = True) -> None:
        """Recompute eviction: the request loses its KV and goes back to the PT queue."""
        s = t.s
        if from_queue:
            if s.id in self.q_g:
                self._unqueue_gt(t)
            else:
                self.q_p.remove(t)
            self.ledger.release(s.id)
        batch.evict.append(s.id)
        t.preempted = True
        t.left_at = self.iteration
        self.stats.preemptions[s.id] = self.stats.preemptions.get(s.id, 0) + 1
        self.q_p.add(t, self._now)  # keyed again in batch_done, once the eviction is applied
        self.stats.set(s.id, "preemption")

    def _evict_one_resident(self, batch: ScheduledBatch, keep: int) -> bool:
        """Evict the lowest-priority waiting request that holds GPU KV (deadlock breaking)."""
        t = self._resident_victim(batch, keep)
        if t is None:
            return False
        self._evict(t, batch)
        return True

    def _resident_victim(self, batch: ScheduledBatch, keep: int) -> _Task | None:
        """The most recently queued waiting request other than ``keep`` that holds GPU KV (GT queue first)."""
        evicted = set(batch.evict) | {rid for rid, _ in batch.swap_out}
        for queue in (self.q_g, self.q_p.tasks):
            for t in reversed(queue.values()):
                if t.s.id != keep and t.s.gpu_tokens > 0 and t.s.id not in evicted:
                    return t
        return None

    def _admit(self, batch: ScheduledBatch, now: float) -> None:
        """Step 2: GT admission (groups, split, pipelining), or one by one without ``sync``."""
        o, lim = self.opt, self.limits
        trigger = (not o.sync) or o.admit_on == "free" or self.group_completed or not self.running
        self.group_completed = False
        if not trigger or not self.q_g:
            return
        room = lim.M - self.reserve_tokens - self.ledger.used
        admitted: list[_Task] = []
        if not o.sync and not o.ordering:  # FCFS one by one: look only at the GTs up to the first that does not fit
            head = self._admit_fcfs(batch, room, admitted)
            eligible = [] if head is None else [head]
        else:
            if o.ordering:
                self.q_g.refresh(now)
                eligible = self._eligible_gts(self.q_g.by_priority())
            else:
                eligible = self._eligible_gts(self.q_g.in_fcfs_order())
        if o.sync:
            by_key: dict[int, list[_Task]] = {}
            for t in eligible:
                by_key.setdefault(t.key, []).append(t)
            blocks, allocs = lim.blocks, self.ledger.allocs
            for members in by_key.values():  # groups in the order of their first member
                gid = None
                for t in members:
                    if len(self.running) >= lim.C:
                        break
                    a = allocs.get(t.s.id)  # `_admission_cost`, inline (every eligible GT, at every admission)
                    cost = blocks(t.s.m + t.gen_alloc) - (0 if a is None else a.charge)
                    if cost <= room:
                        room -= cost
                        gid = self._start(t, batch, gid)
                        admitted.append(t)
        elif o.ordering:
            for t in eligible:
                cost = self._admission_cost(t)
                if cost > room or len(self.running) >= lim.C:
                    break
                room -= cost
                self._start(t, batch, None)
                admitted.append(t)
        if not self.running and eligible:  # nothing fits the allocation model: the head runs alone
            t = eligible[0]
            b = lim.block_size
            fits = b * ((lim.M - self.ledger.used + self.ledger.charge_of(t.s.id)) // b) - t.s.m
            self._start(t, batch, None, gen=max(0, min(t.gen_alloc, fits)))
            admitted.append(t)
            while not self.ledger.need(t.s.id, t.s.m + 1)[0]:
                if not self._evict_one_resident(batch, keep=t.s.id):
                    raise AssertionError(f"EcoServe: request {t.s.id} cannot run alone")
        if o.pipelining:
            for t in admitted:
                if t.s.id in self.running and self.ledger.allocs[t.s.id].lender is None:
                    self._host(t, batch, now)

    def _eligible(self, t: _Task) -> bool:
        """A queued GT may be admitted: not taken out in this iteration, not holding a lender's slot."""
        return t.left_at != self.iteration and not self._held_in_slot(t)

    def _admit_fcfs(self, batch: ScheduledBatch, room: int, admitted: list[_Task]) -> _Task | None:
        """EcoServe-D's admission (FCFS, one by one, until the first GT that does not fit); returns the
        first eligible GT (``None`` if there is none)."""
        keys, head, i = self.q_g.fcfs, None, 0
        while i < len(keys):
            t = self.q_g[keys[i][1]]
            if not self._eligible(t):
                i += 1
                continue
            head = head or t
            cost = self._admission_cost(t)
            if cost > room or len(self.running) >= self.limits.C:
                break
            room -= cost
            self._start(t, batch, None)  # removes keys[i]
            admitted.append(t)
        return head

    def _eligible_gts(self, tasks) -> list[_Task]:
        """``_eligible`` over many queued GTs, its tests inline (run over the whole GT queue at every admission)."""
        it, allocs = self.iteration, self.ledger.allocs
        return [t for t in tasks if t.left_at != it and not ((a := allocs.get(t.s.id)) is not None and a.holds_slot)]

    def _held_in_slot(self, t: _Task) -> bool:
        a = self.ledger.allocs.get(t.s.id)
        return a is not None and a.holds_slot

    def _admission_cost(self, t: _Task) -> int:
        return self.ledger.admission_cost(t.s.id, t.s.m, t.gen_alloc)

    def _start(self, t: _Task, batch: ScheduledBatch, gid: int | None, gen: int | None = None) -> int:
        s = t.s
        self._unqueue_gt(t)
        if s.cpu_tokens:
            batch.swap_in.append((s.id, s.cpu_tokens))
        self.ledger.admit(s.id, s.m, t.gen_alloc if gen is None else gen)
        if gid is None:
            gid = self._next_group
            self._next_group += 1
            self.groups[gid] = set()
        self.groups[gid].add(s.id)
        t.group = gid
        self._enter_running(t)
        return gid

    def _host(self, host: _Task, batch: ScheduledBatch, now: float) -> None:
        """KV pipelining for a newly admitted GT (``hosting_plan``); guests join the running set."""
        a = self.ledger.allocs[host.s.id]
        self.q_g.refresh(now)
        pool = [t for t in self._eligible_gts(self.q_g.by_allocation()) if t.s.cpu_tokens == 0]
        if not pool:
            return
        lengths = [t.gen_alloc for t in pool]
        placed: list[_Task] = [host]

        def pick(cap: int):
            if len(self.running) + len(placed) - 1 >= self.limits.C:
                return None
            i = bisect.bisect_right(lengths, cap) - 1
            while i >= 0 and pool[i] is None:
                i -= 1
            if i < 0:
                return None
            t, pool[i], lengths[i] = pool[i], None, -1
            placed.append(t)
            return t.s.id, t.gen_alloc

        plan = hosting_plan(a.limit - a.m0, host.gen_alloc, self.unit, self.opt.buffer, pick)
        for writer, rid, slot, _ in plan:
            owner = self.ledger.allocs[placed[writer].s.id]
            g = self.tasks[rid]
            self._unqueue_gt(g)
            self.ledger.lend(owner, slot, rid, g.s.m)
            self._watch(placed[writer])  # its limit fell by the slot
            gid = host.group
            self.groups[gid].add(rid)
            g.group = gid
            self._enter_running(g)

    def _fill_prompts(self, batch: ScheduledBatch, now: float) -> None:
        """Step 3: PT chunks up to C − #running GTs tokens (≤ P), KV from anything free."""
        lim = self.limits
        budget = min(lim.C - len(self.running), lim.prefill_budget)
        if budget < 1:
            return
        self.q_p.refresh(now)
        taken = {rid for rid, _ in batch.swap_out} | set(batch.evict)
        iteration = self.iteration

        def skip(t: _Task) -> bool:  # not a candidate: taken out of the GPU in this very iteration
            return t.left_at == iteration or t.s.id in taken

        if self._first_candidate(skip) is None:
            return
        holders = len(self.holding) - sum(1 for rid in set(batch.evict) if self.tasks[rid].s.gpu_tokens > 0)
        # A swapped-out request keeps its GPU part, so swaps do not change the holder count.
        broken = until_done = False  # deadlock broken in this plan; then evict until a prompt completes
        while True:
            picked = self._pick_prompts(budget, holders, skip)
            if self.running or batch.items or (picked and not (
                    until_done and sum(c for _, c in picked) < budget and all(c < t.s.remaining_prefill for t, c in picked))):
                break
            victim = self._resident_victim(batch, keep=self._first_candidate(skip).s.id)  # deadlock breaking
            if victim is None:
                break
            if not broken and self._last_rescue == (victim.s.id, victim.s.m):
                until_done = True
            self._evict(victim, batch)
            broken = True
            holders -= 1
        if broken and picked:
            self._last_rescue = (picked[0][0].s.id, picked[0][0].s.m + picked[0][1])
        for t, c in picked:
            batch.items.append((t.s.id, c))
            self.ledger.set_resident(t.s.id, t.s.m + c)

    def _first_candidate(self, skip) -> _Task | None:
        task_of = self.q_p.task_of
        for key in self.q_p.keys:
            if not skip(task_of[key]):
                return task_of[key]
        return None

    def _pick_prompts(self, budget: int, holders: int, skip) -> list[tuple[_Task, int]]:
        """PTs in priority order (``skip`` ones left out); with ordering, a PT that does not fit the
        budget whole yields to the closest-fitting one (the longest that fits) while one is left.

        A PT is passed over when it may not start (``Rmax``) or no KV is left for a chunk of it. Once
        no remaining PT can get a chunk (free KV below one block and no PT ends inside a block, or
        ``Rmax`` reached and every PT is unstarted), nothing more can be picked: free KV and the
        budget only fall and the holder count only grows, so the walk stops there instead of passing
        over every waiting request."""
        lim, blocks, b, rmax = self.limits, self.limits.blocks, self.limits.block_size, self.limits.Rmax
        q = self.q_p
        free = lim.M - self.ledger.used
        if self.opt.pt_kv == "queue":
            free -= sum(max(0, self._admission_cost(t)) for t in self.q_g.values())
        keys, task_of = q.keys, q.task_of
        picked: list[tuple[_Task, int]] = []
        done: set[int] = set()  # looked at in this call (picked or passed over)
        dead = DeadEntries()  # closest_fit's memory for this walk

        def gone(t: _Task) -> bool:
            return t.s.id in done or skip(t)

        def pass_over(t: _Task) -> None:
            done.add(t.s.id)

        fits_left = self.opt.ordering  # a PT that fits the budget whole may remain
        i = 0
        while i < len(keys) and budget > 0:
            if (q.partial == 0) if free < b else (rmax is not None and holders >= rmax and q.started == 0):
                break
            h = task_of[keys[i]]
            if gone(h):
                i += 1
                continue
            t = h
            if fits_left and h.s.remaining_prefill > budget:
                # With Rmax reached, an unstarted answer would be passed over (below) and the search repeated.
                u = q.closest_fit(budget, keys[i], gone, dead,
                                  pass_over if rmax is not None and holders >= rmax else None)
                if u is None:
                    fits_left = False  # the budget only falls
                else:
                    t = u
            if t is h:
                i += 1
            done.add(t.s.id)
            s = t.s
            if s.m == 0 and rmax is not None and holders >= rmax:
                continue
            c = min(s.remaining_prefill, budget, b * ((free + blocks(s.m)) // b) - s.m)
            if c < 1:
                continue
            free -= blocks(s.m + c) - blocks(s.m)
            budget -= c
            holders += s.m == 0
            picked.append((t, c))
        return picked

    # ---------------------------------------------------------------- after the batch
    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        done = {s.id for s in finished}
        for s in finished:
            t = self.tasks.pop(s.id)
            self.holding.discard(s.id)
            self.stats.finish(s.id, s.finish_s)
            if s.id in self.running:
                gid = t.group
                if (self.opt.release == "group" and gid is not None and len(self.groups[gid]) > 1
                        and not self.ledger.allocs[s.id].holds_slot):
                    self.held.setdefault(gid, []).append(s.id)
                else:
                    self.ledger.release(s.id)
                self._leave_running(t)
            else:
                self.q_p.remove(t)
                self.ledger.release(s.id)
        prompt_items = batch.items[self._n_decode_items:]  # the plan's decode items lead; their GTs stay running
        for rid, _ in prompt_items:
            t = self.tasks.get(rid)
            if t is None or rid in self.running or rid in done:
                continue
            s = t.s
            if s.m == s.input_tokens:  # prompt done: a GT now
                self.q_p.remove(t)
                self._to_gt_queue(t)
                self.stats.set(rid, "preemption" if t.preempted else "gt_queue")
            else:
                self.q_p.rekey(t)  # a chunk: m changed
        for rid in batch.evict:
            if rid in self.q_p:
                self.q_p.rekey(self.tasks[rid])  # m is 0 now and the length may have grown
        for rid, _ in batch.swap_out:
            if rid in self.q_g:
                self.q_g.rekey(self.tasks[rid])  # queued as its swap-out was planned: its GPU KV fell since
        tasks, holding = self.tasks, self.holding
        # A running GT's decode keeps it a KV holder; it became one by its prompt's chunk or its swap-in.
        for rid in chain((rid for rid, _ in prompt_items), batch.evict, (rid for rid, _ in batch.swap_out),
                         (rid for rid, _ in batch.swap_in)):
            t = tasks.get(rid)
            if t is not None:
                if t.s.gpu_tokens > 0:
                    holding.add(rid)
                else:
                    holding.discard(rid)

    def run_summary(self, result) -> dict:
        """EcoServe's metrics (`ecoserve_eval.ecoserve_metrics`): SSR at scale 2 with t_p, t_g from the
        cost model, JCT decomposition, allocation failures, allocated KV and decision time."""
        from ..ecoserve_eval import ecoserve_metrics, slo_params

        if self.cost_model is None:
            return {}
        t_p, t_g = slo_params(result.schedule.requests, self.cost_model)
        return ecoserve_metrics(result, t_p, t_g, scheduler=self)

    def describe_state(self) -> str:
        return (f"PT queue={len(self.q_p)}, GT queue={len(self.q_g)}, running GTs={len(self.running)}, "
                f"KV allocated={self.ledger.used}/{self.limits.M}")
