"""Apt-Serve's waiting queue, indexed so that a batch touches only the waiting requests it selects.

The scheduler needs four things from the waiting requests every iteration, and the straightforward
way computes each over all of them (``O(|W| log |W|)`` per batch, with thousands waiting on a trace):

- the greedy's items in descending value density, but only up to the first that does not fit;
- how many are SLO violators (``N`` excludes them);
- whether the running requests' summed pending time exceeds theirs (the iteration type);
- queue order (ties between densities, the FCFS ablation).

A request's pending time ``p = now − ref`` (``ref``: arrival, or its last token once it has one) and
its prefill size are fixed while it waits, so the index keeps them by ``ref``:

- **Density order** (``items``): requests are bucketed by exact prefill size, each bucket sorted by
  ``ref``. A request's best item density is at most ``max(p/kv, (p − N·ρ·kv)/hidden)`` at its sizes (a
  demoted or decayed value is smaller; an upgrade is never denser than its hidden step), which grows
  with ``p``, so a bucket's oldest unexpanded request bounds the whole bucket, and for a bucket head
  that is not an SLO violator the bound is its density itself. The heads' bounds are computed for
  every bucket at once (numpy, ``heads_array``) and read in descending order (``_descending``). Requests are
  expanded (their exact candidate computed as before) in bound order, and an item is emitted only once
  its density exceeds every unexpanded bucket's bound: every item that could tie with it or precede
  it is already expanded, so the emitted sequence is exactly the full sort's prefix, ties in queue
  order included. Exact sizes matter on an overloaded queue: the greedy serves the densest requests
  first, so the waiting requests' densities crowd just below the one it stops at (on azure-conv,
  hundreds within 0.1%), and a bound loose by a bucket's width (6%, the former size buckets)
  expanded ~400 requests per batch to emit ~25.
  *Demoted requests* (SLO violators: ``now − ref > slo``; the greedy decays or zeroes their value)
  have their own bucket per size, keyed ``~tokens``, whose bound is the demoted one: without it their
  undemoted bound kept them ahead of the densities the greedy stops at, and a batch under SLO pressure
  expanded hundreds of violators to emit a few (1.2 ms per batch on azure-conv's first 1,500 requests
  with targets and M = 60,000). A request moves there once, at the first ``items`` call that finds it
  late (``now − ref`` only grows while it waits), from a per-target heap of refs (the late are a prefix).
- **Violators** (``violators``): per SLO value, refs sorted; ``now − ref > slo`` holds on a prefix.
- **Summed pending time** (``pending_sum_below``): ``|W|·now − Σ ref`` kept exactly (fixed point); the
  float sum the decision uses differs from it by at most ``(|W| + 2)·2⁻⁵³`` relative, so only a
  comparison inside that margin sums the pending times one by one, in queue order, as before.
- **Queue order**: a position key per request (preempted requests at the front get decreasing keys,
  arrivals increasing ones). The FCFS ablation reads the queue from its front every batch, so with
  ``ordered`` the keys also live in a ``SortedKeys`` (a plain sorted list moved its whole tail on every
  preemption: ~9 µs per preempted request with 17,000 waiting, 2.8 µs in ``SortedKeys``). The greedy
  variants never read the queue in order (ties compare positions; only the rare exact pending-time sum
  walks it, and then sorts the positions), and filing every preempted request in and out of that index
  was a tenth of the hybrid variant's batch on azure-conv: they pass ``ordered=False``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Callable, Iterable, Iterator

import numpy as np

from ..replay import RequestState
from .sorted_keys import SortedKeys

NUMPY_HEADS = 64  # more buckets than this: their heads' bounds are computed with numpy
BOUND_SLACK = 1e-9  # relative: covers the rounding of the exact densities against their bound
_FIXED_BITS = 1100  # every finite double is an integer multiple of 2^-1074: times are summed exactly as ints
_FIXED_ONE = 1 << _FIXED_BITS
_last_fixed: tuple[float, int] = (math.nan, 0)  # the last (x, fixed(x)), rebound whole: a plan asks for its clock's twice


def fixed(x: float) -> int:
    """``x · 2^_FIXED_BITS`` exactly."""
    global _last_fixed
    last = _last_fixed
    if x == last[0]:
        return last[1]
    num, den = x.as_integer_ratio()
    out = num << (_FIXED_BITS - den.bit_length() + 1)
    _last_fixed = (x, out)
    return out


def ref_s(s: RequestState) -> float:
    """The time a request's pending time counts from: arrival before its first token, else its last token."""
    return s.req.arrival_s if s.last_token_s is None else s.last_token_s


