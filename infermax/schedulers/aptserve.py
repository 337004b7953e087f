"""Apt-Serve (Gao et al., SIGMOD 2025): hybrid KV/hidden cache and value-based adaptive scheduling.

Per iteration every request ``i`` has a pending time ``p`` (now − arrival before its first token,
else now − its last token) and a memory need ``m`` (its KV size after this iteration: the whole
prefill for a waiting request, ``m + 1`` tokens for a running one). Scheduling it is worth
``g = p − β·N·ρ·m``: ``β = 1`` if it holds its cache as layer-input hidden states (half the memory,
K/V recomputed every iteration, which slows the batch for all ``N`` requests in the system).
Each iteration solves ``max Σ g`` subject to ``Σ memory ≤ M_e`` with the greedy of the paper's
appendix (``aptserve_greedy.greedy_select``): each request is split into a hidden step and a KV upgrade (or one
KV-only step when hidden is not worth it), steps are taken by value density until the first that
does not fit, and the result is compared with the best single request (2-approximation).

Iterations are prefill-only or decode-only (vLLM-like): the waiting greedy runs first on the free
memory; the iteration decodes if requests are running and (their summed pending time exceeds the
waiting requests', or no waiting request was selected), and then every running request the
greedy did not select, or selected in the other cache form, is preempted (recompute, front of the
waiting queue). Requests already past an SLO are demoted to a near-zero value (or decayed by 0.4).
Every choice the paper leaves open is an ``AptServeOptions`` field; see docs/design.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import compress
from typing import Callable, Hashable

import numpy as np

from ..costmodel.base import BatchFeatures, CostModel
from ..limits import Limits
from ..replay import RequestState, cache_tokens
from ..schedule import ScheduledBatch
from . import aptserve_running
from .aptserve_greedy import Candidate, Selection, fcfs_select, feasible_items, greedy_select, greedy_take
from .aptserve_waiting import BOUND_SLACK, WaitingQueue, fixed, pending_bounds
from .base import InfeasibleRequestError, Scheduler

DEMOTED_DENSITY = 1e-12  # value per memory unit of a demoted request: below every other positive density
RHO_MODES = ("cost-model", "authors")
DEMOTIONS = ("near-zero", "decay")
PREFILL_MEMORY = ("free", "paper")


# ---------------------------------------------------------------------------------------------
# rho from the cost model


def rho_from_cost_model(cost_model: CostModel | None, mode: str = "cost-model") -> float:
    """Seconds a batch gains per KV-token unit of ``m`` held in hidden form (Eq. 6's ``ρ``).

    ``cost-model``: the secant slope of the batch time in ``hidden_recompute_tokens`` between 1,024
    and 4,096 recomputed tokens on a one-decode batch (the K/V projection; 0 for a model that does
    not charge it). ``authors``: the authors' code's value, the full QKV projection's slope ÷ 5
    (``(q_dim + 2·kv_dim) / (2·kv_dim)`` × the K/V slope ÷ 5; 0.3× for multi-head attention).
    """
    if mode not in RHO_MODES:
        raise ValueError(f"rho mode must be one of {', '.join(RHO_MODES)} or a number, got {mode!r}")
    if cost_model is None:
        return 0.0

    def t(h: int) -> float:
        features = BatchFeatures(hidden_recompute_tokens=h)
        features.add_decode(0)
        return cost_model.batch_time_s(features)

    rho = (t(4096) - t(1024)) / 3072
    if mode == "authors":
        from ..models import MODELS

        spec = MODELS.get(str(getattr(cost_model, "model", "")).lower())
        qkv_over_kv = 1.5 if spec is None else (spec.num_heads + 2 * spec.num_kv_heads) / (2 * spec.num_kv_heads)
        rho *= qkv_over_kv / 5
    return rho


# ---------------------------------------------------------------------------------------------
# The scheduler


@dataclass(frozen=True)
class AptServeOptions:
    """Apt-Serve's knobs; defaults follow the paper and specs/aptserve.md §7's recommendations.

    ``hybrid``: offer the hidden cache (False: the KV-only ablation). ``adaptive``: value-based
    greedy (False: the FCFS ablation, see ``AptServeScheduler``). ``rho``: ``cost-model``,
    ``authors`` or seconds per KV token. ``n_minus_violators``: ``N`` excludes current SLO violators
    (the authors' code; the paper uses ``|W| + |R|``). ``demotion``: ``near-zero`` or ``decay``
    (value × ``decay``). ``double_check``: compare with the best single request (S').
    ``reprefill_hidden``: re-prefill every running request selected in hidden form (the authors'
    code; §7.6 recommends re-prefilling only on a form change). ``prefill_memory``: ``free``
    (``M`` − used) or ``paper`` (``M`` − Σ of running requests' KV size, even those held hidden).
    """

    hybrid: bool = True
    adaptive: bool = True
    rho: str | float = "cost-model"
    n_minus_violators: bool = True
    demotion: str = "near-zero"
    decay: float = 0.4
    double_check: bool = True
    reprefill_hidden: bool = False
    prefill_memory: str = "free"

    def __post_init__(self) -> None:
        if isinstance(self.rho, str) and self.rho not in RHO_MODES:
            raise ValueError(f"rho must be one of {', '.join(RHO_MODES)} or a number >= 0, got {self.rho!r}")
        if not isinstance(self.rho, str) and not self.rho >= 0:
            raise ValueError(f"rho must be >= 0, got {self.rho}")
        if self.demotion not in DEMOTIONS:
            raise ValueError(f"demotion must be one of {', '.join(DEMOTIONS)}, got {self.demotion!r}")
        if not 0 <= self.decay <= 1:
            raise ValueError(f"decay must be in [0, 1], got {self.decay}")
        if self.prefill_memory not in PREFILL_MEMORY:
            raise ValueError(f"prefill_memory must be one of {', '.join(PREFILL_MEMORY)}, got {self.prefill_memory!r}")


class AptServeScheduler(Scheduler):
    """Apt-Serve over the replayer's request states (see the module docstring).

    The FCFS ablation (``adaptive=False``) keeps the hybrid cache and the iteration types but takes
    requests in queue order (waiting: arrival, preempted first; running: admission order), each
    in KV form if it fits, else in hidden form if that fits, stopping at the first that fits in
    neither; it prefills whenever a waiting request fits (vLLM's rule) and demotes nobody.

    The waiting requests live in a ``WaitingQueue``: a batch reads only those the greedy takes (plus
    the few whose bound could tie with them), never the whole queue; the running requests, which all
    decode, are read in full as the paper's greedy does, except in a *decode-all* iteration: no running
    request holds a hidden-form cache and all of them fit ``C`` and, one token further, ``M``. Then every
    greedy (and FCFS) takes every one of them in KV form whatever their values (`_select_running`), so the
    batch is their decode items in running order, known from running totals (the KV in use; at block size 1
    every decode opens a block, otherwise the openers are counted) without reading a request. Such a batch
    changes the totals by what it planned, less what finished requests held, and leaves every running
    request's last token at its end, which is the engine's clock at the next plan. The decisions are
    those of the plain version (``tests/aptserve_reference.py``; ``tests/test_aptserve_equivalence.py``
    checks them).
    """

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        """True while nobody waits (a batch that preempted someone leaves them waiting, so it never
        repeats). Then, after a full decode batch in KV form (no prefill, finish or hidden item), the next
        call plans a decode iteration (nothing waiting to select) in
        which every running request's KV need fits ``M`` as long as the replayer's KV check passes
        (``Σ blocks(m + 1) ≤ M`` is both conditions), so the greedy takes every item: all stay in KV
        form and decode, in running order. Nothing arrives during the copies, so nobody starts waiting."""
        return not self.waiting

    def __init__(self, limits: Limits, cost_model: CostModel | None = None,
                 options: AptServeOptions = AptServeOptions(), name: str = "aptserve"):
        super().__init__(limits, cost_model)
        self.options, self.name = options, name
        if options.hybrid and cost_model is not None:
            _check_hidden_halves_memory(getattr(cost_model, "model", None))
        self.rho = (options.rho if not isinstance(options.rho, str)
                    else rho_from_cost_model(cost_model, options.rho)) if options.hybrid else 0.0
        self.waiting = WaitingQueue(self._prefill_sizes, ordered=not options.adaptive)  # FCFS reads it in order
        self.running: list[RequestState] = []
        self._decode_items: list[tuple[int, int]] = []  # (id, 1) of each running request, same order
        self._hidden_running = 0  # running requests holding a hidden-form cache
        self._planned: tuple | None = None  # (batch, KV in use after it or None) of the last decode iteration
        # (batch, KV its kept requests hold after it) where the least dense end decided a decode iteration
        self._kept_used: tuple | None = None
        self._ref_at_clock = False  # every running request's last token is at the next plan's clock
        # Decoders' state is read only after `sync_states` or through `cached_tokens`, and the greedy over many
        # running requests reads the kept columns instead (`_running_columns`), so the engine's lazy decode cohort
        # applies a decode iteration without touching its items one by one.
        self.lazy_decode_ok = True
        self._columns: aptserve_running.RunningColumns | None = None
        self._by_id: dict[int, RequestState] = {}
        self._prefill_cap = min(limits.C, limits.prefill_budget)
        self._too_big: list[RequestState] = []  # waiting requests whose prefill exceeds min(C, P)
        self._largest_refill = 0  # the most tokens any arrived request's refill can have: max(I + O − 1)
        self._bucket_sizes: dict[int, tuple[int, int]] = {}  # prefill tokens -> (KV, hidden) memory
        self._running_with_slo: set[int] = set()  # running requests with a TTFT or TBT target
        self._running_ids: set[int] = set()
        self._last_arrays_selection: tuple = ()  # (selected, in hidden form) of the last `_decode_arrays`
        # Running totals, so that a prefill iteration does not read every running request:
        # Σ over the running requests of the memory the prefill iteration counts (``prefill_memory``: free,
        # their cache_tokens; paper, their KV size blocks(m) even when held hidden); None: recompute
        self._used_total: int | None = 0
        self._ref_total = 0  # Σ fixed(ref) over the running requests (ref: their last token)

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            self._by_id[s.id] = s
            self.waiting.append(s)
            self._note_size(s)
            self._largest_refill = max(self._largest_refill, s.req.peak_kv_tokens)

    def _prefill_sizes(self, tokens: int) -> tuple[int, int]:
        """The KV and hidden-form memory of a ``tokens``-token prefill, cached per size (`_DensityBound` reads the
        cache directly on its hot path)."""
        sizes = self._bucket_sizes.get(tokens)
        if sizes is None:
            sizes = self._bucket_sizes[tokens] = (self.limits.blocks(tokens), cache_tokens(self.limits, tokens, True))
        return sizes

    def _note_size(self, s: RequestState) -> None:
        if s.input_tokens > self._prefill_cap:
            self._too_big.append(s)

    # -- per-request quantities -----------------------------------------------------------------
    @staticmethod
    def pending_s(s: RequestState, now_s: float) -> float:
        """Now − arrival before the first token, else now − the last token."""
        return now_s - (s.req.arrival_s if s.last_token_s is None else s.last_token_s)

    @staticmethod
    def violates(s: RequestState, p: float) -> bool:
        """The authors' per-gap test: before its first token ``p > TTFT SLO``, after it ``p > TBT SLO``."""
        slo = s.req.ttft_slo_s if s.last_token_s is None else s.req.tbt_slo_s
        return slo is not None and p > slo

    def _candidate(self, s: RequestState, p: float, kv_tokens: int, n: int, violator: bool,
                   sizes: tuple[int, int] | None = None) -> Candidate:
        """Request ``s``'s options for a ``kv_tokens``-token cache, pending ``p``; ``sizes``: its KV and hidden-form
        memory when known (a waiting request's, from `_prefill_sizes`)."""
        lim, opt = self.limits, self.options
        if sizes is None:
            kv_size, hidden_size = lim.blocks(kv_tokens), cache_tokens(lim, kv_tokens, True)
        else:
            kv_size, hidden_size = sizes
        if violator and opt.demotion == "near-zero":
            return Candidate(s.id, DEMOTED_DENSITY * kv_size, kv_size)
        weight = opt.decay if violator else 1.0
        if not opt.hybrid:
            return Candidate(s.id, weight * p, kv_size)
        return Candidate(s.id, weight * p, kv_size, weight * (p - n * self.rho * kv_size), hidden_size)

    # -- planning -------------------------------------------------------------------------------
    def next_batch(self, now_s: float) -> ScheduledBatch:
        lim, opt, running = self.limits, self.options, self.running
        if self._ref_at_clock:  # after a decode iteration (the first plan after a batch is at its end)
            self._ref_total, self._ref_at_clock = len(running) * fixed(now_s), False
        if self._columns is not None:
            self._columns.clock(now_s)
        self._raise_if_too_big()
        # N enters only the hidden form's value: not computed for the KV-only variant.
        n = 0
        if opt.hybrid:
            n = len(self.waiting) + len(running)
            if opt.n_minus_violators:
                n -= self.waiting.violators(now_s)
                if self._running_with_slo:  # a trace without targets skips the pass over the running requests
                    self.sync_states()
                    n -= sum(self.violates(s, self.pending_s(s, now_s)) for s in running
                             if s.id in self._running_with_slo)
        # Many running requests: their fields are read from the kept columns, for every use below.
        big = len(running) >= aptserve_running.NUMPY_RUNNING
        arrays = None
        if self._used_total is None:
            paper, b = opt.prefill_memory == "paper", lim.block_size
            if big:
                arrays = self._running_columns().view(running)
                held = (aptserve_running.blocks(arrays.m, b) if paper
                        else aptserve_running.cache_sizes(arrays.m, arrays.hidden, b))
                self._used_total = int(held.sum())
            else:
                self.sync_states()
                self._used_total = sum(lim.blocks(s.m) for s in running) if paper else self._used()
        free = lim.M - self._used_total
        chosen = self._select_waiting(now_s, n, max(free, 0), holders=len(running))
        decode = bool(running) and (not chosen.forms or (opt.adaptive and self._running_wait_longer(now_s, arrays)))
        if not decode:
            return self._prefill_batch(chosen)
        batch = self._decode_all()
        if batch is not None:
            return batch
        if not big:
            self.sync_states()
        elif arrays is None:
            arrays = self._running_columns().view(running)
        batch = self._decode_iteration(now_s, n, arrays)
        if batch.evict and self._unrefillable(batch.evict):
            self.sync_states()
            batch = self._decode_batch(self._select_running_pinned(now_s, n), pinned=True)
        if batch.items and batch.items[0][0] in self._running_ids:  # a decode iteration (never mixed with
            kept = self._kept_used  # prefills): it admits nobody
            self._planned = (batch, kept[1] if kept is not None and kept[0] is batch else None)
        self._kept_used = None
        return batch

    def _running_columns(self) -> "aptserve_running.RunningColumns":
        """The running requests' kept columns, built from their states (brought up to date) when many requests
        start running; `batch_done` keeps them in step and drops them when few are left (under half of
        ``NUMPY_RUNNING``), where the plain loops read the states and updating columns would cost more than it
        saves (azure-code: 10% more per batch with columns kept throughout)."""
        if self._columns is None:
            self.sync_states()
            self._columns = aptserve_running.RunningColumns()
            self._columns.append(self.running)
        return self._columns

    def _decode_all(self) -> ScheduledBatch | None:
        """The decode-all iteration (class docstring) when it applies, else None. What the greedy or FCFS would
        find: no hidden-form cache, so the memory check is ``Σ blocks(m + 1) ≤ M`` (the KV in use plus a block
        per request whose decode opens one), with ``count ≤ C``; every request is selected in its own (KV)
        form, so nobody is preempted, re-prefilled or pinned."""
        lim, running = self.limits, self.running
        if self._hidden_running or self._used_total is None or len(running) > lim.C:
            return None
        b = lim.block_size
        openers = len(running) if b == 1 else self.cohort_block_openers(self._decode_items)
        if openers is None:
            self.sync_states()
            openers = sum(1 for s in running if not s.m % b)
        used = self._used_total + b * openers
        if used > lim.M:
            return None
        batch = ScheduledBatch(items=list(self._decode_items))
        self._planned = (batch, used)
        return batch

    def _running_wait_longer(self, now_s: float, arrays: "aptserve_running.RunningArrays | None") -> bool:
        """[C]'s test: Σ pending_s over the running requests (the float sum in running order) exceeds the
        waiting requests' sum. Both sums are known exactly from running totals; the float sums, which
        differ from them by a bounded rounding, are computed only when the margins overlap."""
        run, run_margin = pending_bounds(len(self.running), now_s, self._ref_total)
        wait, wait_margin = self.waiting.pending_bounds(now_s)
        if run - run_margin > wait + wait_margin:
            return True
        if run + run_margin < wait - wait_margin:
            return False
        if arrays is None and len(self.running) >= aptserve_running.NUMPY_RUNNING:
            arrays = self._running_columns().view(self.running)
        if arrays is not None:
            total = sum((now_s - arrays.ref).tolist())
        else:
            self.sync_states()
            total = sum([self.pending_s(s, now_s) for s in self.running])
        return self.waiting.pending_sum_below(total, now_s)

    def _decode_iteration(self, now_s: float, n: int,
                          arrays: "aptserve_running.RunningArrays | None") -> ScheduledBatch:
        if arrays is None:
            kept = self._select_running(now_s, n)
            batch = self._decode_batch(kept)
        else:
            batch = self._decode_arrays(now_s, n, arrays)
            if not batch.items:
                kept = self._selection_of(arrays)
        if batch.items:
            return batch
        # Corner case: every running request is preempted (unselected or switching form). Prefill the
        # waiting requests that fit the then empty memory; if none, defer the switches this once.
        again = self._select_waiting(now_s, n, self.limits.M, holders=0)
        if again.forms:
            prefill = self._prefill_batch(again)
            return ScheduledBatch(items=prefill.items, evict=batch.evict, hidden=prefill.hidden)
        self.sync_states()
        return self._deferred_switch_batch(kept)

    def _used(self) -> int:
        """Memory the running requests hold (``cache_tokens`` summed)."""
        lim = self.limits
        if lim.block_size == 1:
            return sum(-(-s.m // 2) if s.hidden else s.m for s in self.running)
        return sum(cache_tokens(lim, s.m, s.hidden) for s in self.running)

    def _raise_if_too_big(self) -> None:
        """A waiting request whose whole prefill exceeds ``min(C, P)`` can never run (the first in
        queue order is named, as a scan of the queue would find it)."""
        if not self._too_big:  # (every plan asks)
            return
        waiting = [s for s in self._too_big if s.id in self._by_id and not s.finished and s.m == 0
                   and s not in self.running]
        self._too_big = []
        if not waiting:
            return
        s = min(waiting, key=lambda r: self.waiting.position(r.id))
        need = s.input_tokens
        kind = "prompt" if need == s.req.prompt_tokens else "refill after preemption"
        raise self.prefill_too_long(
            f"request {s.id}: its {need}-token prefill ({kind}) exceeds min(C, P) = {self._prefill_cap}, and "
            f"scheduler '{self.name}' does not chunk prefills; raise C/P")

    def _admit(self, prefill: bool, holders: int, size_of: Callable[[Hashable], int], token_cap: int | None = None):
        """The greedy's ``admit``: the token budget (``min(C, P)`` for prefills, ``C`` for decodes, unless
        ``token_cap`` is given) and, for prefills, ``Rmax`` holders."""
        lim = self.limits
        if token_cap is None:
            token_cap = self._prefill_cap if prefill else lim.C
        seq_cap = lim.Rmax
        tokens = [0]

        def admit(key, n_before: int) -> bool:
            if n_before == 0:
                tokens[0] = 0
            size = size_of(key)
            if tokens[0] + size > token_cap:
                return False
            if prefill and seq_cap is not None and holders + n_before + 1 > seq_cap:
                return False
            tokens[0] += size
            return True

        return admit

    def _select_waiting(self, now_s: float, n: int, capacity: int, holders: int) -> Selection:
        """The greedy (or FCFS) over the waiting requests' whole prefills, read lazily from the queue.

        When even the smallest waiting prefill fits ``capacity`` in neither form (its KV size, or with the hybrid
        cache its hidden size, which is never larger), no waiting request has an item (`feasible_items`) and none fits
        in queue order either, so the greedy and FCFS alike select nobody: answered without reading the queue. On
        azure-conv aptserve-kv meets this in about a quarter of its iterations (the memory held by decoding
        requests)."""
        least = self.waiting.least_prefill_tokens()
        if least is None:
            return Selection({}, 0.0, 0)
        kv, hidden = self._prefill_sizes(least)
        if (hidden if self.options.hybrid else kv) > capacity:
            return Selection({}, 0.0, 0)
        by_id = self._by_id
        admit = self._admit(True, holders, lambda key: by_id[key].input_tokens)
        if not self.options.adaptive:
            cands = (self._candidate(s, p, s.input_tokens, n, False)
                     for s in self.waiting for p in (self.pending_s(s, now_s),))
            return fcfs_select(cands, capacity, admit)

        expand = self._waiting_expander(n, capacity)
        items = self.waiting.items(now_s, self._density_bound(n, capacity), expand)
        return greedy_take(items, capacity, admit, self.options.double_check)

    def _waiting_expander(self, n: int, capacity: int) -> Callable[[RequestState, float], list[tuple]]:
        """The adaptive greedy's items of a waiting request pending ``p``: ``(θ, size, step, candidate)`` for each of
        ``feasible_items(_candidate(s, p, s.input_tokens, n, violates(s, p)), capacity)``, with the same float
        operations. A request that is not late is computed inline (no demotion: its values are ``p`` and
        ``p − N·ρ·kv``, weight 1), a late one through `_candidate`. Why: the hybrid variants expand about ten waiting
        requests per prefill iteration, and the four calls per request were an eighth of the plan's instructions
        (`benchmarks/plan_instructions.py`); `tests/test_aptserve_waiting.py` compares the two."""
        sizes, known = self._prefill_sizes, self._bucket_sizes
        hybrid, n_rho = self.options.hybrid, n * self.rho

        def expand(s: RequestState, p: float) -> list[tuple]:
            tokens = s.input_tokens
            kv_size, hidden_size = known.get(tokens) or sizes(tokens)
            slo = s.req.ttft_slo_s if s.last_token_s is None else s.req.tbt_slo_s
            if slo is not None and p > slo:  # late (`violates`): demoted
                c = self._candidate(s, p, tokens, n, True, (kv_size, hidden_size))
                return [(theta, size, step, c) for theta, size, step in feasible_items(c, capacity)]
            if not hybrid:
                c = Candidate(s.id, p, kv_size)
                return [(p / kv_size, kv_size, "kv", c)] if kv_size <= capacity else []
            hv = p - n_rho * kv_size
            c = Candidate(s.id, p, kv_size, hv, hidden_size)
            if kv_size <= capacity:  # `marginal_items`
                kv_density = p / kv_size
                if 0 < hidden_size < kv_size and 0 <= hv <= p and hv / hidden_size >= kv_density:
                    hidden_density, upgrade = hv / hidden_size, (p - hv) / (kv_size - hidden_size)
                    if upgrade <= hidden_density:
                        return [(hidden_density, hidden_size, "hidden", c),
                                (upgrade, kv_size - hidden_size, "upgrade", c)]
                return [(kv_density, kv_size, "kv", c)]
            if 0 < hidden_size <= capacity and hv >= 0:  # the hidden form alone (`feasible_items`)
                return [(hv / hidden_size, hidden_size, "hidden", c)]
            return []

        return expand

    def _density_bound(self, n: int, capacity: int) -> "_DensityBound":
        return _DensityBound(self, n, capacity)

    def _select_running(self, now_s: float, n: int) -> Selection:
        """The greedy (or FCFS) over the running requests' next decode, with all of ``M``.

        When every running request's KV need fits ``M`` together (and ``C`` holds them all), both
        take every item whatever the order (nothing blocks, nobody is refused), so each request is
        selected in KV form: that answer is given without computing the values."""
        lim, running = self.limits, self.running
        if len(running) <= lim.C:
            total = (sum(s.m for s in running) + len(running) if lim.block_size == 1
                     else sum(lim.blocks(s.m + 1) for s in running))
            if total <= lim.M:
                return Selection({s.id: "kv" for s in running}, math.nan, total)  # value not needed
        demote = self.options.adaptive
        cands = []
        for s in running:
            p = self.pending_s(s, now_s)
            cands.append(self._candidate(s, p, s.m + 1, n, demote and self.violates(s, p)))
        admit = self._admit(False, 0, lambda key: 1)
        if self.options.adaptive:
            return greedy_select(cands, lim.M, admit, self.options.double_check)
        return fcfs_select(cands, lim.M, admit)

    def _decode_arrays(self, now_s: float, n: int, arrays: aptserve_running.RunningArrays) -> ScheduledBatch:
        """``_decode_batch(_select_running(now_s, n))`` from the running requests' arrays. The selection is
        kept in ``_last_arrays_selection`` for the corner case (the quick path below never leaves it: it always keeps
        someone). The KV-only greedy without targets takes it from the least dense end (`pending_tail_drop`)."""
        lim, opt = self.limits, self.options
        count = len(arrays.ids)
        if opt.adaptive and not opt.hybrid and not self._running_with_slo and count <= lim.C:
            found = aptserve_running.pending_tail_drop(arrays.m, arrays.ref, now_s, lim.M, lim.block_size,
                                                       opt.double_check)
            if found is not None:
                dropped, used = found
                items = list(self._decode_items)
                for row in reversed(dropped):
                    del items[row]
                batch = ScheduledBatch(items=items, evict=arrays.ids[dropped].tolist() if dropped else [])
                self._kept_used = (batch, used)
                return batch
        if count <= lim.C and int(aptserve_running.blocks(arrays.m + 1, lim.block_size).sum()) <= lim.M:
            selected, as_hidden = np.ones(count, bool), np.zeros(count, bool)  # everybody in KV (_select_running)
        elif self.options.adaptive:
            selected, as_hidden, _ = aptserve_running.greedy_masks(
                self._candidate_arrays(arrays, now_s, n), lim.M, lim.C, self.options.double_check)
        else:  # FCFS: no values needed, only the sizes
            kv_tokens = arrays.m + 1
            selected, as_hidden = aptserve_running.fcfs_masks(
                aptserve_running.blocks(kv_tokens, lim.block_size),
                aptserve_running.cache_sizes(kv_tokens, None, lim.block_size),
                np.full(count, self.options.hybrid), lim.M, lim.C)
        self._last_arrays_selection = (selected, as_hidden)
        keeps = selected & (as_hidden == arrays.hidden)
        if self.options.reprefill_hidden:
            keeps &= ~as_hidden
        ids = arrays.ids
        items = list(compress(self._decode_items, keeps.tolist()))  # the kept (id, 1) tuples, running order
        return ScheduledBatch(items=items, evict=ids[~keeps].tolist(),
                              hidden=frozenset(ids[keeps & arrays.hidden].tolist()))

    def _selection_of(self, arrays: aptserve_running.RunningArrays) -> Selection:
        """The last ``_decode_arrays`` selection as a ``Selection`` (forms only)."""
        selected, as_hidden = self._last_arrays_selection
        forms = dict(zip(arrays.ids[selected].tolist(), np.where(as_hidden[selected], "hidden", "kv").tolist()))
        return Selection(forms, math.nan, 0)

    def _candidate_arrays(self, arrays: aptserve_running.RunningArrays, now_s: float,
                          n: int) -> aptserve_running.CandidateArrays:
        """``_candidate(s, p, s.m + 1, n, violates(s, p))`` of every running request (the adaptive greedy's
        demotion), as arrays: the same float operations elementwise."""
        lim, opt, states = self.limits, self.options, arrays.states
        count, keys = len(states), arrays.ids
        kv_tokens = arrays.m + 1
        p = now_s - arrays.ref
        b = lim.block_size
        kv_blocks = kv_tokens if b == 1 else -(-kv_tokens // b)
        kv_size = kv_tokens if b == 1 else kv_blocks * b
        hidden_size = (kv_tokens + 1) >> 1 if b == 1 else b * -(-kv_blocks // 2)  # `cache_sizes`
        violator = None
        if self._running_with_slo:
            slo = np.fromiter([math.nan if x is None else x for s in states
                               for x in (s.req.ttft_slo_s if s.last_token_s is None else s.req.tbt_slo_s,)],
                              np.float64, count)
            violator = p > slo  # a missing target (nan) is never exceeded
            if not violator.any():
                violator = None
        weight = 1.0
        if violator is not None and opt.demotion == "decay":
            weight = np.where(violator, opt.decay, 1.0)
        kv_value = weight * p
        has_hidden = np.full(count, opt.hybrid)
        if violator is not None and opt.demotion == "near-zero":
            kv_value = np.where(violator, DEMOTED_DENSITY * kv_size, kv_value)
            has_hidden &= ~violator
        hidden_value = weight * (p - n * self.rho * kv_size) if opt.hybrid else kv_value
        return aptserve_running.CandidateArrays(keys, kv_value, kv_size, hidden_value, hidden_size, has_hidden)

    def _prefill_batch(self, chosen: Selection) -> ScheduledBatch:
        """Whole prefills (waiting requests hold no cache: ``input_tokens`` = prompt + generated)."""
        items = [(rid, self._by_id[rid].input_tokens) for rid in chosen.forms]
        if not self.options.hybrid:  # (the KV-only greedy offers no hidden form)
            return ScheduledBatch(items=items)
        return ScheduledBatch(items=items, hidden=frozenset(k for k, f in chosen.forms.items() if f == "hidden"))

    def _unrefillable(self, rids) -> list[RequestState]:
        """Running requests among ``rids`` whose refill after a preemption (prompt + generated tokens)
        would exceed ``min(C, P)``: preempted, they could never be prefilled again (no chunking). A lazily
        advanced decoder's ``generated`` lags its true count by as many tokens as its ``m`` lags
        `cached_tokens`. A running request has generated at most ``O − 1`` tokens, so when every arrived request's
        ``I + O − 1`` fits ``min(C, P)`` nobody is read."""
        cap, by_id, m = self._prefill_cap, self._by_id, self.cached_tokens
        if self._largest_refill <= cap:
            return []
        return [s for s in (by_id[rid] for rid in rids) if s.req.prompt_tokens + s.generated + m(s) - s.m > cap]

    def _select_running_pinned(self, now_s: float, n: int) -> Selection:
        """The decode selection when the greedy would preempt an unrefillable request (design.md):
        every unrefillable request keeps its form and decodes; the greedy (or FCFS) chooses among
        the others with the memory and token budget that remain."""
        lim, running = self.limits, self.running
        pinned = {s.id for s in self._unrefillable(s.id for s in running)}
        need = sum(cache_tokens(lim, s.m + 1, s.hidden) for s in running if s.id in pinned)
        if need > lim.M or len(pinned) > lim.C:
            raise InfeasibleRequestError(
                f"scheduler '{self.name}': the {len(pinned)} running requests whose refill would exceed min(C, P) = "
                f"{self._prefill_cap} need {need} tokens of memory and {len(pinned)} of C = {lim.C} to decode, more "
                f"than the limits (M = {lim.M}); one must be preempted and could never run again; raise C/P or M")
        demote = self.options.adaptive
        cands = []
        for s in running:
            if s.id not in pinned:
                p = self.pending_s(s, now_s)
                cands.append(self._candidate(s, p, s.m + 1, n, demote and self.violates(s, p)))
        token_cap = lim.C - len(pinned)
        admit = self._admit(False, 0, lambda key: 1, token_cap)
        if self.options.adaptive:
            rest = greedy_select(cands, lim.M - need, admit, self.options.double_check)
        else:
            rest = fcfs_select(cands, lim.M - need, admit)
        forms = {s.id: ("hidden" if s.hidden else "kv") for s in running if s.id in pinned}
        forms.update(rest.forms)
        return Selection(forms, math.nan, rest.used + need)  # value not needed

    def _decode_batch(self, chosen: Selection, pinned: bool = False) -> ScheduledBatch:
        """Selected running requests keeping their form decode; the others are preempted. With
        ``pinned``, unrefillable requests are never re-prefilled (``reprefill_hidden``)."""
        items, evict, hidden = [], [], set()
        cap = self._prefill_cap
        for s in self.running:
            form = chosen.forms.get(s.id)
            keeps = form is not None and (form == "hidden") == s.hidden
            if keeps and form == "hidden" and self.options.reprefill_hidden and not (
                    pinned and s.req.prompt_tokens + s.generated > cap):
                keeps = False
            if not keeps:
                evict.append(s.id)
                continue
            items.append((s.id, 1))
            if s.hidden:
                hidden.add(s.id)
        return ScheduledBatch(items=items, evict=evict, hidden=frozenset(hidden))

    def _deferred_switch_batch(self, chosen: Selection) -> ScheduledBatch:
        """Selected running requests decode in their current form while the memory holds them."""
        lim = self.limits
        items, evict, hidden, used = [], [], set(), 0
        for s in self.running:
            size = cache_tokens(lim, s.m + 1, s.hidden)
            if s.id in chosen.forms and used + size <= lim.M:
                items.append((s.id, 1))
                used += size
                if s.hidden:
                    hidden.add(s.id)
            else:
                evict.append(s.id)
        return ScheduledBatch(items=items, evict=evict, hidden=frozenset(hidden))

    def batch_done(self, batch: ScheduledBatch, finished: list[RequestState]) -> None:
        """The preempted requests go back to the front of the waiting queue (in their running order), the admitted
        join the running ones at the end, the finished leave. The preempted and finished leave in one pass over the
        running list, before the admissions (removing some requests and appending others commute); an admitted
        request that finished in the same batch (a one-token output) leaves after joining."""
        planned, self._planned = self._planned, None
        with_slo, running_ids = self._running_with_slo, self._running_ids
        decoded = planned is not None and planned[0] is batch  # a planned decode iteration admits nobody
        used_known = decoded and planned[1] is not None
        evict = batch.evict
        if decoded:
            admitted = []
        elif evict:  # (a preempted request listed as an item is admitted again)
            out = set(evict) if len(evict) > aptserve_running.FEW_ROWS else evict
            admitted = [rid for rid, _ in batch.items if rid not in running_ids or rid in out]
        else:
            admitted = [rid for rid, _ in batch.items if rid not in running_ids]
        done = {s.id for s in finished} if finished else None
        if evict or done:
            gone = done.union(evict) if done else set(evict)
            self._drop_running(gone)
            with_slo.difference_update(gone)
            running_ids.difference_update(gone)
        if evict:
            evicted = [self._by_id[rid] for rid in evict]
            self.waiting.extendleft_in_order(evicted)
            for s in evicted:
                self._note_size(s)
        for rid in admitted:
            s = self.waiting.remove(rid)
            self.running.append(s)
            self._decode_items.append((rid, 1))
            self._hidden_running += s.hidden
            running_ids.add(rid)
            if s.req.ttft_slo_s is not None or s.req.tbt_slo_s is not None:
                with_slo.add(rid)
        columns = self._columns
        if admitted and columns is not None:
            columns.append(self.running[len(self.running) - len(admitted):])
        admitted_done = done.intersection(admitted) if done and admitted else None
        if admitted_done:
            self._drop_running(admitted_done)
            with_slo.difference_update(admitted_done)
            running_ids.difference_update(admitted_done)
        if columns is not None:
            if len(self.running) < aptserve_running.NUMPY_RUNNING // 2:
                self._columns = None
            elif decoded:  # every running request was an item (the others were preempted)
                columns.decoded()
        if used_known:  # what it planned, less what the finished requests held (blocks(I + O − 1) each)
            blocks = self.limits.blocks
            self._used_total = planned[1] - sum(blocks(s.req.peak_kv_tokens) for s in finished) if self.running else 0
            self._ref_at_clock = bool(self.running)
            if not self.running:
                self._ref_total = 0
            return
        self._update_totals(batch, admitted, finished)

    def _drop_running(self, out: set[int]) -> None:
        """Remove these ids from the running requests (and their decode items), the rest keeping their order. With
        many running requests their rows are found in the id column (one numpy comparison per dropped id); a few
        rows are deleted in place (a batch drops one to three of several hundred), more by one filtering pass."""
        columns, running = self._columns, self.running
        if columns is not None and len(running) >= aptserve_running.NUMPY_RUNNING:
            rows = columns.rows(out)
        else:
            rows = [i for i, s in enumerate(running) if s.id in out]
        if not rows:
            return
        if columns is not None:
            columns.delete(rows)
        if len(rows) <= aptserve_running.FEW_ROWS:
            items = self._decode_items
            for i in reversed(rows):
                del running[i], items[i]
        else:
            flags = [True] * len(running)
            for i in rows:
                flags[i] = False
            self.running = list(compress(running, flags))
            self._decode_items = list(compress(self._decode_items, flags))
        self._hidden_running = sum(1 for s in self.running if s.hidden) if self._hidden_running else 0

    def _update_totals(self, batch: ScheduledBatch, admitted: list[int], finished: list[RequestState]) -> None:
        """``_used_total`` and ``_ref_total`` after a batch. A batch that lists a running request (a
        decode iteration, whatever preempted the others) leaves only its items running, every one with its
        last token at the batch's end; a prefill-only batch without preemptions adds its admitted requests
        and leaves the others as they were."""
        running = self.running
        if not running:
            self._used_total, self._ref_total, self._ref_at_clock = 0, 0, False
        elif batch.evict or len(admitted) < len(batch.items):
            self._used_total = None  # every item's m grew: recomputed when next needed
            self._ref_at_clock = True  # every running request was an item: its last token is at the batch's end
        else:
            done = {s.id for s in finished} if finished else ()
            new = [self._by_id[rid] for rid in admitted if rid not in done]
            if new:
                lim = self.limits
                if self._used_total is not None:
                    paper = self.options.prefill_memory == "paper"
                    self._used_total += sum(lim.blocks(s.m) if paper else cache_tokens(lim, s.m, s.hidden) for s in new)
                self._ref_total += len(new) * fixed(new[0].last_token_s)

    def repeated_full_decode(self, batch: ScheduledBatch, copies: int) -> None:
        """Every running request decoded ``copies`` more tokens, the last at the same time (the clock)."""
        if self._columns is not None:
            self._columns.decoded(copies)
        self._used_total = None
        self._ref_at_clock = bool(self.running)

    def describe_state(self) -> str:
        self.sync_states()
        used = sum(cache_tokens(self.limits, s.m, s.hidden) for s in self.running)
        return f"waiting={len(self.waiting)}, running={len(self.running)}, cache used={used}/{self.limits.M}"


class _DensityBound:
    """Upper bound on any item density of a waiting request with a ``tokens``-token prefill, pending
    ``p``, or None when it has no item: no option fits ``capacity``, or only the hidden form does and its value is
    below 0 (not offered, unless a demotion decays it by 0).

    Its options (``feasible_items``) are KV if it fits, ``p/kv`` at most, and hidden (hybrid only)
    if that fits, ``(p − N·ρ·kv)/hidden`` at most; a demoted request's KV density is below twice
    ``DEMOTED_DENSITY``, a decayed one below the undecayed, an upgrade below its hidden step;
    ``BOUND_SLACK`` covers rounding. The waiting queue keeps the requests it knows to be demoted (late for
    their target) in buckets keyed ``~tokens``; theirs is the demoted bound: ``2·DEMOTED_DENSITY`` (near
    zero: KV only, when it fits) or ``decay`` times the bound above (their values are the undemoted ones times
    ``decay``, so their densities too, up to rounding the slack covers)."""

    def __init__(self, scheduler: AptServeScheduler, n: int, capacity: int):
        self.hybrid, self.n_rho = scheduler.options.hybrid, n * scheduler.rho
        self.sizes, self.prefill_sizes, self.capacity = scheduler._bucket_sizes, scheduler._prefill_sizes, capacity
        self.near_zero, self.decay = scheduler.options.demotion == "near-zero", scheduler.options.decay

    def __call__(self, key: int, p: float, negative_hidden_offered: bool = False) -> float | None:
        """None when the request has no item: its KV form does not fit and its hidden form does not fit or has a
        value below 0 (`feasible_items`), which ``p − N·ρ·kv`` keeps for every request of the bucket waiting no
        longer (so a bucket's later entries have none either). ``negative_hidden_offered``: such a value is
        offered, as a demoted request decayed by 0 has it (density ±0)."""
        if key < 0:
            return self._demoted(~key, p)
        kv, hidden = self.sizes.get(key) or self.prefill_sizes(key)
        b = None
        if kv <= self.capacity:
            b = p / kv
            if b < 2 * DEMOTED_DENSITY:
                b = 2 * DEMOTED_DENSITY
        if self.hybrid and hidden <= self.capacity:
            h = (p - self.n_rho * kv) / hidden
            if h < 0:
                h = 0.0 if negative_hidden_offered or b is not None else None
            if h is not None and (b is None or h > b):
                b = h
        return None if b is None else b * (1 + BOUND_SLACK)

    def _demoted(self, tokens: int, p: float) -> float | None:
        if self.near_zero:
            kv, _ = self.sizes.get(tokens) or self.prefill_sizes(tokens)
            return 2 * DEMOTED_DENSITY * (1 + BOUND_SLACK) if kv <= self.capacity else None
        b = self(tokens, p, self.decay == 0)
        return None if b is None else b * self.decay

    def heads_array(self, kv: np.ndarray, hidden: np.ndarray, refs: np.ndarray, now_s: float,
                    demoted: np.ndarray | None = None, kv_max: float | None = None) -> np.ndarray:
        """``__call__`` for many requests at once (their KV and hidden sizes, pending since ``refs``, demoted or
        not: None = none is); −inf for None. The same float operations elementwise. When every KV option fits
        ``capacity`` (``kv_max``, the largest KV size, when the caller keeps it), the KV density is at least
        ``2·DEMOTED_DENSITY`` > 0, so the hidden density's clamp at 0 and the masks change nothing and are skipped."""
        p = now_s - refs
        hidden_below_0 = None  # only the hidden form fits, with a value below 0: no item, unless decayed by 0
        if len(kv) and (kv.max() if kv_max is None else kv_max) <= self.capacity:
            out = p / kv if self.hybrid else np.divide(p, kv, out=p)
            np.maximum(out, 2 * DEMOTED_DENSITY, out=out)
            if self.hybrid:
                h = self.n_rho * kv
                np.subtract(p, h, out=h)
                h /= hidden
                np.maximum(out, h, out=out)
        elif not self.hybrid:  # as the branch below computes it, in place: no temporaries but the mask
            out = np.divide(p, kv, out=p)
            np.maximum(out, 2 * DEMOTED_DENSITY, out=out)
            np.putmask(out, kv > self.capacity, -np.inf)
        else:
            out = np.where(kv <= self.capacity, np.maximum(p / kv, 2 * DEMOTED_DENSITY), -np.inf)
            h = (p - self.n_rho * kv) / hidden
            fits = hidden <= self.capacity
            hidden_below_0 = fits & (out == -np.inf) & (h < 0)
            out = np.where(fits, np.maximum(out, np.maximum(h, 0.0)), out)
        out *= 1 + BOUND_SLACK
        low = None  # the demoted requests' bounds, from the clamped ones (decayed by 0, a value below 0 is offered)
        if demoted is not None and demoted.any():
            if self.near_zero:
                low = np.where(kv <= self.capacity, 2 * DEMOTED_DENSITY * (1 + BOUND_SLACK), -np.inf)
            else:
                with np.errstate(invalid="ignore"):  # −inf · 0 (decay 0) is nan: replaced by −inf
                    low = np.where(out > -np.inf, out * self.decay, -np.inf)
                if hidden_below_0 is not None and self.decay != 0:
                    low[hidden_below_0] = -np.inf
        if hidden_below_0 is not None:
            out[hidden_below_0] = -np.inf
        return out if low is None else np.where(demoted, low, out)


def _check_hidden_halves_memory(model: str | None) -> None:
    """The hidden form saves memory only where ``hidden_size == 2·kv_dim`` (multi-head attention)."""
    from ..models import MODELS

    spec = MODELS.get(str(model).lower()) if model else None
    if spec is not None and spec.num_kv_heads != spec.num_heads:
        raise ValueError(
            f"model {spec.name!r} uses grouped-query attention ({spec.num_kv_heads} KV heads for {spec.num_heads} query "
            f"heads): its hidden states are {spec.num_heads / (2 * spec.num_kv_heads):g}x its KV, not half; use the "
            f"KV-only variant 'aptserve-kv'")
