"""Clairvoyant, eviction-free schedulers for the schedule search (`solvers/search.py`).

They use what an offline optimum may know and an online scheduler may not: every request's output
length ``O``. They are `Scheduler` subclasses run through `infermax.engine.simulate`, so every batch
they plan is validated by the replayer; they are deliberately *not* registered (they exist to search
for better schedules, not to model a deployed system).

**Projected KV profile.** Every running request is processed in every batch (decodes first, and a
request is admitted only with its whole prompt in the admission batch, or, for a prompt longer than
the batch's prefill budget, under the envelope below). So a request admitted at step ``t0`` holds
exactly ``blocks(I + k)`` KV tokens during step ``t0 + k`` (``k = 0 … O − 1``) and is freed after
step ``t0 + O − 1``. `KVProfile` keeps the sum of these trajectories per future step; a request is
admitted only if profile + its trajectory stays ``≤ M`` at every step it covers, so the schedule
never evicts and never exceeds ``M`` (the replayer checks both). Compared with the ``-ef`` variants'
reservation of ``I + O − 1`` from admission on, it counts each request at its real size at each step.

A *step* is one batch in hybrid mode. Without hybrid batching (policy ``no_hybrid``) prefill-only
batches do not advance the decode steps: the step clock counts decode batches, a newcomer prefilled
in a prefill-only batch before decode step ``s`` holds ``blocks(I + 1 + k)`` during step ``s + k``
(``k = 0 … O − 2``), and the prefill batch itself holds at most what step ``s`` will hold.

**Long prompts** (``I`` above the prefill budget ``min(C, P)``, hybrid mode only): the request is
admitted alone (no other admission while it is in prefill; it gets the prefill budget after the
decodes), so its chunks are at least ``q_min = min(P, C − running)`` and at most ``min(P, C)``
tokens per batch; its prefill ends between steps ``t_early`` and ``t_late``. Until then the profile
holds the envelope ``blocks(min(I + max(0, t − t_early), I + O − 1))`` for ``t0 ≤ t ≤ t_late + O − 1``,
an upper bound of its KV at every step whatever the real chunk sizes; when its prefill ends the
envelope is replaced by the exact trajectory (pointwise smaller).

Two admission rules share this machinery:

* `ClairvoyantScheduler` (forward): each batch, waiting requests in rank order (arrival, shortest
  output, prompt or total, smallest KV area ``O·I + O(O − 1)/2``, longest peak) are admitted while they fit the profile, the token budget,
  ``Rmax`` and an optional cap on admissions per batch (pacing). Greedy admission front-loads: at
  B = 1024, I = 1, O = 256 it admits 390 requests at step 0 whose joint peak at step 255 then
  blocks every later admission, which is the ``-ef`` schedulers' wave pattern again.
* `PlannedScheduler` follows a *latest-start plan* (`latest_start_plan`): requests are placed in
  reversed time, each as late as possible (reversed, a trajectory shrinks from ``I + O − 1`` to
  ``I``, so greedy placement in reverse fills the capacity that forward greedy wastes). For
  identical requests its step count equalled the optimum of the step-count LP (minimise ``T`` s.t.
  ``Σ_k x_{t−k}(I + k) ≤ M`` for every ``t``, ``Σ x = B``) on every case we checked (I=1/O=128: 163
  steps; I=1/O=256: 504; I=64/O=256: 661; forward greedy: 256, 768, 1024). The plan also respects
  the token budget, ``P`` and ``Rmax`` per step. It assumes every request present at time 0; with
  online arrivals the forward rule is used. The executor admits requests in plan order no earlier
  than their planned step, under the same profile check (so a plan that drifts stays safe), and
  skips steps where the plan leaves the GPU idle.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Sequence

import numpy as np

from infermax.costmodel.base import BatchFeatures, CostModel
from infermax.limits import Limits
from infermax.replay import RequestState
from infermax.request import Request
from infermax.schedule import ScheduledBatch
from infermax.schedulers.algorithm1 import Algorithm1Policy, Algorithm1Scheduler
from infermax.schedulers.base import InfeasibleRequestError, Scheduler

RANKS = {
    "arrival": lambda r: (r.arrival_s, r.id),
    "short_output": lambda r: (r.output_tokens, r.arrival_s, r.id),
    "short_total": lambda r: (r.prompt_tokens + r.output_tokens, r.arrival_s, r.id),
    "short_prompt": lambda r: (r.prompt_tokens, r.arrival_s, r.id),
    # KV-token-steps a request occupies, O·I + O(O−1)/2: its share of the binding resource when KV-bound
    "small_area": lambda r: (r.output_tokens * r.prompt_tokens + r.output_tokens * (r.output_tokens - 1) // 2,
                             r.arrival_s, r.id),
    "long_peak": lambda r: (-(r.prompt_tokens + r.output_tokens), r.arrival_s, r.id),
}


class KVProfile:
    """Projected KV tokens per future step (absolute step index), grown on demand."""

    def __init__(self, size: int = 4096):
        self.kv = np.zeros(size, dtype=np.int64)

    def _ensure(self, end: int) -> None:
        if end > len(self.kv):
            grown = np.zeros(max(end, 2 * len(self.kv)), dtype=np.int64)
            grown[: len(self.kv)] = self.kv
            self.kv = grown

    def fits(self, start: int, traj: np.ndarray, M: int) -> bool:
        end = start + len(traj)
        self._ensure(end)
        return bool((self.kv[start:end] + traj).max() <= M)

    def add(self, start: int, traj: np.ndarray, sign: int = 1) -> None:
        end = start + len(traj)
        self._ensure(end)
        self.kv[start:end] += sign * traj

    def at(self, step: int) -> int:
        self._ensure(step + 1)
        return int(self.kv[step])


def trajectory(limits: Limits, first_kv: int, steps: int) -> np.ndarray:
    """``blocks(first_kv + k)`` for ``k = 0 … steps − 1``."""
    t = np.arange(first_kv, first_kv + steps, dtype=np.int64)
    b = limits.block_size
    return t if b == 1 else -(-t // b) * b


class _ProfileScheduler(Scheduler):
    """Shared machinery: the running set processed every batch, profile-checked admissions.

    Subclasses give the candidates (`_candidates`), say when to stop trying (`_on_failure`,
    `_on_admitted`) and drop admitted requests from their queue (`_remove`)."""

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, *, hybrid: bool = True,
                 name: str = "clairvoyant"):
        super().__init__(limits, cost_model)
        self.name = name
        self.hybrid = hybrid
        self.profile = KVProfile()
        self.step = 0  # index of the next decode step (hybrid: of the next batch)
        self.running: list[RequestState] = []  # admitted and unfinished, in admission order
        self.long: dict | None = None  # the long prompt in chunked prefill, with its envelope
        self._by_id: dict[int, RequestState] = {}
        self._new: list[RequestState] = []
        self._decode_batch = False
        self._traj_cache: dict[tuple[int, int], np.ndarray] = {}
        # Hybrid mode: per running request, ``t0`` with next step = t0 + tokens generated so far. The
        # engine's fast-forward applies repeated decode batches without calling batch_done, so the step
        # clock is re-derived from a running request's progress (one token per step).
        self._t0: dict[int, int] = {}

    def _traj(self, first_kv: int, steps: int) -> np.ndarray:
        key = (first_kv, steps)
        t = self._traj_cache.get(key)
        if t is None:
            t = self._traj_cache[key] = trajectory(self.limits, first_kv, steps)
        return t

    # --- admission ------------------------------------------------------------------------------
    def _try_admit(self, s: RequestState, tokens_left: int, prefill_left: int, holders: int,
                   prefill_kv: int) -> tuple[int, int] | None:
        """(tokens c, KV of the prefill-only batch so far) if ``s`` is admitted now (profile updated), else None."""
        lim = self.limits
        I, O = s.input_tokens, s.req.output_tokens - s.generated  # an evicted request re-prefills Icur
        if lim.Rmax is not None and holders >= lim.Rmax:
            return None
        if holders + 1 > lim.C:  # every holder needs a token in every later batch
            return None
        if I > min(lim.C, lim.prefill_budget):
            if not self.hybrid:
                raise InfeasibleRequestError(
                    f"request {s.id}: prompt {I} exceeds min(C, P) = {min(lim.C, lim.prefill_budget)}; the "
                    "clairvoyant scheduler chunks long prompts only with hybrid batching")
            return self._try_admit_long(s, I, O, prefill_left, holders)
        if I > prefill_left or I > tokens_left:
            return None
        if self.hybrid:
            traj = self._traj(I, O)
        else:  # prefill-only batch before decode step self.step
            prefill_kv += lim.blocks(I)
            if prefill_kv > lim.M:
                return None
            traj = self._traj(I + 1, O - 1)
        if len(traj) and not self.profile.fits(self.step, traj, lim.M):
            return None
        self.profile.add(self.step, traj)
        self._t0[s.id] = self.step - s.generated
        return I, prefill_kv

    def _try_admit_long(self, s: RequestState, I: int, O: int, prefill_left: int, holders: int):
        if self.long is not None or prefill_left < 1:
            return None
        first = min(I, prefill_left)
        if not self._hold_long(s, I, O, I - first, holders):
            return None
        return first, 0

    def _hold_long(self, s: RequestState, I: int, O: int, left_after_first: int, holders: int) -> bool:
        """Put the long prompt ``s`` (``I`` tokens to hold once prefilled, ``O`` tokens to generate) in chunked
        prefill from `step`: its envelope (module docstring) goes into the profile if it fits. This batch takes
        its first chunk; ``left_after_first`` prompt tokens remain after it; ``holders`` requests decode beside it."""
        lim = self.limits
        q_min = min(lim.prefill_budget, lim.C - holders)  # its chunk while ``holders`` requests decode
        q_max = min(lim.prefill_budget, lim.C)
        if q_min < 1:
            return False
        t0 = self.step
        t_early = t0 + math.ceil(left_after_first / q_max)
        t_late = t0 + math.ceil(left_after_first / q_min)
        env = np.minimum(np.maximum(np.arange(t0, t_late + O) - t_early, 0) + I, I + O - 1)
        if lim.block_size > 1:
            env = -(-env // lim.block_size) * lim.block_size
        if not self.profile.fits(t0, env, lim.M):
            return False
        self.profile.add(t0, env)
        self.long = {"id": s.id, "t0": t0, "env": env, "I": I, "O": O}
        return True

    def _candidates(self):
        """Waiting requests to try this batch, in order."""
        raise NotImplementedError

    def _on_failure(self, s: RequestState) -> bool:
        """``s`` does not fit; True stops trying this batch."""
        return False

    def _on_admitted(self, n_admitted: int) -> bool:
        """True stops admitting this batch."""
        return False

    def _remove(self, admitted: list[RequestState]) -> None:
        """Drop admitted requests from the queue."""

    def _admit(self, tokens_left: int, prefill_left: int, prefill_kv: int) -> list[tuple[int, int]]:
        items = []
        holders = len(self.running)
        for s in self._candidates():
            got = self._try_admit(s, tokens_left, prefill_left, holders, prefill_kv)
            if got is None:
                if self._on_failure(s):
                    break
                continue
            c, prefill_kv = got
            items.append((s.id, c))
            self._new.append(s)
            tokens_left -= c
            prefill_left -= c
            holders += 1
            if self.long is not None or self._on_admitted(len(self._new)):
                break
        if self._new:
            self._remove(self._new)
        return items

    def next_batch(self, now_s: float) -> ScheduledBatch:
        lim = self.limits
        self._new = []
        long_id = self.long["id"] if self.long else None
        decodes = [(s.id, 1) for s in self.running if s.id != long_id]
        if long_id is not None:  # the long prompt's next chunk after the decodes; nobody else is admitted
            s = self._by_id[long_id]
            c = min(s.input_tokens - s.m, lim.prefill_budget, lim.C - len(decodes))
            self._decode_batch = True
            return ScheduledBatch(items=decodes + [(s.id, c)])
        if self.hybrid:
            if self.running:
                s = self.running[0]
                self.step = self._t0[s.id] + s.generated
            self._decode_batch = True
            n = len(decodes)
            return ScheduledBatch(items=decodes + self._admit(lim.C - n, min(lim.prefill_budget, lim.C - n), 0))
        # No hybrid batching: a prefill-only batch when anyone can be admitted, else a decode batch.
        current_kv = sum(lim.blocks(s.m) for s in self.running)
        prefills = self._admit(lim.C, lim.prefill_budget, current_kv)
        self._decode_batch = not prefills
        return ScheduledBatch(items=prefills or decodes)

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        self.running.extend(self._new)
        self._new = []
        if self.long is not None:
            s = self._by_id[self.long["id"]]
            if s.finished or s.m >= s.input_tokens:  # its prefill ended in this step: envelope -> exact trajectory
                env, off = self.long["env"], self.step - self.long["t0"]
                self.profile.add(self.step, env[off:], sign=-1)
                self.profile.add(self.step, self._traj(self.long["I"], self.long["O"]))
                self._t0[s.id] = self.step + 1 - s.generated
                self.long = None
        if finished:
            done = {s.id for s in finished}
            self.running = [s for s in self.running if s.id not in done]
        if self._decode_batch:
            self.step += 1

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        # Nothing waiting: every later batch decodes the same running set until an arrival or a finish.
        return self.hybrid and self.long is None and not self._has_waiting()

    def _has_waiting(self) -> bool:
        raise NotImplementedError

    def describe_state(self) -> str:
        return f"running={len(self.running)}, step={self.step}, projected KV now={self.profile.at(self.step)}"


class PrefillDeferral:
    """Whether to hold a newcomer's prompt back while the running requests finish (for the sum of latencies).

    A prompt prefilled now lengthens the current batch by its cost ``c`` (its prefill alone, less a decode's
    batch), and every running request waits that long. Held back ``t`` decode steps, it no longer delays the
    running requests that finish within them, ``k(t)`` of them, but its own first token, and those of the
    ``q`` other requests still waiting (not admitted in this batch), come about ``t`` decode batches of time ``b``
    later. The rule holds the prompt back when ``c·k(t) > w·(1 + q)·t·b`` for some ``t`` (a running request's
    remaining steps; ``b`` the running set's decode batch now; ``w`` a weight, the search tries several). The
    exchange is only estimated (the decodes held back share fewer intercepts; the requests still waiting would not
    all start at once), so it is a heuristic, judged by the replayer like every candidate. Found on A.3 LISO+SISO,
    B = 16 (linear model): the forward waves prefilled three 512-token prompts in one batch beside five short
    decodes (4.987 s latency sum); finishing the short requests first gives 4.567 s."""

    def __init__(self, cost_model: CostModel, weight: float):
        self.cost_model, self.weight = cost_model, weight
        self._prompt_s: dict[int, float] = {}
        self._finishing: list[tuple[int, int]] = []  # (steps left, running requests finished within them)
        self._decode_s = 0.0

    def start_batch(self, running: list[RequestState]) -> None:
        """The running set of the batch being planned (each decodes in it)."""
        self._finishing = []
        if not running:
            return
        f = BatchFeatures()
        for s in running:
            f.add_decode(s.m)
        self._decode_s = self.cost_model.batch_time_s(f)
        left = sorted(s.req.output_tokens - s.generated for s in running)
        for k, t in enumerate(left, 1):
            if k == len(left) or left[k] != t:
                self._finishing.append((t, k))

    def prompt_s(self, prompt_tokens: int) -> float:
        """What a prompt adds to a batch: its prefill alone less one decode's batch."""
        c = self._prompt_s.get(prompt_tokens)
        if c is None:
            f, one = BatchFeatures(), BatchFeatures()
            f.add_prefill(prompt_tokens, 0)
            one.add_decode(prompt_tokens)
            c = self._prompt_s[prompt_tokens] = max(0.0, self.cost_model.batch_time_s(f)
                                                    - self.cost_model.batch_time_s(one))
        return c

    def defers(self, s: RequestState, behind: int) -> bool:
        """Hold ``s`` back this batch (``behind``: the other requests still waiting, `q`)?"""
        if not self._finishing:
            return False
        c = self.prompt_s(s.input_tokens - s.m)
        wait = self.weight * (1 + max(0, behind)) * self._decode_s
        return any(c * k > wait * t for t, k in self._finishing)


class ClairvoyantScheduler(_ProfileScheduler):
    """Forward profile-checked admission in ``rank`` order (`RANKS`), at most ``max_admit`` per batch
    (None: unlimited), giving up for the batch after ``lookahead`` waiting requests that do not fit."""

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, *, rank: str = "arrival",
                 max_admit: int | None = None, lookahead: int = 8, hybrid: bool = True, name: str | None = None,
                 work_cap_tokens: int | None = None, defer_weight: float | None = None):
        if rank not in RANKS:
            raise ValueError(f"rank must be one of {sorted(RANKS)}, got {rank!r}")
        if defer_weight is not None and (cost_model is None or not defer_weight > 0):
            raise ValueError("defer_weight needs a cost model and a weight > 0")
        super().__init__(limits, cost_model, hybrid=hybrid,
                         name=name or f"clairvoyant rank={rank} max_admit={max_admit}")
        self.rank = RANKS[rank]
        self.max_admit = max_admit
        # Admission only while the running requests' I + O plus the newcomer's stay within this many tokens
        # (always at least one request): many short requests run together, long ones few at a time.
        self.work_cap_tokens = work_cap_tokens
        self.lookahead = lookahead
        self.waiting: list[RequestState] = []
        self._fails = 0
        self.defer = None if defer_weight is None else PrefillDeferral(cost_model, defer_weight)

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            self._by_id[s.id] = s
        self.waiting = sorted(self.waiting + list(arrived), key=lambda s: self.rank(s.req))

    def _candidates(self):
        self._fails = 0
        if self.defer is not None and self.waiting:  # (nobody to hold back otherwise)
            self.defer.start_batch(self.running)
        return self.waiting

    def _try_admit(self, s: RequestState, tokens_left: int, prefill_left: int, holders: int,
                   prefill_kv: int) -> tuple[int, int] | None:
        if self.work_cap_tokens is not None and (self.running or self._new):
            load = sum(r.req.prompt_tokens + r.req.output_tokens for r in (*self.running, *self._new))
            if load + s.req.prompt_tokens + s.req.output_tokens > self.work_cap_tokens:
                return None
        if self.defer is not None and self.defer.defers(s, len(self.waiting) - len(self._new) - 1):
            return None
        return super()._try_admit(s, tokens_left, prefill_left, holders, prefill_kv)

    def _on_failure(self, s) -> bool:
        self._fails += 1
        return self._fails >= self.lookahead

    def _on_admitted(self, n_admitted: int) -> bool:
        return self.max_admit is not None and n_admitted >= self.max_admit

    def _remove(self, admitted) -> None:
        ids = {s.id for s in admitted}
        self.waiting = [s for s in self.waiting if s.id not in ids]

    def _has_waiting(self) -> bool:
        return bool(self.waiting)


