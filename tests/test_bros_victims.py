"""FindPreemptBlock's RT victims, drawn lazily from the per-target holder lists (`_VictimStream`), come in
exactly the order of the straightforward code: every RT KV holder as (slack, arrival, id), sorted, those
after the requester's rank, most slack first. Slack ties between different reference times (floating-point
rounding of ``T − (now − ref)``) and a requester that is itself a holder are drawn on purpose. One stream
serves an iteration's calls, whose ranks only grow: each call gets what the straightforward code would
give it less the items earlier calls took."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.schedulers.bros import _VictimStream

NOW = 1e6  # large: ``NOW − ref`` rounds nearby reference times to one value, so their slacks tie
REFS = [0.0, 1e-11, 3e-11, 0.5, 0.5 + 1e-11, 2.0, NOW - 0.1, NOW - 0.3]


# holders as (slack target, reference time, arrival); a holder's id is its index
HOLDERS = st.lists(st.tuples(st.sampled_from([0.2, 0.4, 3.0]), st.sampled_from(REFS), st.sampled_from([0.0, 1.0, 2.0])),
                   min_size=1, max_size=25)


def _after(stream, rank, most=math.inf):
    """The ids ``stream.take_after(rank)`` gives, up to ``most`` of them (a FindPreemptBlock call drawing victims)."""
    got = []
    while len(got) < most:
        rid = stream.take_after(rank)
        if rid is None:
            break
        got.append(rid)
    return got


def _groups_and_full_sort(holders):
    """The per-target holder lists (keys (ref, arrival, id), sorted) and every holder's (slack, arrival, id), sorted:
    the straightforward order."""
    groups: dict[float, list] = {}
    flat = []
    for rid, (target, ref, arrival) in enumerate(holders):
        groups.setdefault(target, []).append((ref, arrival, rid))
        flat.append((target - (NOW - ref), arrival, rid))
    for group in groups.values():
        group.sort()
    return groups, sorted(flat)


@settings(max_examples=400, deadline=None)
@given(HOLDERS, st.data())
def test_lazy_rt_victims_match_sorting_every_holder(holders, data):
    groups, flat = _groups_and_full_sort(holders)
    # The requester's rank: one of the holders (it holds KV itself), or a point between them.
    rank = data.draw(st.one_of(st.sampled_from(flat),
                               st.tuples(st.sampled_from([f[0] for f in flat]), st.sampled_from([0.5, 1.0, 9.0]),
                                         st.integers(-1, 30))))
    expected = [rid for _, _, rid in reversed([f for f in flat if f > rank])]
    assert _after(_VictimStream(groups, NOW), rank) == expected


@settings(max_examples=300, deadline=None)
@given(HOLDERS, st.data())
def test_one_stream_serves_calls_with_growing_ranks(holders, data):
    """Calls with non-decreasing ranks, each taking a prefix of what it is offered: every call gets the items
    above its rank that no earlier call took, most slack first."""
    groups, flat = _groups_and_full_sort(holders)
    ranks = sorted(data.draw(st.lists(st.sampled_from([(-math.inf, 0.0, 0)] + flat), min_size=1, max_size=6)))
    stream, taken = _VictimStream(groups, NOW), set()
    for rank in ranks:
        offered = [f for f in reversed(flat) if f > rank and f[2] not in taken]
        want = data.draw(st.integers(0, len(offered) + 1))
        got = _after(stream, rank, want)
        assert got == [rid for _, _, rid in offered[:want]]
        taken.update(got)


def test_equal_slack_from_different_reference_times_is_ordered_by_arrival_then_id():
    a, b = 0.0, 1e-11
    assert a != b and 0.4 - (NOW - a) == 0.4 - (NOW - b)  # the premise: one slack from two reference times
    groups = {0.4: sorted([(a, 2.0, 0), (b, 1.0, 1), (a, 1.0, 2)])}
    assert _after(_VictimStream(groups, NOW), (-math.inf, 0.0, 0)) == [0, 2, 1]
