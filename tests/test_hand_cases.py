"""Small cases worked out by hand: exact batch sequences, times and metrics.

Cost model in every case: batch time = 1 + n_tokens seconds (see conftest.AffineCost).
"""

from __future__ import annotations

import math

import pytest
from conftest import AffineCost

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request


def batches_of(result):
    return [(list(b.items), list(b.evict)) for b in result.schedule.batches]


def times(result):
    return [(row.start_s, row.end_s) for row in result.batches.itertuples()]


def test_vllm_two_requests_prefill_then_decode(affine):
    reqs = [Request(0, 0.0, 2, 2), Request(1, 0.0, 2, 2)]
    res = simulate(reqs, "vllm", Limits(M=100), affine)
    # b0: both prompts (4 tokens, 5 s), each generates its first token; b1: both decode (2 tokens, 3 s).
    assert batches_of(res) == [([(0, 2), (1, 2)], []), ([(0, 1), (1, 1)], [])]
    assert times(res) == [(0.0, 5.0), (5.0, 8.0)]
    r = res.requests.set_index("id")
    assert list(r.ttft_s) == [5.0, 5.0]
    assert list(r.tpot_s) == [3.0, 3.0]
    assert res.summary["makespan_s"] == 8.0
    assert res.summary["tps"] == 4 / 8.0


def test_vllm_evicts_the_candidate_itself_then_refills(affine):
    # I=2, O=3: each request peaks at 4 KV tokens; M=5 holds only one at its peak.
    reqs = [Request(0, 0.0, 2, 3), Request(1, 0.0, 2, 3)]
    res = simulate(reqs, "vllm", Limits(M=5), affine)
    assert batches_of(res) == [
        ([(0, 2), (1, 2)], []),  # both prefill: KV 4
        ([(0, 1)], [1]),         # r1's decode does not fit (KV 6 > 5) and no one ranks below it: it evicts itself
        ([(0, 1)], []),          # r1's refill (I + g = 3 tokens) does not fit; r0 decodes its last token
        ([(1, 3)], []),          # r1 refills prompt + 1 generated token and generates its 2nd token
        ([(1, 1)], []),
    ]
    assert times(res) == [(0, 5), (5, 7), (7, 9), (9, 13), (13, 15)]
    r = res.requests.set_index("id")
    assert r.loc[0, "finish_s"] == 9 and r.loc[1, "finish_s"] == 15
    assert r.loc[1, "evictions"] == 1 and r.loc[1, "refilled_tokens"] == 3
    assert r.loc[1, "tpot_s"] == (15 - 5) / 2
    assert res.summary["evictions"] == 1


def test_vllm_victims_are_the_lowest_priority_running_requests(affine):
    # Three 2-token prompts fill M=6; r0's decode needs one more token: vLLM evicts from the tail (r2), not r1.
    reqs = [Request(i, 0.0, 2, 4) for i in range(3)]
    res = simulate(reqs, "vllm", Limits(M=6), affine)
    assert batches_of(res)[:2] == [([(0, 2), (1, 2), (2, 2)], []), ([(0, 1), (1, 1)], [2])]


def test_sarathi_victim_order_prefers_running_prefills(affine):
    # Sarathi ranks running decodes before running prefills, so a prefill that arrived *earlier*
    # than a decode is still the first victim (arrival order alone would pick r2).
    reqs = [Request(0, 0.0, 3, 6), Request(1, 0.0, 10, 1), Request(2, 0.0, 1, 6)]
    res = simulate(reqs, "sarathi", Limits(C=8, P=6, M=10), affine)
    seq = batches_of(res)
    assert seq[0] == ([(0, 3), (1, 3)], [])  # P=6 used up, r2 waits; KV 6
    # r1's next chunk (6 tokens) does not fit M and a prefill never evicts: Sarathi moves on to Rw, admits r2.
    assert seq[1] == ([(0, 1), (2, 1)], [])  # KV 8
    assert seq[2] == ([(0, 1), (2, 1)], [])  # KV 10 = M
    # r0's decode does not fit: the lowest-priority running request is r1 (prefill phase), not r2.
    assert seq[3] == ([(0, 1), (2, 1)], [1])
    assert res.requests.set_index("id").loc[1, "refilled_tokens"] == 3


def test_sarathi_chunks_prompts_under_P(affine):
    reqs = [Request(0, 0.0, 6, 2), Request(1, 0.0, 3, 1)]
    res = simulate(reqs, "sarathi", Limits(C=8, P=4, M=100), affine)
    assert batches_of(res) == [
        ([(0, 4)], []),            # r0's first chunk uses the whole prefill budget P=4; r1 gets 0 tokens
        ([(0, 2), (1, 2)], []),    # r0 completes its prompt (first token); r1 takes the remaining 2 of P
        ([(0, 1), (1, 1)], []),    # decode first: r0's last token, then r1's last prompt token (its only output)
    ]
    assert times(res) == [(0, 5), (5, 10), (10, 13)]
    r = res.requests.set_index("id")
    assert (r.loc[0, "ttft_s"], r.loc[0, "finish_s"], r.loc[1, "ttft_s"]) == (10, 13, 13)
    assert math.isnan(r.loc[1, "tpot_s"])


def test_vllm_ef_waits_instead_of_evicting(affine):
    reqs = [Request(0, 0.0, 2, 3), Request(1, 0.0, 2, 3)]
    res = simulate(reqs, "vllm-ef", Limits(M=5), affine)
    # r0 reserves I+O-1 = 4 of M=5, so r1 waits until r0 finishes.
    assert batches_of(res) == [([(0, 2)], []), ([(0, 1)], []), ([(0, 1)], []),
                               ([(1, 2)], []), ([(1, 1)], []), ([(1, 1)], [])]
    assert res.summary["makespan_s"] == 3 + 2 + 2 + 3 + 2 + 2
    assert res.summary["evictions"] == 0


