"""Reference for the equivalence tests: the EcoServe scheduler as of commit fc1abe4, unchanged except
for absolute imports and one deliberate rule added later (it re-sorts its queues every batch;
``infermax/schedulers/ecoserve.py`` must plan exactly the same batches).

The added rule is the PT deadlock breaking's livelock guard of f32cc2a (``livelock_guard``, on by default):
when a plan's deadlock breaking would evict the PT the previous one rescued without it having progressed,
residents are evicted until a prompt completes or the chunks fill the token budget. fc1abe4's rule can
livelock (``test_ecoserve_deadlock``, which turns the guard off), and where the guard fires the two rules
plan different batches even when fc1abe4's would have got out (found by the equivalence test in session 8:
at plan 403 of a 39-request workload the guard evicted three residents where fc1abe4 evicted one), so the
reference carries the decision too.

EcoServe (Shen & Sen, arXiv 2411.06364): decoupled prompt/generation tasks, time-synced GT groups,
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
from dataclasses import dataclass
from math import lcm
from time import perf_counter

import pandas as pd

from infermax.costmodel.base import CostModel
from infermax.ecoserve_eval import solo_decode_s, solo_prefill_s
from infermax.limits import Limits
from infermax.predictor import make_predictor
from infermax.replay import RequestState
from infermax.schedule import ScheduledBatch
from infermax.schedulers.base import Scheduler
from infermax.schedulers.ecoserve_kv import KVLedger, hosting_plan

STATES = ("waiting", "execution", "gt_queue", "preemption")
SLACK_BUCKETS_S = (0.5, 2.0)  # specs §6.12
KV_BUCKET = LEN_BUCKET = 128


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
    iteration, and the wall-clock time spent deciding batches (``perf_counter``)."""

    def __init__(self):
        self.parts: dict[str, dict[int, float]] = {k: {} for k in STATES}
        self.state: dict[int, str] = {}
        self.since: dict[int, float] = {}
        self.preemptions: dict[int, int] = {}
        self.ledger_per_iteration: list[int] = []
        self.decision_s = 0.0
        self.decisions = 0

    def arrive(self, rid: int, t: float) -> None:
        self.state[rid], self.since[rid] = "waiting", t
        for k in STATES:
            self.parts[k][rid] = 0.0

    def advance(self, now: float) -> None:
        for rid, state in self.state.items():
            self.parts[state][rid] += now - self.since[rid]
            self.since[rid] = now

    def finish(self, rid: int, t: float) -> None:
        self.parts[self.state.pop(rid)][rid] += t - self.since.pop(rid)

    def jct_parts(self) -> pd.DataFrame:
        """Seconds per request in each state (waiting, execution, gt_queue, preemption); rows sum to the JCT."""
        return pd.DataFrame(self.parts).rename_axis("id").sort_index()


class _Task:
    """Scheduler-side facts about one request."""

    __slots__ = ("s", "pred", "gen_alloc", "key", "deadline", "preempted", "group", "left_at")

    def __init__(self, s: RequestState, pred: int, deadline: float):
        self.s, self.pred, self.deadline = s, pred, deadline
        self.gen_alloc = 0  # allocation for the remaining generation (tokens)
        self.key = 0  # group key
        self.preempted = False  # was preempted / swapped / evicted at least once
        self.group: int | None = None
        self.left_at = -1  # iteration in which it was taken out of the running set


