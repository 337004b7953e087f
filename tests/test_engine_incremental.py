"""The engine's incremental state is exact: results equal the item-by-item paths, totals equal rescans.

Reference: the same simulation with every incremental shortcut switched off — the Replayer's
plain-decoder path (its set is emptied before each batch, so every item takes the per-item rules),
Algorithm 1's group fast paths (its groups, and round robin's, are handed over as fresh lists, which the
identity checks never recognise) and its planned bookkeeping (forgotten after each plan, so `batch_done` examines the
batch item by item and rescans the KV in use) — and the decode fast-forward.
"""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from test_engine_fast import COSTS, LINEAR, SWAP, assert_identical, cases

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.metrics import SimResult
from infermax.replay import Replayer, ScheduleViolation, replay
from infermax.request import Request
from infermax.schedule import ScheduledBatch
from infermax.schedulers import available
from infermax.schedulers.algorithm1 import Algorithm1Scheduler
from infermax.schedulers.roundrobin import RoundRobinScheduler
from infermax.workload import fixed


@pytest.fixture
def item_by_item(monkeypatch):
    """Returns a context switch: inside ``with item_by_item():`` every incremental shortcut is off."""
    from contextlib import contextmanager

    @contextmanager
    def switch():
        apply, groups, plan = Replayer.apply, Algorithm1Scheduler._groups, Algorithm1Scheduler.next_batch
        rr_groups = RoundRobinScheduler._groups

        def apply_slow(self, batch):
            self.materialize()
            self.lazy_decoders = False
            self._plain.clear()
            return apply(self, batch)

        def groups_copied(self):
            gs, priority = (rr_groups if isinstance(self, RoundRobinScheduler) else groups)(self)
            if priority is None:  # decode_first: the decode list then the prefill list; a ranking: its running requests
                priority = self._priority()
            return [(list(c), stop) for c, stop in gs], list(priority)

        def plan_forgotten(self, now_s):
            batch = plan(self, now_s)
            self._planned = None
            return batch

        with monkeypatch.context() as m:
            m.setattr(Replayer, "apply", apply_slow)
            m.setattr(Algorithm1Scheduler, "_groups", groups_copied)
            m.setattr(RoundRobinScheduler, "_groups", groups_copied)
            m.setattr(Algorithm1Scheduler, "next_batch", plan_forgotten)
            yield

    return switch


@pytest.fixture
def checked_totals(monkeypatch):
    """After every `batch_done` of an Algorithm 1 scheduler, its incremental lists and KV total must equal
    what a rescan of the running requests gives (the pre-incremental definitions)."""
    done = Algorithm1Scheduler.batch_done
    calls = {"n": 0}

    def checked(self, batch, finished):
        done(self, batch, finished)
        calls["n"] += 1
        running, m = self.running, self.cached_tokens  # (a lazily advanced decoder's m field may lag)
        assert self._decoding == [s for s in running if m(s) >= s.input_tokens]
        assert self._prefilling == [s for s in running if m(s) < s.input_tokens]
        assert self._decode_items == [(s.id, 1) for s in self._decoding]
        if not self.policy.eviction_free:
            assert self._kv_used == sum(self.limits.blocks(m(s)) for s in running)
        if self.policy.grouping == "rank" and self._rank_key_fn is not None:  # the ranking group, kept sorted
            assert self._ranked == sorted([*running, *self.waiting], key=self._rank_key_fn)
            assert self._ranked_running == [s for s in self._ranked if s.id in self._running_ids]

    monkeypatch.setattr(Algorithm1Scheduler, "batch_done", checked)
    return calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases())
def test_incremental_equals_item_by_item(item_by_item, checked_totals, case):
    reqs, limits, name, cost_name = case
    cost = COSTS[cost_name]
    with item_by_item():
        slow = simulate(reqs, name, limits, cost, fast_forward=False, swap_cost=SWAP)
    fast = simulate(reqs, name, limits, cost, swap_cost=SWAP)
    assert_identical(slow, fast)
    # and a replay of the Schedule (plain decoders recognised from a saved schedule) reproduces it
    replayed = replay(fast.schedule, cost, swap_cost=SWAP)
    pd.testing.assert_frame_equal(fast.requests, replayed.requests)
    pd.testing.assert_frame_equal(fast.batches, replayed.batches)


