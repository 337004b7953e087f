"""Shared-prefix workloads: multi-turn conversations, system prompts, few-shot templates (issue 19)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from infermax.cli import app
from infermax.config import RunConfig
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import replay
from infermax.request import Request, output_segment
from infermax.schedule import Schedule
from infermax.workload import with_arrivals
from infermax.workloads_prefix import (
    LMSYS_MESSAGE_MEAN, LMSYS_RESPONSE_MEAN, LMSYS_TURNS_MEAN, few_shot, multiturn, prefix_workload,
    previous_turn, shared_prefix_fraction, shared_prefix_tokens, system_prompt,
)


def _check_conversations(reqs: list[Request], response_s_per_token: float | None = None,
                         think_free: bool = False) -> None:
    by_id = {r.id: r for r in reqs}
    assert [r.id for r in reqs] == list(range(len(reqs)))
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    messages = [r.content[-1][0] for r in reqs]
    assert len(set(messages)) == len(reqs) and min(messages) >= 0  # every turn's new message is its own
    for r in reqs:
        assert sum(n for _, n in r.content) == r.prompt_tokens
        if len(r.content) == 1:
            assert previous_turn(r) is None
            continue
        prev = by_id[previous_turn(r)]
        # Turn t+1 = turn t's prompt, turn t's answer, then one new message.
        assert r.content[:-1] == (*prev.content, (output_segment(prev.id), prev.output_tokens))
        assert prev.id < r.id
        if response_s_per_token is not None:
            gap = r.arrival_s - prev.arrival_s
            expected = response_s_per_token * prev.output_tokens
            assert gap == pytest.approx(expected, abs=1e-9) if think_free else gap >= expected - 1e-9


# ---------------------------------------------------------------- multi-turn conversations

def test_multiturn_turn_extends_the_previous_turn_and_its_answer():
    reqs = multiturn(400, turns_mean=3.0, seed=4)
    _check_conversations(reqs, response_s_per_token=0.02)
    assert sum(len(r.content) > 1 for r in reqs) > 200  # most are later turns at a mean of 3 turns


def test_multiturn_arrival_gap_is_the_response_estimate_without_think_time():
    reqs = multiturn(300, turns_mean=4.0, think_time_s=0.0, response_s_per_token=0.05, seed=1)
    _check_conversations(reqs, response_s_per_token=0.05, think_free=True)


def test_multiturn_hand_case_with_constant_lengths():
    # Offline starts, no think time and no response time: every turn at 0, ids by (conversation, turn).
    reqs = multiturn(6, turns_mean=1e9, think_time_s=0.0, response_s_per_token=0.0,
                     message_dist="const:10", output_dist="const:5", max_context_tokens=100, seed=0)
    # One conversation (the geometric draw with mean 1e9 is far above 6 turns).
    assert [r.prompt_tokens for r in reqs] == [10, 25, 40, 55, 70, 85]
    assert reqs[2].content == ((0, 10), (output_segment(0), 5), (1, 10), (output_segment(1), 5), (2, 10))
    assert shared_prefix_tokens(reqs) == [0, 15, 30, 45, 60, 75]  # the whole history, never the new message
    assert [previous_turn(r) for r in reqs] == [None, 0, 1, 2, 3, 4]
    assert previous_turn(system_prompt(2, seed=0)[1]) is None and previous_turn(Request(0, 0.0, 1, 1)) is None


def test_multiturn_context_limit_ends_a_conversation():
    reqs = multiturn(2000, turns_mean=50.0, max_context_tokens=600, seed=2)
    assert max(r.prompt_tokens + r.output_tokens for r in reqs) <= 600
    _check_conversations(reqs)


def test_multiturn_one_turn_shares_nothing():
    reqs = multiturn(500, turns_mean=1.0, seed=3)
    assert all(len(r.content) == 1 for r in reqs)
    assert shared_prefix_fraction(reqs) == 0.0


def test_multiturn_more_turns_share_more():
    fractions = [shared_prefix_fraction(multiturn(4000, turns_mean=t, seed=5)) for t in (1.0, 2.0, 4.0, 8.0)]
    assert fractions[0] == 0.0
    assert fractions == sorted(fractions) and fractions[1] > 0.5 and fractions[-1] > 0.9


def test_multiturn_conversation_starts_follow_the_arrival_process():
    offline = multiturn(300, seed=6)
    assert all(r.arrival_s == 0.0 for r in offline if len(r.content) == 1)
    rate = 4.0
    reqs = multiturn(40_000, arrival="poisson", rate_per_s=rate, think_time_s=0.0, seed=6)
    starts = np.sort([r.arrival_s for r in reqs if len(r.content) == 1])
    gaps = np.diff(starts)
    assert starts[0] == 0.0
    assert abs(gaps.mean() - 1 / rate) < 4 * gaps.std() / math.sqrt(len(gaps))


def test_multiturn_is_deterministic_per_seed():
    assert multiturn(300, seed=9) == multiturn(300, seed=9)
    assert multiturn(300, seed=9) != multiturn(300, seed=10)


def _within_sampling_error(values, mean, sigmas=4.0):
    values = np.asarray(values, dtype=float)
    return abs(values.mean() - mean) <= sigmas * values.std() / math.sqrt(len(values))


def test_multiturn_calibrated_to_lmsys_chat_1m_means():
    n = 100_000
    single = multiturn(n, turns_mean=1.0, max_context_tokens=100_000, seed=11)
    assert _within_sampling_error([r.prompt_tokens for r in single], LMSYS_MESSAGE_MEAN)  # 69.5
    assert _within_sampling_error([r.output_tokens for r in single], LMSYS_RESPONSE_MEAN)  # 214.5
    reqs = multiturn(n, max_context_tokens=100_000, seed=12)
    conversations = sum(len(r.content) == 1 for r in reqs)
    # Geometric turns with mean 2.0 (LMSYS-Chat-1M): sd sqrt(2); the mean over ~n/2 conversations.
    assert abs(n / conversations - LMSYS_TURNS_MEAN) <= 4 * math.sqrt(2.0) / math.sqrt(conversations)
    # Every turn's own message has the LMSYS mean too.
    assert _within_sampling_error([r.content[-1][1] for r in reqs], LMSYS_MESSAGE_MEAN)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 80), turns=st.floats(1.0, 6.0), think=st.floats(0.0, 60.0), seed=st.integers(0, 2**16),
       context=st.integers(2, 3000))
def test_multiturn_invariants_hold_for_any_parameters(n, turns, think, seed, context):
    reqs = multiturn(n, turns_mean=turns, think_time_s=think, max_context_tokens=context, seed=seed)
    assert len(reqs) == n
    _check_conversations(reqs, response_s_per_token=0.02)
    assert all(r.prompt_tokens + r.output_tokens <= max(context, 2) for r in reqs)
    # An earlier turn always arrived first, so a turn shares its whole history and nothing of its message.
    assert shared_prefix_tokens(reqs) == [r.prompt_tokens - r.content[-1][1] for r in reqs]


# ---------------------------------------------------------------- system prompts and few-shot templates

def test_system_prompt_requests_share_exactly_the_system_prompt():
    reqs = system_prompt(50, system_tokens=700, seed=1)
    assert all(r.content[0] == (0, 700) and len(r.content) == 2 for r in reqs)
    assert len({r.content[1][0] for r in reqs}) == 50
    assert shared_prefix_tokens(reqs) == [0] + [700] * 49
    assert shared_prefix_tokens(reqs, block_size=16) == [0] + [688] * 49  # 43 full blocks of 16


def test_system_prompts_are_distinct_segments():
    reqs = system_prompt(400, system_tokens=100, prefixes=3, seed=2)
    assert {r.content[0] for r in reqs} == {(0, 100), (1, 100), (2, 100)}
    shared = shared_prefix_tokens(reqs)
    assert set(shared) == {0, 100} and shared.count(0) == 3  # the first user of each system prompt


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 1.0])
def test_prefix_share_sets_the_shared_fraction(share):
    n, s, m = 4000, 500, 40
    reqs = system_prompt(n, system_tokens=s, prefix_share=share, message_dist=f"const:{m}", seed=3)
    users = sum(len(r.content) == 2 for r in reqs)
    assert abs(users / n - share) <= 4 * math.sqrt(share * (1 - share) / n)
    # Hand count: every user but the first shares the s tokens; prompts are s per user plus m each.
    expected = s * max(users - 1, 0) / (s * users + m * n)
    assert shared_prefix_fraction(reqs) == pytest.approx(expected)


def test_few_shot_templates():
    reqs = few_shot(300, shots=3, prefixes=2, instruction_tokens=15, example_tokens=65, seed=4)
    templates = {r.content[:-1] for r in reqs}
    assert templates == {((0, 15), (1, 65), (2, 65), (3, 65)), ((4, 15), (5, 65), (6, 65), (7, 65))}
    assert set(shared_prefix_tokens(reqs)) == {0, 15 + 3 * 65}
    zero_shot = few_shot(50, shots=0, prefixes=1, seed=4)
    assert shared_prefix_tokens(zero_shot)[1:] == [15] * 49  # only the instruction is shared
    # Defaults: the vLLM paper's 5-shot prefix (341 tokens there; 15 + 5 x 65 = 340 here).
    assert sum(n for _, n in few_shot(1)[0].content[:-1]) == 340


def test_more_shots_share_more():
    fractions = [shared_prefix_fraction(few_shot(2000, shots=k, seed=5)) for k in (0, 1, 5, 10)]
    assert fractions == sorted(fractions) and fractions[0] > 0


def test_generators_are_deterministic_and_checked():
    for make in (system_prompt, few_shot):
        assert make(200, seed=1) == make(200, seed=1) and make(200, seed=1) != make(200, seed=2)
    with pytest.raises(ValueError, match=r"prefix_share \(--prefix-share\)"):
        system_prompt(10, prefix_share=1.5)
    with pytest.raises(ValueError, match=r"turns_mean \(--turns\)"):
        multiturn(10, turns_mean=0.9)
    with pytest.raises(ValueError, match="unknown shared-prefix workload 'chat'"):
        prefix_workload("chat", 10)
    with pytest.raises(ValueError, match="not 'trace'"):
        multiturn(10, arrival="trace")


# ---------------------------------------------------------------- shared-prefix accounting by hand

def test_shared_prefix_tokens_hand_cases():
    a = Request(0, 0.0, 15, 4, content=((0, 10), (1, 5)))
    b = Request(1, 1.0, 15, 4, content=((0, 10), (2, 5)))              # shares segment 0
    c = Request(2, 2.0, 4, 4, content=((0, 4),))                       # a shorter run of segment 0
    d = Request(3, 3.0, 20, 4, content=((0, 10), (1, 5), (output_segment(0), 3), (7, 2)))  # quotes 3 of a's 4
    e = Request(4, 4.0, 9, 4)                                          # no content: its own segment
    assert shared_prefix_tokens([a, b, c, d, e]) == [0, 10, 4, 18, 0]
    assert shared_prefix_tokens([a, b, c, d, e], block_size=4) == [0, 8, 4, 16, 0]
    # Order of arrival, not of the list: b arriving first is the one that shares nothing.
    early_b = Request(1, 0.0, 15, 4, content=((0, 10), (2, 5)))
    late_a = Request(0, 1.0, 15, 4, content=((0, 10), (1, 5)))
    assert shared_prefix_tokens([late_a, early_b]) == [10, 0]
    assert shared_prefix_fraction([]) == 0.0


# ---------------------------------------------------------------- schedules, RunConfig, the command line

@pytest.mark.parametrize("name", ["multiturn", "system-prompt", "few-shot"])
def test_schedule_with_content_round_trips_through_json(tmp_path, name):
    reqs = prefix_workload(name, 40, seed=1)
    if name != "multiturn":
        reqs = with_arrivals(reqs, "poisson", rate_per_s=5.0, seed=1)
    cost = RunConfig().cost()
    result = simulate(reqs, "vllm", Limits(C=4096, M=20_000, block_size=16), cost)
    path = result.schedule.save(tmp_path / "schedule.json")
    assert all(isinstance(row, dict) and "content" in row for row in json.loads(path.read_text())["requests"])
    loaded = Schedule.load(path)
    assert loaded.requests == result.schedule.requests == reqs
    assert replay(loaded, cost).summary == result.summary


def test_run_config_builds_the_generators():
    config = RunConfig(workload="multiturn", B=60, arrival="poisson", rate=2.0, turns=3.0, think_time_s=5.0, seed=7)
    assert config.requests() == multiturn(60, turns_mean=3.0, think_time_s=5.0, arrival="poisson",
                                          rate_per_s=2.0, seed=7)
    config = RunConfig(workload="system-prompt", B=30, system_tokens=64, prefixes=2, prefix_share=0.5,
                       input_dist="const:8", output_dist="const:4", seed=1)
    assert config.requests() == system_prompt(30, system_tokens=64, prefixes=2, prefix_share=0.5,
                                              message_dist="const:8", output_dist="const:4", seed=1)
    assert RunConfig(workload="few-shot", B=20, shots=2).requests() == few_shot(20, shots=2)
    assert RunConfig.from_dict(config.to_dict()) == config  # a sweep point's configuration


@pytest.mark.parametrize("fields,message", [
    ({"turns": 2.0}, "turns (--turns) applies to --workload multiturn, got no --workload"),
    ({"workload": "multiturn", "shots": 3}, "shots (--shots) applies to --workload few-shot"),
    ({"workload": "few-shot", "system_tokens": 3}, "system_tokens (--system-tokens) applies to --workload system-prompt"),
    ({"workload": "chat"}, "unknown workload 'chat'"),
    ({"workload": "multiturn", "trace": "azure-conv"}, "does not combine with trace"),
    ({"workload": "system-prompt", "arrival": "trace"}, "arrival 'trace' needs a trace"),
    ({"workload": "system-prompt", "rt_dataset": "lmsys", "rt_rate": 1.0}, "does not combine with workload"),
])
def test_run_config_errors(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig(B=10, **fields).requests()


runner = CliRunner()


def test_cli_simulates_each_shared_prefix_workload():
    for args in (["--workload", "multiturn", "--turns", "3", "--arrival", "poisson", "--rate", "2"],
                 ["--workload", "system-prompt", "--system-tokens", "256", "--prefix-share", "0.5"],
                 ["--workload", "few-shot", "--shots", "2", "--prefixes", "3"]):
        res = runner.invoke(app, ["simulate", *args, "--B", "30", "--json"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["num_requests"] == 30


@pytest.mark.parametrize("args,message", [
    (["--workload", "multiturn", "--turns", "0.5"], "turns_mean (--turns) must be a finite number >= 1.0"),
    (["--workload", "system-prompt", "--prefix-share", "2"], "prefix_share (--prefix-share) must be"),
    (["--shots", "2"], "shots (--shots) applies to --workload few-shot"),
    (["--workload", "few-shot", "--prefixes", "0"], "--prefixes must be an integer >= 1"),
    (["--workload", "multiturn", "--think-time", "-1"], "think_time_s (--think-time) must be"),
])
def test_cli_errors_exit_2_on_one_line(args, message):
    res = runner.invoke(app, ["simulate", *args, "--B", "5"], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_a_sweep_spec_varies_the_share_parameter():
    from infermax.sweep import parse_spec
    from infermax.sweep.points import run_point

    spec = parse_spec({"name": "share", "base": {"workload": "multiturn", "B": 20, "M": 20_000},
                       "axes": {"turns": [1, 4]}})
    points = spec.points()
    assert [p["turns"] for p in points] == [1.0, 4.0]
    results = [run_point("simulate", p)["result"] for p in points]
    assert [r["status"] for r in results] == ["ok", "ok"]
    assert all(r["num_requests"] == 20 for r in results)


def test_new_fields_at_their_default_keep_earlier_point_ids():
    """Committed sweep results stay valid: a point's id is the one it had before these fields existed."""
    from infermax.sweep import point_id

    config = RunConfig(B=10).to_dict()
    before = {k: v for k, v in config.items() if k not in RunConfig.ID_OMITS_DEFAULT}
    assert point_id("simulate", config) == point_id("simulate", before)
    assert point_id("simulate", {**config, "workload": "multiturn"}) != point_id("simulate", config)
    assert point_id("simulate", {**config, "B": 11}) != point_id("simulate", config)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), shots=st.integers(0, 6), prefixes=st.integers(1, 5), share=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**16), few=st.booleans())
def test_a_request_shares_its_template_exactly_when_an_earlier_one_used_it(n, shots, prefixes, share, seed, few):
    reqs = (few_shot(n, shots=shots, prefixes=prefixes, prefix_share=share, seed=seed) if few
            else system_prompt(n, system_tokens=shots + 1, prefixes=prefixes, prefix_share=share, seed=seed))
    seen = set()
    for r, shared in zip(reqs, shared_prefix_tokens(reqs)):
        template = r.content[:-1]
        assert sum(x for _, x in r.content) == r.prompt_tokens and r.content[-1][0] >= 0
        assert shared == (sum(x for _, x in template) if template and template in seen else 0)
        seen.add(template)