def test_idle_engine_waits_for_the_next_arrival(affine):
    reqs = [Request(0, 0.0, 1, 1), Request(1, 10.0, 1, 1)]
    res = simulate(reqs, "vllm", Limits(), affine)
    assert times(res) == [(0, 2), (10, 12)]
    assert res.schedule.batches[1].not_before_s == 10.0
    r = res.requests.set_index("id")
    assert r.loc[1, "ttft_s"] == 2.0
    assert res.summary["makespan_s"] == 12.0


def test_block_size_rounds_kv_up(affine):
    # With 16-token blocks a 2-token prompt occupies 16 KV tokens: M=31 holds one request, not two.
    reqs = [Request(0, 0.0, 2, 1), Request(1, 0.0, 2, 1)]
    res = simulate(reqs, "vllm", Limits(M=31, block_size=16), affine)
    assert batches_of(res) == [([(0, 2)], []), ([(1, 2)], [])]
    assert res.batches["kv_tokens_peak"].tolist() == [16, 16]


def test_rmax_limits_running_requests(affine):
    reqs = [Request(i, 0.0, 1, 2) for i in range(3)]
    res = simulate(reqs, "vllm", Limits(M=100, Rmax=2), affine)
    assert batches_of(res)[0] == ([(0, 1), (1, 1)], [])
    assert res.batches["running_peak"].max() == 2


@pytest.mark.parametrize("name,expected_first", [("rank-i", [(1, 2), (0, 8)]), ("rank-o", [(0, 8), (1, 2)]),
                                                 ("rank-org", [(0, 8), (1, 2)])])
def test_rank_schedulers_order_by_key(affine, name, expected_first):
    reqs = [Request(0, 0.0, 8, 1), Request(1, 0.0, 2, 3)]
    res = simulate(reqs, name, Limits(M=100), affine)
    assert batches_of(res)[0] == (expected_first, [])


def test_a_candidate_that_evicts_itself_lets_the_ones_before_it_retry(affine):
    # Rank_O, C = P = 2, M = 6. r0 (I=1, O=3) prefills and decodes once (KV 2); r1 (I=5, O=1) arrives at 3,
    # ranks first and prefills 2 + 2 tokens (KV 6 = M). At t = 10 r1's last prompt token does not fit and, as a
    # prefill, it may not evict; r0's decode does not fit either and, ranked last, evicts itself. That frees 2
    # tokens, so r1 is tried again in the same batch. (Before, the batch carried only the eviction: the engine
    # ran nothing, and with no arrival left the run stopped with NoProgressError.)
    reqs = [Request(0, 0.0, 1, 3), Request(1, 3.0, 5, 1)]
    res = simulate(reqs, "rank-o", Limits(C=2, P=2, M=6), affine)
    assert batches_of(res) == [
        ([(0, 1)], []), ([(0, 1)], []),  # r0: prompt, 2nd token
        ([(1, 2)], []), ([(1, 2)], []),  # r1 ranks first (O = 1) and fills C
        ([(1, 1)], [0]),                 # r0 evicts itself, r1 finishes
        ([(0, 2)], []), ([(0, 1)], []),  # r0 refills I + g = 3 tokens in chunks of P = 2, then its 3rd token
    ]
    assert times(res)[-1] == (15.0, 17.0)


def test_running_prefills_that_fill_memory_may_evict_rather_than_deadlock(affine):
    # Rank_O (only decodes may evict), C = P = 2, M = 6. r0 (I=5, O=2) prefills 2 + 2 tokens; r1 (I=3, O=1)
    # arrives at 5, ranks first and prefills 2 (KV 6 = M). Both need one more token and both are in prefill: no one
    # may evict, and the batch would be empty for ever (NoProgressError before). One more pass lets running prefills
    # evict: r1 evicts r0 (ranked after it) and finishes; r0 starts over.
    reqs = [Request(0, 0.0, 5, 2), Request(1, 5.0, 3, 1)]
    res = simulate(reqs, "rank-o", Limits(C=2, P=2, M=6), affine)
    assert batches_of(res) == [
        ([(0, 2)], []), ([(0, 2)], []), ([(1, 2)], []),
        ([(1, 1)], [0]),
        ([(0, 2)], []), ([(0, 2)], []), ([(0, 1)], []), ([(0, 1)], []),
    ]
    assert res.requests.set_index("id").loc[0, "evictions"] == 1


def test_a_deadlock_after_a_self_eviction_is_broken_too(affine):
    # Rank_O, C = 32, P = 16, M = 38 (shrunk from a random case). r9's decode evicts itself first, which frees too
    # little for the prefills' chunks (a chunk shrinks for C and P, not for M); the prefills then evict in turn.
    rs = [(0.01, 23, 12), (0.02, 11, 3), (0.02, 3, 22), (0.03, 11, 4), (3.03, 18, 15), (3.53, 6, 12), (4.03, 29, 9),
          (4.03, 26, 5), (4.04, 25, 1), (4.05, 4, 23)]
    reqs = [Request(i, a, I, O) for i, (a, I, O) in enumerate(rs)]
    res = simulate(reqs, "rank-o", Limits(C=32, P=16, M=38), AffineCost(0.01, 0.001))
    assert (res.requests.generated_tokens == res.requests.output_tokens).all()
    assert all(b.items for b in res.schedule.batches)
    assert (res.batches.kv_tokens_peak <= 38).all()
