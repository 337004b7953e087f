"""The engine detects schedulers that cannot make progress and rejects invalid plans."""

from __future__ import annotations

import pytest

from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from infermax.schedule import ScheduledBatch
from infermax.schedulers import NoProgressError, Scheduler, SchedulerError


class Scripted(Scheduler):
    """Plans batches from a function of the arrived requests and the batch index."""

    name = "scripted"

    def __init__(self, plan):
        super().__init__(Limits(M=100))
        self.plan, self.arrived, self.index = plan, [], 0

    def add_arrivals(self, arrived):
        self.arrived.extend(arrived)

    def next_batch(self, now_s):
        batch = self.plan(self.arrived, self.index)
        self.index += 1
        return batch

    def batch_done(self, batch, finished):
        pass


def test_an_empty_plan_with_nothing_left_to_arrive_is_reported(affine):
    with pytest.raises(NoProgressError, match="empty batch"):
        simulate([Request(0, 0.0, 4, 2)], Scripted(lambda arrived, j: ScheduledBatch()), Limits(M=100), affine)


def test_a_livelock_is_reported_not_run_forever(affine):
    # r0 prefills half its prompt, is evicted, starts again, forever; r1 only crawls through its
    # prompt one token at a time, so no token is generated for longer than the workload's 96 tokens.
    def plan(arrived, j):
        return ScheduledBatch(items=[(0, 2)]) if j % 2 == 0 else ScheduledBatch(items=[(1, 1)], evict=[0])

    reqs = [Request(0, 0.0, 4, 1), Request(1, 0.0, 90, 1)]
    with pytest.raises(NoProgressError, match="97 batches in a row without generating a token"):
        simulate(reqs, Scripted(plan), Limits(M=100), affine)


def test_evictions_planned_with_an_empty_batch_are_refused_not_dropped(affine):
    # r0 prefills, then the plan evicts it with no batch to run while r1 is still to arrive: the engine
    # idles until r1, and an idle step applies nothing, so the eviction would be lost and the scheduler's
    # view of who holds KV would part from the replayer's.
    def plan(arrived, j):
        return ScheduledBatch(items=[(0, 4)]) if j == 0 else ScheduledBatch(evict=[0])

    reqs = [Request(0, 0.0, 4, 3), Request(1, 5.0, 4, 1)]
    with pytest.raises(SchedulerError, match="evictions or swaps with an empty batch"):
        simulate(reqs, Scripted(plan), Limits(M=100), affine)


def test_an_invalid_plan_names_the_rule(affine):
    with pytest.raises(SchedulerError, match=r"\[C\]"):
        simulate([Request(0, 0.0, 8, 1)], Scripted(lambda arrived, j: ScheduledBatch(items=[(0, 8)])),
                 Limits(C=4, M=100), affine)


def test_idle_gaps_are_skipped_and_arrivals_respected(affine):
    reqs = [Request(i, 10.0 * i, 3, 2) for i in range(4)]
    res = simulate(reqs, "sarathi", Limits(M=100), affine)
    r = res.requests.set_index("id")
    assert (r.first_token_s > r.arrival_s).all()
    # Each request runs alone: prefill (1+3 s) then decode (1+1 s), starting at its arrival.
    assert r.latency_s.tolist() == [6.0] * 4
    assert res.summary["makespan_s"] == 30.0 + 6.0


def test_a_run_past_its_deadline_stops_and_says_where(affine):
    """A deadline already past stops the run at the first look at the clock (after `DEADLINE_CHECK_EVERY` batches),
    naming how far it got; a deadline it never reaches changes nothing."""
    import time

    from infermax.engine import DEADLINE_CHECK_EVERY, SimulationTimeout

    reqs = [Request(0, 0.0, 16, 3 * DEADLINE_CHECK_EVERY), Request(1, 0.0, 8, 5)]  # one batch per decode step
    with pytest.raises(SimulationTimeout, match=rf"after {DEADLINE_CHECK_EVERY - 1:,} batches, with 1 of 2"):
        simulate(reqs, "vllm", Limits(M=10_000), affine, fast_forward=False, deadline_s=time.perf_counter() - 1.0)
    free = simulate(reqs, "vllm", Limits(M=10_000), affine)
    timed = simulate(reqs, "vllm", Limits(M=10_000), affine, deadline_s=time.perf_counter() + 3600.0)
    assert timed.schedule.to_json() == free.schedule.to_json()
    assert timed.summary == free.summary


