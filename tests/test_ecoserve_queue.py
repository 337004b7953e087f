"""EcoServe's PT queue: the closest-fitting-PT search with a walk's memory of entries that no longer
qualify (``DeadEntries``) answers as a search that reads every entry each time (written out below)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.replay import RequestState
from infermax.request import Request
from infermax.schedulers.ecoserve_queue import DeadEntries, PromptQueue


# (prompt length, started tokens, deadline) per PT; (budget, head advance, a task looked at) per step; skipped ids
def WALKS(test):
    return settings(max_examples=300, deadline=None)(given(
        st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5), st.floats(0, 3)), min_size=1, max_size=60),
        st.lists(st.tuples(st.integers(1, 50), st.integers(0, 3), st.integers(0, 59)), max_size=40),
        st.sets(st.integers(0, 59)))(test))


def queue_of(prompts, with_started: bool) -> PromptQueue:
    """PTs of ``length + 1`` tokens; with ``with_started``, those with an odd second field have cached
    ``min(it, length)`` tokens."""
    q = PromptQueue(ordering=True, block_size=1)
    for i, (length, started, deadline) in enumerate(prompts):
        s = RequestState(Request(i, 0.0, length + 1, 1))
        if with_started:
            s.m = started % 2 * min(started, length)
        q.add(SimpleNamespace(s=s, deadline=deadline), 1.0)
    return q


def brute_closest_fit(q: PromptQueue, budget: int, head_key: tuple, gone) -> object | None:
    ok = [(rem, key) for rem, key in q.by_rem if rem <= budget and key >= head_key and not gone(q.task_of[key])]
    if not ok:
        return None
    best = max(rem for rem, _ in ok)
    return q.task_of[min(key for rem, key in ok if rem == best)]


@WALKS
def test_closest_fit_with_memory_matches_a_full_read(prompts, walk, skipped):
    q = queue_of(prompts, with_started=False)
    done: set[int] = set()

    def gone(t) -> bool:
        return t.s.id in done or t.s.id in skipped

    dead, head = DeadEntries(), 0
    for budget, advance, taken in walk:  # the head only advances, looked-at tasks join `done`
        head = min(head + advance, len(q.keys) - 1)
        head_key = q.keys[head]
        got = q.closest_fit(budget, head_key, gone, dead)
        assert got is brute_closest_fit(q, budget, head_key, gone)
        if got is not None and taken % 2:
            done.add(got.s.id)
        done.add(taken)


@WALKS
def test_closest_fit_passing_over_unstarted_answers_matches_repeated_calls(prompts, walk, skipped):
    """``pass_over``: one call answers as the caller's loop of calls that passes over unstarted answers."""
    q = queue_of(prompts, with_started=True)
    done_fast: set[int] = set()
    done_slow: set[int] = set()
    dead, head = DeadEntries(), 0
    for budget, advance, taken in walk:
        head = min(head + advance, len(q.keys) - 1)
        head_key = q.keys[head]
        got = q.closest_fit(budget, head_key, lambda t: t.s.id in done_fast or t.s.id in skipped, dead,
                            lambda t: done_fast.add(t.s.id))
        while True:  # the loop it replaces, on a full read
            want = brute_closest_fit(q, budget, head_key, lambda t: t.s.id in done_slow or t.s.id in skipped)
            if want is None or want.s.m > 0:
                break
            done_slow.add(want.s.id)
        assert got is want and done_fast == done_slow
        for done in (done_fast, done_slow):
            if got is not None and taken % 2:
                done.add(got.s.id)
            done.add(taken)
