"""vLLM V1 scheduler (`infermax.schedulers.vllm_v1`): hand-worked steps beside vLLM 0.33.0's code paths,
and properties on random workloads.

Line numbers ("L…") are of ``vllm/v1/core/sched/scheduler.py`` in the vLLM 0.33.0 wheel (commit
``g4ba787ec9``) unless another file is named. Expected batches were worked out by hand from those
paths (the comments give the arithmetic); block size 1 unless stated, so a decode from ``m`` needs one
KV token and a chunk of ``c`` needs ``c``.
"""

from __future__ import annotations

import json

import pandas as pd
from conftest import AffineCost
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import replay
from infermax.request import Request
from infermax.schedule import Schedule
from infermax.schedulers import get_spec, make_scheduler
from infermax.schedulers.vllm_v1 import V1Options, VllmV1Scheduler
from test_prefix_cache_properties import shared_prefix_workloads

COST = AffineCost(0.01, 0.001)
V1_NAMES = ("vllm-v1", "vllm-v1-priority", "vllm-v1-lpt512", "vllm-v1-noreserve")


def steps(reqs, scheduler, limits):
    """The batches a run plans, as ``(items, evict)`` pairs."""
    res = simulate(reqs, scheduler, limits, COST)
    return [(list(b.items), list(b.evict)) for b in res.schedule.batches]


def v1(limits, **options):
    return VllmV1Scheduler(limits, COST, V1Options(**options))


def test_registered_with_one_token_budget():
    # V1 has no prefill budget: max_num_batched_tokens is shared (L715 token_budget); P stays C.
    for name in V1_NAMES:
        assert get_spec(name).default_P is None
        _, limits = make_scheduler(name, Limits(C=300))
        assert limits.prefill_budget == 300
    assert make_scheduler("vllm-v1-lpt512", Limits())[0].options.long_prefill_token_threshold == 512
    assert make_scheduler("vllm-v1-priority", Limits())[0].options.policy == "priority"
    assert make_scheduler("vllm-v1-noreserve", Limits())[0].options.reserve_full_isl is False


def test_budget_shared_by_prefills_and_decodes():
    # C=10. Step 1, waiting loop (L1062-1570): A takes min(8, 10) = 8 (L1306, L1340), B the 2 left
    # (chunked prefill is always on). Step 2, running loop (L795-1036): A decodes 1, B gets its 4
    # remaining (L836-850). Step 3: both decode; A's third and B's second token finish them.
    reqs = [Request(0, 0.0, 8, 3), Request(1, 0.0, 6, 2)]
    assert steps(reqs, "vllm-v1", Limits(C=10, M=1000)) == [
        ([(0, 8), (1, 2)], []),
        ([(0, 1), (1, 4)], []),
        ([(0, 1), (1, 1)], []),
    ]


def test_running_requests_before_waiting_ones():
    # C=4. Step 1: A's first chunk takes the whole budget; the waiting loop stops at token_budget 0
    # (L1062). Step 2: the running loop first (L795) gives A its last 2 prompt tokens, then B is
    # admitted with the 2 left. B (O=1) finishes; step 3 is A's decode.
    reqs = [Request(0, 0.0, 6, 2), Request(1, 0.0, 2, 1)]
    assert steps(reqs, "vllm-v1", Limits(C=4, M=1000)) == [
        ([(0, 4)], []),
        ([(0, 2), (1, 2)], []),
        ([(0, 1)], []),
    ]


def test_long_prefill_token_threshold_and_alone_rule():
    # threshold 3, C=10. Steps 1-2: two requests are eligible (L757-763), so each gets at most 3
    # tokens (L1332-1333 waiting, L844-845 running): A 3 + B 3, then A 3 + B's last 2 (B, O=1,
    # finishes). Step 3: A is alone (1 running + 0 waiting), the threshold is off: its 6 left at once.
    reqs = [Request(0, 0.0, 12, 2), Request(1, 0.0, 5, 1)]
    limits = Limits(C=10, M=1000)
    assert steps(reqs, v1(limits, long_prefill_token_threshold=3), limits) == [
        ([(0, 3), (1, 3)], []),
        ([(0, 3), (1, 2)], []),
        ([(0, 6)], []),
        ([(0, 1)], []),
    ]


