"""Solver behaviour: replay agreement, batch times, policies, warm starts, slot bound, backends, CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from infermax.cli import app
from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.request import Request
from solvers import (Objective, Policies, SolutionRejected, SolveOptions, SolverUnavailable, optimize, policy_violations,
                     slot_bound)
from solvers.backends import gurobi_error_message
from tests.conftest import AffineCost
from tests.test_solver_bruteforce import ToyPiecewise

LINEAR = load_cost_model(kind="linear")
FITTED_PIECEWISE = load_cost_model(kind="piecewise")  # the default (auto) family, several pieces per term
TIGHT = ([Request(0, 0, 2, 2), Request(1, 0, 1, 3)], Limits(C=8, M=4))
EVICT = ([Request(0, 0, 1, 3), Request(1, 0, 1, 3)], Limits(C=8, M=3))
CHUNK = ([Request(0, 0, 3, 1), Request(1, 0, 1, 2)], Limits(C=3, M=8))


@pytest.mark.parametrize("cost", [LINEAR, FITTED_PIECEWISE, AffineCost(), ToyPiecewise()],
                         ids=["linear", "fitted-piecewise", "affine", "piecewise"])
def test_milp_batch_times_equal_cost_model_on_replay(cost):
    requests, limits = EVICT
    res = optimize(requests, limits, cost, slots=5)
    assert res.status == "optimal"
    assert res.solver_value_s == pytest.approx(res.value_s, rel=1e-9)


def test_milp_tau_matches_batch_time_s():
    """The MILP's per-slot term variables sum to the cost model's batch_time_s of the replayed batch."""
    from solvers.assign import set_from_schedule
    from solvers.formulation import TIME_UNIT, Formulation

    requests, limits = EVICT
    sched = optimize(requests, limits, LINEAR, slots=5).schedule
    form = Formulation(requests, limits, LINEAR, 5, Objective(makespan=1))
    set_from_schedule(form, sched, LINEAR)
    from infermax.replay import replay

    durations = replay(sched, LINEAR).batches["duration_s"].tolist()
    for j, d in enumerate(durations):
        assert sum(t.varValue for t in form.tau[j]) / TIME_UNIT == pytest.approx(d, rel=1e-12)


@pytest.mark.parametrize("policies", [Policies(no_hybrid=True), Policies(no_chunked_prefill=True),
                                      Policies(eviction_free=True)], ids=lambda p: p.names()[0])
def test_forced_policies_hold_in_replayed_schedule(policies):
    for requests, limits in (TIGHT, EVICT, CHUNK):
        res = optimize(requests, limits, LINEAR, policies=policies, slots=6)
        assert res.status == "optimal"
        assert policy_violations(res.schedule, policies, LINEAR) == []


def test_policy_check_detects_violations():
    requests, limits = EVICT
    free = optimize(requests, limits, LINEAR, slots=5)  # the unconstrained optimum evicts (brute force agrees)
    assert policy_violations(free.schedule, Policies(eviction_free=True), LINEAR)
    chunked = optimize(*CHUNK, LINEAR, slots=5)
    assert any("no_chunked_prefill" in p for p in policy_violations(chunked.schedule, Policies(no_chunked_prefill=True), LINEAR))


@pytest.mark.parametrize("scheduler", ["vllm", "vllm-ef", "sarathi", "sarathi-ef"])
def test_scheduler_schedule_is_accepted_as_warm_start(scheduler):
    requests, limits = [Request(i, 0, 4, 3) for i in range(3)], Limits(C=16, M=12)
    sim = simulate(requests, scheduler, limits, LINEAR)
    value = sim.summary["makespan_s"]
    res = optimize(requests, limits, LINEAR, warm_start=sim.schedule, options=SolveOptions(time_limit_s=5))
    assert res.warm_start["accepted"], res.warm_start
    assert res.warm_start["model_objective_s"] == pytest.approx(value, rel=1e-9)
    assert res.value_s <= value * (1 + 1e-9)


def test_fitted_warm_start_sets_capped_context_and_step_variables():
    """A scheduler's schedule on the fitted default model, with chunks after >= 256 cached tokens
    (``prefill_ctx_cap256`` binaries) and batches over 32 tokens (``n_tokens_gt<t>`` steps): every MILP
    variable is set, no constraint breaks, and the slots' term times equal the replayed batch times."""
    from infermax.replay import replay
    from solvers.assign import set_from_schedule, violations
    from solvers.formulation import TIME_UNIT, Formulation

    requests, limits = [Request(i, 0, 300, 2) for i in range(2)], Limits(C=256, M=800)
    sim = simulate(requests, "sarathi", limits, FITTED_PIECEWISE)
    form = Formulation(requests, limits, FITTED_PIECEWISE, len(sim.schedule.batches), Objective(makespan=1))
    assert any(x.cap_vars for row in form.cells for x in row) and any(form.steps)
    set_from_schedule(form, sim.schedule, FITTED_PIECEWISE)
    assert violations(form.prob) == []
    durations = replay(sim.schedule, FITTED_PIECEWISE).batches["duration_s"].tolist()
    assert [sum(t.varValue for t in taus) / TIME_UNIT for taus in form.tau] == pytest.approx(durations, rel=1e-9)