class EcoServeScheduler(Scheduler):
    """EcoServe and its ablations (see the module docstring). ``livelock_guard``: f32cc2a's rule (False: fc1abe4's)."""

    livelock_guard = True

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
        self.q_p: list[_Task] = []
        self.q_g: list[_Task] = []
        self.running: dict[int, _Task] = {}  # insertion order = admission order
        self.groups: dict[int, set[int]] = {}
        self.held: dict[int, list[int]] = {}  # release="group": finished members' ids per group
        self._next_group = 0
        self.group_completed = False
        self._last_rescue: tuple[int, int] | None = None  # the livelock guard's memory
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
            self.q_p.append(t)
            self.stats.arrive(s.id, r.arrival_s)

    def _solo_estimate_s(self, prompt: int, pred: int) -> float:
        """t_p + t_g · RL for this request served alone (cost model; RL = predicted length)."""
        cm = self.cost_model
        if cm is None:
            return float(pred)
        return solo_prefill_s(cm, prompt) + solo_decode_s(cm, prompt) * pred

    def _set_gen_alloc(self, t: _Task, remaining_pred: int) -> None:
        need = math.ceil(max(remaining_pred, 1) * (1 + self.opt.padding) - 1e-9)
        blocks = -(-need // self.opt.alloc_block)
        t.gen_alloc = blocks * self.opt.alloc_block
        t.key = blocks if self.opt.group_by == "blocks" else need

    def _to_gt_queue(self, t: _Task) -> None:
        self._regroup_if_needed(t)
        self.q_g.append(t)

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

    def _leave_running(self, t: _Task) -> None:
        del self.running[t.s.id]
        t.left_at = self.iteration
        members = self.groups.get(t.group)
        if members is not None:
            members.discard(t.s.id)
            if not members:
                self._group_done(t.group)
        t.group = None

    def _group_done(self, gid: int) -> None:
        del self.groups[gid]
        for rid in self.held.pop(gid, []):
            self.ledger.release(rid)
        self.group_completed = True

    # ---------------------------------------------------------------- ordering
    def _gt_order(self, now: float):
        if not self.opt.ordering:
            return lambda t: (t.s.req.arrival_s, t.s.id)
        return lambda t: (self._slack_bucket(t, now), -(t.s.gpu_tokens // KV_BUCKET), -(t.gen_alloc // LEN_BUCKET),
                          -t.gen_alloc, t.s.req.arrival_s, t.s.id)

    def _pt_order(self, now: float):
        if not self.opt.ordering:
            return lambda t: (t.s.req.arrival_s, t.s.id)
        return lambda t: (self._slack_bucket(t, now), -(t.s.m // KV_BUCKET), -(t.s.input_tokens // LEN_BUCKET),
                          -t.s.input_tokens, t.s.req.arrival_s, t.s.id)

    @staticmethod
    def _slack_bucket(t: _Task, now: float) -> int:
        slack = t.deadline - now
        return sum(slack >= b for b in SLACK_BUCKETS_S)

    # ---------------------------------------------------------------- the iteration
    def next_batch(self, now_s: float) -> ScheduledBatch:
        t0 = perf_counter()
        self.iteration += 1
        self.stats.advance(now_s)
        batch = ScheduledBatch()
        self._grow_running(batch)
        self._admit(batch, now_s)
        self._fill_prompts(batch, now_s)
        state = self.stats.state
        prompts = {rid for rid, _ in batch.items}
        for t in self.q_p:
            state[t.s.id] = "execution" if t.s.id in prompts else ("preemption" if t.preempted else "waiting")
        for rid in self.running:
            state[rid] = "execution"
        batch.items = [(rid, 1) for rid in self.running] + batch.items
        self.stats.ledger_per_iteration.append(self.ledger.used)
        self.stats.decision_s += perf_counter() - t0
        self.stats.decisions += 1
        return batch

    def _grow_running(self, batch: ScheduledBatch) -> None:
        """Step 1: every running GT gets room for its next token (slots taken back, reserve, preemption)."""
        for rid in list(self.running):
            t = self.running.get(rid)
            if t is None:
                continue
            while True:
                ok, leaving = self.ledger.need(rid, t.s.m + 1)
                for g in leaving:
                    self._vacate_guest(self.tasks[g.rid], batch)
                if ok:
                    break
                if len(self.running) > 1:
                    self._preempt(t)
                    break
                if not self._evict_one_resident(batch, keep=rid):
                    raise AssertionError(f"EcoServe: lone GT {rid} cannot grow and nothing can be evicted")

    def _vacate_guest(self, g: _Task, batch: ScheduledBatch) -> None:
        """A lender reached a slot whose guest still holds KV there: swap out (or evict) the guest."""
        s = g.s
        in_slot = s.m - self.ledger.allocs[s.id].m0
        if g.s.id in self.running:
            self._leave_running(g)
        else:
            self.q_g.remove(g)
        g.preempted = True
        g.left_at = self.iteration
        self.stats.preemptions[s.id] = self.stats.preemptions.get(s.id, 0) + 1
        if self.opt.overrun == "swap" and in_slot > 0:
            batch.swap_out.append((s.id, in_slot))
            self.ledger.vacate(s.id, s.gpu_tokens - in_slot)
            self._regroup_if_needed(g)
            self.q_g.append(g)
            self.stats.state[s.id] = "preemption"
        elif in_slot > 0:
            self.ledger.vacate(s.id, 0)
            self._evict(g, batch, from_queue=False)
        else:
            self.ledger.vacate(s.id, s.gpu_tokens)
            self._regroup_if_needed(g)
            self.q_g.append(g)
            self.stats.state[s.id] = "preemption"

    def _regroup_if_needed(self, g: _Task) -> None:
        if g.pred - g.s.generated >= 1:
            self._set_gen_alloc(g, g.pred - g.s.generated)
        else:
            self._regroup(g)

    def _preempt(self, t: _Task) -> None:
        """Resident (offload-free) preemption after an under-prediction; regroup (specs §2.7)."""
        s = t.s
        self._leave_running(t)
        self.ledger.preempt(s.id, s.gpu_tokens)
        t.preempted = True
        self.stats.preemptions[s.id] = self.stats.preemptions.get(s.id, 0) + 1
        self._regroup(t)
        self.q_g.append(t)
        self.stats.state[s.id] = "preemption"

    def _evict(self, t: _Task, batch: ScheduledBatch, from_queue: bool = True) -> None:
        """Recompute eviction: the request loses its KV and goes back to the PT queue."""
        s = t.s
        if from_queue:
            (self.q_g if t in self.q_g else self.q_p).remove(t)
            self.ledger.release(s.id)
        batch.evict.append(s.id)
        t.preempted = True
        t.left_at = self.iteration
        self.stats.preemptions[s.id] = self.stats.preemptions.get(s.id, 0) + 1
        self.q_p.append(t)
        self.stats.state[s.id] = "preemption"

    def _evict_one_resident(self, batch: ScheduledBatch, keep: int) -> bool:
        """Evict the lowest-priority waiting request that holds GPU KV (deadlock breaking)."""
        t = self._resident_victim(batch, keep)
        if t is None:
            return False
        self._evict(t, batch)
        return True

    def _resident_victim(self, batch: ScheduledBatch, keep: int) -> _Task | None:
        evicted = set(batch.evict) | {rid for rid, _ in batch.swap_out}
        for queue in (self.q_g, self.q_p):
            for t in reversed(queue):
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
        eligible = [t for t in self.q_g if t.left_at != self.iteration and not self._held_in_slot(t)]
        eligible.sort(key=self._gt_order(now))
        admitted: list[_Task] = []
        if o.sync:
            by_key: dict[int, list[_Task]] = {}
            for t in eligible:
                by_key.setdefault(t.key, []).append(t)
            for members in by_key.values():  # groups in the order of their first member
                gid = None
                for t in members:
                    if len(self.running) >= lim.C:
                        break
                    cost = self._admission_cost(t)
                    if cost <= room:
                        room -= cost
                        gid = self._start(t, batch, gid)
                        admitted.append(t)
        else:
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

    def _held_in_slot(self, t: _Task) -> bool:
        a = self.ledger.allocs.get(t.s.id)
        return a is not None and a.holds_slot

    def _admission_cost(self, t: _Task) -> int:
        return self.ledger.admission_cost(t.s.id, t.s.m, t.gen_alloc)

    def _start(self, t: _Task, batch: ScheduledBatch, gid: int | None, gen: int | None = None) -> int:
        s = t.s
        self.q_g.remove(t)
        if s.cpu_tokens:
            batch.swap_in.append((s.id, s.cpu_tokens))
        self.ledger.admit(s.id, s.m, t.gen_alloc if gen is None else gen)
        if gid is None:
            gid = self._next_group
            self._next_group += 1
            self.groups[gid] = set()
        self.groups[gid].add(s.id)
        t.group = gid
        self.running[s.id] = t
        return gid

    def _host(self, host: _Task, batch: ScheduledBatch, now: float) -> None:
        """KV pipelining for a newly admitted GT (``hosting_plan``); guests join the running set."""
        a = self.ledger.allocs[host.s.id]
        pool = sorted((t for t in self.q_g if t.left_at != self.iteration and t.s.cpu_tokens == 0
                       and not self._held_in_slot(t)),
                      key=lambda t: (t.gen_alloc, self._slack_bucket(t, now), -t.s.id))
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
            self.q_g.remove(g)
            self.ledger.lend(owner, slot, rid, g.s.m)
            gid = host.group
            self.groups[gid].add(rid)
            g.group = gid
            self.running[rid] = g

    def _fill_prompts(self, batch: ScheduledBatch, now: float) -> None:
        """Step 3: PT chunks up to C − #running GTs tokens (≤ P), KV from anything free."""
        lim = self.limits
        budget = min(lim.C - len(self.running), lim.prefill_budget)
        taken = {rid for rid, _ in batch.swap_out} | set(batch.evict)
        cands = [t for t in self.q_p if t.left_at != self.iteration and t.s.id not in taken]
        if budget < 1 or not cands:
            return
        cands.sort(key=self._pt_order(now))
        holders = sum(1 for t in self.tasks.values() if t.s.gpu_tokens > 0) - sum(
            1 for rid in set(batch.evict) if self.tasks[rid].s.gpu_tokens > 0)
        # A swapped-out request keeps its GPU part, so swaps do not change the holder count.
        broken = until_done = False  # the livelock guard (see the class docstring)
        while True:
            picked = self._pick_prompts(cands, budget, holders)
            if self.running or batch.items or (picked and not (
                    until_done and sum(c for _, c in picked) < budget and all(c < t.s.remaining_prefill for t, c in picked))):
                break
            victim = self._resident_victim(batch, keep=cands[0].s.id)  # deadlock breaking
            if victim is None:
                break
            if self.livelock_guard and not broken and self._last_rescue == (victim.s.id, victim.s.m):
                until_done = True
            self._evict(victim, batch)
            broken = True
            cands = [t for t in cands if t.s.id not in set(batch.evict)]
            holders -= 1
        if broken and picked:
            self._last_rescue = (picked[0][0].s.id, picked[0][0].s.m + picked[0][1])
        for t, c in picked:
            batch.items.append((t.s.id, c))
            self.ledger.set_resident(t.s.id, t.s.m + c)

    def _pick_prompts(self, cands: list[_Task], budget: int, holders: int) -> list[tuple[_Task, int]]:
        lim, blocks = self.limits, self.limits.blocks
        free = lim.M - self.ledger.used
        if self.opt.pt_kv == "queue":
            free -= sum(max(0, self._admission_cost(t)) for t in self.q_g)
        picked = []
        order = list(cands)
        while order and budget > 0:
            t = order.pop(0)
            if self.opt.ordering and t.s.remaining_prefill > budget:
                fit = [u for u in order if u.s.remaining_prefill <= budget]  # the closest-fitting PT (binary search)
                if fit:
                    u = max(fit, key=lambda u: u.s.remaining_prefill)
                    order.remove(u)
                    order.insert(0, t)
                    t = u
            s = t.s
            if s.m == 0 and lim.Rmax is not None and holders >= lim.Rmax:
                continue
            b = lim.block_size  # the largest c with blocks(m + c) - blocks(m) <= free
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
        for rid, _ in batch.items:
            t = self.tasks.get(rid)
            if t is None or rid in self.running or rid in done:
                continue
            s = t.s
            if s.m == s.input_tokens:  # prompt done: a GT now
                self.q_p.remove(t)
                self._to_gt_queue(t)
                self.stats.state[rid] = "preemption" if t.preempted else "gt_queue"

    def run_summary(self, result) -> dict:
        """EcoServe's metrics (`ecoserve_eval.ecoserve_metrics`): SSR at scale 2 with t_p, t_g from the
        cost model, JCT decomposition, allocation failures, allocated KV and decision time."""
        from infermax.ecoserve_eval import ecoserve_metrics, slo_params

        if self.cost_model is None:
            return {}
        t_p, t_g = slo_params(result.schedule.requests, self.cost_model)
        return ecoserve_metrics(result, t_p, t_g, scheduler=self)

    def describe_state(self) -> str:
        return (f"PT queue={len(self.q_p)}, GT queue={len(self.q_g)}, running GTs={len(self.running)}, "
                f"KV allocated={self.ledger.used}/{self.limits.M}")
