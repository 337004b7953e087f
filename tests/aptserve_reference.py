"""REFERENCE ONLY: Apt-Serve as of commit fc1abe4 (straightforward O(waiting) per batch), kept unchanged so that
tests/test_aptserve_equivalence.py can check the indexed scheduler in infermax/schedulers/aptserve.py makes the
same decisions. Do not import it from the package.

Apt-Serve (Gao et al., SIGMOD 2025): hybrid KV/hidden cache and value-based adaptive scheduling.

Per iteration every request ``i`` has a pending time ``p`` (now − arrival before its first token,
else now − its last token) and a memory need ``m`` (its KV size after this iteration: the whole
prefill for a waiting request, ``m + 1`` tokens for a running one). Scheduling it is worth
``g = p − β·N·ρ·m``: ``β = 1`` if it holds its cache as layer-input hidden states (half the memory,
K/V recomputed every iteration, which slows the batch for all ``N`` requests in the system).
Each iteration solves ``max Σ g`` subject to ``Σ memory ≤ M_e`` with the greedy of the paper's
appendix (``greedy_select``): each request is split into a hidden step and a KV upgrade (or one
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

from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from infermax.costmodel.base import BatchFeatures, CostModel
from infermax.limits import Limits
from infermax.replay import RequestState, cache_tokens
from infermax.schedule import ScheduledBatch
from infermax.schedulers.base import Scheduler

DEMOTED_DENSITY = 1e-12  # value per memory unit of a demoted request: below every other positive density
RHO_MODES = ("cost-model", "authors")
DEMOTIONS = ("near-zero", "decay")
PREFILL_MEMORY = ("free", "paper")


# ---------------------------------------------------------------------------------------------
# The greedy (pure: tested against brute force)


@dataclass(frozen=True)
class Candidate:
    """One request's options: KV (``kv_value``, ``kv_size``) or hidden (``hidden_value``,
    ``hidden_size``; ``hidden_value`` None = not offered)."""

    key: Hashable
    kv_value: float
    kv_size: int
    hidden_value: float | None = None
    hidden_size: int = 0


@dataclass(frozen=True)
class Selection:
    """The greedy's decision: ``forms[key]`` is ``"kv"`` or ``"hidden"`` for selected requests."""

    forms: dict
    value: float
    used: int
    single: bool = False  # the best single request beat the greedy set (S')


def marginal_items(c: Candidate) -> list[tuple[float, int, str]]:
    """``(density θ, size Δm, step)`` items of a candidate, step ``hidden`` / ``upgrade`` / ``kv``.

    The hidden step and the KV upgrade are offered when the hidden option exists, is smaller, and
    its density is at least the KV-only density ``kv_value / kv_size`` (then ``θ_hidden ≥
    θ_upgrade``: the two steps are the concave hull of the request's options); otherwise one KV step.
    """
    kv_density = c.kv_value / c.kv_size
    hv, hs = c.hidden_value, c.hidden_size
    if hv is not None and 0 < hs < c.kv_size and 0 <= hv <= c.kv_value and hv / hs >= kv_density:
        upgrade = (c.kv_value - hv) / (c.kv_size - hs)
        # θ_upgrade ≤ θ_hidden holds exactly; rounding can break it when the two are equal, and an
        # upgrade sorted before its hidden step would be taken alone. The single KV step is worth
        # the same then.
        if upgrade <= hv / hs:
            return [(hv / hs, hs, "hidden"), (upgrade, c.kv_size - hs, "upgrade")]
    return [(kv_density, c.kv_size, "kv")]


def _feasible_items(c: Candidate, capacity: int) -> list[tuple[float, int, str]]:
    if c.kv_size <= capacity:
        return marginal_items(c)
    if c.hidden_value is not None and 0 < c.hidden_size <= capacity and c.hidden_value >= 0:
        return [(c.hidden_value / c.hidden_size, c.hidden_size, "hidden")]
    return []


