"""The decode fast-forward is exact: every table, summary and Schedule equals step-by-step simulation."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import AffineCost
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infermax.costmodel import AffinePiece, CostTerm, PiecewiseCostModel, load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import Replayer
from infermax.request import Request
from infermax.schedule import ScheduledBatch
from infermax.schedulers import available
from infermax.workload import fixed

LINEAR = load_cost_model(kind="linear")
# hand-made terms on the longest decode KV read capped at 24 tokens (binds at these sizes): fast-forward
# copies must carry decode_kv_max forward exactly
CAPPED = PiecewiseCostModel.from_terms(
    (CostTerm("non_attention", "n_tokens", (AffinePiece(0.01, {"n_tokens": 0.001}),)),
     CostTerm("decode", "n_decode_seqs", (AffinePiece(0.002, {"decode_kv_tokens": 1e-5, "decode_kv_max_cap24": 5e-4}),))),
    family="piecewise", gpu="a100", model="llama-2-7b", tp=1)
COSTS = {"linear": LINEAR, "affine": AffineCost(0.01, 0.001), "capped": CAPPED}
SWAP = SwapCost(per_token_s=0.002, fixed_s=0.001)  # BROS swaps KV
# Schedulers that never promise a repeat (their plan changes every iteration): nothing to fast-forward.
NEVER_REPEATS = ("bros", "bros-strict", "roundrobin")


@pytest.fixture
def count_copies(monkeypatch):
    """Counts the batches applied by ``Replayer.repeat_full_decode``."""
    counter = {"copies": 0}
    original = Replayer.repeat_full_decode

    def counted(self, *args, **kwargs):
        copies = original(self, *args, **kwargs)
        counter["copies"] += copies
        return copies

    monkeypatch.setattr(Replayer, "repeat_full_decode", counted)
    return counter


def assert_identical(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.batches, b.batches)
    assert a.schedule.to_json() == b.schedule.to_json()
    assert a.summary.keys() == b.summary.keys()
    assert all(x == y or (x != x and y != y) for x, y in zip(a.summary.values(), b.summary.values()))


@st.composite
def cases(draw):
    n = draw(st.integers(1, 12))
    online = draw(st.booleans())
    reqs, t = [], 0.0
    for i in range(n):
        if online:
            t += draw(st.sampled_from([0.0, 0.005, 0.05, 0.5, 2.0]))
        # a TBT or TPOT target keeps the request's token times, which every fast path must record as well
        target = draw(st.sampled_from([None, None, "tbt", "tpot"]))
        slo_s = draw(st.sampled_from([0.02, 0.2, 2.0])) if target else None
        reqs.append(Request(i, t, draw(st.integers(1, 40)), draw(st.integers(1, 80)), ttft_slo_s=slo_s and 10 * slo_s,
                            tbt_slo_s=slo_s if target == "tbt" else None, tpot_slo_s=slo_s if target == "tpot" else None))
    block = draw(st.sampled_from([1, 1, 2, 4, 16]))
    peak = max(-(-r.peak_kv_tokens // block) * block for r in reqs)
    need = max(r.peak_kv_tokens for r in reqs)  # non-chunking schedulers must fit any refill in one batch
    C = draw(st.integers(need, 160))
    P = draw(st.one_of(st.none(), st.integers(need, C)))
    M = draw(st.integers(peak, peak * 3))
    Rmax = draw(st.one_of(st.none(), st.none(), st.integers(1, 6)))
    cost = draw(st.sampled_from(list(COSTS)))
    name = draw(st.sampled_from([n for n in available() if n != "bros-strict"]))  # strict BROS may stop by design
    return reqs, Limits(C=C, P=P, M=M, Rmax=Rmax, block_size=block), name, cost


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases())
def test_fast_forward_equals_step_by_step(count_copies, case):
    reqs, limits, name, cost_name = case
    cost = COSTS[cost_name]
    before = count_copies["copies"]
    step = simulate(reqs, name, limits, cost, fast_forward=False, swap_cost=SWAP)
    assert count_copies["copies"] == before  # the reference really stepped every batch
    fast = simulate(reqs, name, limits, cost, swap_cost=SWAP)
    event("fast-forwarded" if count_copies["copies"] > before else "nothing to fast-forward")
    assert_identical(step, fast)


@pytest.mark.parametrize("name", [n for n in available() if n not in NEVER_REPEATS])
@pytest.mark.parametrize("I, O, B, M, block", [(8, 64, 6, 100_000, 1), (64, 200, 40, 4000, 1), (30, 90, 20, 1500, 16)])
def test_fast_forward_skips_planning_and_matches(count_copies, name, I, O, B, M, block):
    # Large enough that long decode-only runs exist (and, with small M, evictions between them).
    reqs = fixed(I, O, B)
    limits = Limits(M=M, block_size=block)
    step = simulate(reqs, name, limits, LINEAR, fast_forward=False)
    fast = simulate(reqs, name, limits, LINEAR)
    # EcoServe never promises repetition (a GT outgrowing its allocation changes the plan without an
    # arrival, a finish or M being reached), so the engine steps it: the results must still match.
    assert count_copies["copies"] > 0 or name.startswith("ecoserve")
    assert_identical(step, fast)


def test_repeat_needs_a_full_decode_batch():
    rp = Replayer(fixed(4, 3, 2), Limits(), AffineCost())
    rp.apply(ScheduledBatch(items=[(0, 4)]))  # a prefill: request 1 holds no KV, nothing to repeat
    with pytest.raises(ValueError, match="full decode-only batch"):
        rp.repeat_full_decode(rp.batches[-1])