class FirstTokenScheduler(ClairvoyantScheduler):
    """For mean TTFT: first tokens first, evicting (recompute) whatever holds the KV they need.

    While some arrived request has no token yet, each batch is prefill-only: such requests, those already
    in a chunked prefill first, then shortest prompt first (with ``srpt``: all of them by prompt tokens left,
    so a short prompt that arrives preempts a long one in chunked prefill, as SRPT does on one machine; the
    Azure slice at P = 512: mean TTFT 0.2036 s against 0.2302 s), each prefilled whole unless its prompt exceeds
    ``min(C, P)`` (then chunked over consecutive batches) or the batch would be empty, within ``C``/``P``; when ``M`` or
    ``Rmax`` is short, running requests are evicted (largest KV first) to make room, and when only prompts in chunked
    prefill hold what the first candidate needs, they are (most tokens left first: SRPT's preemption, by recompute).
    Mean TTFT only counts first tokens, so the optimum for it may well recompute; the latency of everyone else is not
    its concern. With ``defer_decodes``, while some request of the
    workload (`expect`) has yet to arrive, a batch with no prompt to serve is not run at all: the GPU idles until
    the next arrival instead of starting decodes that a newcomer would wait behind (every decode can wait until the
    last first token; Azure slice, SRPT order: mean TTFT 0.2036 s at P = 512 against 0.1783 s deferred at
    P = 2,048). With ``lookahead`` (clairvoyant about arrivals, SRPT order, a cost model to time chunks) each
    prefill-only batch serves one prompt, the SRPT head (joining a second delays the first's token by the second's
    work to save one intercept, which the Azure slice never repays), and its chunk is cut to end by the arrival of a
    prompt shorter than what the head will have left then, so SRPT's preemption happens at that arrival instead of
    at the end of a long batch (the GPU idles until it when not one token fits; Azure slice: 0.1723 s → 0.1543 s
    at P = C). Otherwise the forward clairvoyant rule runs over
    the rest (evicted requests re-prefill ``Icur`` and have ``O − g`` tokens left). Its profile is only
    valid while decodes run every step, so after prefill-only batches it is rebuilt from the running
    requests (their exact remaining trajectories, ``blocks(m + 1 + k)``), evicting, in the first batch
    back, those that do not fit ``M`` or ``C`` (latest-admitted first); a long prompt the forward rule had in
    chunked prefill gets a fresh envelope over what is left of it (`_rebuild`).
    """

    def __init__(self, limits: Limits, cost_model: CostModel | None = None, *, rank: str = "small_area",
                 hybrid: bool = True, name: str | None = None, srpt: bool = False, defer_decodes: bool = False,
                 lookahead: bool = False):
        super().__init__(limits, cost_model, rank=rank, hybrid=hybrid, name=name or f"first-token-first rank={rank}")
        if lookahead and (not srpt or cost_model is None):
            raise ValueError("lookahead needs the SRPT order and a cost model (to time the chunks)")
        self.srpt = srpt
        self.defer_decodes = defer_decodes
        self.lookahead = lookahead
        self._expected = self._arrived = 0  # requests the run will submit (`expect`; 0: unknown) and arrived so far
        self._future: list[tuple[float, int]] = []  # (arrival, prompt tokens) of every open-loop request, by time
        self._dirty = False
        self._evicting: list[RequestState] = []
        self.prefilling: list[RequestState] = []  # in a chunked prefill of their prompt (no token yet)

    def expect(self, requests) -> None:
        # a closed loop may leave some requests never released: deferring for them could idle forever
        open_loop = all(r.closed_loop_group is None for r in requests)
        self._expected = len(requests) if open_loop else 0
        self._future = sorted((r.arrival_s, r.prompt_tokens) for r in requests) if open_loop else []

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        self._arrived += len(arrived)
        super().add_arrivals(arrived)

    def next_batch(self, now_s: float) -> ScheduledBatch:
        self._evicting = []
        fresh = sorted((s for s in self.waiting if s.generated == 0 and s.m == 0),
                       key=lambda s: (s.req.prompt_tokens, s.req.arrival_s, s.id))
        if fresh or self.prefilling:
            started = sorted(self.prefilling, key=lambda s: (s.input_tokens - s.m, s.id))
            if self.srpt:  # one order by prompt tokens left (ties: the one started first)
                order = sorted(started + fresh, key=lambda s: s.input_tokens - s.m)
                if self.lookahead:
                    cap = self._chunk_before_shorter_arrival(order[0], now_s)
                    if cap == 0:
                        return ScheduledBatch(items=[])  # idle: a shorter prompt arrives before one token could run
                    return self._first_tokens(order[:1], cap)
                return self._first_tokens(order)
            return self._first_tokens(started + fresh)
        if self.defer_decodes and self._arrived < self._expected:
            return ScheduledBatch(items=[])  # idle until the next arrival (the engine moves the clock there)
        if not self._dirty:
            return super().next_batch(now_s)
        self._dirty = False
        keep, self._evicting = self._rebuild()
        self.running = keep
        batch = super().next_batch(now_s)
        batch.evict = [s.id for s in self._evicting]
        return batch

    def _chunk_before_shorter_arrival(self, head: RequestState, now_s: float) -> int | None:
        """With ``lookahead``: the most tokens of ``head``'s prompt the batch starting at ``now_s`` may take so that
        it ends by the first arrival, before ``head`` would finish, of a prompt shorter than what ``head`` would
        then have left (SRPT would switch to it); None: no such arrival; 0: not one token fits before it."""
        lim = self.limits
        full = min(lim.C, lim.prefill_budget)
        left = head.input_tokens - head.m
        end_s = now_s + self._chunk_s(min(left, full), head.m)
        i = bisect.bisect_right(self._future, (now_s, math.inf))
        while i < len(self._future) and self._future[i][0] < end_s:
            arrival_s, prompt = self._future[i]
            fits = self._tokens_within(arrival_s - now_s, head.m, min(left, full))
            if prompt < left - fits:
                return fits
            i += 1
        return None

    def _chunk_s(self, tokens: int, context: int) -> float:
        f = BatchFeatures()
        f.add_prefill(tokens, context)
        return self.cost_model.batch_time_s(f)

    def _tokens_within(self, gap_s: float, context: int, most: int) -> int:
        """The most prefill tokens (at most ``most``) at ``context`` one batch can take within ``gap_s``."""
        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._chunk_s(mid, context) <= gap_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _first_tokens(self, candidates: list[RequestState], cap: int | None = None) -> ScheduledBatch:
        """A prefill-only batch over ``candidates`` (no token yet) in that order (`next_batch` orders them). A
        prompt is chunked only when it cannot fit a batch whole (over ``min(C, P)``, or ``cap`` tokens) or the batch
        would otherwise be empty."""
        lim = self.limits
        full = min(lim.C, lim.prefill_budget)
        budget = full if cap is None else min(full, cap)
        kv = sum(lim.blocks(s.m) for s in self.running) + sum(lim.blocks(s.m) for s in self.prefilling)
        victims = sorted(self.running, key=lambda s: (s.m, s.id))  # evict from the end: largest KV first
        holders = len(self.running) + len(self.prefilling)
        items, evict, started, done = [], [], [], []
        for s in candidates:
            if any(v is s for v in evict):
                continue  # preempted below for an earlier candidate
            left = s.input_tokens - s.m
            c = min(left, budget)
            if c < 1 or (c < left and left <= full and items):
                break
            new_holder = s.m == 0
            need = lim.blocks(s.m + c) - lim.blocks(s.m)

            def blocked() -> bool:
                return kv + need > lim.M or (new_holder and lim.Rmax is not None and holders >= lim.Rmax)

            if not items and blocked() and not victims:
                # Only prompts in chunked prefill hold what the first candidate needs: the one with the most tokens
                # left goes first (SRPT preempts it; recompute), so the batch is never empty.
                victims = sorted((p for p in self.prefilling if p is not s),
                                 key=lambda p: (p.input_tokens - p.m, p.id))
            while victims and blocked():
                v = victims.pop()
                evict.append(v)
                kv -= lim.blocks(v.m)
                holders -= 1
            if blocked():
                break
            items.append((s.id, c))
            kv += need
            holders += new_holder
            budget -= c
            (done if c == left else started).append(s)
        if not items:
            raise InfeasibleRequestError(f"{self.name}: no prompt chunk fits M = {lim.M} beside the prompts in "
                                         "chunked prefill")
        moved = {s.id for s in done + started + evict}
        self.prefilling = [s for s in self.prefilling if s.id not in moved] + started
        self.waiting = [s for s in self.waiting if s.id not in moved]
        self._new.extend(done)  # their first token comes in this batch: they decode from the next one on
        self._evicting = evict
        self._decode_batch = False
        self._dirty = True
        return ScheduledBatch(items=items, evict=[v.id for v in evict])

    def _rebuild(self) -> tuple[list[RequestState], list[RequestState]]:
        """The profile from the running requests (their exact remaining trajectories), step 0 = the next batch:
        (kept, evicted). Decoding requests are kept in admission order while they fit ``M`` and leave a token of
        ``C`` (the latest admitted are evicted first); then a long prompt the Clairvoyant rule had in chunked
        prefill gets a fresh envelope over what is left of its prompt (the old one was relative to the old
        profile), or is evicted when that does not fit. So the batch is never empty while anyone is kept: an idle
        step could not carry the evictions (the engine refuses that)."""
        lim = self.limits
        self.profile = KVProfile()
        self.step = 0
        self._t0 = {}
        self.long = None
        keep, evict = [], []
        for s in self.running:
            if s.m < s.input_tokens:
                continue  # the long prompt, placed after the decodes below
            traj = self._traj(s.m + 1, s.req.output_tokens - s.generated)
            if len(keep) + 1 < lim.C and self.profile.fits(0, traj, lim.M):
                self.profile.add(0, traj)
                self._t0[s.id] = -s.generated
                keep.append(s)
            else:
                evict.append(s)
        for s in self.running:
            if s.m < s.input_tokens:
                left = s.input_tokens - s.m
                first = min(left, lim.prefill_budget, lim.C - len(keep))  # its chunk in the next batch
                O = s.req.output_tokens - s.generated
                if first >= 1 and self._hold_long(s, s.input_tokens, O, left - first, len(keep)):
                    keep.append(s)
                else:
                    evict.append(s)
        return keep, evict

    def _candidates(self):
        out = super()._candidates()
        if self._evicting:
            gone = {s.id for s in self._evicting}
            return [s for s in out if s.id not in gone]
        return out

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        if self._evicting:
            gone = {s.id for s in self._evicting}
            self.running = [s for s in self.running if s.id not in gone]
            self.waiting = sorted(self.waiting + self._evicting, key=lambda s: self.rank(s.req))
            self._evicting = []
        super().batch_done(batch, finished)

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        return not self._dirty and super().repeats_full_decode(batch)


