"""What the scalable lower bounds need from a cost model's terms, and the forms they price them in: each term's
least value in a batch that activates it, whether batch time never falls when items are added, and the additive
split (batch time at least the intercepts plus each item's marginal cost) that the per-request bounds use.
docs/design.md, "Lower bounds at scale", has the proofs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from infermax.costmodel.base import PREFILL_CTX_CAPS, AffinePiece, CostTerm, kv_cap, padding_quantum, token_step

from .bounds import DECODE_FEATURES, PREFILL_FEATURES
from .demand import Demand


class BoundUnavailable(ValueError):
    """The cost model lacks a property a bound needs (e.g. a term that can be negative when active)."""


def _floor_features(gate: str, d: Demand, q_features: dict) -> dict:
    """The least value each feature can take in a batch in which the term gated by ``gate`` is active."""
    low = {}
    if gate == "n_tokens":
        low["n_tokens"] = 1
    elif gate in PREFILL_FEATURES:
        low.update(n_tokens=1, prefill_tokens=1, n_prefill_seqs=1, prefill_sq_tokens=1)
    elif gate in DECODE_FEATURES:
        r = d.min_decode_read
        low.update(n_tokens=1, n_decode_seqs=1, decode_kv_tokens=r, decode_kv_max=r)
    out = {}
    for f in q_features:
        q, cap = padding_quantum(f), kv_cap(f)
        if q is not None:
            out[f] = q if low.get("n_tokens") else 0
        elif cap is not None:
            out[f] = min(cap, low.get("decode_kv_max", 0))
        else:
            out[f] = low.get(f, 0)
    return out


def term_floor_s(term: CostTerm, d: Demand) -> float:
    """A lower bound on the term's value in any batch in which it is active (its pieces at the least
    feature values such a batch can have; every slope is >= 0 when this is used for monotonicity)."""
    feats = {f for p in term.pieces for f in p.coef_s}
    low = _floor_features(term.active_if, d, feats)
    return max(p.intercept_s + sum(c * low[f] for f, c in p.coef_s.items()) for p in term.pieces)


def nonnegative_gated_terms(terms: tuple[CostTerm, ...], d: Demand) -> tuple[CostTerm, ...]:
    """``terms`` with every term gated on something else than ``n_tokens`` (prefills, decodes, swaps, hidden-form
    recompute) that can be negative when active (``term_floor_s`` below 0, e.g. the H100 linear fit's prefill-
    attention intercept, −94 µs) raised by its floor's magnitude, and one term active in every non-empty batch (gate
    ``n_tokens``) lowered by their sum; ``terms`` itself when there is no such term, or when no always-active term's
    floor covers the sum (nothing can be done then: `LowerBounder` refuses such a model).

    The result is a *lower* cost model: a batch in which every raised term is active costs the same, any other less
    (by the floors of the raised terms it lacks), so every schedule's batches, finish times and objectives are at
    most what ``terms`` give, and a bound for it is a bound for ``terms``. Its every active term is ``>= 0`` on the
    demand ``d`` (the instance's, whose least features bound every subset's), which the bounds over subsets of the
    requests need (removing items then never lengthens a batch)."""
    floors = {t.name: term_floor_s(t, d) for t in terms}
    # each raised by a hair more than its floor's magnitude, so that it stays >= 0 in floats
    shifts = {t.name: -floors[t.name] * (1 + 1e-9) for t in terms if t.active_if != "n_tokens" and floors[t.name] < 0}
    if not shifts:
        return terms
    total = sum(shifts.values())
    base = next((t.name for t in terms if t.active_if == "n_tokens" and floors[t.name] >= total), None)
    if base is None:
        return terms

    def moved(t: CostTerm, by_s: float) -> CostTerm:
        return replace(t, pieces=tuple(replace(p, intercept_s=p.intercept_s + by_s) for p in t.pieces))

    return tuple(moved(t, shifts[t.name]) if t.name in shifts else moved(t, -total) if t.name == base else t
                 for t in terms)


def monotone_terms(terms: tuple[CostTerm, ...]) -> str | None:
    """None if every slope is >= 0 (batch time never decreases when items are added, so the time of any
    batch is at least that of its items from a subset of requests), else the offending term and feature."""
    for t in terms:
        for p in t.pieces:
            for f, c in p.coef_s.items():
                if c < 0:
                    return f"cost term {t.name!r} has a negative coefficient for {f!r} ({c:.3g})"
    return None


# Features that are sums over a batch's items (so a batch's value is the sum of its items' values).
_ADDITIVE = ("n_tokens", "prefill_tokens", "prefill_sq_tokens", "prefill_ctx_tokens", "n_prefill_seqs",
             "n_decode_seqs", "decode_kv_tokens") + tuple(f"prefill_ctx_cap{k}" for k in PREFILL_CTX_CAPS)


def _linearised_steps(steps: list[tuple[int, float]], max_tokens: int, shift_s: float) -> float:
    """The largest α with Σ_t s_t·[n > t] >= α·n − shift_s for every token count n in 1..max_tokens (s_t >= 0).
    Within a level of the step function (S + shift)/n falls with n, so the minimum over n is at a level's last
    count: each threshold t (where [n > t] is still 0) and max_tokens."""
    ends = sorted({t for t, _ in steps if 1 <= t < max_tokens} | {max_tokens})
    return min((sum(s for t, s in steps if n > t) + shift_s) / n for n in ends)


def _depends_on_tokens_only(term: CostTerm) -> bool:
    """Whether ``term`` is active in every non-empty batch and each of its pieces depends on the token count alone
    (``n_tokens``, its steps and its padded counts)."""
    if term.active_if != "n_tokens":
        return False
    for piece in term.pieces:
        for f in piece.coef_s:
            step = token_step(f)
            if f != "n_tokens" and padding_quantum(f) is None and (step is None or step[0] != "n_tokens"):
                return False
    return True


def _linearised_term(term: CostTerm, max_tokens: int, keep_s: float) -> float:
    """For a term `_depends_on_tokens_only`: the largest α with f(n) >= keep_s + α·n for every token count n in
    1..max_tokens, f the term (the maximum of its pieces, every piece evaluated at every n, so a piece that takes over
    at large counts is priced too)."""
    n = np.arange(1, max_tokens + 1, dtype=float)
    f = np.full(max_tokens, -np.inf)
    for piece in term.pieces:
        value = np.full(max_tokens, piece.intercept_s)
        for feature, c in piece.coef_s.items():
            q, step = padding_quantum(feature), token_step(feature)
            value += c * (n if feature == "n_tokens" else np.ceil(n / q) * q if q is not None else n > step[1])
        f = np.maximum(f, value)
    return float(((f - keep_s) / n).min())


def _kept_piece(term: CostTerm, totals: dict[str, float] | None) -> AffinePiece:
    """The piece `additive_split` keeps for ``term``: the largest intercept; with ``totals``, among the pieces of
    intercept >= 0 (a negative one would lower the batch intercepts every bound shares), the one whose slopes are
    worth the most on ``totals``. Any one piece is below the term, so either choice is valid; the second keeps
    the piece that prices a whole workload's items highest. On the fitted A100 model it keeps the prefill
    attention piece with ``Σc²`` and prompt-token slopes rather than the one with context slopes only, which
    prices an unchunked prompt at 0."""
    top = max(term.pieces, key=lambda p: p.intercept_s)
    if totals is None:
        return top
    eligible = [p for p in term.pieces if p.intercept_s >= 0] or [top]
    return max(eligible, key=lambda p: (sum(c * totals.get(f, 0.0) for f, c in p.coef_s.items()), p.intercept_s))


def additive_split(terms: tuple[CostTerm, ...], max_tokens: int | None = None, step_share: float = 0.0,
                   totals: dict[str, float] | None = None) -> tuple[float, float, tuple[CostTerm, ...]] | None:
    """Batch time >= intercepts + Σ over items of an item's marginal cost: ``(a0, a_p, marginal terms)``.

    Per term one piece is kept (the term is the maximum of its pieces, so at least any one): the one with the
    largest intercept, or, given ``totals`` (feature sums of the work to be bounded, `_kept_piece`), the piece of
    non-negative intercept whose slopes are worth the most on them. When every piece of a term active in every
    batch depends on the token count alone and ``max_tokens`` is given, the whole term (the maximum of its pieces)
    is replaced by the line below it instead (`_linearised_term`). Padded counts ``⌈n/q⌉q`` are replaced by
    ``n``; KV maxima and the swap / hidden-recompute features are dropped (all >= 0 with slopes >= 0, which the
    callers check). Token-count steps ``[n_tokens > t]`` are dropped too, unless ``max_tokens`` (the most tokens a batch can
    hold) is given and the term is active in every non-empty batch (gate ``n_tokens``): then their sum S(n) is
    replaced by the line ``α·n − β`` below it for 1 <= n <= max_tokens, with
    β = ``step_share`` × the piece's intercept (moved out of the intercept) and α the largest slope that keeps
    the line below S (`_linearised_steps`); a step model's batching cost then reaches the marginal costs.
    What remains is additive over items, so a batch's time is at least the gate intercepts plus the sum
    over requests of the intercept-free terms on that request's items. ``a0``: the least intercept of a
    non-empty batch (the token gate plus the cheaper of the prefill and decode gates, plus any negative
    intercept of the other gates); ``a_p``: the same for a batch with a prefill item. None if ``a0 < 0``."""
    a_n = a_p = a_d = a_o = 0.0
    marginal = []
    for t in terms:
        tokens_only = _depends_on_tokens_only(t)
        piece = _kept_piece(t, None if tokens_only else totals)
        intercept = piece.intercept_s
        coefs: dict[str, float] = {}
        steps = []
        for f, c in piece.coef_s.items():
            step = token_step(f)
            if padding_quantum(f) is not None:
                f = "n_tokens"
            elif step is not None and step[0] == "n_tokens":
                steps.append((step[1], c))
                continue
            elif f not in _ADDITIVE:
                continue
            coefs[f] = coefs.get(f, 0.0) + c
        if tokens_only and max_tokens and len(t.pieces) > 1:  # every piece a function of n: the line below their
            keep = intercept - step_share * max(0.0, intercept)  # maximum, all pieces priced
            alpha = _linearised_term(t, max_tokens, keep)
            if alpha >= 0:
                coefs, intercept = {"n_tokens": alpha}, keep
        elif steps and max_tokens and t.active_if == "n_tokens":  # a term active in every batch: α·n sums exactly
            shift = step_share * max(0.0, intercept)
            alpha = _linearised_steps(steps, max_tokens, shift)
            if alpha > 0:
                coefs["n_tokens"] = coefs.get("n_tokens", 0.0) + alpha
                intercept -= shift
        if t.active_if == "n_tokens":
            a_n += intercept
        elif t.active_if in PREFILL_FEATURES:
            a_p += intercept
        elif t.active_if in DECODE_FEATURES:
            a_d += intercept
        else:  # charged only with swaps or hidden-form caches
            a_o += min(0.0, intercept)
            continue
        marginal.append(CostTerm(t.name, t.active_if, (AffinePiece(0.0, coefs),)))
    a0 = a_n + min(a_p, a_d) + a_o
    if a0 < 0:
        return None
    return a0, a_n + a_p + a_o, tuple(marginal)
