"""What a better schedule does differently (solvers/differences.py): the statistics by hand."""

from __future__ import annotations

import pytest
from conftest import AffineCost

from infermax.limits import Limits
from infermax.replay import replay
from infermax.request import Request
from infermax.schedule import Schedule, ScheduledBatch
from solvers.differences import differences, shape


def _valid(requests, batches) -> Schedule:
    """The schedule, after the replayer accepted it (so the statistics are read from a real schedule)."""
    schedule = Schedule(requests, Limits(C=64, M=100), batches)
    replay(schedule, AffineCost(0.01, 0.001))
    return schedule


def test_shape_by_hand():
    """r0 (I = 4, O = 2) and r1 (I = 2, O = 3). Batches: r0's prompt; r0's decode beside r1's prompt; r1's two decodes.
    Four batches, five items; three batches decode, one of them beside 2 prompt tokens; the longer r0 (6 tokens)
    finishes first (batch 1), r1 (5) last (batch 3): rank correlation −1."""
    reqs = [Request(0, 0.0, 4, 2), Request(1, 0.0, 2, 3)]
    s = _valid(reqs, [ScheduledBatch(items=[(0, 4)]), ScheduledBatch(items=[(0, 1), (1, 2)]),
                      ScheduledBatch(items=[(1, 1)]), ScheduledBatch(items=[(1, 1)])])
    got = shape(s)
    assert got.batches == 4
    assert got.requests_per_batch == pytest.approx(5 / 4)
    assert got.prompt_tokens_beside_decodes == pytest.approx(2 / 3)
    assert got.evictions == 0
    assert got.length_order == pytest.approx(-1.0)


def test_a_refill_after_an_eviction_is_prompt_work():
    """r0 (I = 3, O = 3) is evicted after its second token and refilled from scratch: its 3 prompt tokens and the 2
    generated ones, which give its third token. r1 (I = 1, O = 4) decodes beside that refill. Decoding batches: 1
    (both), 2 (r1) and 3 (r1 beside the 5-token refill)."""
    reqs = [Request(0, 0.0, 3, 3), Request(1, 0.0, 1, 4)]
    s = _valid(reqs, [ScheduledBatch(items=[(0, 3), (1, 1)]), ScheduledBatch(items=[(0, 1), (1, 1)]),
                      ScheduledBatch(items=[(1, 1)], evict=[0]), ScheduledBatch(items=[(0, 5), (1, 1)])])
    got = shape(s)
    assert got.evictions == 1
    assert got.prompt_tokens_beside_decodes == pytest.approx(5 / 3)


def test_identical_requests_have_no_length_order_and_differences_pair_the_two():
    reqs = [Request(i, 0.0, 2, 2) for i in range(3)]
    together = _valid(reqs, [ScheduledBatch(items=[(i, 2) for i in range(3)]),
                             ScheduledBatch(items=[(i, 1) for i in range(3)])])
    one_by_one = _valid(reqs, [ScheduledBatch(items=[(i, 2)]) for i in range(3)]
                        + [ScheduledBatch(items=[(i, 1)]) for i in range(3)])
    assert shape(together).length_order == 0.0
    d = differences(together, one_by_one)
    assert d["batches"] == [2, 6]
    assert d["requests_per_batch"] == [pytest.approx(3.0), pytest.approx(1.0)]


def test_differences_are_skipped_when_the_time_left_cannot_cover_them():
    reqs = [Request(i, 0.0, 2, 2) for i in range(3)]
    s = _valid(reqs, [ScheduledBatch(items=[(i, 2) for i in range(3)]),
                      ScheduledBatch(items=[(i, 1) for i in range(3)])])
    assert differences(s, s, seconds_left=0.0) is None  # 12 items need ~5 µs
    assert differences(s, s, seconds_left=1.0) is not None