@pytest.mark.parametrize("name", [n for n in available() if n != "bros-strict"])
@pytest.mark.parametrize("I, O, B, M, block", [(8, 64, 6, 100_000, 1), (64, 200, 40, 4000, 1), (30, 90, 20, 1500, 16),
                                               (100, 40, 60, 5000, 16)])
def test_incremental_equals_item_by_item_fixed(item_by_item, checked_totals, name, I, O, B, M, block):
    # Long decode phases, chunked prefills beside decodes, and (small M) evictions between them.
    reqs = fixed(I, O, B)
    limits = Limits(C=512, M=M, block_size=block)
    with item_by_item():
        slow = simulate(reqs, name, limits, LINEAR, fast_forward=False, swap_cost=SWAP)
    fast = simulate(reqs, name, limits, LINEAR, swap_cost=SWAP)
    assert_identical(slow, fast)


def test_checked_totals_see_algorithm1_batches(checked_totals):
    simulate(fixed(30, 20, 10), "sarathi", Limits(C=64, M=400), LINEAR)
    assert checked_totals["n"] > 0  # the invariant checks above really ran


def _decoding_replayer(lazy: bool) -> Replayer:
    rp = Replayer([Request(0, 0.0, 4, 10), Request(1, 0.0, 4, 10)], Limits(), LINEAR, lazy_decoders=lazy)
    rp.apply(ScheduledBatch(items=[(0, 4), (1, 4)]))
    rp.apply(ScheduledBatch(items=[(0, 1), (1, 1)]))  # both are plain decoders now
    assert rp._plain == {0, 1}
    return rp


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("batch, rule", [
    (ScheduledBatch(items=[(0, 1), (0, 1)]), "duplicate"),
    (ScheduledBatch(items=[(0, 1), (1, 1), (0, 1)]), "duplicate"),
    (ScheduledBatch(items=[(0, 2)]), "decode"),
    (ScheduledBatch(items=[(1, 1)], evict=[1]), "evict-and-process"),
    (ScheduledBatch(items=[(0, 1)], hidden=frozenset({0})), "cache-form"),
])
def test_plain_decoders_still_break_rules(batch, rule, lazy):
    rp = _decoding_replayer(lazy)
    rp.apply(ScheduledBatch(items=[(0, 1), (1, 1)]))  # with lazy_decoders, a batch of the whole cohort
    with pytest.raises(ScheduleViolation) as exc:
        rp.apply(batch)
    assert exc.value.rule == rule


@pytest.mark.parametrize("lazy", [False, True])
def test_plain_decoder_finishes_at_its_last_token(lazy):
    rp = _decoding_replayer(lazy)
    for _ in range(7):  # tokens 3..9 of 10
        assert rp.apply(ScheduledBatch(items=[(0, 1), (1, 1)])) == []
    finished = rp.apply(ScheduledBatch(items=[(1, 1), (0, 1)]))
    assert [s.id for s in finished] == [1, 0]  # in item order
    assert all(s.generated == 10 and s.finish_s == rp.clock_s for s in finished)
    assert rp._plain == set() and rp.kv_tokens == 0


def test_lazy_cohort_equals_eager_replayer():
    """Members finishing inside cohort batches, joiners, and a reordering that dissolves the cohort."""
    reqs = [Request(i, 0.0, 3 + i, 4 + 3 * i) for i in range(5)]
    tables = []
    for lazy in (False, True):
        rp = Replayer(reqs, Limits(block_size=4), LINEAR, lazy_decoders=lazy)
        rp.apply(ScheduledBatch(items=[(0, 3), (1, 4), (2, 2)]))
        left, step = {0, 1, 2, 3, 4}, 0
        while left:
            running = sorted(i for i in left if rp.states[i].finish_s is None)
            items = [(i, 1) if rp.cached_tokens(rp.states[i]) >= rp.states[i].input_tokens
                     else (i, rp.states[i].input_tokens - rp.cached_tokens(rp.states[i])) for i in running]
            if step == 5:
                items.reverse()  # a different order: the cohort is brought up to date, then re-formed
            for s in rp.apply(ScheduledBatch(items=items)):
                left.discard(s.id)
            step += 1
        rp.check_complete()
        assert rp._epoch > 0 if lazy else rp._epoch == 0  # cohort batches really happened
        tables.append(SimResult.from_replayer(rp))
    pd.testing.assert_frame_equal(tables[0].requests, tables[1].requests)
    pd.testing.assert_frame_equal(tables[0].batches, tables[1].batches)