def test_fcfs_preempts_the_last_running_request_and_requeues_it_in_front():
    # M=10, C=100, three requests I=3, O=5, admitted together (3+3+3 = 9 KV, 1 free).
    # Step 2: A's decode takes the free token; B's allocate_slots fails (L914), so the last running
    # request, C, is preempted (L938, L970; _preempt_request L1799-1843: m = 0, front of waiting);
    # B then fits. No admission in a step that preempted (L1050).
    # Step 4: A's decode fails (A, B at m=5: 10 used); the last running request is B (L970).
    # Step 5: A finishes; B (Icur = 3 + 3 generated = 6) needs 6 > 3 free: head-of-line blocking.
    # Step 6: B (front, 6 tokens; its 4th token) and C (Icur = 3 + 1 = 4) are admitted: 10 KV, 0 free.
    # Step 7: B's decode (its 5th and last token) fails; C, the last, is preempted again (2 tokens
    # generated) and resumes alone at step 8 with Icur = 3 + 2 = 5.
    reqs = [Request(i, 0.0, 3, 5) for i in range(3)]
    assert steps(reqs, "vllm-v1", Limits(C=100, M=10)) == [
        ([(0, 3), (1, 3), (2, 3)], []),
        ([(0, 1), (1, 1)], [2]),
        ([(0, 1), (1, 1)], []),
        ([(0, 1)], [1]),
        ([(0, 1)], []),
        ([(1, 6), (2, 4)], []),
        ([(1, 1)], [2]),
        ([(2, 5)], []),
        ([(2, 1)], []),
        ([(2, 1)], []),
    ]


def test_no_admission_after_preemption_and_head_of_line_blocking():
    # M=9. Step 1: A and B (I=4) admitted, 1 KV free; D (I=1, O=1) arrives during step 1.
    # Step 2: A's decode takes the free token; B's fails and B, the last running request, preempts
    # itself (L978-980) and the FCFS running loop stops (L993-994). 4 tokens are free, D would fit,
    # but a step that preempted admits nobody (L1050).
    # Step 3: waiting = [B (front, Icur 4 + 1 = 5), D]; A decodes (3 free left); B needs 5: the
    # waiting loop stops at its head (allocate_slots None, L1454-1460) and D waits behind it.
    # Step 4: A finished; B (5) and D (1) are admitted; D finishes. Step 5: B's last decode.
    reqs = [Request(0, 0.0, 4, 3), Request(1, 0.0, 4, 3), Request(2, 0.001, 1, 1)]
    assert steps(reqs, "vllm-v1", Limits(C=100, M=9)) == [
        ([(0, 4), (1, 4)], []),
        ([(0, 1)], [1]),
        ([(0, 1)], []),
        ([(1, 5), (2, 1)], []),
        ([(1, 1)], []),
    ]


def test_priority_preempts_the_largest_priority_value_not_the_last():
    # X (priority 5) arrives at 0 and is admitted alone; Y (priority 0) arrives during step 1 and is
    # admitted in step 2 behind X's decode: running = [X, Y], 9 of M=9 used.
    # Step 3: X's decode fails. FCFS preempts the last, Y (L938): X decodes.
    # Priority preempts max (priority, arrival) = X itself (L932-936); it then goes on with the next
    # running request (L982-991), Y, which now fits. X re-enters with Icur = 4 + 2 = 6 once Y is done.
    reqs = [Request(0, 0.0, 4, 4, priority=5), Request(1, 0.001, 4, 4, priority=0)]
    limits = Limits(C=100, M=9)
    assert steps(reqs, "vllm-v1-priority", limits) == [
        ([(0, 4)], []),
        ([(0, 1), (1, 4)], []),
        ([(1, 1)], [0]),
        ([(1, 1)], []),
        ([(1, 1)], []),
        ([(0, 6)], []),
        ([(0, 1)], []),
    ]
    assert steps(reqs, "vllm-v1", limits) == [
        ([(0, 4)], []),
        ([(0, 1), (1, 4)], []),
        ([(0, 1)], [1]),
        ([(0, 1)], []),
        ([(1, 5)], []),
        ([(1, 1)], []),
        ([(1, 1)], []),
    ]


