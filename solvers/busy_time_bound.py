"""Mean busy times: the sum of latencies as queueing on one machine plus each request's own chain of steps.

docs/design.md, "Mean busy times", has the proof. In short: spread each batch's attributed work (its items'
marginal costs and shares of its intercept, as in `queue_bound`) evenly over the batch: the requests are then
jobs on one machine of rate 1 with release dates. Keep, of request r's work, only what is sure to be there:

* ``W_pre``: its first token's items (the initial prefill; the marginal LP of the request alone with O = 1) and
  their share of the intercepts;
* per token g = 2..O, a *phase*: every item of r after token g − 1 was generated, up to the one generating
  token g. The phase is one decode reading ``I + g − 1`` tokens, or holds a whole refill of ``I + g − 1`` tokens
  (recompute after an eviction), so its work is at least ``q_g = min(decode, refill) + share``.

With ``K_r`` the kept work and ``M_r`` its mean busy time (the work-weighted mean of the times it is processed),
``C_r − M_r = Σ_pieces (w/K_r)(C_r − t_piece)``. Every piece of phase g lies before the end of the batch that
generates token g, which lasts at least ``d_g`` (intercept plus that item's own cost), and the later phases
follow one after another, each lasting at least ``D_g`` (intercept plus the phase's cheapest marginal cost);
the first-token pieces precede every phase. So ``C_r ≥ M_r + G_r`` with ``G_r`` a per-request constant, and
``Σ_r M_r`` is at least its least value over all schedules of one machine, which the preemptive schedule that
always runs the available job of smallest ``K`` reaches (Goemans 1997; `spt_mean_busy_times`).

The queued bound (`queue_bound`) counts each request's service as its share of the machine only; this one adds
half of the request's own chain of steps (its O − 1 decode steps, each at least an intercept long) on top of the
queueing. It is one more valid bound on the sum of completion times; the caller keeps the largest.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import NamedTuple

import numpy as np

from infermax.costmodel.base import CostTerm, prefill_ctx_cap

from .bounds import DECODE_FEATURES, PREFILL_FEATURES


def spt_schedule(release_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """The preemptive shortest-processing-time schedule on one machine of rate 1 (at every moment the available
    unfinished job of smallest original work runs, ties by index) as its pieces, one row ``(start, length, work,
    job)`` per stretch a job runs, in time order (a piece ends at ``start + length``, where the next may start)."""
    release_s = np.asarray(release_s, dtype=float)
    work_s = np.asarray(work_s, dtype=float)
    if len(release_s) != len(work_s):
        raise ValueError("release_s and work_s differ in length")
    if (work_s < 0).any() or not np.isfinite(work_s).all() or not np.isfinite(release_s).all():
        raise ValueError("works must be finite and >= 0, release times finite")
    n = len(release_s)
    order = np.argsort(release_s, kind="stable")
    pieces: list[tuple[float, float, float, int]] = []
    left = work_s.copy()
    available: list[tuple[float, int]] = []  # (work, job)
    now, i = -np.inf, 0
    while i < n or available:
        if not available:
            now = max(now, release_s[order[i]])
        while i < n and release_s[order[i]] <= now:
            j = int(order[i])
            heappush(available, (float(work_s[j]), j))
            i += 1
        _, job = available[0]
        next_release = release_s[order[i]] if i < n else np.inf
        if left[job] <= next_release - now:  # it finishes before the next arrival
            run = left[job]
            heappop(available)
        else:  # it runs until the next arrival, which may preempt it
            run = next_release - now
        pieces.append((now, run, float(work_s[job]), job))
        now += run
        left[job] -= run
    return np.array(pieces, dtype=float).reshape(-1, 4)


def spt_mean_busy_times(release_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """Mean busy times of the preemptive shortest-processing-time schedule (`spt_schedule`). Their sum is the least
    Σ M_j over every preemptive schedule of the jobs (Goemans, "Improved approximation algorithms for scheduling
    with release dates", SODA 1997: preemptive WSPT minimises Σ w_j M_j; here w_j = 1). A job with no work has
    its release time."""
    return mean_busy_times(spt_schedule(release_s, work_s), release_s, work_s)


def mean_busy_times(pieces: np.ndarray, release_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """Each job's mean busy time in a schedule given as `spt_schedule`'s pieces (its release time if it has no
    work)."""
    release_s, work_s = np.asarray(release_s, dtype=float), np.asarray(work_s, dtype=float)
    moment = np.zeros(len(release_s))  # ∫ t dt over the job's processing
    for start, run, _, job in pieces:
        moment[int(job)] += run * (start + run / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(work_s > 0, moment / np.where(work_s > 0, work_s, 1.0), release_s)


def item_marginal_s(marginal: tuple[CostTerm, ...], decode_read: np.ndarray | None = None,
                    chunk: np.ndarray | None = None, context: np.ndarray | None = None) -> np.ndarray:
    """The intercept-free cost (an `additive_split`'s ``marginal`` terms) of one item: a decode reading
    ``decode_read`` KV tokens, or a prefill chunk of ``chunk`` tokens after ``context`` cached ones. A term counts
    for the item only if the item alone opens its gate (``n_tokens`` for every item; a prefill gate for a chunk,
    a decode gate for a decode): a term gated on the other kind of item may be inactive in the item's batch."""
    decode = decode_read is not None
    x = np.asarray(decode_read if decode else chunk, dtype=float)
    m = np.zeros_like(x) if decode else np.asarray(context, dtype=float)
    total = np.zeros_like(x)
    for term in marginal:
        gate = term.active_if
        if gate != "n_tokens" and gate not in (DECODE_FEATURES if decode else PREFILL_FEATURES):
            continue
        for f, c in term.pieces[0].coef_s.items():
            if decode:
                value = {"n_tokens": 1.0, "n_decode_seqs": 1.0, "decode_kv_tokens": x}.get(f, 0.0)
            else:
                cap = prefill_ctx_cap(f)
                value = {"n_tokens": x, "prefill_tokens": x, "n_prefill_seqs": 1.0, "prefill_sq_tokens": x * x,
                         "prefill_ctx_tokens": x * m}.get(f, 0.0) if cap is None else x * np.minimum(m, cap)
            total = total + c * value
    return total


class ChainSums(NamedTuple):
    """One request's chain (module docstring) as sums over its tokens g = 2..O, so that ``(K, G)`` follow for any
    way of sharing the intercept (`kept_work_and_gap`) without another pass over the tokens: ``phase`` = Σ phase
    marginal, ``kv`` = Σ (I + g − 1), ``span`` = Σ D_g, ``weight`` = Σ w_g with w_g = d_g / 2 + Σ_{g' > g} D_g'
    (how long a piece of phase g waits at least for the request's last token), and the w-weighted sums
    ``phase_w``, ``kv_w``."""

    phase: float
    kv: float
    items: int
    span: float
    weight: float
    phase_w: float
    kv_w: float


class PhaseCosts(NamedTuple):
    """For tokens g = 2..O: the least marginal cost of a decode reading ``I + g − 1`` tokens, of a whole refill of that
    many tokens (all its chunks together), and of the refill's last chunk, which generates the token (one token at
    least). A refill's chunks cover I + g − 1 tokens from an empty cache, in one chunk or several: together they cost
    at least the per-token and per-item part (the quadratic and context terms are >= 0 but not additive over a
    split)."""

    decode: np.ndarray
    refill: np.ndarray
    last_chunk: np.ndarray


def phase_costs(prompt: int, output: int, marginal: tuple[CostTerm, ...]) -> PhaseCosts:
    """`PhaseCosts` of a request with prompt ``prompt`` and ``output`` tokens."""
    kv = prompt + np.arange(1, max(output, 1), dtype=float)  # token g: the generating item holds I + g − 1 tokens
    linear = _token_linear(marginal)
    return PhaseCosts(item_marginal_s(marginal, decode_read=kv),
                      item_marginal_s(linear, chunk=kv, context=np.zeros_like(kv)),
                      item_marginal_s(linear, chunk=np.ones_like(kv), context=np.zeros_like(kv)))


def phase_marginals(prompt: int, output: int, marginal: tuple[CostTerm, ...], refills: bool = True
                    ) -> tuple[np.ndarray, np.ndarray]:
    """For tokens g = 2..O of a request with prompt ``prompt``: the least marginal cost of the phase that generates
    token g (all its items) and of the item that generates it. A phase is one decode reading ``I + g − 1`` tokens
    or, with ``refills``, holds a whole refill of that many tokens (`phase_costs`)."""
    if not refills:
        decode = item_marginal_s(marginal, decode_read=prompt + np.arange(1, max(output, 1), dtype=float))
        return decode, decode
    costs = phase_costs(prompt, output, marginal)
    return np.minimum(costs.decode, costs.refill), np.minimum(costs.decode, costs.last_chunk)


def chain_sums(prompt: int, output: int, a0: float, marginal: tuple[CostTerm, ...], refills: bool = True
               ) -> ChainSums:
    """The `ChainSums` of a request with prompt ``prompt`` and ``output`` tokens (phases: `phase_marginals`)."""
    if output <= 1:
        return ChainSums(0.0, 0.0, 0, 0.0, 0.0, 0.0, 0.0)
    kv = prompt + np.arange(1, output, dtype=float)
    phase, generating = phase_marginals(prompt, output, marginal, refills)
    span = a0 + phase  # D_g: the phase holds at least one batch with its cheapest work
    after = np.concatenate([np.cumsum(span[::-1])[::-1][1:], [0.0]])  # Σ_{g' > g} D_g'
    w = (a0 + generating) / 2 + after  # the batch generating token g lasts at least d_g = a0 + its item's cost
    return ChainSums(float(phase.sum()), float(kv.sum()), len(kv), float(span.sum()), float(w.sum()),
                     float((phase * w).sum()), float((kv * w).sum()))


def kept_work_and_gap(chains: list[ChainSums], first_token_work_s: np.ndarray, first_token_share: np.ndarray,
                      a0: float, share_kv_per_token: float, share_item: float) -> tuple[np.ndarray, np.ndarray]:
    """Per request: the kept work ``K`` and the least ``G = C − M`` (module docstring). ``first_token_work_s``: the
    marginal work of each request's first-token items alone, ``first_token_share``: their share of ``a0`` (a
    fraction); a later token g's generating item gets ``share_kv_per_token·(I + g − 1) + share_item``."""
    phase, kv, items, span, weight, phase_w, kv_w = (np.array(col, dtype=float) for col in zip(*chains))
    k_pre = first_token_work_s + a0 * first_token_share
    k = k_pre + phase + a0 * (share_kv_per_token * kv + share_item * items)
    waited = k_pre * span + phase_w + a0 * (share_kv_per_token * kv_w + share_item * weight)
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = np.where(k > 0, waited / np.where(k > 0, k, 1.0), span)  # no kept work: the chain alone
    return k, gap


def _token_linear(marginal: tuple[CostTerm, ...]) -> tuple[CostTerm, ...]:
    """The terms with only their per-token and per-item features (the quadratic and context ones dropped, all
    coefficients being >= 0): a lower bound on any chunk, additive over the chunks of a split prefill."""
    keep = ("n_tokens", "prefill_tokens", "n_prefill_seqs", "n_decode_seqs")
    out = []
    for t in marginal:
        piece = t.pieces[0]
        out.append(CostTerm(t.name, t.active_if, (type(piece)(0.0, {f: c for f, c in piece.coef_s.items()
                                                                    if f in keep}),)))
    return tuple(out)

