"""The ranking group kept sorted between batches, with waiting requests that cannot be admitted left out
(`Algorithm1Scheduler`, docs/design.md "Engine"): the same schedules as sorting Rr ∪ Rw every batch and trying
CanAllocate on every candidate."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
from test_engine_fast import LINEAR, assert_identical

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from infermax.schedulers import available, make_scheduler
from infermax.schedulers.algorithm1 import Algorithm1Scheduler
from solvers import search
from solvers.search_policies import WorkRankedScheduler

RANKING = ["rank-i", "rank-i-ef", "rank-o", "rank-o-ef", "rank-org", "rank-org-ef"]


def _reference(cls):
    """``cls`` as the ranking group was first written: Rr ∪ Rw sorted at every batch, CanAllocate on every
    candidate."""
    class SortEveryBatch(cls):
        skip_certain_failures = False

        def _groups(self):
            ranked = sorted([*self.running, *self.waiting], key=self._rank_key())
            return [(ranked, False)], [s for s in ranked if s.id in self._running_ids]

    return SortEveryBatch


@st.composite
def ranking_cases(draw):
    n = draw(st.integers(1, 60))
    online = draw(st.booleans())
    reqs, t = [], 0.0
    for i in range(n):
        if online:
            t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.1, 1.0]))
        reqs.append(Request(i, t, draw(st.integers(1, 300)), draw(st.integers(1, 120))))
    block = draw(st.sampled_from([1, 1, 4, 16]))
    peak = max(-(-r.peak_kv_tokens // block) * block for r in reqs)
    C = draw(st.integers(max(r.prompt_tokens for r in reqs), 600))  # rank-* chunk prefills; any C >= 1 would do
    M = draw(st.integers(peak, peak * 4))
    Rmax = draw(st.one_of(st.none(), st.integers(1, 12)))
    name = draw(st.sampled_from(RANKING + ["work-ranked", "work-ranked-ef"]))
    works = {r.id: draw(st.sampled_from([0.1, 0.2, 0.3])) * r.prompt_tokens + r.output_tokens for r in reqs}
    return reqs, Limits(C=C, M=M, Rmax=Rmax, block_size=block), name, works


@given(ranking_cases())
@settings(max_examples=120, deadline=None)
def test_ranked_group_plans_as_sorting_every_batch(case):
    reqs, limits, name, works = case
    if name.startswith("work-ranked"):
        policy = search._algorithm1_policy("rank-i-ef" if name.endswith("-ef") else "rank-i")
        fast, slow = (cls(limits, policy, works, name=name)
                      for cls in (WorkRankedScheduler, _reference(WorkRankedScheduler)))
    else:
        policy = search._algorithm1_policy(name)
        fast, slow = (cls(limits, policy, name=name) for cls in (Algorithm1Scheduler, _reference(Algorithm1Scheduler)))
    assert_identical(simulate(reqs, fast, limits, LINEAR), simulate(reqs, slow, limits, LINEAR))


ALGORITHM1 = [n for n in available() if isinstance(make_scheduler(n, Limits(), LINEAR)[0], Algorithm1Scheduler)]


def _outcome(scheduler, reqs, limits):
    """The run's result, or the error that ended it (type and message)."""
    try:
        return simulate(reqs, scheduler, limits, LINEAR)
    except Exception as exc:  # noqa: BLE001 (the two runs must end the same way)
        return f"{type(exc).__name__}: {exc}"


@given(ranking_cases(), st.data())
@settings(max_examples=150, deadline=None)
def test_skipping_certain_failures_changes_no_plan(case, data):
    """Every Algorithm 1 policy (FCFS groupings, chunked or not, with or without evictions, and the rankings) plans
    the same with the candidates that certainly fail CanAllocate skipped as with every CanAllocate called."""
    reqs, limits, _, _ = case
    name = data.draw(st.sampled_from(ALGORITHM1))
    fast, limits = make_scheduler(name, limits, LINEAR)
    slow, _ = make_scheduler(name, limits, LINEAR)
    slow.skip_certain_failures = False
    a, b = _outcome(fast, reqs, limits), _outcome(slow, reqs, limits)
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
    else:
        assert_identical(a, b)


def test_waiting_request_taken_on_a_chunk_cut_by_the_budget():
    """Found by random search against a `_waiting_closed` that took the first chunk at the whole budget C: decodes
    that open no block use tokens but no KV, so the token budget left can fall below the free KV, and a waiting
    request whose Icur exceeds the free KV is admitted on a chunk that short. The plan must keep such requests."""
    sizes = [(0.0, 60, 7), (0.01, 29, 2), (0.0, 32, 20), (0.0, 36, 7), (0.0, 3, 2), (0.0, 16, 15), (0.06, 40, 8)]
    reqs = [Request(i, t, prompt, output) for i, (t, prompt, output) in enumerate(sizes)]
    limits = Limits(C=17, P=17, M=116, block_size=16)
    fast, _ = make_scheduler("rank-org", limits, LINEAR)
    slow, _ = make_scheduler("rank-org", limits, LINEAR)
    slow.skip_certain_failures = False
    assert_identical(simulate(reqs, fast, limits, LINEAR), simulate(reqs, slow, limits, LINEAR))