def latest_start_plan(requests: Sequence[Request], limits: Limits, order: str | Sequence[int] = "long_peak", *,
                      start_every: int = 1, prefill_cap: int | None = None,
                      lookahead: int = 8) -> list[tuple[int, int]]:
    """Reverse-time greedy: ``(planned start step, request id)`` sorted by step, every request placed as
    late as possible in ``order`` (a `RANKS` key or a list of ids; the first placed finishes last) so that per step the KV
    (``blocks(I + k)``) fits ``M``, the holders fit ``Rmax``, and the prompts started in one step fit
    ``prefill_cap`` (default half of ``min(C, P)``, leaving the rest of the token budget to the
    decodes; the executor enforces ``C`` exactly and delays a request that does not fit).
    ``start_every = k`` allows starts only every ``k`` steps: fewer batches carry a prefill (each pays
    the prefill intercept) at the price of a coarser packing. ``lookahead`` requests that do not fit
    end a reversed step. Raises `InfeasibleRequestError` for a prompt over ``min(C, P)`` (the plan
    prefills every prompt in one batch)."""
    lim = limits
    budget = min(lim.C, lim.prefill_budget)
    cap = max(1, budget // 2) if prefill_cap is None else prefill_cap
    for r in requests:
        if r.prompt_tokens > budget:
            raise InfeasibleRequestError(f"request {r.id}: prompt {r.prompt_tokens} exceeds min(C, P) = {budget}; "
                                         "the latest-start plan prefills every prompt in one batch")
    if isinstance(order, str):
        todo = deque(sorted(requests, key=RANKS[order]))
    else:  # an explicit placement order of request ids
        by_id = {r.id: r for r in requests}
        todo = deque(by_id[rid] for rid in order)
        if len(todo) != len(by_id):
            raise ValueError("an explicit plan order must list every request id once")
    kv, pre, hold = KVProfile(), KVProfile(), KVProfile()
    rev_traj: dict[tuple[int, int], np.ndarray] = {}
    placed: list[tuple[int, int]] = []  # (reversed index of the start step, id)
    rmax = lim.Rmax if lim.Rmax is not None else lim.C
    u = 0
    while todo:
        fails = scanned = 0
        skipped: list[Request] = []
        while todo and fails < lookahead and scanned < lookahead * start_every:
            r = todo.popleft()
            I, O = r.prompt_tokens, r.output_tokens
            start = u + O - 1
            if start % start_every:
                scanned += 1
                skipped.append(r)
                continue
            t = rev_traj.get((I, O))
            if t is None:
                t = rev_traj[(I, O)] = trajectory(lim, I, O)[::-1].copy()
            pre._ensure(start + 1)
            hold._ensure(start + 1)
            if (pre.kv[start] + I <= max(cap, I) and hold.kv[u:start + 1].max() < rmax and kv.fits(u, t, lim.M)):
                kv.add(u, t)
                pre.kv[start] += I
                hold.kv[u:start + 1] += 1
                placed.append((start, r.id))
            else:
                fails += 1
                skipped.append(r)
        todo.extendleft(reversed(skipped))
        u += 1
    last = max(s for s, _ in placed)
    return sorted((last - s, rid) for s, rid in placed)


class PlannedScheduler(_ProfileScheduler):
    """Admits requests in the order of a plan ``[(start step, id)]``, none before its step (the plan is
    shifted when nothing runs, so the GPU never idles waiting for a planned step), under the profile
    check; a request that does not fit (or has not arrived) holds back the rest of the plan."""

    def __init__(self, limits: Limits, plan: list[tuple[int, int]], cost_model: CostModel | None = None, *,
                 hybrid: bool = True, name: str = "latest-start plan"):
        super().__init__(limits, cost_model, hybrid=hybrid, name=name)
        self.plan = deque(plan)
        self.offset = 0

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            self._by_id[s.id] = s

    def _candidates(self):
        if not self.running and self.plan and self.plan[0][0] + self.offset > self.step:
            self.offset = self.step - self.plan[0][0]
        for step, rid in self.plan:
            if step + self.offset > self.step or rid not in self._by_id:
                return
            yield self._by_id[rid]

    def _on_failure(self, s) -> bool:
        return True

    def _remove(self, admitted) -> None:
        for _ in admitted:
            self.plan.popleft()

    def _has_waiting(self) -> bool:
        return bool(self.plan)


# Work cap of `prefill_partition`: requests × prompts per group (each a cost-model evaluation).
PARTITION_MAX_EVALUATIONS = 200_000


def _all_decode_together(requests: Sequence[Request], limits: Limits) -> bool:
    """Whether `PrefillFirstScheduler`'s schedule fits the limits: every request holds its KV from its prefill to its
    end, so their peaks must fit ``M`` together, and every request decodes in every decode batch, so there must be
    at most ``C`` and ``Rmax`` of them."""
    n = len(requests)
    return (sum(limits.blocks(r.peak_kv_tokens) for r in requests) <= limits.M and n <= limits.C
            and (limits.Rmax is None or n <= limits.Rmax))


def prefill_partition(requests: Sequence[Request], limits: Limits, cost_model: CostModel) -> list[list[int]] | None:
    """The prompts, shortest first, split into consecutive groups, each one prefill-only batch of whole prompts
    within ``min(C, P)`` tokens, minimising the sum of those batches' times (a DP over group ends) — the first half
    of `PrefillFirstScheduler`'s schedule. None when that schedule does not fit the limits (every request holds its
    KV from its prefill to its end, so their peaks must fit ``M`` together; every request decodes in every decode
    batch, so there must be at most ``C`` and ``Rmax`` of them) or the DP would exceed `PARTITION_MAX_EVALUATIONS`.

    Found on ``--I 64 --O 4 --B 32`` (fitted A100 profile): groups of 6, 6, 6, 6 and 8 prompts (384, 384, 384, 384
    and 512 tokens, each at or under a token-count step), then three decode batches, 182.690 ms, which meets the
    lower bound (`lower_bound`, item 8), where every earlier candidate stopped at 185.43 ms."""
    n, budget = len(requests), min(limits.C, limits.prefill_budget)
    if not _all_decode_together(requests, limits):
        return None
    order = sorted(requests, key=lambda r: (r.prompt_tokens, r.id))
    if any(r.prompt_tokens > budget for r in order):
        return None
    width = min(n, max(1, budget // max(1, order[0].prompt_tokens)))  # most prompts one batch can hold
    if n * width > PARTITION_MAX_EVALUATIONS:
        return None
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)  # best[k]: the first k prompts; cut[k]: their last group's start
    for k in range(1, n + 1):
        features, tokens = BatchFeatures(), 0
        for j in range(k - 1, -1, -1):  # the group j..k-1, grown backwards one prompt at a time
            tokens += order[j].prompt_tokens
            if tokens > budget:
                break
            features.add_prefill(order[j].prompt_tokens, 0)
            value = best[j] + cost_model.batch_time_s(features)
            if value < best[k]:
                best[k], cut[k] = value, j
    groups, k = [], n
    while k:
        groups.append([r.id for r in order[cut[k]:k]])
        k = cut[k]
    return groups[::-1]


def chunked_prefill_plan(requests: Sequence[Request], limits: Limits, chunk_tokens: int
                         ) -> list[list[tuple[int, int]]] | None:
    """The prompts, shortest first, read as one stream of tokens and cut into prefill-only batches of
    ``chunk_tokens`` each (the last one shorter); a batch holds the end of one prompt and the start of the next where
    the cut falls inside a prompt. The chunked counterpart of `prefill_partition` for `PrefillFirstScheduler`: with a
    token-count step model, batches of exactly a cheap step's tokens (`solvers.search.cheap_batch_tokens`) price every
    prompt token at that step's rate, which whole prompts cannot reach when the prompt does not divide it. Found on
    ``--I 512 --O 128 --B 64`` (fitted A100 profile): 86 batches of 384 tokens (73.4 µs per token, against 77.2 µs in
    the 512-token batches of whole prompts), then 127 decode batches, 5.2177 s, where the search's best had been
    vLLM's 5.3082 s. None under the conditions `prefill_partition` gives, or when ``chunk_tokens`` is outside
    1..min(C, P)."""
    if not 1 <= chunk_tokens <= min(limits.C, limits.prefill_budget) or not _all_decode_together(requests, limits):
        return None
    plan: list[list[tuple[int, int]]] = []
    batch, room = [], chunk_tokens
    for r in sorted(requests, key=lambda r: (r.prompt_tokens, r.id)):
        left = r.prompt_tokens
        while left:
            c = min(left, room)
            batch.append((r.id, c))
            left -= c
            room -= c
            if not room:
                plan.append(batch)
                batch, room = [], chunk_tokens
    if batch:
        plan.append(batch)
    return plan


class PrefillFirstScheduler(Scheduler):
    """Prefill-only batches, one per entry of ``plan`` in order, then decode-only batches of every request still
    running until all finish: every prompt is prefilled before any decode, so each prefill batch can sit just under
    a token-count step of the cost model, and the decodes share the fewest batches (one per output token of the
    longest request). A plan entry lists request ids, each prefilling its whole prompt (`prefill_partition`'s
    groups), or ``(id, tokens)`` chunks of prompts (`chunked_prefill_plan`); a request decodes once its prompt is
    done. For makespan on offline instances; a batch whose requests have not all arrived holds the plan back (the
    GPU idles until they do). Never evicts: the caller checks that every request's peak fits ``M`` together."""

    def __init__(self, limits: Limits, plan: list[list], cost_model: CostModel | None = None, *,
                 name: str = "prefill-first partition"):
        super().__init__(limits, cost_model)
        self.name = name
        self.plan = deque(plan)
        self.prompt: dict[int, int] = {}  # arrived request -> prompt tokens not yet prefilled
        self.running: list[int] = []  # prefilled and unfinished, in prefill order
        self._prefill: list[tuple[int, int]] | None = None  # the prefill batch planned last

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        self.prompt.update((s.id, s.req.prompt_tokens) for s in arrived)

    def next_batch(self, now_s: float) -> ScheduledBatch:
        self._prefill = None
        if not self.plan:
            return ScheduledBatch(items=[(rid, 1) for rid in self.running])
        entries = [(e, None) if isinstance(e, int) else e for e in self.plan[0]]
        if any(rid not in self.prompt for rid, _ in entries):
            return ScheduledBatch(items=[])  # idle until the rest of the batch arrives
        self._prefill = [(rid, self.prompt[rid] if c is None else c) for rid, c in entries]
        return ScheduledBatch(items=list(self._prefill))

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        if self._prefill is not None:
            self.plan.popleft()
            for rid, c in self._prefill:
                self.prompt[rid] -= c
                if not self.prompt[rid]:
                    self.running.append(rid)
        if finished:
            done = {s.id for s in finished}
            self.running = [rid for rid in self.running if rid not in done]

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        return not self.plan  # the decode batches repeat until someone finishes

    def describe_state(self) -> str:
        return f"{len(self.plan)} prefill batches left, {len(self.running)} running"


def marginal_work_s(requests: Sequence[Request], cost_model: CostModel, limits: Limits) -> dict[int, float] | None:
    """Per request id, the intercept-free cost of its own items under an additive split of the cost model
    (`solvers.cost_terms.additive_split`): its prompt in one chunk and its ``O − 1`` decodes. None when the
    model has no such split (a negative intercept).

    The split moves a token-count step term's intercept into its slope (``step_share=1``), pricing a step model's
    tokens at about its least cost per token: a ranking key, not a bound, so the request's cost at the batch sizes
    schedules run matters, not the least one. With the intercept kept (share 0, the bounds' split) the default A100
    model's tokens cost 7.4 µs instead of 61.7 µs and the ranking all but ignores prompt lengths: work-ranked at
    C = 384, Rmax 64 on the Azure slice of the optimality study (first 2,000 azure-conv requests, M = 100K) gave
    24.82 s of mean latency against 21.91 s. A model without steps (the paper's linear one) is split alike
    either way."""
    from .busy_time_bound import item_marginal_s, phase_marginals
    from .cost_terms import additive_split

    split = additive_split(cost_model.milp_terms(), limits.C, step_share=1.0)
    if split is None:
        return None
    marginal = split[2]
    by_shape: dict[tuple[int, int], float] = {}  # one evaluation per distinct (I, O)
    for shape in {(r.prompt_tokens, r.output_tokens) for r in requests}:
        prompt, output = shape
        prefill = item_marginal_s(marginal, chunk=np.array([prompt]), context=np.array([0]))
        decodes = phase_marginals(prompt, output, marginal, refills=False)[0]
        by_shape[shape] = float(prefill[0]) + float(decodes.sum())
    return {r.id: by_shape[(r.prompt_tokens, r.output_tokens)] for r in requests}


class WorkRankedScheduler(Algorithm1Scheduler):
    """Algorithm 1 with a ranking group (the ``rank`` grouping of appendix A.3) whose key is each request's own work
    (`marginal_work_s`: clairvoyant, it knows ``O``), least first: shortest-processing-time among the queued and
    running requests. With the eviction-free policy of ``rank-i-ef`` and ``Rmax`` near the number of mean requests
    that fit ``M`` it was the best of 86 policy settings tried on the Azure slice of the optimality study (mean
    latency 27.38 s at Rmax 64 against rank-i-ef's 28.92 s, docs/design.md)."""

    def __init__(self, limits: Limits, policy: Algorithm1Policy, work_s: dict[int, float], name: str = "work-ranked"):
        if policy.grouping != "rank":
            raise ValueError("WorkRankedScheduler replaces a ranking group's key: the policy must rank")
        super().__init__(limits, policy, name=name)
        self.work_s = work_s

    def _rank_key(self):
        work = self.work_s
        return lambda s: (work[s.id], s.req.arrival_s, s.id)
