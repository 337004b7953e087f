"""The vectorised block manager (infermax/schedulers/bros_blocks.py: per-block owners and counts in numpy
arrays, a request's blocks as numpy chunks, taken and freed by vectorised indexing) reaches exactly the
states of the per-block manager it replaced (tests/bros_blocks_reference.py, commit 622b166) under random
operations: every block's owners and counts, every request's blocks in order, GPU tokens, KV holders, the
iteration's checkpointed and dropped tokens, and every return value; ``check()`` holds after each step."""

from __future__ import annotations

import pytest
from bros_blocks_reference import BiBlockManager as PerBlockManager
from hypothesis import example, given, settings
from hypothesis import strategies as st

from infermax.schedulers.bros_blocks import BE, RT, BiBlockManager, BlockError


def _observed(mgr):
    blocks = [(mgr.rt_owner[b], mgr.rt_n[b], mgr.be_owner[b], mgr.be_n[b]) for b in range(mgr.num_blocks)]
    return (blocks, mgr.blocks, dict(mgr.gpu), set(mgr.holders), dict(mgr.cls), dict(mgr.checkpointed),
            dict(mgr.dropped), len(mgr.free), sorted(mgr.free))


def _receipt_blocks(receipt):
    """A receipt with its free-block steps as plain lists (one manager keeps a numpy array there)."""
    return [("free", [int(b) for b in step[1]], step[2]) if step[0] == "free" else step for step in receipt]


KINDS = ["rt", "rt", "rt", "be", "be", "undo", "undo", "drop", "drop", "release", "end"]
OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 9), st.integers(1, 60),
                         st.sets(st.integers(0, 9), max_size=3)), min_size=10, max_size=80)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([1, 1, 2, 3, 4, 16]), st.integers(1, 64), OPS)
# an RT allocation overwrites BE 3's only slot, 3 is dropped with no GPU token left, the allocation is undone
@example(3, 21, [("rt", 1, 12, set()), ("rt", 2, 7, set()), ("be", 3, 1, set()), ("end", 0, 1, set()),
                 ("rt", 1, 42, set()), ("drop", 3, 1, set()), ("undo", 0, 1, set())])
def test_vectorised_manager_matches_the_per_block_manager(block_size, num_blocks, ops):
    new, ref = BiBlockManager(num_blocks, block_size), PerBlockManager(num_blocks, block_size)
    receipts: dict[int, list] = {}
    for kind, rid, n, protected in ops:
        cls = RT if rid % 3 else BE  # two RT requests to every BE one
        if rid not in new.cls:
            new.register(rid, cls)
            ref.register(rid, cls)
        protected = {p for p in protected if p % 3 == 0}  # BE requests only, as the scheduler would pass
        if kind == "rt" and cls == RT and rid not in receipts:  # one allocation per request per iteration
            assert new.rt_capacity(rid, protected) == ref.rt_capacity(rid, protected)
            a, b = new.alloc_rt(rid, n, protected), ref.alloc_rt(rid, n, protected)
            assert (a is None) == (b is None)
            if a is not None:
                assert _receipt_blocks(a) == _receipt_blocks(b)
                receipts[rid] = (a, b)
        elif kind == "be" and cls == BE and rid in new.dropped:  # outside the contract: refused (bros_blocks)
            with pytest.raises(BlockError):
                new.alloc_be(rid, n)
        elif kind == "be" and cls == BE:
            assert new.be_capacity(rid) == ref.be_capacity(rid)
            assert new.alloc_be(rid, n) == ref.alloc_be(rid, n)
        elif kind == "undo" and receipts:  # any pending receipt, not necessarily the latest
            rid = sorted(receipts)[n % len(receipts)]
            a, b = receipts.pop(rid)
            new.undo_rt(rid, a)
            ref.undo_rt(rid, b)
        elif kind == "drop" and rid not in receipts:  # the scheduler never drops a request it selected
            assert new.drop(rid) == ref.drop(rid)
        elif kind in ("release", "end"):
            # Releases happen between iterations (the scheduler's batch_done): close the iteration first.
            assert new.end_iteration() == ref.end_iteration()
            receipts.clear()
            if kind == "release":
                new.release(rid)
                ref.release(rid)
        new.check()
        assert _observed(new) == _observed(ref)
        assert [new.last_block(r, s) for r in range(10) for s in (RT, BE)] == \
            [ref.last_block(r, s) for r in range(10) for s in (RT, BE)]


def test_scattered_blocks_are_dropped_and_retaken_lowest_first_with_python_ints():
    """Interleaved single-block allocations scatter a request's blocks; dropping it frees exactly those, the
    next allocation takes the lowest free ones, and every count handed out is a plain int (they reach the
    Schedule's JSON)."""
    mgr = BiBlockManager(10, 1)
    for rid in (1, 2):
        mgr.register(rid, RT)
    for _ in range(4):  # decode-like: the two requests alternate single blocks 0..7
        mgr.alloc_rt(1, 1)
        mgr.alloc_rt(2, 1)
    assert mgr.blocks == {1: [0, 2, 4, 6], 2: [1, 3, 5, 7]}
    assert mgr.drop(1) == 4 and type(mgr.drop(1)) is int
    assert list(mgr.free) == [0, 2, 4, 6, 8, 9] and len(mgr.free) == 6
    receipt = mgr.alloc_rt(2, 3)  # lowest first: blocks 0, 2, 4
    assert mgr.blocks[2] == [1, 3, 5, 7, 0, 2, 4] and mgr.last_block(2, RT) == 4
    assert all(type(x) is int for step in receipt for x in step[1:] if not hasattr(x, "dtype"))
    mgr.undo_rt(2, receipt)
    assert mgr.blocks[2] == [1, 3, 5, 7] and list(mgr.free) == [0, 2, 4, 6, 8, 9]
    out = mgr.end_iteration()
    assert out == {1: 4} and all(type(k) is int and type(v) is int for k, v in out.items())
    assert all(type(v) is int for v in mgr.gpu.values()) and type(mgr.used_slots()) is int
    mgr.release(2)
    assert len(mgr.free) == 10 and mgr.blocks == {1: []}
    mgr.check()
