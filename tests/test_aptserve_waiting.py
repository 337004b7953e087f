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
        if n:  # (the heap of KV sizes, with its stale entries, against the columns)
            assert q._largest_kv() == float(q._head_kv[:n].max())
        assert len(q) == len(live)
        assert q.least_prefill_tokens() == min((s.input_tokens for s in live.values()), default=None)


def test_kv_heap_stays_small_while_buckets_open_and_close():
    """A bucket opened and closed again and again (a prefill size that arrives and is admitted) leaves stale heap
    entries behind; the heap is rebuilt from the open slots, and its top is still the largest open KV size."""
    q = WaitingQueue()
    q.append(RequestState(Request(0, 0.0, 7, 3)))
    for k in range(1, 400):
        s = RequestState(Request(k, float(k), 50 + k % 3, 3))
        q.append(s)
        assert len(q._kv_heap) <= 2 * len(q._slot) + 64
        assert q._largest_kv() == 50 + k % 3
        assert q.remove(k) is s
    assert q._largest_kv() == 7


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
        # what the head bounds take instead of reading the columns: the count of demoted slots, the largest KV size
        assert q._demoted_slots == int(q._head_demoted[:n].sum())
        if n:
            assert q._largest_kv() == float(q._head_kv[:n].max())
        # the fewest prefill tokens waiting, demoted or not (the scheduler's test for "nobody fits")
        assert q.least_prefill_tokens() == min((s.input_tokens for s in live.values()), default=None)


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


def test_identical_waiting_requests_are_expanded_only_when_the_greedy_reaches_them(monkeypatch):
    """200 identical offline requests under Rmax 1: each prefill batch admits one, and the density order must
    expand about one waiting request per batch, not every one (they tie in density; queue order settles ties)."""
    from conftest import AffineCost

    from infermax.engine import simulate
    from infermax.limits import Limits
    from infermax.workload import fixed

    expanded = [0]
    items = waiting.WaitingQueue.items

    def counting(self, now_s, bound, expand):
        def counted(s, p):
            expanded[0] += 1
            return expand(s, p)
        return items(self, now_s, bound, counted)

    monkeypatch.setattr(waiting.WaitingQueue, "items", counting)
    res = simulate(fixed(16, 3, 200), "aptserve-kv", Limits(C=4096, M=100_000, Rmax=1), AffineCost(0.01, 0.0005))
    assert len(res.batches) >= 600  # one request at a time: a prefill and two decodes each
    assert expanded[0] <= 2 * len(res.batches)  # before the twin rule: every waiting request on every batch (~60,000)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.booleans(), st.sampled_from(["near-zero", "decay"]), st.sampled_from([0.0, 0.4, 1.0]),
       st.sampled_from([0.0, 1e-3, 0.05]), st.integers(0, 40), st.integers(2, 400), st.sampled_from([1, 16]))
def test_density_bounds_agree_one_by_one_and_for_every_head(data, hybrid, demotion, decay, rho, n, capacity, block):
    """`_DensityBound.heads_array` (numpy, many buckets) gives exactly what its scalar call gives bucket by bucket,
    with −inf where the call says the request has no item (None): no form fits, or only the hidden form with a value
    below 0, which only a demotion decaying by 0 offers; and a request's items lie below its bound. Prompt sizes
    around ``capacity`` (both forms fit, only the hidden one, neither)."""
    from conftest import AffineCost

    from infermax.limits import Limits
    from infermax.schedulers.aptserve import AptServeOptions, AptServeScheduler, _DensityBound
    from infermax.schedulers.aptserve_greedy import feasible_items

    heads = data.draw(st.lists(st.tuples(st.integers(1, 3 * capacity), st.floats(0.0, 50.0), st.booleans()),
                               min_size=1, max_size=12))
    sched = AptServeScheduler(Limits(C=4096, M=100_000, block_size=block), AffineCost(0.01, 0.0005),
                              AptServeOptions(hybrid=hybrid, demotion=demotion, decay=decay, rho=rho))
    bound = _DensityBound(sched, n, capacity)
    now = 60.0
    sizes = [sched._prefill_sizes(t) for t, _, _ in heads]
    got = bound.heads_array(np.array([k for k, _ in sizes], dtype=float), np.array([h for _, h in sizes], dtype=float),
                            np.array([now - p for _, p, _ in heads]), now, np.array([d for _, _, d in heads]))
    for (t, p, d), b_array in zip(heads, got):
        p = now - (now - p)  # the pending time as the queue computes it from the ref
        b = bound(~t if d else t, p)
        assert (b_array == -np.inf) if b is None else b_array == b
        items = feasible_items(sched._candidate(RequestState(Request(0, 0.0, t, 2)), p, t, n, d), capacity)
        assert all(theta <= b for theta, _, _ in items) if b is not None else not items


@settings(max_examples=400, deadline=None)
@given(st.data(), st.booleans(), st.sampled_from(["near-zero", "decay"]), st.sampled_from([0.0, 0.4, 1.0]),
       st.sampled_from([0.0, 1e-3, 0.05, 2.0]), st.integers(0, 40), st.integers(1, 400), st.sampled_from([1, 16]))
