"""Automatic prefix caching in the replayer: hand-worked hits, LRU order, memory, violations, format.

Every case is a hand-written Schedule replayed block by block (block_size 16), with the expected KV,
hits and times worked out by hand in the comments; `CtxCost` charges computed tokens plus the cached
context a prefill chunk reads, so a hit is visibly cheaper than a recompute but not free.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from infermax.limits import Limits
from infermax.replay import BATCH_COLUMNS, Replayer, ScheduleViolation, replay
from infermax.request import Request, output_segment
from infermax.schedule import Schedule, ScheduledBatch

B = 16


class CtxCost:
    """1 s + 1 s per computed token + 0.01 s per cached-context token a prefill chunk reads."""

    name = "ctx"

    def batch_time_s(self, f) -> float:
        return 1.0 + f.n_tokens + 0.01 * f.prefill_ctx_tokens


def caching(M: int = 64 * B, **kw) -> Limits:
    return Limits(C=512, M=M, block_size=B, prefix_caching=True, **kw)


def rows(rp: Replayer) -> pd.DataFrame:
    return pd.DataFrame(rp.batch_rows, columns=list(BATCH_COLUMNS))


def run_alone(rp: Replayer, rid: int, prompt: int, output: int, hit: int = 0) -> None:
    """Prefill ``rid`` in one batch (starting on ``hit`` cached tokens), then decode it to the end."""
    rp.apply(ScheduledBatch(items=[(rid, prompt - hit)], cache_hits=[(rid, hit)] if hit else []))
    for _ in range(output - 1):
        rp.apply(ScheduledBatch(items=[(rid, 1)]))


def test_full_hit_on_a_shared_prefix_and_the_icur_minus_one_cap():
    # A: 32-token prompt (segment 7), 2 outputs -> blocks 0-1 registered after its prefill. B's prompt is
    # A's 32 tokens + 10 of its own: both blocks hit (32 tokens), B computes 10 reading 32 of context.
    # C's prompt equals A's: a hit may not cover the whole input (one token must be computed), so C
    # hits one block and computes 16.
    reqs = [Request(0, 0.0, 32, 2, content=((7, 32),)), Request(1, 0.0, 42, 1, content=((7, 32), (8, 10))),
            Request(2, 0.0, 32, 1, content=((7, 32),))]
    rp = Replayer(reqs, caching(), CtxCost())
    run_alone(rp, 0, 32, 2)
    cache = rp.prefix_cache
    assert cache.hit_tokens(rp.states[1]) == 32
    assert cache.hit_tokens(rp.states[2]) == 16
    assert cache.hit_new_blocks(rp.states[1], 32) == 2  # both cached, unreferenced since A finished
    rp.apply(ScheduledBatch(items=[(1, 10)], cache_hits=[(1, 32)]))
    rp.apply(ScheduledBatch(items=[(2, 16)], cache_hits=[(2, 16)]))
    r = rows(rp)
    assert r.duration_s.tolist()[2:] == [1 + 10 + 0.01 * 10 * 32, 1 + 16 + 0.01 * 16 * 16]
    # B held blocks 0, 1 (shared, now cached again) + 1 partial block of its own = 48 tokens at its peak.
    assert r.kv_tokens_peak.tolist()[2] == 48
    assert rp.states[1].prefix_hit_tokens == 32 and rp.states[1].prefill_processed == 10


def test_partial_hit_ends_at_the_last_whole_shared_block():
    # A and B agree on 40 tokens: blocks 0-1 (tokens 0-31) are identical, block 2 (32-47) is not.
    reqs = [Request(0, 0.0, 48, 1, content=((7, 40), (9, 8))), Request(1, 0.0, 64, 1, content=((7, 40), (8, 24)))]
    rp = Replayer(reqs, caching(), CtxCost())
    run_alone(rp, 0, 48, 1)
    assert rp.prefix_cache.hit_tokens(rp.states[1]) == 32
    with pytest.raises(ScheduleViolation, match=r"\[hit-miss\] block 2 of its input is not cached"):
        rp.apply(ScheduledBatch(items=[(1, 16)], cache_hits=[(1, 48)]))


def test_lru_eviction_takes_a_freed_requests_tail_first_and_then_older_blocks():
    # Capacity 4 blocks. A (32 tokens, O=1) leaves blocks A0, A1 cached; LRU order A1, A0 (tail first).
    # D (40 tokens, unique) then needs 3 blocks: 2 empty + 1 evicted -> A1 goes, A0 stays.
    reqs = [Request(0, 0.0, 32, 1, content=((7, 32),)), Request(1, 0.0, 40, 1),
            Request(2, 0.0, 33, 1, content=((7, 32), (5, 1)))]
    rp = Replayer(reqs, caching(M=4 * B), CtxCost())
    run_alone(rp, 0, 32, 1)
    assert rp.prefix_cache.cached_blocks == 2 and rp.kv_tokens == 0
    run_alone(rp, 1, 40, 1)
    assert rp.prefix_cache.evicted_blocks == 1
    # D's 2 full blocks are registered and cached too; 4 blocks = capacity, nothing more was needed.
    assert rp.prefix_cache.cached_blocks == 1 + 2
    assert rp.prefix_cache.hit_tokens(rp.states[2]) == 16  # A0 survived, A1 did not


def test_lru_order_follows_use_a_hit_refreshes_a_block():
    # X and Y each leave one block. Z hits X's block (moving it out of the LRU order); when Z finishes
    # X's block goes back at the tail, so the next eviction takes Y's block, the least recently used.
    reqs = [Request(0, 0.0, 17, 1, content=((1, 17),)), Request(1, 0.0, 17, 1, content=((2, 17),)),
            Request(2, 0.0, 17, 1, content=((1, 16), (3, 1))), Request(3, 0.0, 48, 1)]
    rp = Replayer(reqs, caching(M=4 * B), CtxCost())
    run_alone(rp, 0, 17, 1)
    run_alone(rp, 1, 17, 1)
    run_alone(rp, 2, 17, 1, hit=16)
    run_alone(rp, 3, 48, 1)  # needs 3 blocks: 2 empty, then 1 evicted: Y's block
    cache = rp.prefix_cache
    assert cache.evicted_blocks == 1
    assert cache.hit_tokens(rp.states[2]) == 16  # X's block is still cached
    assert cache.missing_block(rp.states[1], 16) == 0  # Y's is gone


def test_cached_blocks_are_evicted_when_running_requests_need_memory_and_never_exceed_M():
    # Capacity 6 blocks. Three requests with distinct 32-token prompts leave 6 cached blocks; a 4-block
    # prefill then evicts the 4 least recently used, and a hit on one of them is refused.
    reqs = [Request(i, 0.0, 32, 1, content=((10 + i, 32),)) for i in range(3)]
    reqs += [Request(3, 0.0, 64, 2), Request(4, 0.0, 40, 1, content=((10, 32), (99, 8)))]
    rp = Replayer(reqs, caching(M=6 * B), CtxCost())
    for i in range(3):
        run_alone(rp, i, 32, 1)
    cache = rp.prefix_cache
    assert cache.cached_blocks == 6 and cache.free_tokens() == 6 * B
    rp.apply(ScheduledBatch(items=[(3, 64)]))
    assert rp.kv_tokens == 4 * B and cache.cached_blocks == 2 and cache.evicted_blocks == 4
    assert rp.kv_tokens + B * cache.cached_blocks <= 6 * B
    # Request 0's blocks were the oldest (freed first): gone.
    with pytest.raises(ScheduleViolation, match=r"\[hit-miss\]"):
        rp.apply(ScheduledBatch(items=[(4, 8)], cache_hits=[(4, 32)]))


def test_a_preempted_request_resumes_on_its_own_cached_prefix():
    # A: 32-token prompt, 5 outputs. Prefill (m=32, 1 token), decode (m=33, 2 tokens), evicted in decode
    # phase (before a batch that prefills B): Icur = 32 + 2 = 34. Its blocks 0-1 stay cached; it restarts
    # on them and computes tokens 32-33 (a chunk of 2 reading 32 cached tokens), then decodes the rest.
    reqs = [Request(0, 0.0, 32, 5), Request(1, 0.0, 16, 1)]

    def preempt(rp, restart):
        rp.apply(ScheduledBatch(items=[(0, 32)]))
        rp.apply(ScheduledBatch(items=[(0, 1)]))
        rp.apply(ScheduledBatch(items=[(1, 16)], evict=[0]))
        rp.apply(restart)

    rp = Replayer(reqs, caching(), CtxCost())
    preempt(rp, ScheduledBatch(items=[(0, 2)], cache_hits=[(0, 32)]))
    s = rp.states[0]
    assert (s.m, s.generated, s.input_tokens) == (34, 3, 34)
    assert rows(rp).duration_s.iloc[-1] == 1 + 2 + 0.01 * 2 * 32
    rp.apply(ScheduledBatch(items=[(0, 1)]))
    rp.apply(ScheduledBatch(items=[(0, 1)]))
    rp.check_complete()
    assert s.prefill_processed == 32 + 2 and s.prefix_hit_tokens == 32 and s.evictions == 1
    assert rp.prefix_cache.restart_hit_tokens == 32 and rp.prefix_cache.hit_tokens_total == 32
    # Without caching the same restart recomputes all 34 tokens.
    plain = Replayer(reqs, Limits(C=512, M=64 * B, block_size=B), CtxCost())
    preempt(plain, ScheduledBatch(items=[(0, 34)]))
    assert rows(plain).duration_s.iloc[-1] == 1 + 34


def test_two_requests_sharing_a_prefix_in_one_batch_count_its_blocks_once():
    # A leaves 2 cached blocks. B and C (both A's 32 tokens + 8 of their own) hit them in the same batch:
    # KV in use = 2 shared blocks + 1 partial block each = 4 blocks, not 6.
    reqs = [Request(0, 0.0, 32, 1, content=((7, 32),)),
            Request(1, 0.0, 40, 3, content=((7, 32), (1, 8))), Request(2, 0.0, 40, 3, content=((7, 32), (2, 8)))]
    rp = Replayer(reqs, caching(), CtxCost())
    run_alone(rp, 0, 32, 1)
    rp.apply(ScheduledBatch(items=[(1, 8), (2, 8)], cache_hits=[(1, 32), (2, 32)]))
    assert rp.kv_tokens == 4 * B
    rp.apply(ScheduledBatch(items=[(1, 1), (2, 1)]))
    rp.apply(ScheduledBatch(items=[(1, 1)]))  # B finishes: its private block freed, shared ones still held by C
    assert rp.kv_tokens == 3 * B
    rp.apply(ScheduledBatch(items=[(2, 1)]))
    assert rp.kv_tokens == 0 and rp.prefix_cache.cached_blocks == 2


def test_requests_computing_the_same_prefix_side_by_side_cache_one_copy():
    # Neither can hit the other's blocks in the batch that computes them; afterwards only one copy is cached.
    reqs = [Request(i, 0.0, 32, 1, content=((7, 32),)) for i in range(2)]
    rp = Replayer(reqs, caching(), CtxCost())
    rp.apply(ScheduledBatch(items=[(0, 32), (1, 32)]))
    assert rows(rp).kv_tokens_peak.iloc[0] == 4 * B
    assert rp.prefix_cache.cached_blocks == 2


def test_a_later_turn_hits_the_previous_turns_prompt_and_answer():
    # Turn 1: 20-token prompt, 13 outputs -> KV of 20 + 12 = 32 tokens = 2 full blocks (the last output
    # token's KV is never computed). Turn 2 quotes prompt + answer + a new 5-token message: 38 tokens.
    t1 = Request(0, 0.0, 20, 13, content=((1, 20),))
    t2 = Request(1, 0.0, 38, 1, content=((1, 20), (output_segment(0), 13), (2, 5)))
    rp = Replayer([t1, t2], caching(), CtxCost())
    run_alone(rp, 0, 20, 13)
    assert rp.prefix_cache.hit_tokens(rp.states[1]) == 32


@pytest.mark.parametrize("hits, items, limits, rule", [
    ([(1, 16)], [(1, 24)], Limits(C=512, M=1024, block_size=B), "prefix-caching-off"),
    ([(1, 8)], [(1, 32)], caching(), "hit-size"),
    ([(1, 48)], [(1, 1)], caching(), "hit-size"),  # the whole 48-token input: one token must be computed
    ([(1, 16)], [(0, 1)], caching(), "hit-not-item"),
    ([(0, 16)], [(0, 1)], caching(), "hit-holder"),
])
def test_invalid_hits_are_named(hits, items, limits, rule):
    reqs = [Request(0, 0.0, 32, 3, content=((7, 32),)), Request(1, 0.0, 48, 1, content=((7, 32), (8, 16)))]
    rp = Replayer(reqs, limits, CtxCost())
    rp.apply(ScheduledBatch(items=[(0, 32)]))
    with pytest.raises(ScheduleViolation, match=rf"\[{rule}\]"):
        rp.apply(ScheduledBatch(items=items, cache_hits=hits))


def test_schedule_with_hits_round_trips_through_json_and_replays_identically(tmp_path):
    reqs = [Request(0, 0.0, 32, 2, content=((7, 32),)), Request(1, 0.5, 42, 2, content=((7, 32), (8, 10)))]
    sched = Schedule(reqs, caching(), [
        ScheduledBatch(items=[(0, 32)]), ScheduledBatch(items=[(0, 1), (1, 10)], cache_hits=[(1, 32)]),
        ScheduledBatch(items=[(1, 1)])])
    first = replay(sched, CtxCost())
    loaded = Schedule.load(sched.save(tmp_path / "s.json"))
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["batches"][1]["cache_hits"] == [[1, 32]] and data["limits"]["prefix_caching"] is True
    assert data["requests"][1]["content"] == [[7, 32], [8, 10]]
    again = replay(loaded, CtxCost())
    pd.testing.assert_frame_equal(first.requests, again.requests)
    pd.testing.assert_frame_equal(first.batches, again.batches)
    assert first.summary["prefix_hit_tokens"] == 32
    assert first.summary["prefix_hit_rate_tokens"] == 32 / (32 + 42)
    assert first.summary["prefix_hit_rate_blocks"] == 2 / (1 + 2)  # ⌊31/16⌋ + ⌊41/16⌋ blocks could hit
    assert first.requests["refilled_tokens"].tolist() == [0, 0]
    # Without caching in its limits the same file is invalid.
    off = Schedule(reqs, Limits(C=512, M=64 * B, block_size=B), sched.batches)
    with pytest.raises(ScheduleViolation, match=r"\[prefix-caching-off\]"):
        replay(off, CtxCost())


def test_schedulers_without_caching_support_and_the_solvers_refuse_it():
    from solvers.analyse import analyse
    from solvers.lower_bound import lower_bound
    from solvers.optimize import optimize

    from conftest import AffineCost

    from infermax.engine import simulate

    reqs = [Request(0, 0.0, 32, 2, content=((7, 32),))]
    with pytest.raises(ValueError, match="does not support prefix caching"):
        simulate(reqs, "vllm", caching(), AffineCost())
    for solve in (optimize, analyse, lower_bound):
        with pytest.raises(ValueError, match="do not model prefix caching"):
            solve(reqs, caching(), AffineCost())


def test_command_line_runs_caching_and_names_the_schedulers_that_support_it():
    from typer.testing import CliRunner

    from infermax.cli import app

    runner = CliRunner()
    args = ["simulate", "--prefix-caching", "--block-size", "16", "--workload", "system-prompt", "--system-tokens",
            "64", "--B", "20", "--output-dist", "const:4", "--arrival", "poisson", "--rate", "2", "--json"]
    ok = runner.invoke(app, [*args, "-s", "vllm-v1"])
    assert ok.exit_code == 0, ok.output
    summary = json.loads(ok.output)
    # 20 requests, arriving over about 10 s, share a 64-token (4-block) system prompt: the first computes it,
    # the later ones can hit it (blocks are hittable after the batch that computes them).
    assert 0 < summary["prefix_hit_tokens"] <= 19 * 64 and summary["generated_tokens"] == 20 * 4
    refused = runner.invoke(app, [*args, "-s", "vllm"])
    assert refused.exit_code == 2 and "does not support prefix caching" in refused.output
    assert "vllm-v1" in refused.output
