"""FindPreemptBlock's RT victims, drawn lazily from the per-target holder lists (``_holders_after``), come in
exactly the order of the straightforward code: every RT KV holder as (slack, arrival, id), sorted, those
after the requester's rank, most slack first. Slack ties between different reference times (floating-point
rounding of ``T − (now − ref)``) and a requester that is itself a holder are drawn on purpose."""

from __future__ import annotations

import math
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.schedulers.bros import BrosScheduler

NOW = 1e6  # large: ``NOW − ref`` rounds nearby reference times to one value, so their slacks tie
REFS = [0.0, 1e-11, 3e-11, 0.5, 0.5 + 1e-11, 2.0, NOW - 0.1, NOW - 0.3]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.2, 0.4, 3.0]), st.sampled_from(REFS), st.sampled_from([0.0, 1.0, 2.0])),
                min_size=1, max_size=25),
       st.data())
def test_lazy_rt_victims_match_sorting_every_holder(holders, data):
    groups: dict[float, list] = {}
    flat = []
    for rid, (target, ref, arrival) in enumerate(holders):
        groups.setdefault(target, []).append((ref, arrival, rid))
        flat.append((target - (NOW - ref), arrival, rid))
    for group in groups.values():
        group.sort()
    flat.sort()
    # The requester's rank: one of the holders (it holds KV itself), or a point between them.
    rank = data.draw(st.one_of(st.sampled_from(flat),
                               st.tuples(st.sampled_from([f[0] for f in flat]), st.sampled_from([0.5, 1.0, 9.0]),
                                         st.integers(-1, 30))))
    expected = [rid for _, _, rid in reversed([f for f in flat if f > rank])]
    fake = SimpleNamespace(_holder_groups=groups, rt={rid: SimpleNamespace(id=rid) for rid in range(len(holders))},
                           _group_stream_desc=BrosScheduler._group_stream_desc)
    assert [s.id for s in BrosScheduler._holders_after(fake, rank, NOW)] == expected


def test_equal_slack_from_different_reference_times_is_ordered_by_arrival_then_id():
    a, b = 0.0, 1e-11
    assert a != b and 0.4 - (NOW - a) == 0.4 - (NOW - b)  # the premise: one slack from two reference times
    groups = {0.4: sorted([(a, 2.0, 0), (b, 1.0, 1), (a, 1.0, 2)])}
    fake = SimpleNamespace(_holder_groups=groups, rt={i: SimpleNamespace(id=i) for i in range(3)},
                           _group_stream_desc=BrosScheduler._group_stream_desc)
    assert [s.id for s in BrosScheduler._holders_after(fake, (-math.inf, 0.0, 0), NOW)] == [0, 2, 1]