def test_priority_orders_the_waiting_queue_and_max_num_seqs_caps_running():
    # Rmax (max_num_seqs) = 1: the waiting loop stops once one request runs (L1071-1074). The
    # priority queue pops the lowest (priority, arrival, id) first (request_queue.py
    # PriorityRequestQueue, vllm/v1/request.py L357-367): B (priority 0) before A (priority 1).
    reqs = [Request(0, 0.0, 2, 1, priority=1), Request(1, 0.0, 2, 1, priority=0)]
    limits = Limits(C=100, M=100, Rmax=1)
    assert steps(reqs, "vllm-v1-priority", limits) == [([(1, 2)], []), ([(0, 2)], [])]
    assert steps(reqs, "vllm-v1", limits) == [([(0, 2)], []), ([(1, 2)], [])]


def test_max_num_seqs_counts_running_requests():
    # Rmax = 2, three requests: two admitted; while they decode the third waits (L1073), and it is
    # admitted once both finished.
    reqs = [Request(i, 0.0, 2, 2) for i in range(3)]
    assert steps(reqs, "vllm-v1", Limits(C=100, M=100, Rmax=2)) == [
        ([(0, 2), (1, 2)], []),
        ([(0, 1), (1, 1)], []),
        ([(2, 2)], []),
        ([(2, 1)], []),
    ]


def test_full_input_reservation_prevents_admit_then_preempt():
    # M=10, C=4, A and B with I=6, O=2.
    # Reserve (default, kv_cache_manager.py L531-548): in step 2 B's whole input (6) must fit the 4
    # free tokens, so B waits until A is done.
    # Without it (only the chunk is checked, L586) B's first 2 tokens are admitted in step 2, and in
    # step 3 B's next chunk (3) does not fit after A's decode: B, the last, preempts itself and loses
    # its progress (prefill phase: Icur stays 6).
    reqs = [Request(0, 0.0, 6, 2), Request(1, 0.0, 6, 2)]
    limits = Limits(C=4, M=10)
    tail = [([(1, 4)], []), ([(1, 2)], []), ([(1, 1)], [])]
    assert steps(reqs, "vllm-v1", limits) == [([(0, 4)], []), ([(0, 2)], []), ([(0, 1)], [])] + tail
    assert steps(reqs, "vllm-v1-noreserve", limits) == [
        ([(0, 4)], []), ([(0, 2), (1, 2)], []), ([(0, 1)], [1])] + tail


def test_block_granular_kv():
    # block 4, M=8: A (I=4) holds one block; its first decode (m=4, 4 % 4 == 0) opens a second
    # block. B (I=4) admitted in step 1 too (8 used); step 2: A's decode needs a block, none free:
    # B (last) is preempted and A decodes its last token. B comes back with Icur = 4 + 1 = 5, whose
    # two blocks (8) fit once A is done; completing that prefill gives its second and last token.
    reqs = [Request(0, 0.0, 4, 2), Request(1, 0.0, 4, 2)]
    assert steps(reqs, "vllm-v1", Limits(C=100, M=8, block_size=4)) == [
        ([(0, 4), (1, 4)], []),
        ([(0, 1)], [1]),
        ([(1, 5)], []),
    ]


# -- properties --------------------------------------------------------------------------------------

