"""Queued completions: online arrivals through one unit-rate machine (docs/design.md, "Queued completions").

Every batch lasts at least its intercept plus the marginal costs of its items (`additive_split`), and the
intercept ``a`` of a non-empty batch can be shared among its items in proportion to what the batch can hold
at most: ``a >= a·Σ_items (λ_kv·kv/M + λ_tok·tokens/C + λ_item/Rmax)`` for any λ >= 0 summing to 1. So the
work attributed to the items of each request fits into the batches' durations, and request k's attributed
work ``p_k`` is processed inside [arrival_k, finish_k] on one machine of rate 1 (processor sharing within a
batch, preemption across batches). On such a machine the first i requests to finish all had their work done
by the i-th finish, so the i-th finish is at least the earliest time any i requests can be done, and SRPT
(shortest remaining processing time first) reaches that time for every i at once (Schrage 1968: SRPT
completes the most jobs by every time on one preemptive machine with release dates; the tests check it by
enumeration). `srpt_finish_times` computes those times; the caller combines them with its other per-rank
bounds. The attributed work ``p_k`` comes from per-request LPs; `fine_classes` rounds each request down to a
fine (I, O) grid (every per-request quantity used is monotone in I and O) so that few LPs are needed.
"""

from __future__ import annotations

from heapq import heappop, heappush

import numpy as np

# (λ_kv, λ_tok, λ_item): the ways of sharing a batch's intercept among its items that the bound tries (each
# gives a valid bound; the per-rank maximum is kept). λ_item is used only when Rmax caps a batch's items.
INTERCEPT_SHARES = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.5, 0.0), (0.5, 0.0, 0.5),
                    (0.0, 0.5, 0.5), (1 / 3, 1 / 3, 1 / 3))
# Relative step of the (I, O) grid requests are rounded down to (values below 1 / (ratio − 1) stay exact).
FINE_GRID_RATIO = 1 + 1 / 64
# Up to this many distinct (I, O) every request keeps its own (one LP each; the Azure slice's 1,778 take about as
# long as its 1/64 grid, and its mean-latency bound rises 11.88 -> 12.83 s, mean TTFT 0.1379 -> 0.1392 s).
EXACT_CLASSES_MAX = 4096


def srpt_finish_times(release_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """Ascending finish times of SRPT on one preemptive machine of rate 1: entry i − 1 is the earliest time by
    which any i of the jobs can all be done (jobs with zero work finish at their release)."""
    release_s = np.asarray(release_s, dtype=float)
    work_s = np.asarray(work_s, dtype=float)
    n = len(release_s)
    order = np.argsort(release_s, kind="stable")
    finish = np.empty(n)
    waiting: list[tuple[float, int]] = []  # (remaining work, job)
    now, i = -np.inf, 0
    while i < n or waiting:
        if not waiting:
            now = max(now, release_s[order[i]])
        while i < n and release_s[order[i]] <= now:
            heappush(waiting, (float(work_s[order[i]]), int(order[i])))
            i += 1
        left, job = heappop(waiting)
        next_release = release_s[order[i]] if i < n else np.inf
        if now + left <= next_release:
            now += left
            finish[job] = now
        else:  # preempted (perhaps) by the next arrival: run until it, then decide again
            heappush(waiting, (left - (next_release - now), job))
            now = next_release
    return np.sort(finish)


def fine_classes(prompt: np.ndarray, output: np.ndarray, ratio: float = FINE_GRID_RATIO,
                 exact_up_to: int = EXACT_CLASSES_MAX) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (I, O) and each request's index into them when there are at most ``exact_up_to`` of them;
    otherwise each (I, O) rounded down to the grid {⌊ratio^j⌋} ∪ {1, 2, …, ⌈1/(ratio − 1)⌉}: the distinct grid
    points and each request's index into them (a request is never rounded above its own I or O)."""
    pairs, which = np.unique(np.stack([np.asarray(prompt), np.asarray(output)], axis=1), axis=0, return_inverse=True)
    if len(pairs) <= exact_up_to:
        return pairs, np.ravel(which)

    def grid(a: np.ndarray) -> np.ndarray:
        top = int(a.max())
        exact = np.arange(1, min(top, int(np.ceil(1 / (ratio - 1)))) + 1)
        geometric = np.floor(ratio ** np.arange(0, np.log(max(top, 1)) / np.log(ratio) + 1)).astype(np.int64)
        points = np.unique(np.concatenate([exact, geometric[geometric <= top]]))
        return points[np.searchsorted(points, a, side="right") - 1]

    keys = np.stack([grid(np.asarray(prompt)), grid(np.asarray(output))], axis=1)
    classes, which = np.unique(keys, axis=0, return_inverse=True)
    return classes, np.ravel(which)