def test_a_large_run_looks_at_the_clock_before_its_first_batch(affine, monkeypatch):
    """Runs of more than `LARGE_RUN_REQUESTS` requests look at the clock from the first iteration (vLLM on 10^6
    requests ran 255 batches, 1.5 s, past a 1 s limit before its first look); smaller runs still wait for
    `DEADLINE_CHECK_EVERY` iterations. The threshold is lowered here so that two requests make a large run."""
    import time

    from infermax import engine
    from infermax.engine import SimulationTimeout

    reqs = [Request(0, 0.0, 16, 40), Request(1, 0.0, 8, 5)]
    small = simulate(reqs, "vllm", Limits(M=10_000), affine, fast_forward=False, deadline_s=time.perf_counter() - 1.0)
    assert small.summary["num_requests"] == 2  # 44 batches: never looked
    monkeypatch.setattr(engine, "LARGE_RUN_REQUESTS", 1)
    with pytest.raises(SimulationTimeout, match=r"after 0 batches, with 2 of 2"):
        simulate(reqs, "vllm", Limits(M=10_000), affine, fast_forward=False, deadline_s=time.perf_counter() - 1.0)
    timed = simulate(reqs, "vllm", Limits(M=10_000), affine, deadline_s=time.perf_counter() + 3600.0)
    assert timed.schedule.to_json() == small.schedule.to_json()


def test_a_fast_forward_under_a_deadline_looks_at_the_clock(affine, monkeypatch):
    """One request decoding many tokens is one fast-forward of all of them: under a deadline it stops every
    `FAST_FORWARD_UNDER_DEADLINE` copies to look at the clock (a 10^7-token decode ran minutes past a 5 s limit, at
    10 GB), and a deadline it never reaches still changes nothing."""
    import time

    from infermax import engine
    from infermax.engine import SimulationTimeout

    monkeypatch.setattr(engine, "FAST_FORWARD_UNDER_DEADLINE", 1000)
    reqs = [Request(0, 0.0, 16, 5000)]
    with pytest.raises(SimulationTimeout, match=r"after 1,002 batches, with 1 of 1"):  # prefill, decode, 1,000 copies
        simulate(reqs, "vllm", Limits(M=10_000), affine, deadline_s=time.perf_counter() - 1.0)
    free = simulate(reqs, "vllm", Limits(M=10_000), affine)
    timed = simulate(reqs, "vllm", Limits(M=10_000), affine, deadline_s=time.perf_counter() + 3600.0)
    assert timed.schedule.to_json() == free.schedule.to_json() and timed.summary == free.summary


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_restored_after_a_run_and_after_a_failed_one(affine, monkeypatch, enabled_before):
    # The loop turns automatic garbage collection off and collects the young generations itself (engine.py,
    # `_young_collections_only`); afterwards the collector is as the caller had it, also when the run raised.
    import gc

    import infermax.engine as engine

    collected, inside = [], []
    real_collect = gc.collect
    monkeypatch.setattr(engine, "GC_YOUNG_EVERY", 2)
    monkeypatch.setattr(engine.gc, "collect", lambda generation=2: collected.append(generation) or real_collect(
        generation))

    def one_token_at_a_time(arrived, j):
        inside.append(gc.isenabled())
        return ScheduledBatch(items=[(0, 1)])

    (gc.enable if enabled_before else gc.disable)()
    try:
        result = simulate([Request(0, 0.0, 8, 1)], Scripted(one_token_at_a_time), Limits(M=100), affine)
        assert len(result.schedule.batches) == 8
        assert gc.isenabled() == enabled_before
        with pytest.raises(SchedulerError):
            simulate([Request(0, 0.0, 8, 1)], Scripted(lambda arrived, j: ScheduledBatch(items=[(0, 8)])),
                     Limits(C=4, M=100), affine)
        assert gc.isenabled() == enabled_before
        assert inside and not any(inside)  # off inside the loop
        assert collected == [1, 1, 1, 1]  # the young generations, every second iteration of the first run
    finally:
        gc.enable()


def test_what_a_notebook_passes_by_mistake_is_refused_with_a_message(affine):
    """Found by probing the Python API (2026-12-01): an infinite arrival time passed Request's ``>= 0`` check and the
    run ended in an overflow error about the cost model; a list of tuples (an arrival table read by hand) ended in
    an AttributeError deep in the engine."""
    with pytest.raises(ValueError, match="arrival_s must be a finite number >= 0, got inf"):
        Request(0, float("inf"), 4, 2)
    with pytest.raises(ValueError, match="arrival_s must be a finite number >= 0, got nan"):
        Request(0, float("nan"), 4, 2)
    with pytest.raises(TypeError, match=r"requests must be infermax.request.Request objects, got tuple \(0, 0.0, 4, 2\)"):
        simulate([Request(1, 0.0, 4, 2), (0, 0.0, 4, 2)], "vllm", Limits(M=100), affine)
    late = simulate([Request(0, 1e9, 4, 2)], "vllm", Limits(M=100), affine)  # a late but finite arrival runs
    assert late.requests.finish_s.iloc[0] > 1e9


