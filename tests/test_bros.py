"""BROS: bidirectional block manager, priority order and time budget, replacement guard, strict mode,
hybrid workloads and closed-loop submission. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import AffineCost
from hypothesis import example, given, settings
from hypothesis import strategies as st

from infermax.costmodel.swap import SwapCost
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.metrics import class_summary
from infermax.replay import Replayer, replay
from infermax.request import Request
from infermax.schedule import Schedule
from infermax.schedulers import NoProgressError, make_scheduler
from infermax.schedulers.bros import BrosOptions, BrosScheduler
from infermax.schedulers.bros_blocks import BE, RT, BiBlockManager, BlockError
from infermax.workloads_hybrid import hybrid

SWAP = SwapCost(per_token_s=0.5, fixed_s=1.0)


def _blocks(mgr):
    """Per block: (RT owner, RT slots, BE owner, BE slots)."""
    return [(mgr.rt_owner[b], mgr.rt_n[b], mgr.be_owner[b], mgr.be_n[b]) for b in range(mgr.num_blocks)]


# --- block manager -------------------------------------------------------------------------------

def test_be_fills_from_empty_slots_and_rt_preempts_with_lazy_checkpoints():
    mgr = BiBlockManager(2, 4)
    mgr.register(10, BE)
    mgr.register(20, RT)
    assert mgr.alloc_be(10, 6)  # a free block (4 slots), then 2 slots of the other free block
    assert _blocks(mgr) == [(None, 0, 10, 4), (None, 0, 10, 2)]
    # RT, 5 slots, no free block: (4) the BE-only block with the most empty slots (block 1, 2 empty): 2 slots;
    # (3) then overwrite its peer there: 2 tokens; (4) then the full BE-only block 0: overwrite 1 token.
    receipt = mgr.alloc_rt(20, 5)
    assert receipt is not None
    assert _blocks(mgr) == [(20, 1, 10, 3), (20, 4, 10, 0)]
    assert mgr.checkpointed == {10: 3} and mgr.gpu == {10: 3, 20: 5}
    mgr.check()
    # The BE owner with no slot left in block 1 is cleared at the end of the iteration.
    assert mgr.end_iteration() == {10: 3}
    assert _blocks(mgr) == [(20, 1, 10, 3), (20, 4, None, 0)]
    assert mgr.blocks == {10: [0], 20: [1, 0]}
    mgr.check()


def test_undo_returns_every_slot_and_checkpoint():
    mgr = BiBlockManager(2, 4)
    mgr.register(10, BE)
    mgr.register(20, RT)
    mgr.alloc_be(10, 6)
    receipt = mgr.alloc_rt(20, 5)
    mgr.undo_rt(20, receipt)
    assert _blocks(mgr) == [(None, 0, 10, 4), (None, 0, 10, 2)]
    assert mgr.checkpointed == {} and mgr.gpu == {10: 6, 20: 0}
    mgr.check()
    assert mgr.end_iteration() == {}


def test_never_two_rt_or_two_be_owners_in_a_block():
    mgr = BiBlockManager(2, 4)
    for rid, cls in ((1, RT), (2, RT), (3, BE), (4, BE)):
        mgr.register(rid, cls)
    assert mgr.alloc_rt(1, 2) is not None  # block A: RT 1 with 2 slots, 2 empty
    assert mgr.alloc_rt(2, 2) is not None  # not RT 1's block: the free block B
    assert mgr.alloc_rt(2, 2) is not None  # its own block B, now full
    # RT 2 needs one more: its own block is full, no free block, no BE peer, no BE-only block -> fails, unchanged.
    before = _blocks(mgr)
    assert mgr.alloc_rt(2, 1) is None
    assert _blocks(mgr) == before
    assert mgr.alloc_be(3, 1)  # the right side of RT 1's block (the only block without a BE owner with room)
    # BE 4 cannot join a block that has a BE owner, nor use RT slots: 1 empty slot left, but it is BE 3's.
    assert mgr.be_capacity(4) == 0 and not mgr.alloc_be(4, 1)
    assert mgr.alloc_be(3, 1)  # BE 3 grows in its own last block
    assert _blocks(mgr) in ([(1, 2, 3, 2), (2, 4, None, 0)], [(2, 4, None, 0), (1, 2, 3, 2)])
    mgr.check()


def test_drop_swaps_out_everything_and_release_frees():
    mgr = BiBlockManager(3, 4)
    mgr.register(1, RT)
    mgr.register(2, BE)
    mgr.alloc_rt(1, 5)
    mgr.alloc_be(2, 3)
    assert mgr.drop(2) == 3 and mgr.gpu[2] == 0
    assert mgr.end_iteration() == {2: 3}
    mgr.release(1)
    assert mgr.used_slots() == 0 and len(mgr.free) == 3
    mgr.check()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rt", "be", "undo", "drop", "release", "end"]), st.integers(0, 5),
                          st.integers(1, 9)), max_size=40))
@example([("be", 1, 1), ("drop", 1, 1), ("be", 1, 1)])  # a BE request given slots again after its drop (CI draw)
def test_random_operations_keep_the_invariants(ops):
    mgr = BiBlockManager(4, 4)
    receipts = {}
    for kind, rid, n in ops:
        cls = RT if rid % 2 == 0 else BE
        if rid not in mgr.cls:
            mgr.register(rid, cls)
        if kind == "rt" and cls == RT:
            r = mgr.alloc_rt(rid, n)
            if r is not None:
                receipts.setdefault(rid, []).append(r)
        elif kind == "be" and cls == BE and rid in mgr.dropped:  # outside the contract (bros_blocks): refused
            with pytest.raises(BlockError):
                mgr.alloc_be(rid, n)
        elif kind == "be" and cls == BE:
            mgr.alloc_be(rid, n)
        elif kind == "undo" and receipts.get(rid):
            mgr.undo_rt(rid, receipts[rid].pop())
        elif kind == "drop":
            mgr.drop(rid)
            receipts.pop(rid, None)
        elif kind == "release":
            mgr.release(rid)
            receipts.pop(rid, None)
        elif kind == "end":
            mgr.end_iteration()
            receipts.clear()  # receipts are valid within one iteration only
        mgr.check()
        assert mgr.used_slots() <= 16


# --- scheduler on hand-made states -----------------------------------------------------------------

def _bros(reqs, options=BrosOptions(), M=1000, now=0.0, cost=None):
    sched = BrosScheduler(Limits(C=1000, M=M, block_size=1), cost or AffineCost(1.0, 1.0), options)
    sched.swap_cost = SWAP
    rp = Replayer(reqs, Limits(C=1000, M=M), cost or AffineCost(1.0, 1.0), SWAP)
    sched.add_arrivals(list(rp.states.values()))
    return sched, rp


def test_priority_order_and_budget_skip_late_requests():
    # Cost = 1 + tokens. At t=2: A (I=3, TTFT 10): slack 8, alone 4 -> feasible; B (I=3, TTFT 4): slack 2,
    # alone 4 -> late; C (I=1, TTFT 5): slack 3, alone 2 -> feasible. Order B, C, A; budget = C's slack 3.
    reqs = [Request(0, 0.0, 3, 1, ttft_slo_s=10.0), Request(1, 0.0, 3, 1, ttft_slo_s=4.0),
            Request(2, 0.0, 1, 1, ttft_slo_s=5.0)]
    sched, rp = _bros(reqs)
    ranked = sorted(((sched.slack(s, 2.0), s.id) for s in rp.states.values()))
    assert ranked == [(2.0, 1), (3.0, 2), (8.0, 0)]
    batch = sched.next_batch(2.0)
    assert sched.last_budget_s == 3.0
    # B alone costs 4 > 3 but the head guard admits it; B + C costs 1 + 4 = 5 > 3: stop.
    assert batch.items == [(1, 3)]
    assert sched.b_curr == 128  # the RT loop stopped on the budget: B_curr resets to the base


def test_strict_budget_is_the_head_slack_and_fails_fast():
    reqs = [Request(0, 0.0, 3, 1, ttft_slo_s=10.0), Request(1, 0.0, 3, 1, ttft_slo_s=4.0),
            Request(2, 0.0, 1, 1, ttft_slo_s=5.0)]
    sched, _ = _bros(reqs, BrosOptions(strict=True))
    # Strict: budget = B's slack 2 < C({B}) = 4: lines 11-12 return an empty batch.
    with pytest.raises(NoProgressError, match="strict BROS"):
        sched.next_batch(2.0)
    assert sched.last_budget_s == 2.0
    with pytest.raises(NoProgressError, match="strict BROS"):  # through the engine: no hang
        simulate([Request(0, 0.0, 30, 2, ttft_slo_s=1.0)], BrosScheduler(Limits(M=100), AffineCost(), BrosOptions(strict=True)),
                 Limits(M=100), AffineCost(), swap_cost=SWAP)


def test_strict_be_loop_keeps_rmax_on_an_empty_batch():
    """Strict BROS's BE loop, on a batch the RT loop left empty, admitted a new KV holder past Rmax (the replayer
    rejected batch 39: 2 requests holding KV with Rmax = 1). Found by a random campaign (an H100 cost model, 80
    requests, reduced to these 12). It must stop there instead: strict mode then ends with its NoProgressError."""
    from infermax.costmodel import load_cost_model
    from infermax.schedulers.base import SchedulerError

    shapes = [(925, 125, "rt"), (1, 1, "rt"), (339, 12, "rt"), (460, 26, "rt"), (970, 11, "rt"), (26, 209, "rt"),
              (740, 15, "rt"), (25, 1, "be"), (586, 16, "rt"), (986, 12, "rt"), (13, 1, "rt"), (31, 30, "rt")]
    reqs = [Request(i, 0.3, p, o, request_class=c) for i, (p, o, c) in enumerate(shapes)]
    limits = Limits(C=1024, P=1017, M=1987, Rmax=1, block_size=1)
    cost, swap = load_cost_model(gpu="h100"), SwapCost.for_system("h100", "llama-2-7b", 1)
    try:
        result = simulate(reqs, "bros-strict", limits, cost, swap_cost=swap)
    except NoProgressError:
        pass
    except SchedulerError as exc:
        pytest.fail(f"bros-strict planned an invalid batch: {exc}")
    else:
        assert result.batches["running_peak"].max() <= 1
    assert simulate(reqs, "bros", limits, cost, swap_cost=swap).batches["running_peak"].max() <= 1


def test_replacement_of_the_least_urgent_rt_and_its_guard():
    # RT 0 (TTFT 5) more urgent than RT 1 (TTFT 9), BE 2; all I=1. Budget 5 (RT 0's slack at t=0).
    reqs = [Request(0, 0.0, 1, 2, ttft_slo_s=5.0), Request(1, 0.0, 1, 2, ttft_slo_s=9.0),
            Request(2, 0.0, 1, 2, request_class="be")]
    # B_curr = 2: RT 0, RT 1 selected; BE 2 does not pack (3 > 2): it replaces RT 1 (cost 1 + 2 = 3 <= 5).
    sched, _ = _bros(reqs, BrosOptions(base_batch=2, max_batch=2))
    assert sched.next_batch(0.0).items == [(0, 1), (2, 1)]
    # B_curr = 1: only RT 0 selected; replacing it would remove the most urgent request: the guard stops.
    sched, _ = _bros(reqs, BrosOptions(base_batch=1, max_batch=1))
    assert sched.next_batch(0.0).items == [(0, 1)]
    # Strict Algorithm 1 pops it anyway (line 26).
    sched, _ = _bros(reqs, BrosOptions(base_batch=1, max_batch=1, strict=True))
    assert sched.next_batch(0.0).items == [(2, 1)]


def test_adaptive_batch_size_doubles_without_budget_break():
    reqs = [Request(i, 0.0, 1, 3, ttft_slo_s=100.0) for i in range(3)]
    sched, _ = _bros(reqs, BrosOptions(base_batch=2, max_batch=8))
    assert sched.next_batch(0.0).items == [(0, 1), (1, 1)]  # B_curr = 2 binds, not the budget
    assert sched.b_curr == 4


def test_checkpoint_and_swap_in_schedule_by_hand():
    # Blocks of 4 slots, M = 8: 2 blocks. Cost 1 + tokens; swap 1 + 0.5/token.
    reqs = [Request(0, 0.0, 6, 3, request_class="be"), Request(1, 0.5, 5, 2, ttft_slo_s=100.0, tpot_slo_s=100.0)]
    sched = BrosScheduler(Limits(M=8, block_size=4), AffineCost(), BrosOptions(check=True))
    res = simulate(reqs, sched, Limits(M=8), AffineCost(), swap_cost=SWAP)
    got = [(b.items, b.swap_out, b.swap_in) for b in res.schedule.batches]
    assert got == [
        ([(0, 6)], [], []),  # t=0: BE prefill, blocks [BE 4], [BE 2 | 2 empty]; ends at 7
        # RT prefill, 5 slots: the 2 empty slots, 2 overwrites of its peer, then the full BE block's
        # first slot: 3 BE tokens checkpointed (lazily, only the overwritten ones). BE 0 skipped.
        ([(1, 5)], [(0, 3)], []),
        # RT decode: its last block (1 RT + 3 BE) is full, no free block: overwrite 1 more BE token.
        ([(1, 1)], [(0, 1)], []),
        # RT finished; BE swaps its 4 host tokens back in and decodes (4 + 1 slots: 2 empty in its block + 3).
        ([(0, 1)], [], [(0, 4)]),
        ([(0, 1)], [], []),
    ]
    # Times: 7; max(1 + 5, 1 + 0.5*3) = 6 -> 13; max(2, 1.5) = 2 -> 15; max(2, 1 + 2) = 3 -> 18; 2 -> 20.
    assert res.batches.end_s.tolist() == [7.0, 13.0, 15.0, 18.0, 20.0]
    r = res.requests.set_index("id")
    assert (r.swapped_out_tokens.tolist(), r.swapped_in_tokens.tolist()) == ([4, 0], [4, 0])


# --- engine: closed-loop groups, workloads, invariants ---------------------------------------------

def test_closed_loop_groups_are_released_on_completion_and_replay_identically():
    reqs = [Request(0, 0.0, 2, 2, closed_loop_group=0), Request(1, 0.0, 3, 1, closed_loop_group=0),
            Request(2, 0.0, 1, 1, closed_loop_group=1), Request(3, 10.0, 1, 1, closed_loop_group=2),
            Request(4, 0.0, 1, 1, closed_loop_group=3)]
    res = simulate(reqs, "vllm", Limits(C=64, M=100), AffineCost())
    r = res.requests.set_index("id")
    # vLLM: prefill 0 and 1 (5 tokens: 6 s, ends 6; 1 done), decode 0 (2 s, ends 8): group 0 done at 8.
    # Group 1 arrives at 8 (2 s, ends 10); group 2 at max(10, 10) = 10 (ends 12); group 3 at 12.
    assert r.arrival_s.to_dict() == {0: 0.0, 1: 0.0, 2: 8.0, 3: 10.0, 4: 12.0}
    assert r.finish_s.to_dict() == {0: 8.0, 1: 6.0, 2: 10.0, 3: 12.0, 4: 14.0}
    again = replay(Schedule.from_json(json.loads(json.dumps(res.schedule.to_json()))), AffineCost())
    pd.testing.assert_frame_equal(again.requests, res.requests)
    # With a horizon of 9 s, group 2 (due at 10) and later groups are never submitted.
    cut = simulate(reqs, "vllm", Limits(C=64, M=100), AffineCost(), closed_loop_until_s=9.0)
    assert sorted(cut.requests.id) == [0, 1, 2] and cut.meta["unreleased_requests"] == 2


def test_hybrid_workload_moments_and_classes():
    reqs = hybrid("sharegpt", rt_rate=50.0, duration_s=100.0, be_batch=10, be_groups=3, seed=1)
    rt = [r for r in reqs if r.request_class == "rt"]
    be = [r for r in reqs if r.request_class == "be"]
    assert abs(len(rt) - 5000) < 5 * 71  # Poisson(5000): within 5 standard deviations
    prompts = pd.Series([r.prompt_tokens for r in rt])
    outputs = pd.Series([r.output_tokens for r in rt])
    # Table 2: 222.76 / 256.36 and 234.51 / 268.50 (clipping at 2048 trims the tail slightly).
    assert prompts.mean() == pytest.approx(222.76, rel=0.06) and prompts.std() == pytest.approx(256.36, rel=0.15)
    assert outputs.mean() == pytest.approx(234.51, rel=0.06) and outputs.std() == pytest.approx(268.50, rel=0.15)
    assert len(be) == 30 and [r.closed_loop_group for r in be] == [k // 10 for k in range(30)]
    assert all(512 <= r.prompt_tokens <= 1024 and 32 <= r.output_tokens <= 128 for r in be)
    assert all(r.ttft_slo_s == 0.4 and r.tpot_slo_s == 0.2 for r in rt)


@pytest.mark.parametrize("name", ["bros", "vllm", "roundrobin"])
def test_hybrid_run_completes_every_request_within_memory(name):
    from infermax.costmodel import load_cost_model

    cost = load_cost_model("a100", "llama-2-7b", 1, kind="linear")
    reqs = hybrid("lmsys", rt_rate=6.0, duration_s=6.0, be_batch=24, seed=3)
    limits = Limits(C=8192, M=12_000, block_size=16)
    if name == "bros":
        sched, resolved = make_scheduler(name, limits, cost)
        sched.options = BrosOptions(check=True)
        assert resolved.block_size == 1 and sched.S == 16
    else:
        sched, resolved = make_scheduler(name, limits, cost)
    swap = SwapCost.for_system("a100", "llama-2-7b")
    res = simulate(reqs, sched, resolved, cost, swap_cost=swap, closed_loop_until_s=6.0)
    q = res.requests
    assert (q.generated_tokens == q.output_tokens).all()
    assert (res.batches.kv_tokens_peak <= limits.M).all()
    summary = class_summary(res)
    assert set(summary) == {"be", "rt"} and 0 <= summary["rt"]["tpot_gap_attainment"] <= 1
    again = replay(Schedule.from_json(json.loads(json.dumps(res.schedule.to_json()))), cost)
    pd.testing.assert_frame_equal(again.requests, res.requests)