@st.composite
def workloads(draw):
    n = draw(st.integers(1, 10))
    online = draw(st.booleans())
    reqs, t = [], 0.0
    for i in range(n):
        if online:
            t += draw(st.sampled_from([0.0, 0.005, 0.05, 0.5]))
        reqs.append(Request(i, t, draw(st.integers(1, 40)), draw(st.integers(1, 30)),
                            priority=draw(st.sampled_from([None, 0, 1, 2]))))
    block = draw(st.sampled_from([1, 1, 2, 4, 16]))
    peak = max(-(-r.peak_kv_tokens // block) * block for r in reqs)
    C = draw(st.integers(1, 96))
    P = draw(st.one_of(st.none(), st.none(), st.integers(1, C)))
    M = draw(st.integers(peak, peak + peak // 2))
    Rmax = draw(st.one_of(st.none(), st.none(), st.integers(1, 6)))
    options = V1Options(policy=draw(st.sampled_from(["fcfs", "priority"])),
                        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 5, 16])),
                        reserve_full_isl=draw(st.booleans()))
    return reqs, Limits(C=C, P=P, M=M, Rmax=Rmax, block_size=block), options


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_properties_exact_outputs_kv_bound_replay_and_fast_path(case):
    reqs, limits, options = case
    res = simulate(reqs, VllmV1Scheduler(limits, COST, options), limits, COST)
    r, b = res.requests.set_index("id"), res.batches
    assert (r.generated_tokens == r.output_tokens).all()  # every request generates exactly O tokens
    assert (b.kv_tokens_peak <= limits.M).all()  # KV never exceeds M
    assert (b.prefill_tokens + b.decode_tokens <= limits.C).all()
    assert (b.prefill_tokens <= limits.prefill_budget).all()
    again = replay(Schedule.from_json(json.loads(json.dumps(res.schedule.to_json()))), COST)
    pd.testing.assert_frame_equal(again.requests, res.requests)
    pd.testing.assert_frame_equal(again.batches, res.batches)
    # The fast path and the fast-forward are shortcuts of V1's loop: walking every step request by
    # request, without fast-forward, plans the same batches.
    walker = VllmV1Scheduler(limits, COST, options)
    walker.always_walk = True
    slow = simulate(reqs, walker, limits, COST, fast_forward=False)
    assert [(x.items, x.evict) for x in slow.schedule.batches] == [(x.items, x.evict) for x in res.schedule.batches]


# -- with automatic prefix caching ---------------------------------------------------------------------

def cached_steps(reqs, scheduler, limits):
    """The batches a run plans, as ``(items, evict, cache_hits)`` triples."""
    res = simulate(reqs, scheduler, limits, COST)
    return [(list(b.items), list(b.evict), list(b.cache_hits)) for b in res.schedule.batches]


def test_hits_start_the_chunk_after_the_cached_prefix_capped_below_the_input():
    # block 4. A (system prompt 100 of 8 tokens + its own 4) runs and finishes; its full blocks stay
    # cached. B shares the system prompt: get_computed_blocks finds 2 cached blocks (8 tokens), and
    # the waiting loop computes only num_tokens - 8 = 4 (L1110-1130, L1306). C repeats A's prompt
    # exactly: all 3 blocks are cached, but the hit is capped at num_tokens - 1 = 11
    # (kv_cache_manager.py L294-302), i.e. 2 whole blocks, so C computes its last block's 4 tokens.
    a = Request(0, 0.0, 12, 1, content=((100, 8), (1, 4)))
    b = Request(1, 1.0, 12, 1, content=((100, 8), (2, 4)))
    c = Request(2, 2.0, 12, 1, content=((100, 8), (1, 4)))
    limits = Limits(C=100, M=64, block_size=4, prefix_caching=True)
    assert cached_steps([a, b, c], "vllm-v1", limits) == [
        ([(0, 12)], [], []),
        ([(1, 4)], [], [(1, 8)]),
        ([(2, 4)], [], [(2, 8)]),
    ]


def test_preempted_request_resumes_on_its_own_cached_prefix():
    # block 4, M=20 (5 blocks), A and B with unique 8-token prompts: 4 blocks after step 1.
    # Step 2: A's decode (m=8) opens a block, the last free one; B's decode needs one too and B, the
    # last running request, preempts itself (L978-980). Its 2 full blocks stay cached, unreferenced.
    # Steps 3-4: B (Icur = 8 + 1 = 9) would hit 8 tokens, but taking those 2 cached blocks out of the
    # free pool plus a new block for the rest needs 12 KV tokens > the 8 free (L531-548 counts the
    # cached blocks a hit touches as allocations, single_type_kv_cache_manager.py L256-266).
    # Step 5: A is done; B resumes on its own 8 cached tokens and computes 1.
    reqs = [Request(0, 0.0, 8, 4), Request(1, 0.0, 8, 4)]
    limits = Limits(C=100, M=20, block_size=4, prefix_caching=True)
    assert cached_steps(reqs, "vllm-v1", limits) == [
        ([(0, 8), (1, 8)], [], []),
        ([(0, 1)], [1], []),
        ([(0, 1)], [], []),
        ([(0, 1)], [], []),
        ([(1, 1)], [], [(1, 8)]),
        ([(1, 1)], [], []),
        ([(1, 1)], [], []),
    ]
    # Without caching B recomputes all 9 tokens.
    assert steps(reqs, "vllm-v1", Limits(C=100, M=20, block_size=4))[4] == ([(1, 9)], [])


def test_a_victim_sharing_blocks_frees_only_its_own():
    # block 4, M=20. A (system prompt 100 of 8 + 4 own, O=6) runs alone in step 1; B (same system
    # prompt) arrives during it. Step 2: B hits A's 2 registered blocks, which A still references, so
    # taking them costs no free KV; its own 4 tokens take a block; A's decode (m=12) takes the last.
    # Step 3: B's decode (m=12) needs a block, none free: B preempts itself. It frees only the block
    # no one else references (block_pool.py free_blocks: ref_cnt reaching 0), 4 tokens, not 12.
    # Steps 4-6: B (Icur 13) would hit 12 (A's 2 blocks + its own cached third) but needs 8 > 4.
    # Step 6's A decode (m=16) takes a block; memory is full, so B's cached third block is evicted
    # (least recently used). Step 7: A is done; B resumes on the 2 shared blocks and computes 5.
    a = Request(0, 0.0, 12, 6, content=((100, 8), (1, 4)))
    b = Request(1, 0.001, 12, 3, content=((100, 8), (2, 4)))
    limits = Limits(C=100, M=20, block_size=4, prefix_caching=True)
    assert cached_steps([a, b], "vllm-v1", limits) == [
        ([(0, 12)], [], []),
        ([(0, 1), (1, 4)], [], [(1, 8)]),
        ([(0, 1)], [1], []),
        ([(0, 1)], [], []),
        ([(0, 1)], [], []),
        ([(0, 1)], [], []),
        ([(1, 5)], [], [(1, 8)]),
        ([(1, 1)], [], []),
    ]


def test_two_requests_sharing_a_prefix_in_one_step_both_compute_it():
    # V1 caches a chunk's full blocks when it allocates them (kv_cache_manager.py allocate_slots,
    # cache_blocks), so a request admitted later in the same step could hit them. Here blocks are
    # registered at the end of the batch that computes them (docs/design.md, "Automatic prefix
    # caching"): both requests compute the shared 8 tokens; a third, later, hits them.
    reqs = [Request(0, 0.0, 12, 1, content=((100, 8), (1, 4))), Request(1, 0.0, 12, 1, content=((100, 8), (2, 4))),
            Request(2, 1.0, 12, 1, content=((100, 8), (3, 4)))]
    limits = Limits(C=100, M=64, block_size=4, prefix_caching=True)
    assert cached_steps(reqs, "vllm-v1", limits) == [
        ([(0, 12), (1, 12)], [], []),
        ([(2, 4)], [], [(2, 8)]),
    ]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_workloads(), st.sampled_from(["fcfs", "priority"]), st.sampled_from([0, 3]), st.booleans())
