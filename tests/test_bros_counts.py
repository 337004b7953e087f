"""The count-only block manager (infermax/schedulers/bros_counts.py) against the block-faithful one
(bros_blocks.BiBlockManager) on RT-only operations; whole BROS runs without BE requests with either manager
(identical schedules), and against the straightforward reference scheduler (tests/bros_reference.py) on
random RT-only workloads."""

from __future__ import annotations

import pytest
from bros_reference import RefBrosScheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.costmodel import load_cost_model
from infermax.costmodel.swap import SwapCost
from infermax.schedulers.bros import BrosOptions, BrosScheduler
from infermax.schedulers.bros_blocks import BE, RT, BiBlockManager, BlockError
from infermax.schedulers.bros_counts import CountBlockManager
from infermax.workload import sampled, with_arrivals
from test_bros_equivalence import _run as _decisions
from test_bros_equivalence import hybrid_workloads

KINDS = ["rt", "rt", "rt", "rt", "undo", "undo", "drop", "drop", "release", "end"]
OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 7), st.integers(1, 40)), min_size=10, max_size=120)


def _observed(mgr, free_blocks):
    return (dict(mgr.gpu), set(mgr.holders), set(mgr.be_holders), dict(mgr.cls), dict(mgr.checkpointed),
            dict(mgr.dropped), free_blocks, mgr.used_slots())


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([1, 1, 2, 3, 4, 16]), st.integers(1, 48), OPS)
def test_counts_match_the_block_manager_without_be_requests(block_size, num_blocks, ops):
    new, ref = CountBlockManager(num_blocks, block_size), BiBlockManager(num_blocks, block_size)
    receipts: dict[int, tuple] = {}
    for kind, rid, n in ops:
        if rid not in ref.cls:
            new.register(rid, RT)
            ref.register(rid, RT)
        if kind == "rt" and rid not in receipts:  # one allocation per request per iteration (the scheduler's)
            assert new.rt_capacity(rid) == ref.rt_capacity(rid)
            a, b = new.alloc_rt(rid, n), ref.alloc_rt(rid, n)
            assert (a is None) == (b is None)
            if a is not None:
                assert sum(step[-1] for step in a) == sum(step[-1] for step in b) == n
                receipts[rid] = (a, b)
        elif kind == "undo" and receipts:  # any pending receipt, not necessarily the latest
            rid = sorted(receipts)[n % len(receipts)]
            a, b = receipts.pop(rid)
            new.undo_rt(rid, a)
            ref.undo_rt(rid, b)
        elif kind == "drop" and rid not in receipts:
            a, b = new.drop(rid), ref.drop(rid)
            assert a == b and type(a) is int
        elif kind in ("release", "end"):
            assert new.end_iteration() == ref.end_iteration()
            receipts.clear()
            if kind == "release":
                new.release(rid)
                ref.release(rid)
        new.check()
        assert _observed(new, new.free_blocks) == _observed(ref, len(ref.free))


def test_count_manager_refuses_be_requests_and_bad_states():
    mgr = CountBlockManager(4, 2)
    with pytest.raises(BlockError):
        mgr.register(1, BE)
    mgr.register(2, RT)
    assert mgr.alloc_rt(2, 3) == [("count", 3)] and mgr.free_blocks == 2 and mgr.rt_capacity(2) == 5
    assert mgr.alloc_rt(2, 6) is None and mgr.gpu[2] == 3
    mgr.free_blocks += 1  # a corrupted count is caught
    with pytest.raises(BlockError):
        mgr.check()


def _run(requests, count_blocks: bool, block_size: int):
    limits = Limits(C=16384, M=12000, block_size=1)
    # check: every iteration, the manager against the replayer (cheap for the counts; the block manager's
    # check walks every block, so the run it is compared with goes without)
    sched = BrosScheduler(limits, load_cost_model(), BrosOptions(block_size=block_size, count_blocks=count_blocks,
                                                                  check=count_blocks))
    result = simulate(requests, sched, limits, sched.cost_model, swap_cost=SwapCost.for_system("a100", "llama-2-7b", 1))
    return sched, result


@pytest.mark.parametrize("block_size", [1, 16])
def test_rt_only_runs_are_identical_with_counts(block_size):
    """Long prompts at 2 req/s in 12,000 KV slots: the run drops and swaps back in heavily (the regime where
    the counts pay off); every batch (items, swaps) and every request's times are the same either way."""
    requests = with_arrivals(sampled(40, "lognormal:2500:0.3:4000", "lognormal:200:1.0:2000", seed=3), "poisson",
                             rate_per_s=2.0, seed=3)
    fast, a = _run(requests, True, block_size)
    slow, b = _run(requests, False, block_size)
    assert isinstance(fast.mgr, CountBlockManager) and isinstance(slow.mgr, BiBlockManager)
    assert a.schedule.to_json() == b.schedule.to_json()
    assert sum(len(batch.swap_out) for batch in a.schedule.batches) > 50  # it did thrash


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid_workloads(max_be=0))
def test_rt_only_bros_with_counts_makes_the_reference_decisions(workload):
    """Random RT-only workloads (ties in slack, several targets, strict mode, Rmax, block sizes 1-16, tight
    memory): the scheduler runs on counts (`expect` saw no BE request) and decides as the reference does."""
    reqs, limits, options, cost, swap = workload
    try:
        ref = _decisions(RefBrosScheduler, reqs, limits, options, cost, swap)
    except Exception as e:  # the reference's own failures must be matched too
        with pytest.raises(type(e)):
            _decisions(BrosScheduler, reqs, limits, options, cost, swap)
        return
    checked = BrosOptions(**{**options.__dict__, "check": True})
    assert _decisions(BrosScheduler, reqs, limits, checked, cost, swap) == ref
    probe = BrosScheduler(limits, cost, options)
    probe.expect(reqs)
    assert isinstance(probe.mgr, CountBlockManager)
