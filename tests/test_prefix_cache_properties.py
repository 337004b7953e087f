"""Property tests of prefix caching: random shared-prefix workloads x every scheduler that supports it.

Workloads draw prompts from shared templates (system prompts, few-shot examples) and multi-turn
chains (a later request quotes an earlier one's prompt and answer), so hits are decided by content.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
from conftest import AffineCost
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infermax.engine import caching_schedulers, simulate
from infermax.limits import Limits
from infermax.replay import Replayer, replay
from infermax.request import Request, output_segment
from infermax.schedulers import get_spec

CACHING = caching_schedulers()
COST = AffineCost(0.01, 0.001)


@st.composite
def shared_prefix_workloads(draw):
    template = [(100 + k, draw(st.integers(1, 24))) for k in range(3)]
    n = draw(st.integers(1, 10))
    online = draw(st.booleans())
    reqs: list[Request] = []
    t = 0.0
    for i in range(n):
        if online:
            t += draw(st.sampled_from([0.0, 0.01, 0.5]))
        content = list(template[:draw(st.integers(0, 3))])
        if reqs and draw(st.booleans()):  # a later turn: an earlier request's prompt and answer
            prev = draw(st.sampled_from(reqs))
            content = list(prev.content) + [(output_segment(prev.id), prev.output_tokens)]
        content.append((1000 + i, draw(st.integers(1, 12))))
        reqs.append(Request(i, t, sum(n for _, n in content), draw(st.integers(1, 12)), content=tuple(content)))
    block = draw(st.sampled_from([1, 4, 16]))
    peak = max(-(-r.peak_kv_tokens // block) * block for r in reqs)
    M = draw(st.integers(peak, 2 * peak))
    limits = Limits(C=draw(st.integers(16, 128)), M=M, Rmax=draw(st.one_of(st.none(), st.integers(1, 6))),
                    block_size=block, prefix_caching=True)
    return reqs, limits, draw(st.sampled_from(CACHING))


def _cache_never_exceeds_memory(result) -> None:
    """Replay the schedule batch by batch: referenced + cached blocks never exceed ⌊M/b⌋ blocks."""
    sched = result.schedule
    lim = sched.limits
    rp = Replayer(sched.requests, lim, COST)
    for batch in sched.batches:
        rp.apply(batch)
        assert rp.kv_tokens + lim.block_size * rp.prefix_cache.cached_blocks <= lim.M


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_workloads())
def test_caching_schedules_obey_the_semantics_and_replay_identically(case):
    reqs, limits, name = case
    res = simulate(reqs, name, limits, COST)
    event(f"hits: {'yes' if res.summary['prefix_hit_tokens'] else 'no'}")
    r = res.requests.set_index("id")
    assert (r.generated_tokens == r.output_tokens).all()
    assert (res.batches.kv_tokens_peak <= limits.M).all()
    if get_spec(name).eviction_free:
        assert res.summary["evictions"] == 0
    _cache_never_exceeds_memory(res)
    again = replay(res.schedule, COST)
    pd.testing.assert_frame_equal(res.requests, again.requests)
    pd.testing.assert_frame_equal(res.batches, again.batches)
    assert {k: v for k, v in again.summary.items()} == res.summary


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_workloads())
def test_with_caching_off_content_changes_nothing(case):
    reqs, limits, name = case
    off = replace(limits, prefix_caching=False)
    with_content = simulate(reqs, name, off, COST)
    without = simulate([replace(r, content=None) for r in reqs], name, off, COST)
    pd.testing.assert_frame_equal(with_content.requests, without.requests)
    pd.testing.assert_frame_equal(with_content.batches, without.batches)
    assert "prefix_hit_tokens" not in with_content.summary


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_workloads())
def test_caching_on_without_anything_to_hit_equals_caching_off(case):
    # Unique prompts and memory for every request at once: no hit is possible (no sharing, no eviction),
    # so caching must change neither a decision nor a time.
    reqs, limits, name = case
    unique = [replace(r, content=None) for r in reqs]
    roomy = replace(limits, M=sum(-(-r.peak_kv_tokens // limits.block_size) * limits.block_size for r in reqs),
                    Rmax=None)
    on = simulate(unique, name, roomy, COST)
    off = simulate(unique, name, replace(roomy, prefix_caching=False), COST)
    assert on.summary["prefix_hit_tokens"] == 0 and on.summary["evictions"] == 0
    pd.testing.assert_frame_equal(on.requests.drop(columns="prefix_hit_tokens"), off.requests)
    pd.testing.assert_frame_equal(on.batches, off.batches)
