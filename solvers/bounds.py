"""Instance-derived constants of the MILP: per-request and per-batch bounds, the big-M values built
from them, and the slot bound implied by a known schedule's objective (docs/design.md, solver section).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infermax.costmodel.base import (PREFILL_CTX_CAPS, CostTerm, kv_cap, padded, padding_quantum, prefill_ctx_cap,
                                     token_step)
from infermax.limits import Limits
from infermax.request import Request

from .objective import Objective
from .policy import Policies

PREFILL_FEATURES = ("n_prefill_seqs", "prefill_tokens", "prefill_sq_tokens")
DECODE_FEATURES = ("n_decode_seqs", "decode_kv_tokens", "decode_kv_max")
ALWAYS_ZERO = ("swap_tokens", "hidden_recompute_tokens")


def vanishes_with_gate(feature: str, gate: str) -> bool:
    """Whether ``feature`` is 0 in every slot whose gate ``[gate > 0]`` is 0 (so a piece over such features may be
    written in perspective form ``τ ≥ intercept·a + Σ coef·feature``): every feature of an empty batch
    (gate ``n_tokens``); prefill features without prefill items; decode features without decode items."""
    if gate == "n_tokens" or feature == gate:
        return True
    if gate in PREFILL_FEATURES:
        return feature in PREFILL_FEATURES or feature == "prefill_ctx_tokens" or prefill_ctx_cap(feature) is not None
    if gate in DECODE_FEATURES:
        return feature in DECODE_FEATURES or kv_cap(feature) is not None
    return False


@dataclass(frozen=True)
class RequestBounds:
    """``peak``: most KV tokens the request can hold (``I + O − 1``); ``chunk``: largest prefill chunk
    (``min(C, P, M, largest Icur)``, where the largest ``Icur`` is ``I + O − 1`` after a decode-phase
    eviction, ``I`` when eviction-free)."""

    peak: int
    chunk: int


def request_bounds(r: Request, limits: Limits, policies: Policies) -> RequestBounds:
    peak = r.prompt_tokens + r.output_tokens - 1
    largest_input = r.prompt_tokens if policies.eviction_free else peak
    chunk = min(limits.C, limits.prefill_budget, limits.M, largest_input)
    if policies.no_chunked_prefill and r.prompt_tokens > chunk:
        raise ValueError(f"request {r.id}: prompt of {r.prompt_tokens} tokens exceeds min(C, P, M) = {chunk}; "
                         "it cannot be prefilled without chunking")
    return RequestBounds(peak=peak, chunk=chunk)


def feature_bounds(rb: list[RequestBounds], limits: Limits) -> dict[str, int]:
    """Upper bound of each batch feature over every valid batch of the instance."""
    n = len(rb)
    if limits.Rmax is not None:
        n = min(n, limits.Rmax)
    chunks = sorted((b.chunk for b in rb), reverse=True)[:n]
    prefill = min(limits.prefill_budget, sum(chunks))
    tokens = min(limits.C, sum(max(c, 1) for c in chunks))
    # a chunk c after m cached tokens of the same input has c + m <= Icur <= peak
    ctx_item = sorted((min(b.chunk * (b.peak - 1), (b.peak // 2) * ((b.peak + 1) // 2)) for b in rb), reverse=True)[:n]
    ctx = min(sum(ctx_item), prefill * max(b.peak - 1 for b in rb))
    return {
        "n_tokens": tokens,
        "prefill_tokens": prefill,
        "prefill_sq_tokens": min(sum(c * c for c in chunks), prefill * max(chunks)),
        "prefill_ctx_tokens": ctx,
        **{f"prefill_ctx_cap{k}": min(ctx, prefill * k) for k in PREFILL_CTX_CAPS},
        "n_prefill_seqs": min(n, prefill),
        "n_decode_seqs": min(n, tokens),
        "decode_kv_tokens": min(limits.M, sum(sorted((b.peak for b in rb), reverse=True)[:n])),
        "decode_kv_max": min(limits.M, max(b.peak for b in rb)),
        "swap_tokens": 0,
        "hidden_recompute_tokens": 0,
    }


def feature_bound(fb: dict[str, int], name: str) -> int:
    """Upper bound of feature ``name``: from ``fb``, the padded ``n_tokens`` bound for ``n_tokens_pad<q>``, the
    capped ``decode_kv_max`` bound for ``decode_kv_max_cap<K>``, or whether a step ``<count>_gt<t>`` can be 1."""
    if name in fb:
        return fb[name]
    q, cap, step = padding_quantum(name), kv_cap(name), token_step(name)
    if q is not None:
        return padded(fb["n_tokens"], q)
    if cap is not None:
        return min(fb["decode_kv_max"], cap)
    if step is not None:
        return int(fb[step[0]] > step[1])
    raise ValueError(f"cost term uses unknown feature {name!r}")


def piece_range(piece, fb: dict[str, int]) -> tuple[float, float]:
    """(lower, upper) of an affine piece over the feature box ``0 <= f <= bound(f)``."""
    lo = hi = piece.intercept_s
    for f, c in piece.coef_s.items():
        bound = feature_bound(fb, f)
        lo += min(0.0, c * bound)
        hi += max(0.0, c * bound)
    return lo, hi


def max_batch_time_s(terms: tuple[CostTerm, ...], fb: dict[str, int]) -> float:
    """Upper bound on any batch's time: Σ over terms of max(0, largest piece upper bound)."""
    return sum(max(0.0, max(piece_range(p, fb)[1] for p in t.pieces)) for t in terms)