def greedy_select(candidates: Sequence[Candidate], capacity: int,
                  admit: Callable[[Hashable, int], bool] | None = None, double_check: bool = True) -> Selection:
    """The appendix's Algorithm 1 over ``candidates`` with memory ``capacity``.

    Items (``marginal_items``) are sorted by density, descending and stable (ties keep candidate
    order), and taken until the first that does not fit. A request whose first item is taken
    must pass ``admit(key, n_selected_before)`` (token and sequence budgets): the first refusal stops
    the greedy too. With ``double_check``, the best single feasible option of the request whose
    item did not fit (KV if it fits ``capacity``, else hidden) replaces the set when it is worth more.
    Options larger than ``capacity`` are dropped first (no solution can use them); the appendix's
    proof assumes this, and without it a request too big to fit could block every other one.
    """
    items = []
    for order, c in enumerate(candidates):
        for rank, (theta, size, step) in enumerate(_feasible_items(c, capacity)):
            items.append((-theta, order, rank, size, step, c))
    items.sort(key=lambda t: (t[0], t[1], t[2]))
    forms: dict = {}
    value, used = 0.0, 0
    blocked: Candidate | None = None
    for _, _, _, size, step, c in items:
        if used + size > capacity:
            blocked = c
            break
        if step != "upgrade":
            if admit is not None and not admit(c.key, len(forms)):
                break
            forms[c.key] = "hidden" if step == "hidden" else "kv"
            value += c.hidden_value if step == "hidden" else c.kv_value
        else:
            forms[c.key] = "kv"
            value += c.kv_value - c.hidden_value
        used += size
    if double_check and blocked is not None and (admit is None or admit(blocked.key, 0)):
        single = None
        if blocked.kv_size <= capacity:
            single = ("kv", blocked.kv_value, blocked.kv_size)
        elif blocked.hidden_value is not None and 0 < blocked.hidden_size <= capacity:
            single = ("hidden", blocked.hidden_value, blocked.hidden_size)
        if single is not None and single[1] > value:
            return Selection({blocked.key: single[0]}, single[1], single[2], single=True)
    return Selection(forms, value, used)


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
        from infermax.models import MODELS

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
    """

    def repeats_full_decode(self, batch: ScheduledBatch) -> bool:
        """True while nobody waits (a batch that preempted someone leaves them waiting, so it never
        repeats). Then, after a full decode batch in KV form (no prefill, finish or hidden item), the next call plans a decode iteration (nothing waiting to select) in
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
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self._by_id: dict[int, RequestState] = {}

    def add_arrivals(self, arrived: list[RequestState]) -> None:
        for s in arrived:
            self._by_id[s.id] = s
            self.waiting.append(s)

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

    def _candidate(self, s: RequestState, p: float, kv_tokens: int, n: int, violator: bool) -> Candidate:
        lim, opt = self.limits, self.options
        kv_size = lim.blocks(kv_tokens)
        hidden_size = cache_tokens(lim, kv_tokens, True)
        if violator and opt.demotion == "near-zero":
            return Candidate(s.id, DEMOTED_DENSITY * kv_size, kv_size)
        weight = opt.decay if violator else 1.0
        if not opt.hybrid:
            return Candidate(s.id, weight * p, kv_size)
        return Candidate(s.id, weight * p, kv_size, weight * (p - n * self.rho * kv_size), hidden_size)

    # -- planning -------------------------------------------------------------------------------
    def next_batch(self, now_s: float) -> ScheduledBatch:
        lim = self.limits
        p_wait = [self.pending_s(s, now_s) for s in self.waiting]
        p_run = [self.pending_s(s, now_s) for s in self.running]
        v_wait = [self.violates(s, p) for s, p in zip(self.waiting, p_wait)]
        v_run = [self.violates(s, p) for s, p in zip(self.running, p_run)]
        n = len(self.waiting) + len(self.running)
        if self.options.n_minus_violators:
            n -= sum(v_wait) + sum(v_run)
        used = sum(cache_tokens(lim, s.m, s.hidden) for s in self.running)
        if self.options.prefill_memory == "paper":
            free = lim.M - sum(lim.blocks(s.m) for s in self.running)
        else:
            free = lim.M - used
        waiting = list(self.waiting)
        chosen = self._select(waiting, p_wait, v_wait, n, max(free, 0), prefill=True, holders=len(self.running))
        decode = bool(self.running) and (
            (sum(p_run) > sum(p_wait) if self.options.adaptive else False) or not chosen.forms)
        if not decode:
            return self._prefill_batch(chosen)
        kept = self._select(self.running, p_run, v_run, n, lim.M, prefill=False, holders=0)
        batch = self._decode_batch(kept)
        if batch.items:
            return batch
        # Corner case: every running request is preempted (unselected or switching form). Prefill the
        # waiting requests that fit the then empty memory; if none, defer the switches this once.
        again = self._select(waiting, p_wait, v_wait, n, lim.M, prefill=True, holders=0)
        if again.forms:
            prefill = self._prefill_batch(again)
            return ScheduledBatch(items=prefill.items, evict=batch.evict, hidden=prefill.hidden)
        return self._deferred_switch_batch(kept)

    def _select(self, states, pending, violators, n, capacity, prefill: bool, holders: int) -> Selection:
        lim = self.limits
        token_cap = min(lim.C, lim.prefill_budget) if prefill else lim.C
        seq_cap = lim.Rmax
        sizes = {}
        cands = []
        for s, p, v in zip(states, pending, violators):
            need = s.input_tokens if prefill else s.m + 1
            if prefill and need > token_cap:
                kind = "prompt" if need == s.req.prompt_tokens else "refill after preemption"
                raise self.prefill_too_long(  # (the engine's hint on the longest prompt, as the scheduler's)
                    f"request {s.id}: its {need}-token prefill ({kind}) exceeds min(C, P) = {token_cap}, and "
                    f"scheduler '{self.name}' does not chunk prefills; raise C/P")
            sizes[s.id] = need if prefill else 1
            cands.append(self._candidate(s, p, need, n, v and self.options.adaptive))
        tokens = [0]

        def admit(key, n_before: int) -> bool:
            if n_before == 0:
                tokens[0] = 0
            if tokens[0] + sizes[key] > token_cap:
                return False
            if prefill and seq_cap is not None and holders + n_before + 1 > seq_cap:
                return False
            tokens[0] += sizes[key]
            return True

        if self.options.adaptive:
            return greedy_select(cands, capacity, admit, self.options.double_check)
        return _fcfs_select(cands, capacity, admit)

    def _prefill_batch(self, chosen: Selection) -> ScheduledBatch:
        """Whole prefills (waiting requests hold no cache: ``input_tokens`` = prompt + generated)."""
        items = [(rid, self._by_id[rid].input_tokens) for rid in chosen.forms]
        return ScheduledBatch(items=items, hidden=frozenset(k for k, f in chosen.forms.items() if f == "hidden"))

    def _decode_batch(self, chosen: Selection) -> ScheduledBatch:
        """Selected running requests keeping their form decode; the others are preempted."""
        items, evict, hidden = [], [], set()
        for s in self.running:
            form = chosen.forms.get(s.id)
            keeps = form is not None and (form == "hidden") == s.hidden
            if keeps and form == "hidden" and self.options.reprefill_hidden:
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
        if batch.evict:
            out = set(batch.evict)
            self.running = [s for s in self.running if s.id not in out]
            self.waiting.extendleft(self._by_id[rid] for rid in reversed(batch.evict))
        running_ids = {s.id for s in self.running}
        admitted = [rid for rid, _ in batch.items if rid not in running_ids]
        if admitted:
            gone = set(admitted)
            self.waiting = deque(s for s in self.waiting if s.id not in gone)
            self.running.extend(self._by_id[rid] for rid in admitted)
        if finished:
            done = {s.id for s in finished}
            self.running = [s for s in self.running if s.id not in done]

    def describe_state(self) -> str:
        used = sum(cache_tokens(self.limits, s.m, s.hidden) for s in self.running)
        return f"waiting={len(self.waiting)}, running={len(self.running)}, cache used={used}/{self.limits.M}"