def test_cohort_members_keep_their_token_times():
    """Requests with a TBT or TPOT target are plain decoders and cohort members too: their token times, filled
    in from the cohort batches' ends when they are brought up to date (a sync, a dissolving batch, their finish),
    equal the eager replayer's."""
    reqs = [Request(i, 0.0, 3 + i, 9, tbt_slo_s=0.1 if i % 2 else None, tpot_slo_s=0.1 if i == 2 else None)
            for i in range(4)]
    times, joined = [], []
    for lazy in (False, True):
        rp = Replayer(reqs, Limits(block_size=2), LINEAR, lazy_decoders=lazy)
        rp.apply(ScheduledBatch(items=[(i, 3 + i) for i in range(4)]))
        decode = [(i, 1) for i in range(4)]
        for step in range(8):
            if step == 3:
                rp.sync()  # up to date, cohort kept
            rp.apply(ScheduledBatch(items=decode if step != 5 else decode[::-1]))  # step 5 dissolves it
            joined.append(lazy and {1, 2, 3} <= rp._cohort_ids)
        rp.check_complete()
        times.append({i: list(rp.states[i].token_times) for i in (1, 2, 3)})
        assert all(len(t) == 9 for t in times[-1].values())
    assert times[0] == times[1]
    assert any(joined)


def _with_cohort(reqs: list[Request], members: int, lazy: bool) -> tuple[Replayer, list]:
    """A replayer (block size 2) in which requests 0..members − 1 (prompt 4 + i) prefilled and decoded once
    together, so that with ``lazy`` they form the cohort; returns it and their decode items."""
    rp = Replayer(reqs, Limits(block_size=2), LINEAR, lazy_decoders=lazy)
    rp.apply(ScheduledBatch(items=[(i, 4 + i) for i in range(members)]))
    decode = [(i, 1) for i in range(members)]
    rp.apply(ScheduledBatch(items=decode))  # the cohort forms
    return rp, decode


def test_cohort_survives_evictions_and_syncs():
    """A batch evicting some cohort members and decoding the rest in order stays a cohort batch, and `sync`
    brings members up to date without dissolving the cohort; tables equal the eager replayer's."""
    reqs = [Request(i, 0.0, 4 + i, 12) for i in range(4)]
    tables, epochs = [], []
    for lazy in (False, True):
        rp, decode = _with_cohort(reqs, 4, lazy)
        rp.apply(ScheduledBatch(items=decode))
        if lazy:
            rp.sync()
            assert [rp.states[i].m for i in range(4)] == [rp.cached_tokens(rp.states[i]) for i in range(4)]
            assert [rp.states[i].generated for i in range(4)] == [3] * 4
            assert rp._cohort_ids == {0, 1, 2, 3}  # kept
        epoch = rp._epoch
        rp.apply(ScheduledBatch(items=[(0, 1), (2, 1), (3, 1)], evict=[1]))  # evicts a member, decodes the rest
        epochs.append(rp._epoch - epoch)
        if lazy:
            assert rp._cohort_ids == {0, 2, 3}
        rp.apply(ScheduledBatch(items=[(0, 1), (2, 1), (3, 1), (1, rp.states[1].input_tokens)]))
        while rp.unfinished:
            running = [i for i in range(4) if rp.states[i].finish_s is None]
            rp.apply(ScheduledBatch(items=[(i, 1) for i in running]))
        tables.append(SimResult.from_replayer(rp))
    assert epochs == [0, 1]  # the eviction batch was applied to the cohort as a whole
    pd.testing.assert_frame_equal(tables[0].requests, tables[1].requests)
    pd.testing.assert_frame_equal(tables[0].batches, tables[1].batches)


