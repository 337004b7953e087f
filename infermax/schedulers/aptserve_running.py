"""Apt-Serve's decode greedy over the running requests, one numpy expression per step instead of a loop.

A decode iteration reads every running request (the paper's greedy does: each one's value depends on
its own pending time and size), so its cost is ``O(|R|)`` whatever is done; what this module removes
is the per-request Python work (a ``Candidate`` built, its items expanded, sorted as tuples, an
``admit`` call each), ~2.4 µs per running request per batch, which made a decode batch of a few hundred
running requests cost ~0.7 ms on the azure-conv trace.

Exactness: every quantity is computed with the same IEEE operations, in the same order, as
``AptServeScheduler._candidate``, ``marginal_items``, ``feasible_items`` and ``greedy_take`` (numpy's
elementwise ``+ − × ÷`` on float64 round exactly as Python's floats; integers stay below 2^53); the
items are ordered by ``(−θ, candidate order, rank)`` with a stable lexicographic sort, as the tuple
sort does; the greedy's running value is the sequential float sum (``np.add.accumulate`` adds left to
right, as ``value += x`` does). ``tests/test_aptserve_running.py`` checks it against ``greedy_select``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .aptserve_waiting import ref_s

NUMPY_RUNNING = 24  # fewer running requests than this: the plain loop is cheaper than numpy's per-call cost
FEW_ROWS = 8  # ids looked up one at a time (`RunningColumns.rows`), rows deleted in place from lists, up to this many
SHIFT_ROWS = 2  # rows deleted from the columns by slice shifts up to this many, beyond by one gather

KV, HIDDEN, UPGRADE = 0, 1, 2


class CandidateArrays(NamedTuple):
    """``Candidate`` fields for many requests, in candidate order; ``has_hidden`` False = not offered."""

    keys: np.ndarray  # int64
    kv_value: np.ndarray  # float64
    kv_size: np.ndarray  # int64
    hidden_value: np.ndarray  # float64 (any value where not offered)
    hidden_size: np.ndarray  # int64
    has_hidden: np.ndarray  # bool


def feasible_items(c: CandidateArrays, capacity: int) -> tuple[np.ndarray, ...]:
    """``feasible_items`` for every candidate: ``(θ, size, step, candidate index, rank)`` per item, items of
    one candidate adjacent and in rank order. Without any hidden option (the KV-only variants, or every request
    demoted) each candidate whose KV fits has one KV item and nothing else is computed: the general expressions
    give the same arrays then (no hidden step, no upgrade), at about a sixth of the cost for a few hundred."""
    kv_v, kv_s, hv, hs, has = c.kv_value, c.kv_size, c.hidden_value, c.hidden_size, c.has_hidden
    if not has.any():
        idx = np.flatnonzero(kv_s <= capacity)
        with np.errstate(divide="ignore", invalid="ignore"):
            theta = kv_v[idx] / kv_s[idx]
        zeros = np.zeros(len(idx), dtype=np.int64)
        return theta, kv_s[idx], zeros + KV, idx, zeros
    kv_fits = kv_s <= capacity
    with np.errstate(divide="ignore", invalid="ignore"):
        kv_density = kv_v / kv_s
        hid_density = hv / hs
        # marginal_items: the hidden step and the upgrade, when the hidden option is smaller, worth no more
        # than KV, at least as dense, and the upgrade (rounded) no denser than the hidden step
        two = has & (0 < hs) & (hs < kv_s) & (0 <= hv) & (hv <= kv_v) & (hid_density >= kv_density)
        upgrade = (kv_v - hv) / (kv_s - hs)
        two &= upgrade <= hid_density
    two &= kv_fits
    # KV too big: the hidden step alone when it is offered, fits and is worth >= 0
    alone = ~kv_fits & has & (0 < hs) & (hs <= capacity) & (hv >= 0)
    first = kv_fits | alone
    idx = np.flatnonzero(first)
    hidden_first = (two | alone)[idx]
    theta0 = np.where(hidden_first, hid_density[idx], kv_density[idx])
    size0 = np.where(hidden_first, hs[idx], kv_s[idx])
    step0 = np.where(hidden_first, HIDDEN, KV)
    up = np.flatnonzero(two)
    theta = np.concatenate([theta0, upgrade[up]])
    size = np.concatenate([size0, (kv_s - hs)[up]])
    step = np.concatenate([step0, np.full(len(up), UPGRADE)])
    cand = np.concatenate([idx, up])
    rank = np.concatenate([np.zeros(len(idx), dtype=np.int64), np.ones(len(up), dtype=np.int64)])
    return theta, size, step, cand, rank


class RunningArrays(NamedTuple):
    """The running requests' ids, cached tokens ``m``, the time their pending time counts from and cache
    form, in running order: one read of each state per batch, shared by every use in that batch."""

    states: list
    ids: np.ndarray  # int64
    m: np.ndarray  # int64
    ref: np.ndarray  # float64
    hidden: np.ndarray  # bool

    @classmethod
    def of(cls, states: list) -> "RunningArrays":
        count = len(states)
        return cls(states, np.fromiter([s.id for s in states], np.int64, count),
                   np.fromiter([s.m for s in states], np.int64, count),
                   np.fromiter([ref_s(s) for s in states], np.float64, count),
                   np.fromiter([s.hidden for s in states], bool, count))


class RunningColumns:
    """`RunningArrays`' columns kept up to date batch by batch instead of read from every running request's
    state each time: after a decode iteration every running request that is still running decoded one token
    (``decoded``), after a prefill iteration the admitted requests join at the end (``append``), and
    preempted or finished ones leave (``keep``), in the running list's order. A decode iteration leaves every
    running request's last token at its end, which is the engine's clock at the next plan, so those
    reference times are filled in at that plan (``clock``).

    Why: the paper's decode greedy reads every running request each iteration; reading them from their
    states (``RunningArrays.of``) is a Python pass over hundreds of requests, and it needs every state to be
    current, which keeps the engine's lazy decode cohort off. The columns need neither."""

    __slots__ = ("_ids", "_m", "_ref", "_hidden", "_n", "_at_clock")

    def __init__(self, capacity: int = 64):
        self._ids = np.empty(capacity, np.int64)
        self._m = np.empty(capacity, np.int64)
        self._ref = np.empty(capacity, np.float64)
        self._hidden = np.empty(capacity, bool)
        self._n = 0
        self._at_clock = 0  # the first rows whose reference time is the next plan's clock

    def __len__(self) -> int:
        return self._n

    def rows(self, ids: set[int]) -> list[int]:
        """The rows whose id is in ``ids``, ascending (a comparison per id: usually one or two, where ``np.isin``'s
        set-up costs more)."""
        if not self._n:
            return []
        column = self._ids[:self._n]
        if len(ids) > FEW_ROWS:
            return np.flatnonzero(np.isin(column, np.fromiter(ids, np.int64, len(ids)))).tolist()
        found = []
        for rid in ids:  # (ids are unique in the column: its first match is its only one)
            equal = column == rid
            i = int(equal.argmax())
            if equal[i]:
                found.append(i)
        found.sort()
        return found

    def delete(self, rows: list[int]) -> None:
        """Remove ``rows`` (ascending), the others keeping their order: one or two rows by shifting the stretches
        between them down (slice copies: 4.8 µs for one row of 400, against 10.4 µs for a gather, min of five timeit
        runs; about even at three), more by one gather."""
        if not rows:
            return
        n, k = self._n, len(rows)
        columns = (self._ids, self._m, self._ref, self._hidden)
        if k > SHIFT_ROWS:
            keep = np.ones(n, bool)
            keep[rows] = False
            idx = np.flatnonzero(keep)
            for col in columns:
                col[:n - k] = col[idx]
        else:
            ends = [*rows[1:], n]
            for col in columns:
                to = rows[0]
                for row, end in zip(rows, ends):
                    col[to:to + end - row - 1] = col[row + 1:end]
                    to += end - row - 1
        self._n = n - k

    def decoded(self, tokens: int = 1) -> None:
        """Every row decoded ``tokens`` tokens, the last at the next plan's clock."""
        self._m[:self._n] += tokens
        self._at_clock = self._n

    def append(self, states: list) -> None:
        """Rows for ``states`` (current: their cached tokens, last token and cache form), at the end."""
        n, k = self._n, len(states)
        if n + k > len(self._ids):
            size = max(2 * len(self._ids), n + k)
            for name in ("_ids", "_m", "_ref", "_hidden"):
                col = getattr(self, name)
                grown = np.empty(size, col.dtype)
                grown[:n] = col[:n]
                setattr(self, name, grown)
        for i, s in enumerate(states, start=n):
            self._ids[i], self._m[i], self._hidden[i] = s.id, s.m, s.hidden
            self._ref[i] = ref_s(s)
        self._n = n + k

    def clock(self, now_s: float) -> None:
        """At the start of a plan: the rows that decoded in the last batch have their last token at ``now_s``."""
        if self._at_clock:
            self._ref[:self._at_clock] = now_s
            self._at_clock = 0

    def view(self, states: list) -> RunningArrays:
        """The columns as `RunningArrays` of ``states`` (the running list, same order), read-only views valid
        until the next update."""
        n = self._n
        return RunningArrays(states, self._ids[:n], self._m[:n], self._ref[:n], self._hidden[:n])