def _fcfs_select(cands: Sequence[Candidate], capacity: int, admit) -> Selection:
    """Queue order: KV if it fits, else hidden if offered and it fits; stop at the first that fits neither."""
    forms: dict = {}
    value, used = 0.0, 0
    for c in cands:
        if used + c.kv_size <= capacity:
            form, v, size = "kv", c.kv_value, c.kv_size
        elif c.hidden_value is not None and used + c.hidden_size <= capacity:
            form, v, size = "hidden", c.hidden_value, c.hidden_size
        else:
            break
        if not admit(c.key, len(forms)):
            break
        forms[c.key] = form
        value, used = value + v, used + size
    return Selection(forms, value, used)


def _check_hidden_halves_memory(model: str | None) -> None:
    """The hidden form saves memory only where ``hidden_size == 2·kv_dim`` (multi-head attention)."""
    from infermax.models import MODELS

    spec = MODELS.get(str(model).lower()) if model else None
    if spec is not None and spec.num_kv_heads != spec.num_heads:
        raise ValueError(
            f"model {spec.name!r} uses grouped-query attention ({spec.num_kv_heads} KV heads for {spec.num_heads} query "
            f"heads): its hidden states are {spec.num_heads / (2 * spec.num_kv_heads):g}x its KV, not half; use the "
            f"KV-only variant 'aptserve-kv'")
