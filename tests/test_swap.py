"""KV swapping in the replayer (memory, holders, overlap timing, rules), and the Request fields and
Schedule format parts that go with it. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
from conftest import AffineCost

from infermax.costmodel.swap import SwapCost
from infermax.limits import Limits
from infermax.metrics import SimResult
from infermax.models import get_model
from infermax.replay import Replayer, ScheduleViolation, replay
from infermax.request import Request
from infermax.schedule import Schedule, ScheduledBatch

SWAP = SwapCost(per_token_s=0.5, fixed_s=1.0)


def _two_requests(limits=Limits(C=64, M=100, block_size=4)):
    # Batch time 1 + n_tokens (AffineCost); request 0: I=6, O=3; request 1: I=3, O=2.
    return Replayer([Request(0, 0.0, 6, 3), Request(1, 0.0, 3, 2)], limits, AffineCost(), SWAP)


def test_swap_out_frees_gpu_blocks_and_overlaps_compute():
    rp = _two_requests()
    rp.apply(ScheduledBatch(items=[(0, 6), (1, 3)]))  # 9 tokens: 10 s; KV blocks of 6 and 3 tokens: 8 + 4
    assert (rp.kv_tokens, rp.holders) == (12, 2)
    # Move 5 of request 0's 6 cached tokens out: 1 stays on the GPU (1 block = 4 tokens).
    rp.apply(ScheduledBatch(items=[(1, 1)], swap_out=[(0, 5)]))
    s0 = rp.states[0]
    assert (s0.m, s0.cpu_tokens, s0.gpu_tokens) == (6, 5, 1)
    # compute 1 + 1 = 2 s; swap-out 1 + 5 * 0.5 = 3.5 s; the batch lasts the longer: 3.5 s.
    assert rp.batch_rows[-1][2] == pytest.approx(3.5)
    # Request 1 finished in that batch and was freed: only request 0's GPU block remains.
    assert (rp.kv_tokens, rp.holders) == (4, 1)


def test_fully_swapped_request_holds_no_gpu_and_must_swap_in_before_running():
    rp = _two_requests()
    rp.apply(ScheduledBatch(items=[(0, 6), (1, 3)]))
    rp.apply(ScheduledBatch(items=[(1, 1)], swap_out=[(0, 6)]))
    assert (rp.kv_tokens, rp.holders) == (0, 0)
    with pytest.raises(ScheduleViolation, match="swapped-out"):
        rp.apply(ScheduledBatch(items=[(0, 1)]))
    rp.apply(ScheduledBatch(items=[(0, 1)], swap_in=[(0, 6)]))  # compute 2 s, swap-in 1 + 3 = 4 s
    assert rp.batch_rows[-1][2] == pytest.approx(4.0)
    s0 = rp.states[0]
    assert (s0.cpu_tokens, s0.swapped_out_tokens, s0.swapped_in_tokens, s0.generated) == (0, 6, 6, 2)
    assert (rp.kv_tokens, rp.holders) == (8, 1)  # 7 cached tokens: 2 blocks


def test_swap_rules():
    rp = _two_requests()
    rp.apply(ScheduledBatch(items=[(0, 6), (1, 3)]))
    with pytest.raises(ScheduleViolation, match="swap-out"):
        rp.apply(ScheduledBatch(items=[(1, 1)], swap_out=[(0, 7)]))  # only 6 on the GPU
    rp = _two_requests()
    rp.apply(ScheduledBatch(items=[(0, 6), (1, 3)]))
    with pytest.raises(ScheduleViolation, match="swap-in"):
        rp.apply(ScheduledBatch(items=[(1, 1)], swap_in=[(0, 1)]))  # nothing in host memory
    rp = _two_requests()
    rp.apply(ScheduledBatch(items=[(0, 6), (1, 3)]))
    with pytest.raises(ScheduleViolation, match="swap-out"):
        rp.apply(ScheduledBatch(items=[(1, 1)], evict=[0], swap_out=[(0, 1)]))
    no_model = Replayer([Request(0, 0.0, 2, 2)], Limits(), AffineCost())
    no_model.apply(ScheduledBatch(items=[(0, 2)]))
    with pytest.raises(ScheduleViolation, match="swap-cost"):
        no_model.apply(ScheduledBatch(items=[(0, 1)], swap_out=[(0, 1)]))


def test_eviction_drops_host_copy_too():
    rp = Replayer([Request(0, 0.0, 6, 3), Request(1, 0.0, 3, 3)], Limits(C=64, M=100, block_size=4),
                  AffineCost(), SWAP)
    rp.apply(ScheduledBatch(items=[(0, 6), (1, 3)]))
    rp.apply(ScheduledBatch(items=[(1, 1)], swap_out=[(0, 3)]))  # request 0: 3 on the GPU (4), 3 on the host
    assert rp.kv_tokens == 4 + 4
    rp.apply(ScheduledBatch(items=[(1, 1)], evict=[0]))  # request 1 finishes too
    s0 = rp.states[0]
    assert (s0.m, s0.cpu_tokens, s0.input_tokens, s0.evictions) == (0, 0, 7, 1)  # decode phase: Icur = I + g
    assert (rp.kv_tokens, rp.holders) == (0, 0)
    rp.apply(ScheduledBatch(items=[(0, 7)]))  # recompute from scratch, no swap-in needed
    assert rp.states[0].generated == 2


def test_memory_limit_counts_only_gpu_tokens():
    limits = Limits(C=64, M=8, block_size=1)
    rp = Replayer([Request(0, 0.0, 6, 2), Request(1, 0.0, 6, 2)], limits, AffineCost(), SWAP)
    rp.apply(ScheduledBatch(items=[(0, 6)]))
    with pytest.raises(ScheduleViolation, match=r"\[M\]"):
        rp.apply(ScheduledBatch(items=[(1, 6)]))  # 7 + 6 > 8
    rp = Replayer([Request(0, 0.0, 6, 2), Request(1, 0.0, 6, 2)], limits, AffineCost(), SWAP)
    rp.apply(ScheduledBatch(items=[(0, 6)]))
    rp.apply(ScheduledBatch(items=[(1, 6)], swap_out=[(0, 4)]))  # 2 + 6 = 8 on the GPU: allowed
    assert rp.kv_tokens == 8


def test_schedule_with_swaps_and_new_request_fields_round_trips_and_replays_identically():
    from infermax.engine import simulate

    reqs = [Request(0, 0.0, 6, 3, request_class="be"),
            Request(1, 0.0, 3, 2, ttft_slo_s=5.0, tpot_slo_s=3.0, request_class="rt", predicted_output_tokens=4)]
    sched = Schedule(reqs, Limits(C=64, M=100), [
        ScheduledBatch(items=[(0, 6), (1, 3)]),
        ScheduledBatch(items=[(1, 1)], swap_out=[(0, 6)]),
        ScheduledBatch(items=[(0, 1)], swap_in=[(0, 6)]),
        ScheduledBatch(items=[(0, 1)]),
    ], {"swap_cost": SWAP.to_dict()})
    back = Schedule.from_json(sched.to_json())
    assert back.requests == reqs
    assert back.batches[1].swap_out == [(0, 6)] and back.batches[2].swap_in == [(0, 6)]
    result = replay(back, AffineCost())
    # Batches: 10, max(2, 1 + 3) = 4, max(2, 4) = 4, 2 -> request 1 done at 14, request 0 at 20.
    assert result.requests.set_index("id").finish_s.to_dict() == {0: 20.0, 1: 14.0}
    assert result.requests.set_index("id").request_class.to_dict() == {0: "be", 1: "rt"}
    assert result.summary["swapped_out_tokens"] == result.summary["swapped_in_tokens"] == 6
    # Request 1: TTFT 10 > 5 and TPOT (14 - 10) / 1 = 4 > 3: both missed.
    row = result.requests.set_index("id").loc[1]
    assert (bool(row.ttft_ok), bool(row.tpot_ok)) == (False, False)
    assert result.summary["tpot_attainment"] == 0.0
    assert math.isnan(result.requests.set_index("id").loc[0].tpot_slo_s)
    # The engine records its swap model so replay() times swaps the same way.
    sim = simulate(reqs, "vllm", Limits(C=64, M=100), AffineCost(), swap_cost=SWAP)
    assert sim.meta["swap_cost"] == SWAP.to_dict()
    assert isinstance(replay(sim.schedule, AffineCost()), SimResult)


def test_swap_cost_for_system_from_kv_bytes_and_link():
    # Llama-2-7B: 2 * 32 layers * 32 heads * 128 dims * 2 bytes = 524288 bytes per token.
    cost = SwapCost.for_system("a100", "llama-2-7b", 1)
    assert get_model("llama-2-7b").kv_bytes_per_token(1) == 524288
    assert cost.per_token_s == pytest.approx(524288 / (32e9 * 0.8))
    assert SwapCost.for_system("h100", "llama-2-7b", 2).per_token_s == pytest.approx(262144 / (64e9 * 0.8))
    assert cost.time_s(0) == 0.0
