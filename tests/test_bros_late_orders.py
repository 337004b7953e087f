"""BROS keeps each target's RT requests in two orders, the late ones and the budget's candidates
(`bros_orders.RtOrders`, whose re-filed requests leave stale keys behind; `RtOrders.rank_keys`). Under direct
calls in any order (arrivals filed late and out of arrival order, a TTFT target equal to another request's TPOT
target, time going back), the priority order is still that of sorting every RT request by (slack, arrival, id),
the budget still the smallest slack with ``slack ≥ C({i})``, and every request's key is live in exactly one of
its target's two orders."""

from __future__ import annotations

import math
from itertools import islice
from unittest import mock

from conftest import AffineCost
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.costmodel.swap import SwapCost
from infermax.limits import Limits
from infermax.replay import RequestState
from infermax.request import Request
from infermax.schedulers import bros
from infermax.schedulers.bros import BrosScheduler

TIMES = [0.0, 0.2, 0.5, 0.9, 1.0, 1.4, 2.0, 3.0]
TARGETS = st.sampled_from([None, 0.5, 1.0, 3.0])  # shared by TTFT and TPOT targets on purpose


@st.composite
def rt_states(draw):
    """RT requests waiting (no token yet) or decoding (last token at some time), some with KV in host memory."""
    states = []
    for rid in range(draw(st.integers(1, 10))):
        arrival = draw(st.sampled_from(TIMES[:6]))
        s = RequestState(Request(rid, arrival, draw(st.integers(1, 5)), 4, ttft_slo_s=draw(TARGETS),
                                 tpot_slo_s=draw(TARGETS)))
        if draw(st.booleans()):  # decoding: m = prompt + generated − 1
            s.generated = draw(st.integers(1, 3))
            s.m = s.input_tokens + s.generated - 1
            s.last_token_s = arrival + draw(st.sampled_from([0.0, 0.1, 0.5]))
            s.cpu_tokens = draw(st.sampled_from([0, s.m]))
        states.append(s)
    return states


@settings(max_examples=300, deadline=None)
@given(rt_states(), st.data())
def test_late_and_candidate_orders_rank_and_budget_as_sorting_everything(states, data):
    sched = BrosScheduler(Limits(C=1000, M=10_000, block_size=1), AffineCost(0.1, 0.1))
    sched.swap_cost = SwapCost(per_token_s=0.3, fixed_s=0.1)
    unfiled, filed = list(states), []
    for _ in range(data.draw(st.integers(1, 12))):
        if unfiled and data.draw(st.booleans()):  # some of the rest arrive, in any order
            batch = data.draw(st.lists(st.sampled_from(unfiled), min_size=1, unique_by=id))
            sched.add_arrivals(batch)
            filed += batch
            unfiled = [s for s in unfiled if s not in batch]
        now = data.draw(st.sampled_from(TIMES))  # forward or back
        want = sorted((sched.slack(s, now), s.req.arrival_s, s.id) for s in filed)
        feasible = [slack for slack, _, rid in want if slack >= sched._solo_cost(states[rid])]
        assert sched.budget((), now) == min(feasible, default=math.inf)
        assert [item[:3] for item in sched._ranked(now)] == want
        orders = sched._orders
        assert orders.check() is None
        filed_keys = sorted(orders.live("late") + orders.live("cand"))
        assert filed_keys == sorted(sched._rt_target_key(s) for s in filed) and len(filed_keys) == len(filed)


def test_a_candidate_filed_below_a_late_request_is_ranked_by_merging():
    """The one case where a target's late requests do not all precede its candidates: a request filed after the
    budget found a later-arrived one late (a direct call; the engine files arrivals before planning). Cost 0.1 + 0.1
    per token, TTFT target 0.5. At t = 1: L (arrived at 1.0, 5 tokens) has slack 0.5 < C({L}) = 0.6: late. Then B
    (arrived at 0.9, 1 token) is filed: slack 0.4 ≥ C({B}) = 0.2, a candidate ranked before L."""
    late = RequestState(Request(0, 1.0, 5, 4, ttft_slo_s=0.5))
    early = RequestState(Request(1, 0.9, 1, 4, ttft_slo_s=0.5))
    sched = BrosScheduler(Limits(C=1000, M=10_000, block_size=1), AffineCost(0.1, 0.1))
    sched.add_arrivals([late])
    orders = sched._orders
    assert sched.budget((), 1.0) == math.inf and (0.5, orders.key[0]) in orders.live("late")
    sched.add_arrivals([early])
    assert sched.budget((), 1.0) == sched.slack(early, 1.0) and (0.5, orders.key[1]) in orders.live("cand")
    assert orders.late[0.5][-1] > orders.cand[0.5][0]
    assert [item[2] for item in sched._ranked(1.0)] == [1, 0]


REFS = [0.5, math.nextafter(0.5, 1.0), math.nextafter(math.nextafter(0.5, 1.0), 1.0), 0.7]  # the first three: one
# slack at t = 3 (3 − ref rounds to 2.5), so runs of different reference times tie


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(REFS), st.sampled_from([0.0, 0.1, 0.2, 0.3]), st.booleans(), TARGETS),
                min_size=1, max_size=60),
       st.sampled_from([1, 2, 3, 16]), st.sampled_from([3.0, 3.5]))
def test_long_runs_read_lazily_rank_as_sorting_everything(requests, lazy_run, now):
    """Many requests of one reference time make one run of equal slack; past ``LAZY_RUN`` keys its end is found by
    bisection and the rest yielded as read, unless the next reference time ties with it (drawn on purpose: reference
    times one ulp apart, whose requests' arrivals are not in reference-time order, so a tie reorders them). The order
    must still be that of sorting everything, read whole or in part."""
    states = []
    for rid, (ref, arrival, decoding, target) in enumerate(requests):
        s = RequestState(Request(rid, arrival if decoding else ref, 3, 4, ttft_slo_s=target, tpot_slo_s=target))
        if decoding:  # one token out at ``ref``
            s.generated, s.m, s.last_token_s = 1, 3, ref
        states.append(s)
    sched = BrosScheduler(Limits(C=1000, M=10_000, block_size=1), AffineCost(0.1, 0.1))
    sched.add_arrivals(states)
    want = sorted((sched.slack(s, now), s.req.arrival_s, s.id) for s in states)
    with mock.patch.object(bros, "LAZY_RUN", lazy_run):
        sched.budget((), now)
        assert [item[:3] for item in sched._ranked(now)] == want
        assert [item[:3] for item in islice(sched._ranked(now), 5)] == want[:5]
