"""The Apt-Serve waiting queue's bookkeeping behind the lazy density order: the per-size buckets'
heads kept in compact arrays (slots reused as buckets empty), and the chunked descending read of the
heads' bounds. (The decisions themselves are checked against the plain scheduler in
test_aptserve_equivalence.py.)"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.replay import RequestState
from infermax.request import Request
from infermax.schedulers.aptserve_waiting import WaitingQueue, _descending


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6) | st.just(-np.inf), max_size=300), st.integers(1, 8), st.integers(0, 20))
def test_descending_reads_every_finite_bound_in_order(bounds, first, lazy):
    tokens = np.arange(len(bounds), dtype=np.int64) + 1
    got = list(_descending(np.array(bounds, dtype=float), tokens, first, lazy))
    expected = sorted((-b, int(t)) for b, t in zip(bounds, tokens) if b > -np.inf)
    assert [g[0] for g in got] == [e[0] for e in expected]  # the bounds, nonincreasing
    assert sorted(got) == expected  # each finite entry once, with its own tokens


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12), st.integers(0, 20)), min_size=1, max_size=120))
def test_head_arrays_follow_adds_and_removes(ops):
    q, live, next_id = WaitingQueue(), {}, 0
    for add, tokens, when in ops:
        if add or not live:
            s = RequestState(Request(next_id, float(when), tokens, 3))
            (q.append if when % 2 else lambda x: q.extendleft_in_order([x]))(s)
            live[next_id] = s
            next_id += 1
        else:
            rid = sorted(live)[when % len(live)]
            assert q.remove(rid) is live.pop(rid)
        n = len(q._slot)
        heads = {int(t): float(r) for t, r in zip(q._head_tokens[:n], q._head_refs[:n])}
        expected = {}
        for s in live.values():
            expected[s.input_tokens] = min(expected.get(s.input_tokens, np.inf), s.req.arrival_s)
        assert heads == expected
        assert sorted(q._slot.values()) == list(range(n))
        assert len(q) == len(live)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "demote"]), st.integers(1, 6), st.integers(0, 20),
                          st.sampled_from([None, 0.5, 3.0])), min_size=1, max_size=120))
def test_demoted_buckets_hold_exactly_the_late_requests(ops):
    """After each `_demote(now)` a request is in its size's demoted bucket (key ~tokens) exactly when it was waiting
    then and ``now − arrival > TTFT target`` (time may go back: the demotions are undone); a request added since
    waits undemoted. The buckets' head arrays follow."""
    q, live, demoted, next_id = WaitingQueue(), {}, set(), 0
    for op, tokens, when, slo in ops:
        if op == "add" or not live:
            s = RequestState(Request(next_id, float(when), tokens, 3, slo, slo))
            (q.append if when % 2 else lambda x: q.extendleft_in_order([x]))(s)
            live[next_id] = s
            next_id += 1
        elif op == "remove":
            rid = sorted(live)[when % len(live)]
            assert q.remove(rid) is live.pop(rid)
            demoted.discard(rid)
        else:
            now = when / 2
            q._demote(now)
            demoted = {rid for rid, s in live.items() if slo_of(s) is not None and now - s.req.arrival_s > slo_of(s)}
        keys = {rid: ~s.input_tokens if rid in demoted else s.input_tokens for rid, s in live.items()}
        assert {rid: q._entry[rid][2] for rid in live} == keys
        n = len(q._slot)
        heads = {int(t): float(r) for t, r in zip(q._head_tokens[:n], q._head_refs[:n])}
        expected = {}
        for rid, s in live.items():
            expected[keys[rid]] = min(expected.get(keys[rid], np.inf), s.req.arrival_s)
        assert heads == expected
        assert [bool(d) for d in q._head_demoted[:n]] == [int(t) < 0 for t in q._head_tokens[:n]]


def slo_of(s: RequestState) -> float | None:
    return s.req.ttft_slo_s


# Both ways of computing the buckets' head bounds make the plain scheduler's decisions: the random
# workloads of test_aptserve_equivalence.py have few sizes (the loop), so they are run here with numpy
# for every bucket count, and a loaded queue with many sizes with the loop only.
from test_aptserve_equivalence import check_same, runs  # noqa: E402

import infermax.schedulers.aptserve_waiting as waiting  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(runs())
def test_numpy_heads_make_the_plain_decisions(run):
    old = waiting.NUMPY_HEADS
    waiting.NUMPY_HEADS = 0
    try:
        check_same(*run)
    finally:
        waiting.NUMPY_HEADS = old


def test_both_head_paths_on_a_loaded_queue_with_many_sizes(monkeypatch):
    import random

    from conftest import AffineCost

    from infermax.limits import Limits
    from infermax.schedulers.aptserve import AptServeOptions

    rng = random.Random(7)
    reqs = [Request(i, float(rng.randrange(0, 60)) / 3, rng.randrange(1, 400), rng.randrange(1, 30),
                    rng.choice([None, 4.0]), 0.5) for i in range(400)]
    for threshold in (0, 10**9):
        monkeypatch.setattr(waiting, "NUMPY_HEADS", threshold)
        for options in (AptServeOptions(rho=1e-4), AptServeOptions(rho=2e-3, demotion="decay"),
                        AptServeOptions(hybrid=False)):
            check_same(reqs, Limits(C=700, M=3000, block_size=4), options, AffineCost(0.01, 0.0005))
