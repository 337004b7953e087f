"""Property tests: random small workloads x every registered scheduler."""

from __future__ import annotations

import json

import pandas as pd
from conftest import AffineCost
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import replay
from infermax.request import Request
from infermax.schedule import Schedule
from infermax.schedulers import available, get_spec

SCHEDULERS = [n for n in available() if n != "bros-strict"]  # strict BROS may stop by design (tests/test_bros.py)
SWAP = SwapCost(per_token_s=0.002, fixed_s=0.001)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 10))
    online = draw(st.booleans())
    reqs = []
    t = 0.0
    for i in range(n):
        if online:
            t += draw(st.sampled_from([0.0, 0.01, 0.5, 3.0]))
        reqs.append(Request(i, t, draw(st.integers(1, 40)), draw(st.integers(1, 24)),
                            request_class=draw(st.sampled_from([None, "rt", "be"]))))
    block = draw(st.sampled_from([1, 1, 4, 16]))
    peak = max(-(-r.peak_kv_tokens // block) * block for r in reqs)
    # Non-chunked schedulers need every prefill (refills up to I+O-1 included) to fit min(C, P).
    C = draw(st.integers(max(r.peak_kv_tokens for r in reqs), 96))
    P = draw(st.one_of(st.none(), st.integers(max(r.peak_kv_tokens for r in reqs), C)))
    M = draw(st.integers(peak, peak + peak // 3))
    Rmax = draw(st.one_of(st.none(), st.none(), st.integers(1, 6)))
    return reqs, Limits(C=C, P=P, M=M, Rmax=Rmax, block_size=block), draw(st.sampled_from(SCHEDULERS))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_schedule_obeys_the_semantics(case):
    reqs, limits, name = case
    affine = AffineCost(0.01, 0.001)
    res = simulate(reqs, name, limits, affine, swap_cost=SWAP)  # BROS swaps KV
    lim = res.schedule.limits
    event(f"evictions: {'yes' if res.summary['evictions'] else 'no'}")
    b, r = res.batches, res.requests.set_index("id")
    # Every request generates exactly O tokens, and all tokens are accounted for batch by batch.
    assert (r.generated_tokens == r.output_tokens).all()
    assert b.generated_tokens.sum() == sum(q.output_tokens for q in reqs)
    # Limits hold in every batch.
    assert (b.prefill_tokens + b.decode_tokens <= lim.C).all()
    assert (b.prefill_tokens <= lim.prefill_budget).all()
    assert (b.kv_tokens_peak <= lim.M).all()
    if lim.Rmax is not None:
        assert (b.running_peak <= lim.Rmax).all()
    # Time is consistent.
    assert (r.ttft_s <= r.latency_s + 1e-12).all()
    assert (r.first_token_s >= r.arrival_s).all()
    assert (b.start_s.iloc[1:].to_numpy() >= b.end_s.iloc[:-1].to_numpy()).all()
    if get_spec(name).eviction_free:
        assert res.summary["evictions"] == 0
        assert not any(batch.evict for batch in res.schedule.batches)
    # The saved schedule replays to identical metrics.
    again = replay(Schedule.from_json(json.loads(json.dumps(res.schedule.to_json()))), affine)
    pd.testing.assert_frame_equal(again.requests, res.requests)
    pd.testing.assert_frame_equal(again.batches, res.batches)
    assert again.summary == res.summary or _nan_equal(again.summary, res.summary)


def _nan_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x == y or (x != x and y != y) for x, y in zip(a.values(), b.values()))
