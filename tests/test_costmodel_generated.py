"""The piecewise model's generated ``batch_time_s`` equals the terms evaluated one by one, to the last bit.

The reference below evaluates ``milp_terms()`` as the module docstring of ``costmodel.piecewise`` states
it, in the order the generated code promises (per piece: ``s = 0.0``, ``s += c·x`` for each plain, padded
or capped coefficient, then each count's steps as one prefix sum; ``intercept + s``; the first largest
piece; the active terms summed from 0.0).
"""

from __future__ import annotations

import itertools
import math
import pickle
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.costmodel import AffinePiece, BatchFeatures, CostTerm, PiecewiseCostModel, profiles_dir, roofline_model
from infermax.costmodel.base import kv_cap, padding_quantum, token_step


def reference_time_s(model: PiecewiseCostModel, f: BatchFeatures) -> float:
    total = 0.0
    for term in model.milp_terms():
        if getattr(f, term.active_if) <= 0:
            continue
        best = -math.inf
        for piece in term.pieces:
            s, steps = 0.0, {}
            for name, c in piece.coef_s.items():
                step = token_step(name)
                if step is not None:
                    steps.setdefault(step[0], []).append((step[1], c))
                elif padding_quantum(name):
                    q = padding_quantum(name)
                    s += c * (-(-f.n_tokens // q) * q)
                elif kv_cap(name):
                    s += c * min(f.decode_kv_max, kv_cap(name))
                else:
                    s += c * getattr(f, name)
            for count, pairs in steps.items():
                pairs.sort()
                heights = list(itertools.accumulate((c for _, c in pairs), initial=0.0))
                s += heights[bisect_left([t for t, _ in pairs], getattr(f, count))]
            value = piece.intercept_s + s
            if value > best:
                best = value
        total += best
    return total


def toy_model(model: str = "llama-2-7b") -> PiecewiseCostModel:
    """Every kind of coefficient: plain, padded, capped KV read and steps of two counts; a hidden term when the
    model is registered."""
    terms = (
        CostTerm("non_attention", "n_tokens", (
            AffinePiece(1e-3, {"n_tokens": 2e-5, "n_tokens_gt64": 3e-4, "n_tokens_gt16": 1e-4, "n_tokens_pad32": 1e-6}),
            AffinePiece(2e-3, {"n_tokens": 1e-5, "hidden_recompute_tokens_gt8": 5e-4}),
        )),
        CostTerm("prefill", "n_prefill_seqs", (AffinePiece(5e-4, {"prefill_sq_tokens": 1e-9, "prefill_ctx_cap256": 2e-8}),)),
        CostTerm("decode", "n_decode_seqs", (AffinePiece(3e-4, {"decode_kv_tokens": 1e-8, "decode_kv_max_cap512": 4e-7}),)),
    )
    return PiecewiseCostModel.from_terms(terms, family="piecewise", gpu="toy", model=model, tp=1)


def fitted_models() -> list[PiecewiseCostModel]:
    paths = sorted(profiles_dir().glob("*/*/tp*/infermax_piecewise.json"))
    assert paths, "no fitted piecewise profile found"
    return [PiecewiseCostModel.from_json(p) for p in paths]


MODELS = [toy_model(), *fitted_models(), roofline_model("a100", "llama-2-7b"), roofline_model("h100", "llama-2-70b", 4)]

batches = st.builds(
    lambda prefills, decodes, hidden: _batch(prefills, decodes, hidden),
    st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20000)), max_size=4),
    st.lists(st.integers(0, 40000), max_size=60),
    st.sampled_from([0, 0, 3, 100]),
)


def _batch(prefills, decodes, hidden) -> BatchFeatures:
    f = BatchFeatures()
    for c, m in prefills:
        f.add_prefill(c, m)
    for m in decodes:
        f.add_decode(m)
    f.hidden_recompute_tokens = hidden
    return f


@settings(max_examples=200, deadline=None)
@given(batches)
def test_generated_equals_reference(f):
    for model in MODELS:
        assert model.batch_time_s(f) == reference_time_s(model, f)


def test_unregistered_model_refuses_hidden_recompute_and_survives_pickling():
    model = toy_model("not-a-registered-model")
    f = _batch([(10, 0)], [5], 0)
    assert pickle.loads(pickle.dumps(model)).batch_time_s(f) == model.batch_time_s(f) == reference_time_s(model, f)
    with pytest.raises(ValueError, match="K/V projection share is unknown"):
        model.batch_time_s(_batch([(10, 0)], [], 4))