def test_numbers_from_numpy_are_accepted_and_stored_as_python_numbers(affine, tmp_path):
    """Found by probing the Python API (2026-12-02): a request built from a DataFrame row (np.int64 token counts)
    simulated, but its Schedule could not be saved ("Object of type int64 is not JSON serializable"); Limits refused
    np.int64(512) as "C must be an integer"; load_cost_model(tp=np.int64(2)) worked only by formatting."""
    import json

    import numpy as np

    from infermax.costmodel import load_cost_model

    r = Request(np.int64(0), np.float32(0.5), np.int64(4), np.int32(3), ttft_slo_s=np.float32(2.0), priority=np.int8(1))
    assert [type(getattr(r, f)) for f in ("id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_slo_s",
                                          "priority")] == [int, float, int, int, float, int]
    limits = Limits(C=np.int64(512), M=np.int64(1000), Rmax=np.int16(8), P=np.int64(256))
    assert Limits(prefix_caching=np.True_).prefix_caching is True
    assert json.loads(json.dumps(limits.to_dict())) == {"C": 512, "P": 256, "M": 1000, "Rmax": 8, "block_size": 1}
    result = simulate([r], "vllm", limits, affine)
    result.schedule.save(tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text())["requests"]
    assert load_cost_model(tp=np.int64(2)).name == load_cost_model(tp=2).name
    from infermax.costmodel.swap import SwapCost
    from infermax.models import kv_capacity_tokens

    m = kv_capacity_tokens("llama-2-7b", "a100", np.float32(0.9), np.int64(2))
    assert type(m) is int and m == kv_capacity_tokens("llama-2-7b", "a100", float(np.float32(0.9)), 2)
    assert SwapCost.for_system("a100", "llama-2-7b", np.int64(2)) == SwapCost.for_system("a100", "llama-2-7b", 2)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        kv_capacity_tokens("llama-2-7b", "a100", "0.9")


def test_simulate_and_load_cost_model_refuse_wrong_argument_types(affine):
    """Found by probing the Python API (2026-12-02): each of these ended in an AttributeError or a TypeError from
    inside the engine or pathlib ("unsupported operand type(s) for /: 'PosixPath' and 'NoneType'")."""
    from infermax.costmodel import load_cost_model

    reqs = [Request(0, 0.0, 4, 2)]
    with pytest.raises(TypeError, match="scheduler must be a registered scheduler's name .* got int 5"):
        simulate(reqs, 5, Limits(M=100), affine)
    with pytest.raises(TypeError, match=r"limits must be an infermax.limits.Limits .* got dict \{'C': 5\}"):
        simulate(reqs, "vllm", {"C": 5}, affine)
    with pytest.raises(TypeError, match="cost_model must be a cost model .* got str 'linear'"):
        simulate(reqs, "vllm", Limits(M=100), "linear")
    with pytest.raises(TypeError, match="swap_cost must be an infermax.costmodel.swap.SwapCost .* got str 'a100'"):
        simulate(reqs, "vllm", Limits(M=100), affine, swap_cost="a100")
    for name in ("deadline_s", "closed_loop_until_s"):
        with pytest.raises(TypeError, match=f"{name} must be a number of seconds or None, got str '5'"):
            simulate(reqs, "vllm", Limits(M=100), affine, **{name: "5"})
    with pytest.raises(ValueError, match="gpu must be a name .* got None"):
        load_cost_model(gpu=None)
    for tp in ("2", True, 0, 1.0):
        with pytest.raises(ValueError, match="tp must be an integer >= 1"):
            load_cost_model(tp=tp)
    with pytest.raises(ValueError, match="arrival_s must be a number, got None"):
        Request(0, None, 4, 2)
    with pytest.raises(ValueError, match="ttft_slo_s must be a number, got '1'"):
        Request(0, 0.0, 4, 2, ttft_slo_s="1")


def test_a_custom_scheduler_s_malformed_batch_is_named(affine):
    """Found by probing a scheduler written in a notebook (2026-12-02): next_batch returning a list or None ended in
    "'list' object has no attribute 'items'", items of triples in "too many values to unpack", a dict of items or an
    int of evictions in "is not iterable". Now a SchedulerError names the scheduler and what is wrong."""
    from infermax.workload import fixed

    class Custom(Scheduler):
        name = "custom"

        def __init__(self, limits, plan):
            super().__init__(limits)
            self.plan = plan

        def add_arrivals(self, arrived):
            pass

        def next_batch(self, now_s):
            return self.plan()

        def batch_done(self, batch, finished):
            pass

    limits = Limits(M=1000)
    for plan, message in (
            (lambda: [(0, 4)], r"scheduler 'custom': next_batch must return a ScheduledBatch, got list \[\(0, 4\)\]"),
            (lambda: None, "next_batch must return a ScheduledBatch, got NoneType None"),
            (lambda: ScheduledBatch(items=[(0, 4, 1)]),
             r"planned a malformed batch: its items must be \(request id, tokens\) pairs, got \(0, 4, 1\)"),
            (lambda: ScheduledBatch(items={0: 4}), "its items must be a list of .* got dict"),
            (lambda: ScheduledBatch(items=[(0, 4)], evict=5), "its evict must be a collection of request ids, got int 5")):
        with pytest.raises(SchedulerError, match=message):
            simulate(fixed(4, 2, 1), Custom(limits, plan), limits, affine)
