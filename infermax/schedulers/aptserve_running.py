"""Apt-Serve's decode greedy over the running requests, one numpy expression per step instead of a loop.

A decode iteration reads every running request (the paper's greedy does: each one's value depends on
its own pending time and size), so its cost is ``O(|R|)`` whatever is done; what this module removes
is the per-request Python work (a ``Candidate`` built, its items expanded, sorted as tuples, an
``admit`` call each), ~2.4 µs per running request per batch, which made a decode batch of a few hundred
running requests cost ~0.7 ms on the azure-conv trace.

Exactness: every quantity is computed with the same IEEE operations, in the same order, as
``AptServeScheduler._candidate``, ``marginal_items``, ``_feasible_items`` and ``greedy_take`` (numpy's
elementwise ``+ − × ÷`` on float64 round exactly as Python's floats; integers stay below 2^53); the
items are ordered by ``(−θ, candidate order, rank)`` with a stable lexicographic sort, as the tuple
sort does; the greedy's running value is the sequential float sum (``np.add.accumulate`` adds left to
right, as ``value += x`` does). ``tests/test_aptserve_running.py`` checks it against ``greedy_select``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

NUMPY_RUNNING = 24  # fewer running requests than this: the plain loop is cheaper than numpy's per-call cost

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
    """``_feasible_items`` for every candidate: ``(θ, size, step, candidate index, rank)`` per item, items of
    one candidate adjacent and in rank order."""
    kv_v, kv_s, hv, hs, has = c.kv_value, c.kv_size, c.hidden_value, c.hidden_size, c.has_hidden
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


def greedy_forms(c: CandidateArrays, capacity: int, token_cap: int, double_check: bool) -> tuple[dict, int]:
    """``greedy_select(candidates, capacity, admit, double_check)`` where ``admit`` allows at most
    ``token_cap`` requests (a decode's one token each): the selected forms (``"kv"`` / ``"hidden"`` by key)
    and the memory they use."""
    theta, size, step, cand, rank = feasible_items(c, capacity)
    order = np.lexsort((rank, cand, -theta + 0.0))  # (−θ, candidate order, rank), −0.0 as 0.0
    size, step, cand = size[order], step[order], cand[order]
    used = np.cumsum(size)
    cut = int(np.searchsorted(used, capacity, side="right"))  # first item that does not fit
    starts = step != UPGRADE
    refused = len(size)  # the item whose request is the (token_cap + 1)-th: admit says no
    if token_cap < len(size):
        n_started = np.cumsum(starts)
        hit = int(np.searchsorted(n_started, token_cap + 1, side="left"))
        if hit < len(size):
            refused = hit
    stop = min(cut, refused)
    keys = c.keys
    taken_cand, taken_step = cand[:stop], step[:stop]
    forms = dict(zip(keys[taken_cand].tolist(), np.where(taken_step == HIDDEN, "hidden", "kv").tolist()))
    total = int(used[stop - 1]) if stop else 0
    if double_check and cut <= refused and cut < len(size) and token_cap >= 1:  # blocked (size before admit)
        b = int(cand[cut])
        single = None
        if c.kv_size[b] <= capacity:
            single = ("kv", float(c.kv_value[b]), int(c.kv_size[b]))
        elif c.has_hidden[b] and 0 < c.hidden_size[b] <= capacity:
            single = ("hidden", float(c.hidden_value[b]), int(c.hidden_size[b]))
        if single is not None:
            gain = np.where(taken_step == KV, c.kv_value[taken_cand],
                            np.where(taken_step == HIDDEN, c.hidden_value[taken_cand],
                                     c.kv_value[taken_cand] - c.hidden_value[taken_cand]))
            value = float(np.add.accumulate(gain)[-1]) if stop else 0.0
            if single[1] > value:
                return {int(keys[b]): single[0]}, single[2]
    return forms, total
