"""The additive split's line under a token-count term with several pieces (docs/design.md, "Batched completions",
additive split): every piece is priced, so a piece that takes over at large token counts (the fitted A100 model's
second non-attention piece, above about 4,087 tokens) raises the slope instead of being dropped."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from infermax.costmodel import load_cost_model
from infermax.costmodel.base import AffinePiece, BatchFeatures, CostTerm
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import load_trace, with_arrivals
from solvers.cost_terms import additive_split
from solvers.lower_bound import LowerBounder


def _term_at(term: CostTerm, n: int) -> float:
    """The term's value in a batch of ``n`` tokens, from the cost model's own evaluation."""
    return term.value_s(BatchFeatures(n_tokens=n))


def _split_line(term: CostTerm, max_tokens: int, share: float) -> tuple[float, float]:
    """(kept intercept, slope per token) of the split's line for a model made of ``term`` alone."""
    a0, _, marginal = additive_split((term,), max_tokens, share)
    return a0, marginal[0].pieces[0].coef_s.get("n_tokens", 0.0)


_steps = st.dictionaries(st.sampled_from([16, 32, 64, 96, 128, 256, 384, 512]), st.floats(0, 0.01), max_size=5)
_piece = st.tuples(st.floats(-0.3, 0.0), st.floats(0, 2e-4), _steps)


@given(st.floats(0.0, 0.02), st.floats(0, 1e-4), _steps, st.lists(_piece, min_size=1, max_size=2),
       st.integers(1, 700), st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([None, 8, 64]))
@settings(max_examples=150, deadline=None)
def test_line_stays_below_the_term_and_touches_it(top_b, top_s, top_steps, others, max_tokens, share, pad):
    """kept + α·n <= the term (the maximum of its pieces, steps and padding included) at every n in 1..max_tokens,
    with equality at some n (α is the largest such slope). Fails if a piece is left out of the maximum or α is
    taken from the top piece alone while another piece is lower somewhere."""
    def piece(b, s, steps):
        coefs = {"n_tokens": s, **{f"n_tokens_gt{t}": c for t, c in steps.items()}}
        if pad:
            coefs[f"n_tokens_pad{pad}"] = s / 2
        return AffinePiece(b, coefs)

    term = CostTerm("non_attention", "n_tokens", (piece(top_b, top_s, top_steps), *(piece(*p) for p in others)))
    kept, alpha = _split_line(term, max_tokens, share)
    assert kept == top_b - share * top_b
    slack = np.array([_term_at(term, n) - (kept + alpha * n) for n in range(1, max_tokens + 1)])
    assert slack.min() >= -1e-12
    assert slack.min() <= 1e-12


def test_fitted_model_prices_the_large_batch_piece():
    """The fitted A100 profile at C = 8,192 with the whole intercept moved into the slope: the slope is the least
    time per token of the non-attention term over every batch size (brute force from the model's own evaluation),
    61.7 µs at 384 tokens. Taking only the piece with the largest intercept gave 39 µs: its token steps end at
    3,968, so its time per token falls towards 8,192, where the second piece is the larger."""
    term = next(t for t in load_cost_model().milp_terms() if t.name == "non_attention")
    per_token = np.array([_term_at(term, n) / n for n in range(1, 8193)])
    kept, alpha = _split_line(term, 8192, 1.0)
    assert kept == 0.0
    assert alpha == per_token.min() or abs(alpha - per_token.min()) <= 1e-15
    assert int(per_token.argmin()) + 1 == 384
    assert abs(alpha - 61.68e-6) < 0.01e-6


def test_online_latency_bound_below_schedules_at_a_large_token_budget():
    """The first 300 azure-conv requests with their arrival times, fitted model, C = 8,192: the latency and TTFT
    bounds stay below the schedules of several schedulers."""
    reqs = with_arrivals(load_trace("azure-conv", limit=300), "trace")
    cost, limits = load_cost_model(), Limits(C=8192, M=100_000)
    bounder = LowerBounder(reqs, limits, cost)
    latency, ttft = bounder.latency_sum_s(), bounder.mean_ttft_s()
    for scheduler in ("vllm", "sarathi", "sarathi-pc-ef", "rank-i-ef"):
        summary = simulate(reqs, scheduler, limits, cost).summary
        assert latency.value_s <= summary["mean_latency_s"] * len(reqs)
        assert ttft.value_s <= summary["mean_ttft_s"]


_chunks = st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 6000)), max_size=4)
_decodes = st.lists(st.integers(0, 8000), max_size=300)


@given(_chunks, _decodes, st.sampled_from([0.0, 0.5, 1.0]), st.booleans(), st.sampled_from([4096, 8192]))
@settings(max_examples=200, deadline=None)
def test_split_is_below_every_batch_of_the_fitted_model(chunks, decodes, share, ranked, C):
    """Every split the bounds use (each share, pieces kept by intercept or ranked on a workload's totals) is below the
    fitted model's time of any batch: its gate intercepts (``a_p`` with a prefill item, else ``a0``) plus its
    marginal terms on the batch's features."""
    if not chunks and not decodes:
        chunks = [(1, 0)]
    f = BatchFeatures()
    for c, m in chunks:
        f.add_prefill(c, m)
    for m in decodes:
        f.add_decode(m)
    if f.n_tokens > C:
        return
    cost = load_cost_model()
    totals = {"prefill_tokens": 2.2e6, "prefill_sq_tokens": 5e9, "n_prefill_seqs": 2000, "n_decode_seqs": 5e5,
              "decode_kv_tokens": 6e8, "n_tokens": 2.7e6} if ranked else None
    a0, a_p, marginal = additive_split(cost.milp_terms(), C, share, totals)
    estimate = (a_p if chunks else a0) + sum(t.value_s(f) for t in marginal)
    assert estimate <= cost.batch_time_s(f) * (1 + 1e-12)


def test_ranked_piece_prefers_slopes_of_a_non_negative_intercept():
    """Given a workload's totals the split keeps, of the pieces with intercept >= 0, the one whose slopes are worth
    most on them (here the second); without totals, the largest intercept (the first)."""
    from solvers.cost_terms import _kept_piece

    pieces = (AffinePiece(0.002, {"prefill_tokens": 1e-7}), AffinePiece(0.001, {"prefill_sq_tokens": 1e-9}),
              AffinePiece(-0.5, {"prefill_tokens": 1e-3}))
    term = CostTerm("prefill_attention", "n_prefill_seqs", pieces)
    totals = {"prefill_tokens": 1e6, "prefill_sq_tokens": 1e9}
    assert _kept_piece(term, None) is pieces[0]
    assert _kept_piece(term, totals) is pieces[1]