def test_set_from_a_schedule_prefix_counts_the_unfinished_to_its_end():
    """`set_from_schedule` of a schedule's first batches into a model of that many slots whose requests need not
    finish (``finish_all=False``, as `benchmarks/window_milp.py` builds it): a request unfinished there gets the last
    slot's end as its finish and first-token time, so the model's latency and TTFT objectives equal the prefix's, by
    hand from the replayed batch ends (each request's finish or first token if inside the prefix, else its end)."""
    from infermax.replay import replay
    from infermax.schedule import Schedule
    from solvers.assign import set_from_schedule, violations
    from solvers.formulation import Formulation

    requests, limits = [Request(0, 0, 3, 1), Request(1, 0, 2, 4), Request(2, 0, 4, 3)], Limits(C=4, M=16)
    sched = simulate(requests, "sarathi", limits, LINEAR).schedule
    w = 3
    ends = replay(sched, LINEAR).batches["end_s"].tolist()[:w]
    prefix = Schedule(requests, limits, sched.batches[:w])
    done_at = {rid: ends[-1] for rid in range(3)}
    first_at = dict(done_at)
    generated = {rid: 0 for rid in range(3)}
    for j, batch in enumerate(prefix.batches):  # by hand: prompts of 3, 2, 4 tokens, then one token per decode
        for rid, c in batch.items:
            before = sum(n for b in prefix.batches[:j] for r, n in b.items if r == rid)
            if before + c >= requests[rid].prompt_tokens:
                generated[rid] += 1
                first_at[rid] = min(first_at[rid], ends[j])
                if generated[rid] == requests[rid].output_tokens:
                    done_at[rid] = ends[j]
    assert any(g < requests[rid].output_tokens for rid, g in generated.items())  # someone is unfinished
    for objective, expected in ((Objective(latency=1), sum(done_at.values())),
                                (Objective(ttft=1), sum(first_at.values()) / 3)):
        form = Formulation(requests, limits, LINEAR, w, objective, finish_all=False)
        set_from_schedule(form, prefix, LINEAR)
        assert violations(form.prob) == []
        assert form.objective_s() == pytest.approx(expected, rel=1e-9)


def test_warm_start_breaking_a_forced_policy_is_refused():
    requests, limits = EVICT
    sim = simulate(requests, "vllm", limits, LINEAR)
    assert sim.summary["evictions"] > 0
    res = optimize(requests, limits, LINEAR, policies=Policies(eviction_free=True), warm_start=sim.schedule)
    assert not res.warm_start["accepted"]


def test_slot_bound_by_hand():
    """AffineCost (1 s + 1 s/token): one request I=2, O=2 needs 3 tokens; a schedule of makespan 5 s has
    K·1 + 3 <= 5, so at most 2 batches; sum of latency with weight 2 and value 10: budget 5, same bound."""
    r = [Request(0, 0, 2, 2)]
    terms = AffineCost().milp_terms()
    assert slot_bound(r, terms, Objective(makespan=1), 5.0).slots == 2
    assert slot_bound(r, terms, Objective(latency=2), 10.0).slots == 2
    assert slot_bound(r, terms, Objective(ttft=1), 5.0).slots is None