def _per_token(piece) -> float:
    """A piece's slope in ``n_tokens`` with every padded token count ``⌈n/q⌉·q >= n`` counted as ``n``."""
    return sum(c for f, c in piece.coef_s.items() if f == "n_tokens" or padding_quantum(f) is not None)


@dataclass(frozen=True)
class SlotBound:
    """``slots``: an upper bound on the non-empty batches of any schedule with objective <= ``budget_s``
    (None when it cannot be derived; ``reason`` says why)."""

    slots: int | None
    reason: str
    tau0_s: float = math.nan
    alpha_s: float = math.nan


def slot_bound(requests: list[Request], terms: tuple[CostTerm, ...], objective: Objective, objective_s: float) -> SlotBound:
    """How many non-empty batches a schedule with objective at most ``objective_s`` can have.

    Every non-empty batch takes at least ``tau0 + alpha · n_tokens`` (derived from the cost terms when
    every slope is >= 0, so each piece bounds its term from below: the ``n_tokens``-gated terms' pieces with
    the largest intercept, their per-token slope counting padded token counts ``⌈n/q⌉·q ≥ n`` as ``n``, plus
    the least of the prefill-gated terms' largest intercepts, the decode-gated ones' and both together, since
    a non-empty batch has a prefill item, a decode item or both; intercepts may be negative). A complete schedule processes at least ``N = Σ (I + O − 1)`` tokens, so its
    busy time is at least ``K·tau0 + alpha·N``. Busy time <= makespan <= objective / w_makespan, and
    busy time <= last end − first arrival <= T_max − T_min + Σ latency <= ... + objective / w_latency.
    Hence ``K <= (busy budget − alpha·N) / tau0``. Mean TTFT alone bounds nothing.

    Token-count steps (``n_tokens_gt<t>``, coefficient ``s_t >= 0`` in those pieces) tighten it: a batch of ``n``
    tokens takes at least ``tau0 + h(n)`` with ``h(n) = alpha·n + Σ_{t<n} s_t``, non-decreasing; with ``h̆`` its
    convex envelope on ``[1, N]`` (every batch has 1..N tokens), Jensen gives busy time
    ``>= K·tau0 + Σ h̆(n_j) >= K·(tau0 + h̆(N/K))`` (as ``Σ n_j >= N`` and ``h̆`` is non-decreasing); the bound is the
    largest ``K`` within the budget by this test (never above the first).
    """
    for t in terms:
        for p in t.pieces:
            if any(c < 0 for c in p.coef_s.values()):
                return SlotBound(None, f"cost term {t.name!r} has a negative slope")
    arrivals = [r.arrival_s for r in requests]
    budgets = []
    if objective.makespan > 0:
        budgets.append(objective_s / objective.makespan)
    if objective.latency > 0:
        budgets.append(objective_s / objective.latency + max(arrivals) - min(arrivals))
    if not budgets:
        return SlotBound(None, "the objective has no makespan or latency weight (mean TTFT does not bound the batch count)")
    tau0 = alpha = prefill0 = decode0 = 0.0
    steps: dict[int, float] = {}  # token-count threshold t -> the step's cost once a batch has more than t tokens
    for t in terms:
        if t.active_if == "n_tokens":
            best = max(t.pieces, key=lambda p: (p.intercept_s, _per_token(p)))
            tau0 += best.intercept_s
            alpha += _per_token(best)
            for f, c in best.coef_s.items():
                step = token_step(f)
                if step is not None and step[0] == "n_tokens" and c > 0:
                    steps[step[1]] = steps.get(step[1], 0.0) + c
        elif t.active_if in PREFILL_FEATURES:
            prefill0 += max(p.intercept_s for p in t.pieces)
        elif t.active_if in DECODE_FEATURES:
            decode0 += max(p.intercept_s for p in t.pieces)
        else:  # charged in some batches only: at least min(0, its largest intercept)
            tau0 += min(0.0, max(p.intercept_s for p in t.pieces))
    tau0 += min(prefill0, decode0, prefill0 + decode0)
    if tau0 <= 0:
        return SlotBound(None, "the cost model gives no positive minimum batch time", tau0, alpha)
    tokens = sum(r.prompt_tokens + r.output_tokens - 1 for r in requests)
    k = math.floor((min(budgets) - alpha * tokens) / tau0 * (1 + 1e-9) + 1e-9)
    reason = f"busy time >= K*{tau0 * 1e3:.6g} ms + {alpha * 1e3:.6g} ms/token * {tokens} tokens"
    if steps and k > 0:
        hull = token_hull(alpha, steps, tokens)
        last = _last_within(lambda n: n * (tau0 + hull(tokens / n)), k, min(budgets) * (1 + 1e-9))
        if last is not None and last < k:
            k = last
            reason += f" + the token-count steps ({len(steps)}, convex envelope at the mean batch)"
    return SlotBound(max(k, 0), reason, tau0, alpha)


