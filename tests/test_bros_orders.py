"""BROS's RT orders (`infermax/schedulers/bros_orders.py`) leave a re-filed request's old key behind as a stale
entry instead of removing it. Under random filing (keys mostly above every filed key, sometimes below: the in-place
path), finishing, swapping out, budget scans that pop a prefix of the candidates into the late order, and time going
back, the live entries must be exactly a model's: per target, the priority order (`rank_keys`) is the sorted keys of
its requests, the holder order read from the back is its holders' keys descending, every request is live once, in
the candidates or the late order as the model says, and a target's deques stay within their compaction bound."""

from __future__ import annotations

from itertools import chain
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.schedulers import bros_orders
from infermax.schedulers.bros_orders import COMPACT_SLACK, RtOrders

TARGETS = [0.2, 0.4]


def _scan(orders: RtOrders, target: float, k: int) -> list:
    """What `BrosScheduler.budget` does to one target: drop stale front entries and move the first ``k`` live
    candidates to the late order. Returns the moved keys."""
    cand, moved = orders.cand.get(target), []
    while cand and len(moved) < k:
        key = cand[0]
        if orders.key.get(key[2]) is not key:
            cand.popleft()
            continue
        moved.append(cand.popleft())
    if moved:
        orders.mark_late(target, moved)
    if cand is not None and not cand:
        del orders.cand[target]
    return moved


def _live(keys, live: dict) -> list:
    return [k for k in keys if live.get(k[2]) is k]


def _rank_keys(orders: RtOrders, target: float):
    """`RtOrders.rank_keys` as one iterable (its list of deques read one after the other)."""
    order = orders.rank_keys(target)
    return chain.from_iterable(order) if isinstance(order, list) else order


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_stale_entries_leave_exactly_the_live_orders(data):
    """With the compaction slack drawn down to 0, so that rebuilds happen in small runs too."""
    with mock.patch.object(bros_orders, "COMPACT_SLACK", data.draw(st.sampled_from([0, 1, COMPACT_SLACK]))):
        _random_operations(data)


def _random_operations(data):
    orders = RtOrders()
    model: dict[int, list] = {}  # rid -> [target, key, late, holds]
    clock = 0.0
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["file", "file", "file", "forget", "swap_out", "scan", "back"]))
        if op == "file":  # a batch's requests (or arrivals): new keys, mostly the latest so far
            rids = data.draw(st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True))
            clock += data.draw(st.sampled_from([0.0, 0.5, 1.0]))
            ref = clock if data.draw(st.integers(0, 4)) else data.draw(st.sampled_from([0.0, clock / 2]))
            filed = []
            for rid in rids:
                target, holds = data.draw(st.sampled_from(TARGETS)), data.draw(st.booleans())
                key = (ref, float(rid % 3), rid)
                filed.append((target, key, holds))
                model[rid] = [target, key, False, holds]
            orders.file(filed)
            for target in {t for t, _, _ in filed}:
                most = 2 * orders.members.get(target, 0) + bros_orders.COMPACT_SLACK
                assert all(len(by.get(target, ())) <= most for by in (orders.cand, orders.late))
                assert len(orders.held.get(target, ())) <= 2 * orders.holding.get(target, 0) + bros_orders.COMPACT_SLACK
        elif op == "forget" and model:
            rid = data.draw(st.sampled_from(sorted(model)))
            orders.forget(rid)
            del model[rid]
        elif op == "swap_out" and model:
            rid = data.draw(st.sampled_from(sorted(model)))
            orders.stop_holding(rid)
            model[rid][3] = False
            target = model[rid][0]
            assert len(orders.held.get(target, ())) <= 2 * orders.holding.get(target, 0) + bros_orders.COMPACT_SLACK
        elif op == "scan":
            target = data.draw(st.sampled_from(TARGETS))
            candidates = sorted((v[1], rid) for rid, v in model.items() if v[0] == target and not v[2])
            k = data.draw(st.integers(0, len(candidates)))
            moved = _scan(orders, target, k)
            assert [key for key, _ in candidates[:k]] == moved
            for key in moved:
                model[key[2]][2] = True
        elif op == "back":
            orders.unmark_late()
            for v in model.values():
                v[2] = False
        assert orders.check() is None
        for target in TARGETS:
            mine = {rid: v for rid, v in model.items() if v[0] == target}
            assert _live(_rank_keys(orders, target), orders.key) == sorted(v[1] for v in mine.values())
            assert sorted(_live(orders.late.get(target, ()), orders.key)) == sorted(v[1] for v in mine.values() if v[2])
        groups = orders.holder_groups()
        for target in TARGETS:
            want = sorted((v[1] for v in model.values() if v[0] == target and v[3]), reverse=True)
            assert _live(reversed(groups.get(target, ())), orders.holder) == want