def test_objective_parse():
    assert Objective.parse("makespan") == Objective(makespan=1)
    assert Objective.parse("makespan=1,ttft=0.5") == Objective(makespan=1, ttft=0.5)
    with pytest.raises(ValueError, match="unknown objective"):
        Objective.parse("tps")
    with pytest.raises(ValueError, match=">= 0"):
        Objective(latency=-1)


def test_replay_mismatch_is_rejected_loudly(monkeypatch):
    import importlib

    opt_mod = importlib.import_module("solvers.optimize")
    real = opt_mod.replay
    monkeypatch.setattr(opt_mod, "replay", lambda schedule, cost: real(schedule, AffineCost(2.0, 1.0)))
    with pytest.raises(SolutionRejected, match="differs from the solver"):
        optimize(*TIGHT, AffineCost(), slots=4)


def test_cbc_agrees_with_highs():
    a = optimize(*EVICT, LINEAR, slots=5)
    b = optimize(*EVICT, LINEAR, slots=5, options=SolveOptions(backend="cbc"))
    assert b.status == "optimal" and b.value_s == pytest.approx(a.value_s, rel=1e-6)


def test_gurobi_unavailable_or_size_limited_is_explained():
    class SizeLimit(Exception):
        errno = 10010

    import pulp

    prob = pulp.LpProblem("p")
    assert "size-limited" in gurobi_error_message(SizeLimit("Model too large for size-limited license"), prob)
    assert gurobi_error_message(ValueError("other"), prob) is None
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        with pytest.raises(SolverUnavailable, match="not installed"):
            optimize(*TIGHT, LINEAR, slots=3, options=SolveOptions(backend="gurobi"))


def test_online_arrival_waits_with_not_before():
    requests, limits = [Request(0, 0.0, 2, 1), Request(1, 1.0, 2, 1)], Limits(C=8, M=8)
    res = optimize(requests, limits, LINEAR, slots=3)
    assert res.result.batches["start_s"].iloc[-1] == pytest.approx(1.0)
    assert res.schedule.batches[-1].not_before_s == pytest.approx(1.0)


runner = CliRunner()
SMALL = ["--I", "1", "--O", "3", "--B", "2", "--M", "3", "--C", "8", "--time-limit", "30", "--cost-model", "linear"]


def test_cli_optimize_saves_schedule_and_summary(tmp_path):
    out = tmp_path / "opt"
    res = runner.invoke(app, ["optimize", *SMALL, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["status"] == "optimal" and summary["optimal_over_all_schedules"]
    assert (out / "schedule.json").exists() and (out / "summary.json").exists()
    check = runner.invoke(app, ["validate", str(out / "schedule.json"), "--json", "--cost-model", "linear"])
    assert check.exit_code == 0
    assert json.loads(check.output)["makespan_s"] == pytest.approx(summary["objective_s"], rel=1e-9)


def test_cli_better_yes_and_no():
    # brute force (test_solver_bruteforce, "evict-pays"): the optimum is 12.6% below vllm-ef and equals vllm
    yes = runner.invoke(app, ["better", "-s", "vllm-ef", "--margin", "0.1", *SMALL, "--json"])
    assert yes.exit_code == 0, yes.output
    found = json.loads(yes.output.strip().splitlines()[-1])
    assert found["answer"] == "yes"
    assert set(found["differences"]) == {"batches", "requests_per_batch", "prompt_tokens_beside_decodes",
                                         "evictions", "length_order"}
    assert found["differences"]["evictions"][1] > 0  # the optimum evicts ("evict-pays"); vllm-ef never does
    assert found["differences"]["evictions"][0] == 0
    text = runner.invoke(app, ["better", "-s", "vllm-ef", "--margin", "0.1", *SMALL])
    assert "what the schedule found does differently" in text.output
    no = runner.invoke(app, ["better", "-s", "vllm", "--margin", "0.1", *SMALL, "--json"])
    ans = json.loads(no.output.strip().splitlines()[-1])
    assert ans["answer"] == "no" and ans["bound_s"] > ans["target_s"]
    assert "differences" not in ans


def test_cli_bad_input_exits_2():
    res = runner.invoke(app, ["optimize", *SMALL, "--solver", "nope"])
    assert res.exit_code == 2 and "unknown solver" in res.output
    res = runner.invoke(app, ["optimize", *SMALL, "--objective", "tps"])
    assert res.exit_code == 2
