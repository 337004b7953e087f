"""The semantics of `design.md`, applied batch by batch: state, validation, timing.

`Replayer` is the single implementation of what a batch does to requests. The
engine feeds it every batch a scheduler plans (so a scheduler cannot break a rule
unnoticed) and `replay` feeds it a saved Schedule; both therefore compute metrics
with the same code.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush
from numbers import Integral
from typing import Iterable

from .costmodel.base import BatchFeatures, CostModel
from .costmodel.swap import SwapCost
from .limits import Limits
from .request import Request
from .schedule import Schedule, ScheduledBatch, batch_shape_problem


class ScheduleViolation(ValueError):
    """A batch breaks a rule; names the batch, the request (if any) and the rule."""

    def __init__(self, batch: int, request: int | None, rule: str, detail: str):
        self.batch, self.request, self.rule = batch, request, rule
        who = f", request {request}" if request is not None else ""
        super().__init__(f"batch {batch}{who}: [{rule}] {detail}")


class RequestState:
    """Mutable progress of one request (the Semantics' ``m``, ``Icur``, ``g``)."""

    __slots__ = (
        "req", "id", "m", "input_tokens", "generated", "evictions",
        "prefill_processed", "first_token_s", "finish_s", "last_token_s", "hidden", "token_times",
        "cpu_tokens", "swapped_out_tokens", "swapped_in_tokens", "last_decode_m", "e0", "prefix_hit_tokens",
        "cache_blocks",
    )

    def __init__(self, req: Request):
        self.req = req
        self.id = req.id
        self.m = 0  # tokens whose KV is cached
        self.input_tokens = req.prompt_tokens  # Icur: grows when evicted in decode phase
        self.generated = 0  # g
        self.evictions = 0
        self.prefill_processed = 0  # prefill tokens processed, refills included
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.last_token_s: float | None = None
        self.hidden = False  # cache form of the m cached tokens: hidden states (True) or KV
        self.cpu_tokens = 0  # of the m cached tokens, those whose KV is in host memory (swapped out)
        self.swapped_out_tokens = 0
        self.swapped_in_tokens = 0
        self.last_decode_m = req.prompt_tokens + req.output_tokens - 2  # m before the decode of the last token
        self.prefix_hit_tokens = 0  # input tokens taken from the prefix cache instead of computed
        self.cache_blocks = 0  # full KV blocks registered with the prefix cache (`PrefixCache.fill`)
        self.e0 = 0  # the replayer's cohort epoch when m, generated, last_token_s were last brought up to date
        # Every token's emission time, kept only for requests with a TBT or TPOT target (P99 TBT and the
        # share of on-time gaps need them).
        self.token_times: list[float] | None = [] if req.tbt_slo_s is not None or req.tpot_slo_s is not None else None

    @property
    def in_prefill(self) -> bool:
        return self.m < self.input_tokens

    @property
    def finished(self) -> bool:
        return self.finish_s is not None

    @property
    def remaining_prefill(self) -> int:
        return self.input_tokens - self.m

    @property
    def gpu_tokens(self) -> int:
        """Cached tokens whose KV (or hidden states) is in GPU memory."""
        return self.m - self.cpu_tokens


def cache_tokens(limits: Limits, m: int, hidden: bool) -> int:
    """Memory, in KV-token units, of ``m`` cached tokens: ``blocks(m)`` as KV; as hidden states half
    the blocks, rounded up (``b·⌈⌈m/b⌉/2⌉``; ``⌈m/2⌉`` with ``block_size`` 1)."""
    if not hidden:
        return limits.blocks(m)
    b = limits.block_size
    kv_blocks = -(-m // b)
    return b * -(-kv_blocks // 2)


# Leaves of the lazy decode cohort after which its members' places are taken afresh (`Replayer._drop_from_cohort`):
# a leave searches at most this many places, and re-placing ~400 members costs about as much as 30 such searches.
COHORT_REINDEX = 32

# The fields of `BatchFeatures`, in the order `Replayer._process_items` passes them positionally.
REPLAY_FEATURE_ORDER = (
    "n_tokens", "prefill_tokens", "prefill_sq_tokens", "prefill_ctx_tokens", "prefill_ctx_cap256", "prefill_ctx_cap512",
    "prefill_ctx_cap1024", "prefill_ctx_cap2048", "n_prefill_seqs", "n_decode_seqs", "decode_kv_tokens", "decode_kv_max",
    "swap_tokens", "hidden_recompute_tokens",
)

BATCH_COLUMNS = (
    "batch", "start_s", "duration_s", "end_s", "num_requests", "num_prefill_seqs", "num_decode_seqs",
    "prefill_tokens", "decode_tokens", "generated_tokens", "evictions",
    "kv_tokens_peak", "kv_tokens", "running_peak", "running", "hidden_seqs",
    "compute_s", "swap_out_tokens", "swap_in_tokens",
)


class Replayer:
    """Applies batches to request states under limits, timing each with a cost model.

    Per batch: evictions first, then each ``(id, c)``; checks the Semantics and the
    limits (``Σc ≤ C``, prefill tokens ``≤ P``, KV ``≤ M`` and KV holders ``≤ Rmax``
    counting requests that finish in the batch); then frees finished requests. An item in
    ``batch.hidden`` holds its cache in hidden form (``cache_tokens``), chosen when its cache
    starts (``m = 0``) and kept until evicted or finished; each processed hidden-form item adds
    its ``m`` cached tokens to ``hidden_recompute_tokens`` (their K/V are projected again).

    Swaps (after evictions, before the items): ``swap_out`` ``(id, n)`` moves ``n`` of a request's
    GPU-resident cached tokens to host memory (``cpu_tokens``); ``swap_in`` moves them back. Only
    GPU-resident tokens count against ``M``, and only requests with some count against ``Rmax``; a
    processed item must have all its cache on the GPU. A batch that swaps lasts
    ``max(compute, swap_cost.time_s(in), swap_cost.time_s(out))`` (copies overlap compute).

    Prefix caching (``limits.prefix_caching``; rules in `infermax.prefix_cache`): the replayer owns the
    `PrefixCache` (``prefix_cache``, else None). ``cache_hits`` ``(id, n)`` (after swaps, before the
    items) start a request holding no KV on ``n`` cached tokens; the request must be an item of the
    batch, which then computes from ``m = n``. ``kv_tokens`` counts a block shared by several requests
    once. Caching runs step by step (no lazy decode cohort, no fast-forward) and excludes swaps and
    hidden-form caches.
    """

    def __init__(self, requests: Iterable[Request], limits: Limits, cost_model: CostModel,
                 swap_cost: SwapCost | None = None, lazy_decoders: bool = False):
        self.limits = limits
        self.cost_model = cost_model
        self.swap_cost = swap_cost
        self.states: dict[int, RequestState] = {}
        self.unfinished = 0
        for r in requests:
            self.add_request(r)
        self.clock_s = 0.0
        self.kv_tokens = 0  # block-rounded GPU-resident cache of holders
        self.holders = 0  # requests with GPU-resident cache
        self.last_generated = 0
        self.last_full_decode = False
        self.batch_rows: list[tuple] = []
        self.batches: list[ScheduledBatch] = []
        # Ids of "plain decoders": unfinished requests in decode phase (m ≥ Icur > 0) holding their whole
        # cache on the GPU in KV form (token times, where kept, are appended as for any generator). `apply` checks
        # such an item with a set lookup instead of the per-field rules, which all hold for it (see `apply`).
        self._plain: set[int] = set()
        self.prefix_cache = None
        if limits.prefix_caching:
            from .prefix_cache import PrefixCache

            self.prefix_cache = PrefixCache(limits, lambda: self.kv_tokens)
            lazy_decoders = False  # the cache registers every filled block, batch by batch
        # The lazy decode cohort (``lazy_decoders``; see `_cohort_batch`): plain decoders that the last
        # batch listed, in its order, whose m, generated and last_token_s lag by ``_epoch − e0`` tokens.
        self.lazy_decoders = lazy_decoders
        self._epoch = 0  # batches applied to the whole cohort at once
        # The end of each cohort batch since every member was last up to date (epoch ``_ends_base + i`` at index
        # i): a member that keeps its token times (a TBT or TPOT target) takes its lagging ones from here.
        self._epoch_ends: list[float] = []
        self._ends_base = 0
        self._synced_epoch = -1  # every member is up to date when this equals _epoch (`sync`)
        self._cohort_end_s = 0.0  # end of the last such batch
        self._cohort: list[tuple[int, int]] = []  # (id, 1) per member, in item order
        self._cohort_ids: set[int] = set()
        # Where each member stood in ``_cohort`` when it was last placed, and how many members left since: a member's
        # place now lies within that many before it (`_drop_from_cohort`).
        self._cohort_at: dict[int, int] = {}
        self._cohort_left = 0
        self._cohort_key_sum = 0  # Σ key over members, key = m − e0 (true m = key + _epoch)
        self._cohort_max: list[tuple[int, int]] = []  # heap of (−key, id); stale entries skipped
        self._cohort_hist = [0] * limits.block_size  # members by key mod block_size
        self._finish_at: dict[int, list[RequestState]] = {}  # epoch → members decoding their last token then

    def add_request(self, r: Request) -> RequestState:
        """Add a request (the engine submits closed-loop requests when they are released)."""
        if r.id in self.states:
            raise ValueError(f"duplicate request id {r.id}")
        s = self.states[r.id] = RequestState(r)
        self.unfinished += 1
        return s

    def apply(self, batch: ScheduledBatch) -> list[RequestState]:
        """Apply one batch; return the requests it finished. Raises ScheduleViolation.

        The steps, in the order their rules are checked: evictions, swaps, cache hits, the items (each
        item's rules, the batch's features and the KV it adds), the limits; then the batch's time, the
        tokens it generates (and the requests it finishes), the plain decoders and the lazy cohort after
        it, and its record."""
        j = len(self.batch_rows)
        if not batch.items:
            raise ScheduleViolation(j, None, "empty", "a batch must process at least one token")
        lazy = self._cohort_batch(batch) if self._cohort_ids else 0
        evicted = self._evict(j, batch.evict) if batch.evict else set()
        swapped_out, swapped_in = self._swap(j, batch, evicted) if batch.swap_out or batch.swap_in else (0, 0)
        cache = self.prefix_cache
        if cache is not None and (batch.hidden or swapped_out or swapped_in):
            raise ScheduleViolation(j, None, "prefix-caching", "prefix caching excludes swaps and hidden-form caches")
        if batch.cache_hits:
            self._take_hits(j, batch, evicted)

        start = self.clock_s if batch.not_before_s is None else max(self.clock_s, batch.not_before_s)
        todo = batch.items if not lazy else batch.items[lazy:]
        feats, start, generators, fast, now_plain = self._process_items(
            j, batch, todo, lazy, start, evicted, swapped_out + swapped_in)
        self._check_limits(j, feats)

        if cache is not None:  # the batch's new blocks come from empty ones, then from the LRU cached ones
            cache.make_room()
        compute = self.cost_model.batch_time_s(feats)
        duration = compute
        if swapped_out or swapped_in:
            duration = max(compute, self.swap_cost.time_s(swapped_out), self.swap_cost.time_s(swapped_in))
        end = start + duration
        kv_peak, holders_peak = self.kv_tokens, self.holders
        finished = self._generate(end, generators, fast, todo)
        if lazy:
            cohort_done = self._cohort_generate(end)
            if cohort_done:  # the cohort's items come first
                finished = cohort_done + finished
        self.unfinished -= len(finished)
        self._after_items(batch, todo, now_plain)
        self.clock_s = end
        self.last_generated = len(generators) + len(fast) + lazy
        # Every KV holder decoded one token in KV form; nothing was prefilled or finished (evictions allowed).
        self.last_full_decode = (cache is None and not feats.n_prefill_seqs and not finished and not batch.hidden
                                 and not swapped_out and not swapped_in and len(batch.items) == self.holders)
        self.batches.append(batch)
        self.batch_rows.append((
            j, start, duration, end, len(batch.items), feats.n_prefill_seqs, feats.n_decode_seqs,
            feats.prefill_tokens, feats.n_decode_seqs, self.last_generated, len(batch.evict),
            kv_peak, self.kv_tokens, holders_peak, self.holders, len(batch.hidden),
            compute, swapped_out, swapped_in,
        ))
        return finished

    def _evict(self, j: int, evict: list[int]) -> set[int]:
        """Check the batch's evictions (each request once, each holding KV), then apply them (recompute): the KV is
        dropped and, in decode phase, the generated tokens join the input. Returns the evicted ids."""
        evicted = set()
        for rid in evict:
            s = self._state(j, rid)
            if rid in evicted:
                raise ScheduleViolation(j, rid, "evict-twice", "evicted twice in one batch")
            if s.m == 0:
                raise ScheduleViolation(j, rid, "evict-no-kv", "evicted but holds no KV")
            evicted.add(rid)
        states = self.states
        for rid in evict:
            s = states[rid]
            if s.m >= s.input_tokens:
                s.input_tokens = s.req.prompt_tokens + s.generated
            self._release(s)
            s.evictions += 1
        return evicted

    def _process_items(self, j: int, batch: ScheduledBatch, todo, lazy: int, start: float, evicted: set[int],
                       swap_tokens: int) -> tuple[BatchFeatures, float, list, list, list]:
        """Check and process ``todo`` (the batch's items after its ``lazy`` cohort items): each item's rules, its
        ``m`` and the KV and holders it adds. Returns the batch's features (the cohort's decodes and
        ``swap_tokens`` included), its start (no earlier than any item's arrival), the requests generating a
        token (``generators``: by the item-by-item path; ``fast``: plain decoders, whose generation is applied
        after timing like every generator's) and those that become plain decoders unless the batch finishes them.
        """
        lim, states, blocks = self.limits, self.states, self.limits.blocks
        cache = self.prefix_cache
        # Feature sums kept in locals (the hot loop); BatchFeatures is built once after it.
        n_tokens = prefill_tokens = prefill_sq = prefill_ctx = n_prefill = n_decode = decode_kv = decode_max = hidden_rc = 0
        ctx256 = ctx512 = ctx1024 = ctx2048 = 0  # Σ c·min(m, K), BatchFeatures.prefill_ctx_cap<K>
        unit_blocks = lim.block_size == 1
        hidden_ids = batch.hidden
        kv, holders = self.kv_tokens, self.holders
        generators: list[RequestState] = []
        seen: set[int] = set()
        # Plain decoders (see __init__) take a short path: each was processed in an earlier batch (so it
        # has arrived), is unfinished, not evicted in this batch (eviction drops it from the set), holds
        # all its cache on the GPU in KV form and is in decode phase, so of the per-item rules only
        # "no duplicate", "c = 1" and (per batch) "no hidden items" remain; its arithmetic is the decode
        # branch below.
        plain = self._plain if not hidden_ids else ()
        block = lim.block_size
        fast: list[RequestState] = []
        fast_append, seen_add = fast.append, seen.add
        openers = 0  # plain decoders whose token opens a KV block (m % block_size == 0)
        now_plain: list[RequestState] = []  # checked item by item; plain after the batch unless finished
        for rid, c in todo:
            if rid in plain and c == 1 and rid not in seen:
                seen_add(rid)
                s = states[rid]
                m0 = s.m
                decode_kv += m0
                if m0 >= decode_max:
                    decode_max = m0 + 1
                fast_append(s)
                if not m0 % block:
                    openers += 1
                continue
            s = states.get(rid)
            if s is None or s.finish_s is not None:
                self._state(j, rid)  # raises the matching violation
            if rid in seen:
                raise ScheduleViolation(j, rid, "duplicate", "appears twice in the batch")
            if rid in evicted:
                raise ScheduleViolation(j, rid, "evict-and-process", "evicted and processed in the same batch")
            if s.cpu_tokens:
                raise ScheduleViolation(j, rid, "swapped-out", (
                    f"{s.cpu_tokens} of its {s.m} cached tokens are in host memory; swap them in before processing it"))
            seen.add(rid)
            arrival = s.req.arrival_s
            if arrival > start:
                start = arrival
            if type(c) is not int:
                c = _whole_tokens(j, rid, c, "chunk")
            m0 = s.m
            icur = s.input_tokens
            if m0 < icur:
                if not 1 <= c <= icur - m0:
                    raise ScheduleViolation(
                        j, rid, "chunk", f"prefill chunk c={c} outside 1..{icur - m0} (m={m0}, Icur={icur})")
                n_tokens += c
                prefill_tokens += c
                prefill_sq += c * c
                prefill_ctx += c * m0
                if m0:
                    ctx256 += c * (m0 if m0 < 256 else 256)
                    ctx512 += c * (m0 if m0 < 512 else 512)
                    ctx1024 += c * (m0 if m0 < 1024 else 1024)
                    ctx2048 += c * (m0 if m0 < 2048 else 2048)
                n_prefill += 1
                s.prefill_processed += c
                if m0 + c == icur:
                    generators.append(s)
                    if not s.hidden and rid not in hidden_ids:
                        now_plain.append(s)
            else:
                if c != 1:
                    raise ScheduleViolation(j, rid, "decode", f"decode phase processes exactly 1 token, got c={c}")
                n_tokens += 1
                decode_kv += m0 + 1
                if m0 >= decode_max:
                    decode_max = m0 + 1
                n_decode += 1
                generators.append(s)
                if not s.hidden and rid not in hidden_ids:
                    now_plain.append(s)
            if m0 == 0:
                holders += 1
                if cache is not None:
                    cache.admit(s, 0)
                if hidden_ids:
                    s.hidden = rid in hidden_ids
            elif s.hidden != (rid in hidden_ids):
                raise ScheduleViolation(j, rid, "cache-form", (
                    f"holds its cache in {'hidden' if s.hidden else 'KV'} form; switching form needs an eviction "
                    f"(discard and recompute) first"))
            if s.hidden:
                hidden_rc += m0
                kv += cache_tokens(lim, m0 + c, True) - cache_tokens(lim, m0, True)
            else:
                kv += c if unit_blocks else blocks(m0 + c) - blocks(m0)
            s.m = m0 + c
        if batch.cache_hits and not {rid for rid, _ in batch.cache_hits} <= seen:
            rid = min({rid for rid, _ in batch.cache_hits} - seen)
            raise ScheduleViolation(j, rid, "hit-not-item", "takes a cache hit but is not processed in the batch")
        if hidden_ids and not hidden_ids <= seen:
            rid = min(hidden_ids - seen)
            raise ScheduleViolation(j, rid, "hidden-not-item", "listed as hidden but not processed in the batch")
        if fast:
            n_tokens += len(fast)
            n_decode += len(fast)
            decode_kv += len(fast)
            kv += block * openers
        if lazy:  # the cohort's decodes, from its running sums (true m = key + epoch)
            e = self._epoch
            n_tokens += lazy
            n_decode += lazy
            decode_kv += self._cohort_key_sum + lazy * (e + 1)
            top = self._cohort_max_key() + e + 1
            if top > decode_max:
                decode_max = top
            kv += lazy if block == 1 else block * self._cohort_hist[-e % block]
        self.kv_tokens, self.holders = kv, holders
        # Positional, in the field order of `BatchFeatures` (REPLAY_FEATURE_ORDER; tests/test_validator.py checks it): a
        # third of the keyword form's cost, once per batch.
        feats = BatchFeatures(n_tokens, prefill_tokens, prefill_sq, prefill_ctx, ctx256, ctx512, ctx1024, ctx2048,
                              n_prefill, n_decode, decode_kv, decode_max, swap_tokens, hidden_rc)
        return feats, start, generators, fast, now_plain

    def _check_limits(self, j: int, feats: BatchFeatures) -> None:
        """``Σc ≤ C``, prefill tokens ``≤ P``, KV ``≤ M`` and KV holders ``≤ Rmax`` (counting requests that finish in
        the batch: checked before they are freed)."""
        lim = self.limits
        if feats.n_tokens > lim.C:
            raise ScheduleViolation(j, None, "C", f"{feats.n_tokens} tokens > C={lim.C}")
        if feats.prefill_tokens > lim.prefill_budget:
            raise ScheduleViolation(j, None, "P", f"{feats.prefill_tokens} prefill tokens > P={lim.prefill_budget}")
        if self.kv_tokens > lim.M:
            raise ScheduleViolation(j, None, "M", f"KV {self.kv_tokens} tokens > M={lim.M}")
        if lim.Rmax is not None and self.holders > lim.Rmax:
            raise ScheduleViolation(j, None, "Rmax", f"{self.holders} requests hold KV > Rmax={lim.Rmax}")

    def _generate(self, end: float, generators: list[RequestState], fast: list[RequestState], todo) -> list[RequestState]:
        """Each generator's token at ``end``; returns the requests finished by it, in item order (``todo``), their
        cache freed."""
        finished = []
        for s in generators:
            s.generated += 1
            if s.first_token_s is None:
                s.first_token_s = end
            s.last_token_s = end
            if s.token_times is not None:
                s.token_times.append(end)
            if s.generated == s.req.output_tokens:
                s.finish_s = end
                self._release(s)
                finished.append(s)
        if fast:  # plain decoders: first token long emitted
            fast_done = []
            for s in fast:
                m = s.m
                s.m = m + 1
                s.generated += 1
                s.last_token_s = end
                if s.token_times is not None:
                    s.token_times.append(end)
                if m == s.last_decode_m:  # its last token: m + 1 = I + O − 1, evicted or not
                    fast_done.append(s)
            for s in fast_done:
                s.finish_s = end
                self._release(s)
            if fast_done and finished:  # report finishes in item order, as the item-by-item path does
                order = {rid: i for i, (rid, _) in enumerate(todo)}
                finished += fast_done
                finished.sort(key=lambda s: order[s.id])
            else:
                finished += fast_done
        return finished

    def _cohort_generate(self, end: float) -> list[RequestState]:
        """A cohort batch's tokens (one more epoch, ending at ``end``); returns the members it finished, in cohort
        order (the epoch index keeps join order, i.e. item order), their cache freed."""
        e = self._epoch
        self._epoch, self._cohort_end_s = e + 1, end
        self._epoch_ends.append(end)
        cohort_done = []
        for s in self._finish_at.pop(e, ()):
            if s.id in self._cohort_ids and s.last_decode_m - (s.m - s.e0) == e:  # not a stale entry
                self._leave_cohort(s)
                s.finish_s = end
                self._release(s)
                cohort_done.append(s)
        return cohort_done

    def _after_items(self, batch: ScheduledBatch, todo, now_plain: list[RequestState]) -> None:
        """After the batch's tokens: the prefix cache registers the blocks the batch filled (``cache_blocks``: those
        registered); unfinished requests checked item by item that qualify become plain decoders; the batch's
        plain decoders (re)join the lazy cohort."""
        states = self.states
        if self.prefix_cache is not None:
            b = self.limits.block_size
            for rid, _ in batch.items:
                s = states[rid]
                if s.m >= (s.cache_blocks + 1) * b and s.finish_s is None:
                    self.prefix_cache.fill(s)
        for s in now_plain:
            if s.finish_s is None:
                self._plain.add(s.id)
        if self.lazy_decoders:
            plain_now = self._plain
            for rid, _ in todo:
                if rid in plain_now:
                    self._join_cohort(states[rid])

    def _take_hits(self, j: int, batch: ScheduledBatch, evicted: set[int]) -> None:
        """Check and apply the batch's cache hits (`infermax.prefix_cache`, "Hits")."""
        cache, b = self.prefix_cache, self.limits.block_size
        if cache is None:
            raise ScheduleViolation(j, batch.cache_hits[0][0], "prefix-caching-off",
                                    "takes a cache hit but prefix caching is off (Limits.prefix_caching)")
        seen: set[int] = set()
        for rid, n in batch.cache_hits:
            s = self._state(j, rid)
            if rid in seen or rid in evicted:
                raise ScheduleViolation(j, rid, "hit", "listed twice in cache_hits, or also evicted, in one batch")
            seen.add(rid)
            if s.m:
                raise ScheduleViolation(j, rid, "hit-holder", f"holds {s.m} cached tokens; only a request holding no KV "
                                                              f"may start on cached blocks")
            if not (n >= b and n % b == 0 and n < s.input_tokens):
                raise ScheduleViolation(j, rid, "hit-size", (
                    f"hit of {n} tokens: must be a positive multiple of block_size={b} below Icur={s.input_tokens}"))
            missing = cache.missing_block(s, n)
            if missing is not None:
                raise ScheduleViolation(j, rid, "hit-miss", f"block {missing} of its input is not cached")
            self.kv_tokens += b * cache.admit(s, n)
            self.holders += 1
            s.m = n
            s.prefix_hit_tokens += n

    def _swap(self, j: int, batch: ScheduledBatch, evicted: set[int]) -> tuple[int, int]:
        """Apply the batch's swap-outs then swap-ins (it has one or the other); return the tokens moved each way."""
        if self.swap_cost is None:
            raise ScheduleViolation(j, None, "swap-cost", "the batch swaps KV but the replay has no swap cost model")
        out, into = batch.swap_out, batch.swap_in
        if out and into:
            both = {rid for rid, _ in out}.intersection([rid for rid, _ in into])
            if both:
                raise ScheduleViolation(j, min(both), "swap-both", "swapped out and in in the same batch")
        return (self._move(j, out, True, evicted) if out else 0), (self._move(j, into, False, evicted) if into else 0)

    def _move(self, j: int, pairs: list[tuple[int, int]], out: bool, evicted: set[int]) -> int:
        """Check and apply one direction of a batch's swaps, (request, tokens) ``pairs``: each request once, not
        evicted in the batch, in KV form, moving between 1 and the tokens it has on the side it leaves. Returns the
        tokens moved. (Called for nearly every batch of a swapping scheduler such as BROS: the KV and holder sums
        are kept in locals.)"""
        states, b = self.states, self.limits.block_size
        kv, holders, total, seen = self.kv_tokens, self.holders, 0, set()
        for rid, n in pairs:
            s = states.get(rid)
            if s is None or s.finish_s is not None:
                self._state(j, rid)  # raises the matching violation
            if rid in seen or rid in evicted:
                raise ScheduleViolation(j, rid, "swap-out" if out else "swap-in",
                                        "listed twice, or also evicted, in one batch")
            seen.add(rid)
            if s.hidden:
                raise ScheduleViolation(j, rid, "swap-out" if out else "swap-in", "a hidden-form cache cannot be swapped")
            if type(n) is not int:
                n = _whole_tokens(j, rid, n, "swap-out" if out else "swap-in")
            before = s.m - s.cpu_tokens
            room = before if out else s.cpu_tokens
            if not 1 <= n <= room:
                raise ScheduleViolation(j, rid, "swap-out" if out else "swap-in",
                                        f"moves {n} tokens; it has {room} {'on the GPU' if out else 'in host memory'}")
            if out:
                self._plain.discard(rid)
                s.cpu_tokens += n
                s.swapped_out_tokens += n
                after = before - n
            else:
                s.cpu_tokens -= n
                s.swapped_in_tokens += n
                after = before + n
            kv += after - before if b == 1 else -(-after // b) * b - -(-before // b) * b
            holders += (after > 0) - (before > 0)
            total += n
        self.kv_tokens, self.holders = kv, holders
        return total

    def repeat_full_decode(self, batch: ScheduledBatch, stop_at_s: float | None = None,
                           max_copies: int | None = None) -> int:
        """Apply further copies of ``batch`` while that is exactly what ``apply`` would do; return how many.

        Precondition: ``batch`` was the last batch applied and ``last_full_decode`` (every item was a
        decode in KV form, it finished nothing, and it held every KV holder); its evictions are not
        repeated. Copies stop before one that would start at or after ``stop_at_s`` (an arrival),
        exceed ``M``, or finish a request, so each copy decodes the same requests one token further. Each copy is recorded like ``apply``
        records it (a Schedule batch and a table row with the same arithmetic), at O(1) cost per copy
        plus O(len(batch.items)) once. The copies share one ``items`` list. At most ``max_copies`` (a caller
        under a deadline looks at its clock in between).
        """
        if not self.last_full_decode or batch is not self.batches[-1]:
            raise ValueError("repeat_full_decode needs the last applied batch, a full decode-only batch")
        if stop_at_s is not None and stop_at_s <= self.clock_s:
            return 0  # the next batch starts at an arrival: no copy (and nothing to bring up to date)
        self.sync()
        sts = [self.states[rid] for rid, _ in batch.items]
        n, b, M = len(sts), self.limits.block_size, self.limits.M
        copies = min(s.req.output_tokens - s.generated for s in sts) - 1
        if max_copies is not None:
            copies = min(copies, max_copies)
        new_block_at = None
        if b > 1:  # a decode from m to m+1 takes a new block when m % b == 0
            new_block_at = [0] * b
            for s in sts:
                new_block_at[s.m % b] += 1
        decode_kv = sum(s.m for s in sts) + n
        decode_max = max(s.m for s in sts) + 1
        kv, clock, holders, j = self.kv_tokens, self.clock_s, self.holders, len(self.batch_rows)
        rows, batches, cost = self.batch_rows, self.batches, self.cost_model.batch_time_s
        items = list(batch.items)
        ends: list[float] = []
        done = 0
        while done < copies and (stop_at_s is None or stop_at_s > clock):
            grow = n if new_block_at is None else b * new_block_at[-done % b]
            if kv + grow > M:
                break
            kv += grow
            duration = cost(BatchFeatures(n_tokens=n, n_decode_seqs=n, decode_kv_tokens=decode_kv, decode_kv_max=decode_max))
            end = clock + duration
            rows.append((j, clock, duration, end, n, 0, n, 0, n, n, 0, kv, kv, holders, holders, 0, duration, 0, 0))
            batches.append(ScheduledBatch(items=items))
            ends.append(end)
            clock, decode_kv, decode_max, j, done = end, decode_kv + n, decode_max + 1, j + 1, done + 1
        if done:
            for s in sts:
                s.m += done
                s.generated += done
                s.last_token_s = clock
                if s.token_times is not None:
                    s.token_times.extend(ends)
            self.kv_tokens, self.clock_s, self.last_generated = kv, clock, n
            if self._cohort_ids:  # every member (a KV holder, so an item) is `done` tokens further: as many
                self._epoch += done  # cohort batches, so each member's key m − e0 stands (no finish among them)
                for rid in self._cohort_ids:
                    self.states[rid].e0 = self._epoch
                self._cohort_end_s, self._synced_epoch, self._ends_base = clock, self._epoch, self._epoch
        return done

    def _release(self, s: RequestState) -> None:
        """Free a request's cache, on the GPU and in host memory (eviction or finish)."""
        if s.id in self._cohort_ids:
            self._leave_cohort(s)
        gpu = s.gpu_tokens
        self._plain.discard(s.id)
        if self.prefix_cache is not None:  # shared blocks stay referenced by their other holders
            self.kv_tokens -= self.limits.block_size * self.prefix_cache.release(s)
        else:
            self.kv_tokens -= cache_tokens(self.limits, gpu, s.hidden)
        self.holders -= gpu > 0
        s.m = s.cpu_tokens = 0
        s.hidden = False

    # The lazy decode cohort. A batch that lists exactly the cohort's items first (same ids, c = 1, same
    # order; C-level list equality), swaps none of them, lists none of them again and none of them as
    # hidden (its other items may be) applies to every member what `apply`'s plain-decoder path would: one
    # decode from m to m + 1 (the members are plain decoders, so no other rule can fail). Instead of touching each member it
    # advances ``_epoch``: Σ(m + 1), max(m + 1) and the blocks opened (members with m % block_size == 0)
    # come from running sums over ``key = m − e0``, and members whose last token falls in the batch
    # (``m = I + O − 2``) are found by epoch. Members the batch evicts leave the cohort first (brought up
    # to date, out of the sums), so a batch that evicts some members and decodes the rest in order is
    # still a cohort batch. A batch that touches no member leaves the cohort as it is (its lag is
    # unchanged). Any other batch and `materialize` bring the members up to date and dissolve the cohort; a
    # scheduler's `sync_states` (`sync`) brings them up to date and keeps it (a member's key ``m − e0`` does
    # not change when both catch up), and so does `repeat_full_decode`, whose copies advance ``_epoch`` as
    # that many cohort batches would. Item-for-item the same arithmetic, so
    # results are identical (tests).

    def _cohort_batch(self, batch: ScheduledBatch) -> int:
        """The number of leading items applied as a cohort batch (0: the cohort was materialised)."""
        items, ids = batch.items, self._cohort_ids
        if ids.isdisjoint(batch.hidden) and not batch.swap_out and not batch.swap_in:
            if not ids.isdisjoint(batch.evict):
                states = self.states
                for rid in batch.evict:
                    if rid in ids:
                        self._leave_cohort(states[rid])
            k = len(self._cohort)
            head = items[:k]
            if head == self._cohort and ids.isdisjoint([it[0] for it in items[k:]]):
                # Keep the planner's own item tuples: a scheduler that lists the same tuple objects again
                # (Algorithm 1's decode list) is then compared by identity, not element by element.
                self._cohort = head
                return k
            if ids.isdisjoint([it[0] for it in items]):
                return 0  # touches no member (a prefill-only batch): the cohort waits, up to date as it is
        self.materialize()
        return 0

    def _cohort_max_key(self) -> int:
        heap, states, ids = self._cohort_max, self.states, self._cohort_ids
        while True:
            key, rid = -heap[0][0], heap[0][1]
            s = states[rid]
            if rid in ids and s.m - s.e0 == key:
                return key
            heappop(heap)

    def _join_cohort(self, s: RequestState) -> None:
        e = self._epoch
        s.e0 = e
        key = s.m - e
        self._cohort_at[s.id] = len(self._cohort)
        self._cohort.append((s.id, 1))
        self._cohort_ids.add(s.id)
        self._cohort_key_sum += key
        heappush(self._cohort_max, (-key, s.id))
        self._cohort_hist[key % self.limits.block_size] += 1
        self._finish_at.setdefault(s.last_decode_m - key, []).append(s)

    def _bring_up_to_date(self, s: RequestState) -> int:
        """Apply a member's lagging decodes to its fields; return its key."""
        key = s.m - s.e0
        lag = self._epoch - s.e0
        if lag:
            s.m += lag
            s.generated += lag
            s.last_token_s = self._cohort_end_s
            if s.token_times is not None:
                base = self._ends_base
                s.token_times.extend(self._epoch_ends[s.e0 - base:self._epoch - base])
            s.e0 = self._epoch
        return key

    def _leave_cohort(self, s: RequestState) -> None:
        key = self._bring_up_to_date(s)
        self._cohort_ids.discard(s.id)
        self._drop_from_cohort(s.id)
        self._cohort_key_sum -= key
        self._cohort_hist[key % self.limits.block_size] -= 1

    def _drop_from_cohort(self, rid: int) -> None:
        """Remove a member's item from ``_cohort``, searching only the places it can have moved to: each member that
        left since it was placed moved it at most one place forward. ``list.remove`` searched from the front, about
        6 µs per leave in a cohort of ~400 (aptserve-kv on azure-conv: 35,713 leaves, mostly evictions and
        finishes). After `COHORT_REINDEX` leaves the window is wide enough that the places are taken afresh."""
        cohort, left = self._cohort, self._cohort_left
        at = self._cohort_at.pop(rid)
        del cohort[cohort.index((rid, 1), max(at - left, 0), at + 1)]
        if left + 1 < COHORT_REINDEX:
            self._cohort_left = left + 1
        else:
            self._cohort_at = {member: k for k, (member, _) in enumerate(cohort)}
            self._cohort_left = 0

    def sync(self) -> None:
        """Bring every cohort member's ``m``, ``generated`` and ``last_token_s`` up to date, keeping the cohort
        (the engine's `Scheduler.sync_states`: a scheduler reads the members and may list them again)."""
        if not self._cohort_ids or self._synced_epoch == self._epoch:
            return
        states = self.states
        for rid in self._cohort_ids:
            self._bring_up_to_date(states[rid])
        self._synced_epoch = self._ends_base = self._epoch
        self._epoch_ends.clear()

    def materialize(self) -> None:
        """Bring every cohort member's ``m``, ``generated`` and ``last_token_s`` up to date and dissolve
        the cohort (members rejoin after their next batch)."""
        if not self._cohort_ids:
            return
        self.sync()
        self._cohort, self._cohort_ids, self._cohort_key_sum = [], set(), 0
        self._cohort_at, self._cohort_left = {}, 0
        self._cohort_max, self._finish_at = [], {}
        self._cohort_hist = [0] * self.limits.block_size

    def cached_tokens(self, s: RequestState) -> int:
        """A request's true ``m`` (a cohort member's field may lag)."""
        return s.m + self._epoch - s.e0 if s.id in self._cohort_ids else s.m

    def cohort_block_openers(self, items: list) -> int | None:
        """How many of ``items`` open a KV block by decoding one token, if ``items`` are the cohort's
        items in order (O(1) after a C-level list comparison); None otherwise."""
        if not self._cohort or items != self._cohort:
            return None
        b = self.limits.block_size
        return len(items) if b == 1 else self._cohort_hist[-self._epoch % b]

    def _state(self, j: int, rid: int) -> RequestState:
        s = self.states.get(rid)
        if s is None:
            raise ScheduleViolation(j, rid, "unknown-request", "no such request in the workload")
        if s.finish_s is not None:
            raise ScheduleViolation(j, rid, "finished", f"already finished at {s.finish_s:.6g}s")
        return s

    def check_complete(self) -> None:
        """Raise unless every request generated all its output tokens."""
        self.materialize()
        if self.unfinished:
            left = [s for s in self.states.values() if s.finish_s is None]
            s = left[0]
            raise ScheduleViolation(
                len(self.batch_rows), s.id, "incomplete",
                f"{len(left)} request(s) unfinished at the end of the schedule; request {s.id} generated "
                f"{s.generated}/{s.req.output_tokens} tokens")


class BatchTimeOverflow(ValueError):
    """A batch time the cost model gave is not finite (a coefficient too large to be a measurement, as in a
    hand-edited cost-model file: 1e308 s per token is finite, two tokens are not)."""


def check_clock_finite(rp: "Replayer") -> None:
    """Raise `BatchTimeOverflow` when the replayer's clock is no longer finite: a batch time, or the sum of them,
    overflowed (every batch time is a sum of non-negative terms, so it reaches infinity rather than NaN, and the
    clock keeps it from then on)."""
    if not rp.clock_s < math.inf:
        j, duration_s = next((row[0], row[2]) for row in rp.batch_rows if not row[3] < math.inf)  # its end
        raise BatchTimeOverflow(
            f"cost model {getattr(rp.cost_model, 'name', type(rp.cost_model).__name__)!r}: batch {j} takes "
            f"{duration_s:.4g} s and ends past the largest float; batch times this large are not a GPU's (is a "
            f"coefficient or intercept far too large?)")


def recorded_swap_cost(schedule: Schedule) -> SwapCost | None:
    """The swap cost model the schedule's ``meta["swap_cost"]`` records (the engine records the one it simulated
    with), or None."""
    return SwapCost.from_dict(schedule.meta["swap_cost"]) if "swap_cost" in schedule.meta else None


def _whole_tokens(j: int, rid: int, n: object, rule: str) -> int:
    """A token count of a batch that is not a plain int (a Python-built schedule's): one from numpy, or a float that is
    a whole number (as a schedule file's are read), as an int; anything else breaks ``rule``. (A chunk of 2.5
    tokens had ended in a TypeError about list indices.)"""
    if isinstance(n, Integral) and not isinstance(n, bool):
        return int(n)
    if isinstance(n, float) and n.is_integer():
        return int(n)
    raise ScheduleViolation(j, rid, rule, f"token counts must be whole numbers, got {n!r}")


def replay(schedule: Schedule, cost_model: CostModel, limits: Limits | None = None,
           swap_cost: SwapCost | None = None):
    """Validate a Schedule and recompute all metrics; returns a `SimResult`.

    ``swap_cost`` defaults to the one the schedule's ``meta["swap_cost"]`` records (the engine
    records the one it simulated with)."""
    from .engine import check_requests
    from .metrics import SimResult

    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be an infermax.schedule.Schedule (Schedule.load(path) reads a file), got "
                        f"{type(schedule).__name__} {schedule!r:.60}")
    check_requests(schedule.requests)
    if not isinstance(limits or schedule.limits, Limits):
        raise TypeError(f"limits must be an infermax.limits.Limits, got {type(limits or schedule.limits).__name__}")
    if not hasattr(cost_model, "batch_time_s"):
        raise TypeError(f"cost_model must be a cost model (infermax.costmodel.load_cost_model builds one), got "
                        f"{type(cost_model).__name__} {cost_model!r:.60}")
    if swap_cost is None:
        swap_cost = recorded_swap_cost(schedule)
    rp = Replayer(schedule.requests, limits or schedule.limits, cost_model, swap_cost, lazy_decoders=True)
    for j, batch in enumerate(schedule.batches):
        try:
            rp.apply(batch)
        except ScheduleViolation:
            raise
        except (AttributeError, TypeError, ValueError):  # a malformed batch (one built in Python), or another error
            problem = batch_shape_problem(batch)
            if problem is None:
                raise
            raise ScheduleViolation(j, None, "shape", problem.replace("next_batch must return", "each batch must be")
                                    ) from None
    check_clock_finite(rp)
    rp.check_complete()
    return SimResult.from_replayer(rp, meta={**schedule.meta, "replayed": True})