def test_compaction_keeps_memory_linear_in_the_requests():
    """One request re-filed 10,000 times leaves at most 2 + COMPACT_SLACK entries, not 10,000."""
    orders = RtOrders()
    for batch in range(10_000):
        orders.file([(0.2, (float(batch), 0.0, 7), True)])
    assert len(orders.cand[0.2]) <= 2 + COMPACT_SLACK and len(orders.held[0.2]) <= 2 + COMPACT_SLACK
    assert orders.live("cand") == [(0.2, (9999.0, 0.0, 7))] and orders.check() is None


def test_holder_order_stays_short_when_few_of_many_requests_hold_kv():
    """Thousands of requests under one target, two holding KV at a time, each dropped after it runs (BROS under
    Rmax 2): the holder deque is bounded by its holders, not by the target's requests, so the victim stream read from
    its back never passes the stale entries of the others."""
    orders = RtOrders()
    orders.file([(0.2, (0.0, 0.0, rid), False) for rid in range(5_000)])
    for batch in range(1, 2_000):
        ran = [(0.2, (float(batch), 0.0, rid), True) for rid in (2 * batch % 5_000, (2 * batch + 1) % 5_000)]
        orders.file(ran)
        for _, key, _ in ran:
            orders.stop_holding(key[2])
        assert len(orders.held.get(0.2, ())) <= 2 * orders.holding.get(0.2, 0) + COMPACT_SLACK
    assert orders.check() is None and orders.holding.get(0.2, 0) == 0


def test_check_names_each_broken_invariant():
    """`RtOrders.check` (run by BROS's `check` option) finds each kind of corruption: a deque out of key order, a
    request's key live twice or missing, a holder's key missing from the holders, and a wrong holder count."""
    def filed() -> RtOrders:
        orders = RtOrders()
        orders.file([(0.2, (1.0, 0.0, 1), True), (0.2, (2.0, 0.0, 2), False), (0.4, (3.0, 0.0, 3), True)])
        assert orders.check() is None
        return orders

    orders = filed()
    orders.cand[0.2].reverse()
    assert orders.check() == "an order is out of key order"
    orders = filed()
    orders.late[0.2] = bros_orders.deque([orders.key[1]])  # live in the late order as well as the candidates
    assert orders.check() == "the candidates and late orders do not hold each RT request's key once"
    orders = filed()
    orders.cand[0.4].clear()
    assert orders.check() == "the candidates and late orders do not hold each RT request's key once"
    orders = filed()
    orders.held[0.4].clear()
    assert orders.check() == "the holder order does not hold each holder's key once"
    orders = filed()
    orders.holding[0.2] += 1
    assert orders.check() == "the holder counts per target are wrong"


def test_refiling_pops_the_victims_stale_back_entries():
    """A batch's victims had the most slack, so their holder entries are the back of the holder deque; once they
    stop holding, re-filing the batch's items pops them before appending, instead of leaving them under the new
    holders for every later victim stream to read past."""
    orders = RtOrders()
    orders.file([(0.2, (float(i), 0.0, i), True) for i in range(4)])
    for rid in (2, 3):  # this batch's victims: the two most-slack holders
        orders.stop_holding(rid)
    orders.file([(0.2, (10.0, 0.0, 0), True)])  # the request the batch ran, re-filed
    held = list(orders.held[0.2])
    assert held[-1] == (10.0, 0.0, 0)
    assert (2.0, 0.0, 2) not in held and (3.0, 0.0, 3) not in held