def slo_s(s: RequestState) -> float | None:
    """The target its pending time is compared with: TTFT before the first token, else TBT."""
    return s.req.ttft_slo_s if s.last_token_s is None else s.req.tbt_slo_s


class WaitingQueue:
    """The waiting requests in queue order, with the indexes described in the module docstring.

    ``sizes(tokens)``: the KV and hidden-form memory of a ``tokens``-token prefill (default: block size 1), kept
    per bucket beside its head so that the bounds of every head are a few array operations (``heads_array``)."""

    def __init__(self, sizes: Callable[[int], tuple[int, int]] | None = None, ordered: bool = True) -> None:
        self._sizes = sizes or (lambda tokens: (tokens, -(-tokens // 2)))
        self._states: dict[int, RequestState] = {}
        self._entry: dict[int, tuple] = {}  # id -> (pos, ref, bucket low, slo, tokens, fixed(ref))
        # (pos, id), kept only when ``ordered``: preempted requests join at the front of thousands
        self._order: SortedKeys | None = SortedKeys() if ordered else None
        self._last_fixed: tuple[float, int] = (math.nan, 0)  # (ref, fixed(ref)) of the last request filed
        self._front = 0  # next front position is _front - 1
        self._back = 0
        self._buckets: dict[int, list[tuple[float, int, int, int]]] = {}  # tokens -> sorted (ref, pos, id, tokens)
        # The buckets' heads, compact for numpy: slot i holds bucket _head_tokens[i] with oldest ref _head_refs[i]
        self._slot: dict[int, int] = {}  # tokens -> slot
        self._head_tokens = np.zeros(64, dtype=np.int64)
        self._head_refs = np.zeros(64)
        self._head_kv = np.zeros(64)  # sizes(_head_tokens[i]), as floats
        self._head_hidden = np.zeros(64)
        self._head_demoted = np.zeros(64, dtype=bool)  # slot i is a bucket of demoted requests (key ~tokens)
        self._demoted_slots = 0  # how many slots hold demoted buckets (none: the bounds skip the demoted column)
        self._kv_heap: list[tuple[float, int]] = []  # (−KV size, key) of the open slots, stale ones popped when read
        self._slo_refs: dict[float, list[float]] = {}
        self._undemoted: dict[float, list[tuple[float, int, int]]] = {}  # target -> heap of (ref, pos, id), lazy
        self._demoted_at = -np.inf  # the latest ``now`` at which the late requests were moved to demoted buckets
        self._ref_sum = 0  # Σ ref, fixed point (fixed)
        # Prefill sizes (tokens) of the open buckets, a min-heap read lazily (`least_prefill_tokens`), each size once
        self._size_heap: list[int] = []
        self._in_size_heap: set[int] = set()

    def __len__(self) -> int:
        return len(self._entry)

    def __bool__(self) -> bool:
        return len(self._entry) > 0

    def __iter__(self) -> Iterator[RequestState]:
        """Queue order."""
        states = self._states
        if self._order is not None:  # (one generator, not two: the FCFS ablation reads it every batch)
            return (states[rid] for _, rid in self._order)
        return (states[rid] for rid in self._ids_in_order())

    def _ids_in_order(self) -> Iterator[int]:
        """The waiting ids in queue order: read from the order index, or (not ``ordered``) sorted by position."""
        if self._order is not None:
            return (rid for _, rid in self._order)
        entry = self._entry
        return iter(sorted(entry, key=lambda rid: entry[rid][0]))

    def position(self, rid: int) -> int:
        return self._entry[rid][0]

    def append(self, s: RequestState) -> None:
        """At the back (an arrival)."""
        self._file((s,), self._back, 1)
        self._back += 1

    def extendleft_in_order(self, states: list[RequestState]) -> None:
        """At the front, keeping the order of ``states`` (preempted requests): the last first, at the next front
        position, and so on."""
        self._file(reversed(states), self._front - 1, -1)
        self._front -= len(states)

    def _file(self, states: Iterable[RequestState], pos: int, step: int) -> None:
        """Enter ``states`` at positions ``pos``, ``pos + step``, …: their entries, the order index (if kept), the
        SLO refs and heaps (demoted at the next `items`) and Σ ref, each in that order; then each size's bucket once
        (one decode iteration of the hybrid variant preempts hundreds at once on azure-conv), which leaves the
        buckets, their slots (opened in the order of their sizes' first request) and heads as filing the requests
        one by one would (a test compares them)."""
        entry, known, order = self._entry, self._states, self._order
        refs_by_slo, undemoted = self._slo_refs, self._undemoted
        last_ref, exact = self._last_fixed  # the requests one batch preempts share their last token's time
        groups: dict[int, list[tuple]] = {}
        ref_sum = 0
        for s in states:
            rid, low, slo, ref = s.id, s.input_tokens, slo_s(s), ref_s(s)
            if ref != last_ref:
                last_ref, exact = ref, fixed(ref)
            known[rid] = s
            entry[rid] = (pos, ref, low, slo, low, exact)
            if order is not None:
                order.add((pos, rid))
            item = (ref, pos, rid, low)
            group = groups.get(low)
            if group is None:
                groups[low] = [item]
            else:
                group.append(item)
            if slo is not None:
                bisect.insort(refs_by_slo.setdefault(slo, []), ref)
                heapq.heappush(undemoted.setdefault(slo, []), (ref, pos, rid))
            ref_sum += exact
            pos += step
        self._last_fixed = (last_ref, exact)
        self._ref_sum += ref_sum
        for low, items in groups.items():
            bucket = self._buckets.get(low)
            if bucket is None:
                items.sort()
                self._buckets[low] = items
                self._open_slot(low)
                self._head_refs[self._slot[low]] = items[0][0]
                continue
            head = bucket[0]
            if len(items) == 1:
                bisect.insort(bucket, items[0])
            else:
                bucket.extend(items)
                bucket.sort()
            if bucket[0] is not head:
                self._head_refs[self._slot[low]] = bucket[0][0]

    def remove(self, rid: int) -> RequestState:
        pos, ref, key, slo, tokens, exact = self._entry.pop(rid)
        if self._order is not None:
            self._order.remove((pos, rid))
        self._bucket_remove(key, (ref, pos, rid, tokens))
        if slo is not None:  # its entry in the heap of undemoted requests, if any, is dropped when met
            refs = self._slo_refs[slo]
            _delete(refs, ref)
            if not refs:
                del self._slo_refs[slo]
        self._ref_sum -= exact
        return self._states.pop(rid)

    def _bucket_add(self, key: int, item: tuple) -> None:
        """File ``item`` (ref, pos, id, tokens) in bucket ``key`` (tokens, or ~tokens: demoted)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = []
            self._open_slot(key)
        bisect.insort(bucket, item)
        if bucket[0] is item:
            self._head_refs[self._slot[key]] = item[0]

    def _bucket_remove(self, key: int, item: tuple) -> None:
        bucket = self._buckets[key]
        _delete(bucket, item)
        if not bucket:
            del self._buckets[key]
            self._close_slot(key)
        else:
            self._head_refs[self._slot[key]] = bucket[0][0]

    def _demote(self, now_s: float) -> None:
        """Move the requests late at ``now_s`` (``now − ref > slo``, the greedy's own test) to their size's demoted
        bucket. Within a target the late are a prefix of the refs, so each heap is read from its top; an entry whose
        request has left (or left and come back: another position) is dropped. If time went back (direct calls),
        every demotion is undone first."""
        if now_s < self._demoted_at:
            for rid, (pos, ref, key, slo, tokens, exact) in list(self._entry.items()):
                if key < 0:
                    self._move(rid, ~key)
            self._undemoted = {}
            for rid, (pos, ref, key, slo, tokens, exact) in self._entry.items():
                if slo is not None:
                    heapq.heappush(self._undemoted.setdefault(slo, []), (ref, pos, rid))
        self._demoted_at = now_s
        entry = self._entry
        for slo, heap in self._undemoted.items():
            while heap and now_s - heap[0][0] > slo:
                _, pos, rid = heapq.heappop(heap)
                e = entry.get(rid)
                if e is not None and e[0] == pos and e[2] >= 0:
                    self._move(rid, ~e[2])

    def _move(self, rid: int, key: int) -> None:
        pos, ref, old, slo, tokens, exact = self._entry[rid]
        item = (ref, pos, rid, tokens)
        self._bucket_remove(old, item)
        self._entry[rid] = (pos, ref, key, slo, tokens, exact)
        self._bucket_add(key, item)

    def _open_slot(self, key: int) -> None:
        tokens = key if key >= 0 else ~key
        if tokens not in self._in_size_heap:
            self._in_size_heap.add(tokens)
            heapq.heappush(self._size_heap, tokens)
        i = len(self._slot)
        if i == len(self._head_tokens):
            self._head_tokens = np.concatenate([self._head_tokens, np.zeros(i, dtype=np.int64)])
            self._head_demoted = np.concatenate([self._head_demoted, np.zeros(i, dtype=bool)])
            self._head_refs, self._head_kv, self._head_hidden = (
                np.concatenate([a, np.zeros(i)]) for a in (self._head_refs, self._head_kv, self._head_hidden))
        self._slot[key] = i
        self._head_tokens[i], self._head_demoted[i] = key, key < 0
        self._head_kv[i], self._head_hidden[i] = self._sizes(key if key >= 0 else ~key)
        self._demoted_slots += key < 0
        heap = self._kv_heap
        heapq.heappush(heap, (-float(self._head_kv[i]), key))
        if len(heap) > 2 * len(self._slot) + 64:  # stale entries of closed slots: keep one entry per open slot
            heap[:] = [(-float(self._head_kv[j]), k) for k, j in self._slot.items()]
            heapq.heapify(heap)

    def _close_slot(self, key: int) -> None:
        """The last slot moves into the emptied one."""
        i, last = self._slot.pop(key), len(self._slot)
        self._demoted_slots -= key < 0
        if i != last:
            moved = int(self._head_tokens[last])
            self._slot[moved] = i
            self._head_tokens[i], self._head_refs[i] = moved, self._head_refs[last]
            self._head_kv[i], self._head_hidden[i] = self._head_kv[last], self._head_hidden[last]
            self._head_demoted[i] = self._head_demoted[last]

    def _largest_kv(self) -> float:
        """The largest KV size of an open slot's bucket: the heap's top once closed slots' entries are popped (a key
        closed and opened again is pushed again, with the same sizes; `_open_slot` keeps the heap below twice the
        open slots plus 64 entries)."""
        heap, slot = self._kv_heap, self._slot
        while heap[0][1] not in slot:
            heapq.heappop(heap)
        return -heap[0][0]

    # -- the aggregates -----------------------------------------------------------------------------
    def least_prefill_tokens(self) -> int | None:
        """The fewest prefill tokens any waiting request has (None when none waits): the heap's top once every size
        whose buckets (plain and demoted) have both closed is dropped from it."""
        heap, buckets = self._size_heap, self._buckets
        while heap and heap[0] not in buckets and ~heap[0] not in buckets:
            self._in_size_heap.discard(heapq.heappop(heap))
        return heap[0] if heap else None

    def violators(self, now_s: float) -> int:
        """How many waiting requests have ``now − ref > slo`` (the per-gap test of ``violates``)."""
        count = 0
        for slo, refs in self._slo_refs.items():
            lo, hi = 0, len(refs)
            while lo < hi:  # now − ref (rounded) does not grow with ref: the violators are a prefix
                mid = (lo + hi) // 2
                if now_s - refs[mid] > slo:
                    lo = mid + 1
                else:
                    hi = mid
            count += lo
        return count

    def pending_bounds(self, now_s: float) -> tuple[float, float]:
        """``Σ (now − ref)`` over the queue (rounded once) and a margin that holds the float sum a loop
        computes (module function ``pending_bounds``)."""
        return pending_bounds(len(self._entry), now_s, self._ref_sum)

    def pending_sum_below(self, total_s: float, now_s: float) -> bool:
        """``total_s > sum(now − ref over the queue, in queue order)``, the float sum as a loop computes it."""
        exact, margin = self.pending_bounds(now_s)
        if total_s > exact + margin:
            return True
        if total_s < exact - margin:
            return False
        entry = self._entry
        return total_s > sum(now_s - entry[rid][1] for rid in self._ids_in_order())

    # -- density order ------------------------------------------------------------------------------
    def items(self, now_s: float, bound, expand: Callable[[RequestState, float], list[tuple]]) -> Iterator[tuple]:
        """The greedy's items ``(−θ, position, rank, size, step, candidate)`` in ascending order.

        ``bound(key, p)``: an upper bound on the density of any item of a request of bucket ``key`` (its
        prefill tokens, or ``~tokens`` when it is demoted: late for its target) waiting ``p`` (nondecreasing in
        ``p``; never None for a bucket ``heads_array`` offers), and ``bound.heads_array(kv, hidden, refs, now,
        demoted)`` the same for every bucket's head at once, from the heads' ``sizes`` and demoted flags (an array,
        −inf where the request has no item, e.g. no option fits; used above ``NUMPY_HEADS`` buckets);
        ``expand(state, p)``: the request's items ``(θ, size, step, candidate)`` in rank order.
        """
        self._demote(now_s)
        buckets, states = self._buckets, self._states
        n = len(self._slot)
        if n > NUMPY_HEADS:
            bounds = bound.heads_array(self._head_kv[:n], self._head_hidden[:n], self._head_refs[:n], now_s,
                                       self._head_demoted[:n] if self._demoted_slots else None, self._largest_kv())
            heads = _descending(bounds, self._head_tokens[:n])
        else:  # a few buckets: numpy's per-call cost would exceed the loop's
            found = [(-b, low) for low, bucket in buckets.items() for b in (bound(low, now_s - bucket[0][0]),)
                     if b is not None]
            found.sort()
            heads = iter(found)
        # (−bound, tokens, index in bucket, whether reading it brings in the next head); holds the next unread head
        sources: list[tuple] = []
        nxt = next(heads, None)
        if nxt is not None:
            sources.append((nxt[0], nxt[1], 0, True))
        ready: list[tuple] = []
        while True:
            deferred = []  # sources whose items all follow the ready head (`_twins_follow`)
            while sources and (not ready or sources[0][0] <= ready[0][0]):
                neg_bound, low, i, head = heapq.heappop(sources)
                if head:  # every later head's bound is no larger than this one's
                    nxt = next(heads, None)
                    if nxt is not None:
                        heapq.heappush(sources, (nxt[0], nxt[1], 0, True))
                bucket = buckets[low]
                if ready and not ready[0][2] and self._twins_follow(ready[0], bucket, low, i, bound, now_s):
                    deferred.append((neg_bound, low, i, False))
                    continue
                ref, pos, rid, _ = bucket[i]
                for rank, (theta, size, step, cand) in enumerate(expand(states[rid], now_s - ref)):
                    heapq.heappush(ready, (-theta, pos, rank, size, step, cand))
                if i + 1 < len(bucket):
                    b = bound(low, now_s - bucket[i + 1][0])
                    if b is not None:  # (None: no item, and none for the entries after it, pending no longer)
                        heapq.heappush(sources, (-b, low, i + 1, False))
            for source in deferred:
                heapq.heappush(sources, source)
            if not ready:
                return
            yield heapq.heappop(ready)

    def _twins_follow(self, head: tuple, bucket: list, key: int, i: int, bound, now_s: float) -> bool:
        """Whether every item of ``bucket[i:]`` (unexpanded) sorts after ``head``, the first item of a request filed
        in the same bucket ``key`` with the same ref. Such a request is its twin: the same prefill size and pending
        time give the same candidate, so its items' densities equal the head request's, the first equal to the
        head's, and the bucket's (ref, position) order puts it after the head in queue order (ties in density go
        by queue order); so do the later entries with that ref. The first entry with a later ref has the least
        bound among the rest (p = now − ref falls along the bucket): below the head's density, none of them ties.
        Without this, a queue of identical requests (an offline grid point: one size, one arrival) expanded every
        waiting request on every batch to emit the one the greedy takes (`--I 16 --O 600 --B 1000 --Rmax 1`,
        aptserve-kv: one request expanded per batch instead of 999)."""
        entry = self._entry[head[5].key]
        ref, pos = bucket[i][0], bucket[i][1]
        if entry[2] != key or entry[1] != ref or pos < head[1]:
            return False
        k = bisect.bisect_right(bucket, (ref, math.inf))
        if k == len(bucket):
            return True
        b = bound(key, now_s - bucket[k][0])
        return b is None or -b > head[0]


def pending_bounds(count: int, now_s: float, ref_sum: int) -> tuple[float, float]:
    """``count·now − ref_sum`` (``ref_sum`` fixed point, ``fixed``) as a float and a margin: a float loop
    summing ``now − ref`` (each ≥ 0) differs from it by at most ``(count + 4)·2⁻⁵²`` relative."""
    exact = (count * fixed(now_s) - ref_sum) / _FIXED_ONE  # int / int rounds correctly
    return exact, (count + 4) * 2.0 ** -52 * abs(exact)


def _descending(bounds: np.ndarray, tokens: np.ndarray, first: int = 32,
                lazy: int = 16) -> Iterator[tuple[float, int]]:
    """``(−bound, tokens)`` of the entries with a finite bound, by descending bound: the first ``lazy`` one by
    one (``argmax``, the entry then set to −inf in ``bounds``, which is overwritten), then the rest sorted a
    chunk at a time (``first`` entries, then four times as many, ...). A batch reads 3-5 heads on average on
    long-prompt and azure-code, 10 on azure-conv's first 3,000 requests, and a partition of a thousand bounds
    (~15 µs) costs about as much as a dozen argmax reads (single runs with 4 lazy reads were slower on
    azure-conv, with 20 no faster than with 16)."""
    argmax, bound_at, token_at = bounds.argmax, bounds.item, tokens.item  # (Python floats and ints)
    for _ in range(min(lazy, len(bounds))):
        i = argmax()
        b = bound_at(i)
        if b == -math.inf:
            return
        yield -b, token_at(i)
        bounds[i] = -math.inf
    keep = np.flatnonzero(bounds > -np.inf)
    neg, toks = -bounds[keep], tokens[keep]
    k = first
    while len(neg):
        if len(neg) > k:
            part = np.argpartition(neg, k)
            top, rest = part[:k], part[k:]
        else:
            top, rest = np.arange(len(neg)), None
        top = top[np.argsort(neg[top], kind="stable")]
        yield from zip(neg[top].tolist(), toks[top].tolist())
        if rest is None:
            return
        neg, toks, k = neg[rest], toks[rest], 4 * k


def _delete(sorted_list: list, key) -> None:
    i = bisect.bisect_left(sorted_list, key)
    if i == len(sorted_list) or sorted_list[i] != key:
        raise KeyError(key)
    del sorted_list[i]
