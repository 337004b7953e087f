"""The first-token-first candidate of the schedule search (solvers/search_ttft.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import AffineCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from solvers.search_ttft import FirstTokenScheduler


def test_waiting_prompt_evicts_a_running_request():
    """M = 4: A (I = 2, O = 3) prefills first (shorter prompt); B's 3-token prompt does not fit beside A's 2
    cached tokens, so batch 2 evicts A (it has its first token) and prefills B; vLLM makes B wait for A."""
    reqs = [Request(0, 0.0, 2, 3), Request(1, 0.0, 3, 2)]
    limits = Limits(C=8, M=4)
    cost = AffineCost(1.0, 0.0)
    ftf = simulate(reqs, FirstTokenScheduler(limits, cost), limits, cost)
    first, second = ftf.schedule.batches[:2]
    assert first.items == [(0, 2)] and not first.evict
    assert second.items == [(1, 3)] and second.evict == [0]
    vllm = simulate(reqs, "vllm", limits, cost)
    assert ftf.summary["mean_ttft_s"] == 1.5  # first tokens at the ends of batches 1 and 2
    assert vllm.summary["mean_ttft_s"] > ftf.summary["mean_ttft_s"]


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 10))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.01, 0.5]))
        reqs.append(Request(i, t, draw(st.integers(1, 40)), draw(st.integers(1, 24))))
    block = draw(st.sampled_from([1, 4, 16]))
    peak = max(-(-r.peak_kv_tokens // block) * block for r in reqs)
    C = draw(st.integers(max(r.peak_kv_tokens for r in reqs), 96))
    M = draw(st.integers(peak, peak + peak // 2))
    return reqs, Limits(C=C, M=M, Rmax=draw(st.one_of(st.none(), st.integers(1, 5))), block_size=block)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_request_finishes_under_the_replayer(case):
    reqs, limits = case
    cost = AffineCost(0.01, 0.001)
    result = simulate(reqs, FirstTokenScheduler(limits, cost), limits, cost)  # the replayer validates every batch
    assert (result.requests["generated_tokens"] == result.requests["output_tokens"]).all()