def blocks(tokens: np.ndarray, block: int) -> np.ndarray:
    """``Limits.blocks`` elementwise."""
    return tokens if block == 1 else -(-tokens // block) * block


def cache_sizes(m: np.ndarray, hidden: np.ndarray | None, block: int) -> np.ndarray:
    """``cache_tokens(limits, m, hidden)`` elementwise (``hidden`` None: every one in hidden form). With block size 1
    the hidden size ``⌈m/2⌉`` is ``(m + 1) >> 1`` (integer ``m >= 0``): two numpy calls instead of four floor
    divisions and negations (5.7 against 2.6 µs for 400 requests, `timeit`)."""
    if block == 1:
        half = (m + 1) >> 1
        return half if hidden is None else np.where(hidden, half, m)
    kv_blocks = -(-m // block)
    if hidden is None:
        return block * -(-kv_blocks // 2)
    return np.where(hidden, block * -(-kv_blocks // 2), kv_blocks * block)


def greedy_masks(c: CandidateArrays, capacity: int, token_cap: int,
                 double_check: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """``greedy_select(candidates, capacity, admit, double_check)`` where ``admit`` allows at most
    ``token_cap`` requests (a decode's one token each): per candidate, selected and selected in hidden
    form (both boolean arrays), and the memory the selection uses."""
    count = len(c.keys)
    tail = _least_dense_dropped(c, capacity, token_cap, double_check)
    if tail is not None:
        return tail
    theta, size, step, cand, rank = feasible_items(c, capacity)
    if rank.any():
        order = np.lexsort((rank, cand, -theta + 0.0))  # (−θ, candidate order, rank), −0.0 as 0.0
    else:  # no upgrade: one item per candidate, in candidate order, so a stable sort by −θ is the same order
        order = np.argsort(-theta + 0.0, kind="stable")
    size, step, cand = size[order], step[order], cand[order]
    used = np.cumsum(size)
    cut = int(np.searchsorted(used, capacity, side="right"))  # first item that does not fit
    refused = len(size)  # the item whose request is the (token_cap + 1)-th: admit says no
    if token_cap < len(size):
        hit = int(np.searchsorted(np.cumsum(step != UPGRADE), token_cap + 1, side="left"))
        if hit < len(size):
            refused = hit
    stop = min(cut, refused)
    taken_cand, taken_step = cand[:stop], step[:stop]
    if double_check and cut <= refused and cut < len(size) and token_cap >= 1:  # blocked (size before admit)
        b = int(cand[cut])
        single = None
        if c.kv_size[b] <= capacity:
            single = (False, float(c.kv_value[b]), int(c.kv_size[b]))
        elif c.has_hidden[b] and 0 < c.hidden_size[b] <= capacity:
            single = (True, float(c.hidden_value[b]), int(c.hidden_size[b]))
        if single is not None:
            gain = np.where(taken_step == KV, c.kv_value[taken_cand],
                            np.where(taken_step == HIDDEN, c.hidden_value[taken_cand],
                                     c.kv_value[taken_cand] - c.hidden_value[taken_cand]))
            value = float(np.add.accumulate(gain)[-1]) if stop else 0.0  # value += gain, in order
            if single[1] > value:
                selected, as_hidden = np.zeros(count, bool), np.zeros(count, bool)
                selected[b], as_hidden[b] = True, single[0]
                return selected, as_hidden, single[2]
    selected, as_hidden = np.zeros(count, bool), np.zeros(count, bool)
    selected[taken_cand] = True
    as_hidden[taken_cand[taken_step == HIDDEN]] = True
    as_hidden[taken_cand[taken_step == UPGRADE]] = False  # the upgrade follows its hidden step
    return selected, as_hidden, int(used[stop - 1]) if stop else 0


def _least_dense_dropped(c: CandidateArrays, capacity: int, token_cap: int,
                         double_check: bool) -> tuple[np.ndarray, np.ndarray, int] | None:
    """`greedy_masks` from the least dense end (`least_dense_suffix`) where its conditions hold: no hidden option,
    values >= 0, every request fitting alone, the token budget taking them all, and more than ``capacity`` together.
    None where they do not, or where the suffix cannot decide: the full sort then does.

    Why: aptserve-kv's decode iterations that evict (a quarter of them on azure-conv) drop one or two of ~400
    running requests; sorting all of them was most of the decode greedy's time."""
    kv_v, kv_s = c.kv_value, c.kv_size
    count = len(kv_s)
    if count == 0 or count > token_cap or c.has_hidden.any():
        return None
    total = int(kv_s.sum())
    if total <= capacity or int(kv_s.max()) > capacity or int(kv_s.min()) < 1 or float(kv_v.min()) < 0:
        return None
    drop = least_dense_suffix(kv_v / kv_s, kv_v, kv_s, total, capacity, double_check, TAIL)
    if drop is None:
        return None
    selected = np.zeros(count, bool)
    if drop.single is not None:
        selected[drop.single] = True
    else:
        selected[:] = True
        selected[drop.rows] = False
    return selected, np.zeros(count, bool), drop.used


def pending_tail_drop(m: np.ndarray, ref: np.ndarray, now_s: float, capacity: int, block: int,
                      double_check: bool, tail: int | None = None) -> tuple[list[int], int] | None:
    """`greedy_masks` for the adaptive KV-only greedy without SLO targets, from the running requests' columns: every
    candidate's value is its pending time ``now − ref`` and its size ``blocks(m + 1)``, with no hidden option and no
    demotion (`least_dense_suffix` decides it). Returns the rows the greedy drops, ascending (``[]``: everybody fits
    ``capacity``; every row but one where that single request beats the greedy set), with the memory the kept rows
    then hold (Σ their sizes); or None where `greedy_masks` must decide: a request too big to fit alone, a negative
    value, or a suffix that cannot decide.

    Why: a decode iteration that preempts (a quarter of aptserve-kv's on azure-conv) built every candidate's arrays
    for `greedy_masks` in about forty numpy calls; this takes about fifteen."""
    size = blocks(m + 1, block)
    count = len(size)
    total = int(size.sum())
    if total <= capacity:
        return [], total
    if count == 0 or int(size.max()) > capacity:
        return None
    p = now_s - ref
    if float(p.min()) < 0:
        return None
    # feasible_items' density: the value (1.0 · p, which is p) over the KV size
    drop = least_dense_suffix(p / size, p, size, total, capacity, double_check, TAIL if tail is None else tail)
    if drop is None:
        return None
    if drop.single is not None:
        return [row for row in range(count) if row != drop.single], drop.used
    return drop.rows, drop.used


class SuffixDrop(NamedTuple):
    """What `least_dense_suffix` decided: the rows dropped (ascending) and the memory the kept ones use; or, where
    the best single request beats the greedy set, that request's row (``single``; every other row is dropped)."""

    rows: list[int]
    used: int
    single: int | None = None


# `least_dense_suffix` first orders only the TAIL least dense rows.
TAIL = 16
SORT_IN_PYTHON = 64  # rows up to this many are ordered with Python's sort, more with numpy's


def least_dense_suffix(theta: np.ndarray, value: np.ndarray, size: np.ndarray, total: int, capacity: int,
                       double_check: bool, tail: int = TAIL) -> SuffixDrop | None:
    """The greedy's decision over one KV item per row (density ``theta = value / size``, values >= 0, each size in
    1..``capacity``, ``total`` = Σ size > ``capacity``, a token budget that takes every row), found from the least
    dense end; None where that end cannot decide it.

    The greedy takes the items in density order (descending; equal ones in row order) until the first that does not
    fit, so it drops a suffix of that order: the fewest least dense rows whose sizes reach the overflow ``total −
    capacity``. Only the ``tail`` least dense rows (one partition) are ordered, least dense first and, among equal
    ones, the later row first (the full order read backwards). When the overflow is reached inside them at a row
    strictly less dense than every row outside, the full order drops the same rows. When that row ties with the
    boundary, every row as dense as the boundary joins the tail and it is ordered again; when the tail is too short:
    None. The single-request check compares the blocked row's value with the kept rows' sum, taken as the whole sum
    less the dropped values; a margin of every summation order's rounding covers the difference from the greedy's own
    sum, and where the two are that close: None."""
    count = len(size)
    if count > tail:
        part = np.argpartition(theta, tail)
        rows, boundary = part[:tail], float(theta[part[tail]])  # every row outside `rows` is at least that dense
    else:
        rows, boundary = np.arange(count), math.inf
    cut = _cut(rows, theta, size, value, total - capacity)
    if cut is not None and not cut[3] < boundary:  # a tie with the boundary: every row as dense joins the tail
        cut = _cut(np.flatnonzero(theta <= boundary), theta, size, value, total - capacity)
    if cut is None or len(cut[0]) == count:  # the tail is too short; or nobody kept (a guard: every row fits alone)
        return None
    dropped, freed, value_sum, _, blocked_value, blocked_size = cut
    if double_check:
        whole = float(value.sum())
        kept = whole - value_sum
        margin = 2 * (count + 8) * 2.0 ** -52 * whole
        if blocked_value > kept + margin:  # the blocked row alone is worth more
            return SuffixDrop([], blocked_size, single=dropped[-1])
        if not blocked_value < kept - margin and whole > 0:  # a near tie: the greedy's own sum decides
            return None  # (every value 0: the sums are exact, 0 against 0, and the greedy keeps its set)
    return SuffixDrop(sorted(dropped), total - freed)


def _cut(rows: np.ndarray, theta: np.ndarray, size: np.ndarray, value: np.ndarray, need: int
         ) -> tuple[list[int], int, float, float, float, int] | None:
    """``rows`` ordered least dense first (equal ones: the later row first) and cut after the first whose sizes reach
    ``need``: (the rows cut, least dense first, so the last is the blocked one; their sizes' sum; their values' sum;
    the blocked row's density, value and size), or None when all of them do not reach it."""
    th, sz, vl, rl = theta[rows].tolist(), size[rows].tolist(), value[rows].tolist(), rows.tolist()
    if len(rl) <= SORT_IN_PYTHON:
        order = sorted(range(len(rl)), key=lambda k: (th[k], -rl[k]))
    else:
        order = np.lexsort((-rows, theta[rows])).tolist()
    freed = 0
    for last, k in enumerate(order):
        freed += sz[k]
        if freed >= need:
            cut = order[:last + 1]
            return [rl[j] for j in cut], freed, sum([vl[j] for j in cut]), th[k], vl[k], sz[k]
    return None


def greedy_forms(c: CandidateArrays, capacity: int, token_cap: int, double_check: bool) -> tuple[dict, int]:
    """``greedy_masks`` as ``Selection.forms`` (``"kv"`` / ``"hidden"`` by key) and the memory used."""
    selected, as_hidden, used = greedy_masks(c, capacity, token_cap, double_check)
    forms = dict(zip(c.keys[selected].tolist(), np.where(as_hidden[selected], "hidden", "kv").tolist()))
    return forms, used


def fcfs_masks(kv_size: np.ndarray, hidden_size: np.ndarray, has_hidden: np.ndarray, capacity: int,
               token_cap: int) -> tuple[np.ndarray, np.ndarray]:
    """``fcfs_select`` over requests in order (KV if it fits, else hidden if offered and it fits; stop at
    the first that fits in neither, or at the (``token_cap`` + 1)-th): selected and selected in hidden
    form. The prefix that fits in KV is one cumulative sum; the rest is a loop over plain ints."""
    count = len(kv_size)
    selected, as_hidden = np.zeros(count, bool), np.zeros(count, bool)
    used_kv = np.cumsum(kv_size)
    k = min(int(np.searchsorted(used_kv, capacity, side="right")), token_cap, count)
    selected[:k] = True
    used = int(used_kv[k - 1]) if k else 0
    taken = k
    kv_tail, hid_tail, has_tail = kv_size[k:].tolist(), hidden_size[k:].tolist(), has_hidden[k:].tolist()
    for i, (kv, hid, has) in enumerate(zip(kv_tail, hid_tail, has_tail), start=k):
        if used + kv <= capacity:
            size = kv
        elif has and used + hid <= capacity:
            size = hid
            as_hidden[i] = True
        else:
            break
        if taken + 1 > token_cap:
            as_hidden[i] = False
            break
        selected[i] = True
        used += size
        taken += 1
    return selected, as_hidden