def test_waiting_expander_is_feasible_items_of_the_candidate(data, hybrid, demotion, decay, rho, n, capacity, block):
    """`_waiting_expander`'s items of a waiting request are ``feasible_items(_candidate(...))``'s, the same floats:
    first-token and refill waits (TTFT / TBT targets, late or not, demoted either way), prompts around
    ``capacity`` (both forms fit, only the hidden one, neither), hidden values below 0 and at 0 (a pending time of 0),
    and round pending times, where densities tie (a strict comparison in place of any of the rule's fails here)."""
    from conftest import AffineCost

    from infermax.limits import Limits
    from infermax.schedulers.aptserve import AptServeOptions, AptServeScheduler
    from infermax.schedulers.aptserve_greedy import feasible_items

    sched = AptServeScheduler(Limits(C=4096, M=100_000, block_size=block), AffineCost(0.01, 0.0005),
                              AptServeOptions(hybrid=hybrid, demotion=demotion, decay=decay, rho=rho))
    expand = sched._waiting_expander(n, capacity)
    for _ in range(6):
        tokens = data.draw(st.integers(1, 3 * capacity))
        ttft, tbt = data.draw(st.sampled_from([None, 0.5, 5.0])), data.draw(st.sampled_from([None, 0.2, 2.0]))
        s = RequestState(Request(data.draw(st.integers(0, 9)), 0.0, tokens, 4, ttft, tbt))
        if data.draw(st.booleans()):
            s.last_token_s = 1.0  # a preempted request's refill: its TBT target applies
        p = data.draw(st.sampled_from([0.0, 1.0, 0.45, 3.0]) | st.floats(0.0, 20.0))
        want = [(theta, size, step, c) for c in (sched._candidate(s, p, tokens, n, sched.violates(s, p)),)
                for theta, size, step in feasible_items(c, capacity)]
        assert expand(s, p) == want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "front", "remove"]), st.integers(1, 12), st.integers(0, 40),
                          st.integers(1, 3)), min_size=1, max_size=100), st.floats(0, 50))
def test_unordered_queue_reads_the_same_queue_order(ops, now):
    """Without the order index (``ordered=False``, the greedy variants) the queue still iterates in queue order:
    arrivals at the back, each preempted group at the front in its own order; and the exact pending-time test,
    which walks that order when the running totals cannot decide, answers as the indexed queue does (at a time no
    earlier than any arrival, as the scheduler asks it: its margin assumes every pending time ≥ 0)."""
    ordered, unordered = WaitingQueue(), WaitingQueue(ordered=False)
    model, live, next_id = [], {}, 0
    for op, tokens, when, group in ops:
        if op == "remove" and live:
            rid = sorted(live)[when % len(live)]
            assert ordered.remove(rid) is unordered.remove(rid) is live.pop(rid)
            model.remove(rid)
            continue
        states = [RequestState(Request(next_id + k, float(when) / 4, tokens, 3)) for k in range(group)]
        next_id += group
        for q in (ordered, unordered):
            if op == "front":
                q.extendleft_in_order(states)
            else:
                for s in states:
                    q.append(s)
        ids = [s.id for s in states]
        model = ids + model if op == "front" else model + ids
        live.update((s.id, s) for s in states)
    assert [s.id for s in unordered] == [s.id for s in ordered] == model
    assert len(unordered) == len(ordered) == len(model)
    now += max((s.req.arrival_s for s in live.values()), default=0.0)  # every request has arrived: now − ref ≥ 0
    exact = sum(now - live[rid].req.arrival_s for rid in model)  # the float sum in queue order
    for total in (exact, np.nextafter(exact, np.inf), np.nextafter(exact, -np.inf), exact + 1.0):
        assert unordered.pending_sum_below(total, now) == ordered.pending_sum_below(total, now) == (total > exact)


def _queue_state(q: WaitingQueue) -> tuple:
    n = len(q._slot)
    return (q._entry, q._buckets, q._slot, q._head_tokens[:n].tolist(), q._head_refs[:n].tolist(),
            q._head_kv[:n].tolist(), q._head_hidden[:n].tolist(), q._head_demoted[:n].tolist(), q._slo_refs,
            q._undemoted, q._ref_sum, q._front, q._back, list(q._order) if q._order is not None else None)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "front", "remove"]), st.lists(st.integers(1, 5), min_size=1,
                                                                                  max_size=8),
                          st.integers(0, 12), st.sampled_from([None, 0.5, 3.0])), min_size=1, max_size=40),
       st.booleans())
def test_bulk_front_insert_equals_one_by_one(ops, ordered):
    """`extendleft_in_order` of a group (each size's bucket filed once: extended and sorted) leaves exactly the state
    of filing its requests one by one, last first, each at the next front position (one insort each): entries,
    buckets, slots in the same order, head arrays, the SLO heaps and sums, and the order index."""
    bulk, single = WaitingQueue(ordered=ordered), WaitingQueue(ordered=ordered)
    live, next_id = [], 0
    for op, sizes, when, slo in ops:
        if op == "remove" and live:
            rid = live.pop(when % len(live))
            bulk.remove(rid)
            single.remove(rid)
        else:
            states = [RequestState(Request(next_id + k, float(when + k % 2) / 4, tokens, 3, slo, slo))
                      for k, tokens in enumerate(sizes)]
            next_id += len(states)
            if op == "front":
                bulk.extendleft_in_order(states)
                for s in reversed(states):
                    single.extendleft_in_order([s])
            else:
                for s in states:
                    bulk.append(s)
                    single.append(s)
            live += [s.id for s in states]
        assert _queue_state(bulk) == _queue_state(single)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e7, 1e7) | st.sampled_from([0.0, -0.0, 5e-324]), min_size=1, max_size=6))
def test_fixed_point_times_are_exact_on_repeated_calls(xs):
    """`fixed` (``x · 2^_FIXED_BITS`` as an int; it remembers its last argument, which a plan asks for twice) equals
    the exact product on every call, repeats and signed zeros included."""
    from fractions import Fraction

    from infermax.schedulers.aptserve_waiting import _FIXED_BITS, fixed

    for x in xs + xs[::-1] + xs:
        assert fixed(x) == Fraction(x) * 2 ** _FIXED_BITS