@pytest.mark.parametrize("reindex", [2, 5, 32])
def test_cohort_keeps_its_order_through_many_leaves(monkeypatch, reindex):
    """Forty members leave the cohort one or a few at a time (finishes at different lengths, evictions of members
    at the front, middle and back, refills that rejoin at the end) while it stays a cohort: each leave searches only
    the places its item can have moved to, and the places are taken afresh every ``reindex`` leaves. Tables equal
    the eager replayer's, and every batch after the first decodes was a cohort batch."""
    from infermax import replay as replay_module

    monkeypatch.setattr(replay_module, "COHORT_REINDEX", reindex)
    leaves, drop = [], Replayer._drop_from_cohort
    monkeypatch.setattr(Replayer, "_drop_from_cohort", lambda self, rid: leaves.append(rid) or drop(self, rid))
    n = 40
    reqs = [Request(i, 0.0, 4 + i, 6 + (7 * i) % 29) for i in range(n)]  # (the prompts `_with_cohort` prefills)
    tables, epochs = [], []
    for lazy in (False, True):
        rp, _ = _with_cohort(reqs, n, lazy)
        order, waiting, step = list(range(n)), [], 0  # the decoders in item order; the evicted, by eviction
        while rp.unfinished:
            evict = [order[k] for k in (0, len(order) // 2, -1)] if step % 6 == 3 and len(order) > 6 else []
            decoders = [i for i in order if i not in evict]
            refills = waiting[:2]
            items = [(i, 1) for i in decoders] + [(i, rp.states[i].input_tokens) for i in refills]
            done = {s.id for s in rp.apply(ScheduledBatch(items=items, evict=evict))}
            order = [i for i in decoders if i not in done] + [i for i in refills if i not in done]  # refills join last
            waiting = waiting[len(refills):] + evict
            step += 1
        tables.append(SimResult.from_replayer(rp))
        epochs.append(rp._epoch)
    assert epochs[0] == 0 and epochs[1] >= len(tables[1].batches) - 2  # every batch after the first two: cohort
    assert len(leaves) > 40  # every member left it once at least, some more often
    pd.testing.assert_frame_equal(tables[0].requests, tables[1].requests)
    pd.testing.assert_frame_equal(tables[0].batches, tables[1].batches)


def test_cohort_survives_batches_with_other_hidden_items():
    """A batch that decodes the cohort first and also prefills or decodes other requests in hidden form stays a
    cohort batch (Apt-Serve's hybrid variants mix the two), and the hidden request's items are still checked; the
    tables equal the eager replayer's. Listing a member as hidden is still a cache-form violation."""
    reqs = [Request(i, 0.0, 4 + i, 9) for i in range(3)] + [Request(3, 0.0, 6, 5)]
    tables, epochs = [], []
    for lazy in (False, True):
        rp, decode = _with_cohort(reqs, 3, lazy)
        epoch = rp._epoch
        rp.apply(ScheduledBatch(items=[*decode, (3, 6)], hidden=frozenset({3})))  # request 3 prefills in hidden form
        rp.apply(ScheduledBatch(items=[*decode, (3, 1)], hidden=frozenset({3})))  # and decodes in it
        epochs.append(rp._epoch - epoch)
        if lazy:
            assert rp._cohort_ids == {0, 1, 2}
        probe, _ = _with_cohort(reqs, 3, lazy)
        probe.apply(ScheduledBatch(items=decode))
        with pytest.raises(ScheduleViolation) as exc:
            probe.apply(ScheduledBatch(items=decode, hidden=frozenset({1})))
        assert exc.value.rule == "cache-form"
        while rp.unfinished:
            running = [i for i in range(4) if rp.states[i].finish_s is None]
            rp.apply(ScheduledBatch(items=[(i, 1) for i in running], hidden=frozenset({3} & set(running))))
        tables.append(SimResult.from_replayer(rp))
    assert epochs == [0, 2]  # both mixed batches were applied to the cohort as a whole
    pd.testing.assert_frame_equal(tables[0].requests, tables[1].requests)
    pd.testing.assert_frame_equal(tables[0].batches, tables[1].batches)