def test_with_caching_the_fast_path_equals_the_walk(case, policy, threshold, reserve):
    reqs, limits, _ = case
    options = V1Options(policy=policy, long_prefill_token_threshold=threshold, reserve_full_isl=reserve)
    res = simulate(reqs, VllmV1Scheduler(limits, COST, options), limits, COST)
    r = res.requests.set_index("id")
    assert (r.generated_tokens == r.output_tokens).all()
    assert (res.batches.kv_tokens_peak <= limits.M).all()
    walker = VllmV1Scheduler(limits, COST, options)
    walker.always_walk = True
    slow = simulate(reqs, walker, limits, COST, fast_forward=False)
    assert ([(x.items, x.evict, x.cache_hits) for x in slow.schedule.batches]
            == [(x.items, x.evict, x.cache_hits) for x in res.schedule.batches])


def test_eviction_free_variant_reserves_each_requests_peak_and_never_preempts():
    # M = 8 tokens, block 1, two requests I = 4, O = 4 (peak I + O - 1 = 7). vllm-v1 admits both in step
    # one (each needs its 4 input tokens: 8 <= 8), so the first decode step has no room and preempts the
    # last admitted. vllm-v1-ef admits one (7 <= 8, then 7 > 8 - 7 for the second) and the other only
    # after the first finished: no eviction; the second's first token comes 4 steps later.
    reqs = [Request(0, 0.0, 4, 4), Request(1, 0.0, 4, 4)]
    lim = Limits(C=64, M=8)
    plain = simulate(reqs, "vllm-v1", lim, AffineCost())
    free = simulate(reqs, "vllm-v1-ef", lim, AffineCost())
    assert plain.summary["evictions"] >= 1
    assert free.summary["evictions"] == 0
    items = [b.items for b in free.schedule.batches]
    assert items[:5] == [[(0, 4)], [(0, 1)], [(0, 1)], [(0, 1)], [(1, 4)]]