def _last_within(g, k: int, budget: float) -> int | None:
    """The largest ``n`` in ``1..k`` with ``g(n) <= budget`` (None if there is none), for ``g`` convex on ``[1, k]``.

    `slot_bound`'s ``g(n) = n·(tau0 + h̆(N/n))`` is: ``n·h̆(N/n)`` is the perspective of the convex ``h̆``, convex in
    ``n``, and ``h̆`` held at ``h̆(1)`` below 1 keeps it convex past ``n = N`` (the slope there rises from at most
    ``h̆(1)`` to ``h̆(1)``). So ``g`` falls and then rises, and the ``n`` within the budget form one interval: its
    minimiser is the first ``n`` with ``g(n + 1) >= g(n)``, and the interval's end the last ``n`` from there with
    ``g(n) <= budget``, both found by bisection in ``O(log k)`` evaluations. (A scan of every ``n`` took minutes and
    gigabytes where ``k`` is in the billions: the sum-of-latencies budget of a whole Azure trace.)"""
    if g(k) <= budget:
        return k
    lo, hi = 1, k  # the minimiser is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if g(mid + 1) >= g(mid):
            hi = mid
        else:
            lo = mid + 1
    if g(lo) > budget:
        return None
    hi = k  # g(lo) <= budget < g(k): the last n within it is in [lo, k)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if g(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def token_hull(alpha: float, steps: dict[int, float], tokens: int):
    """The lower convex envelope, over ``1 <= n <= tokens``, of ``h(n) = alpha·n + Σ_{t < n} steps[t]`` (a batch's
    token-dependent time), as a function. ``h`` is non-decreasing (``alpha``, steps >= 0), so its envelope is too;
    ``h`` is linear between thresholds, so the envelope's vertices are among 1, ``tokens`` and each ``t``, ``t + 1``."""
    def h(n: int) -> float:
        return alpha * n + sum(c for t, c in steps.items() if t < n)

    xs = sorted({1, tokens} | {x for t in steps for x in (t, t + 1) if 1 <= x <= tokens})
    hull: list[tuple[int, float]] = []
    for x in xs:
        y = h(x)
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (x - hull[-1][0]) >= (y - hull[-1][1]) * (hull[-1][0] - hull[-2][0]):
            hull.pop()
        hull.append((x, y))

    def envelope(n: float) -> float:
        if n <= hull[0][0]:
            return hull[0][1]
        for (x0, y0), (x1, y1) in zip(hull, hull[1:]):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return hull[-1][1]
    return envelope
