"""`infermax optimize` / `better` at any size: bound + search when the MILP is too large, one time limit,
JSON alone on stdout, and every reported schedule replays to its reported objective."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from infermax.cli import app
from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.replay import replay
from infermax.request import Request
from solvers import Objective, Policies, optimize, policy_violations
from solvers.analyse import analyse
from solvers.better import better
from solvers.policy import check_policies_feasible
from solvers.lower_bound import LowerBounder
from solvers.search import search
from tests.test_lower_bound import workloads  # random small instances: online/offline, blocks, Rmax, P

runner = CliRunner()
COST = load_cost_model()
TOL = 1e-9


def test_optimize_large_instance_falls_back_to_bound_and_search(tmp_path):
    out = tmp_path / "opt"
    res = runner.invoke(app, ["optimize", "--I", "512", "--O", "128", "--B", "64", "--time-limit", "20", "--json",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)  # JSON alone on stdout
    assert summary["milp_refused"]  # the MILP was judged too large and never built
    assert summary["status"] in ("feasible", "optimal")
    assert 0 < summary["lower_bound_s"] <= summary["objective_s"] * (1 + TOL)
    assert summary["certified_gap"] == pytest.approx(summary["objective_s"] / summary["lower_bound_s"] - 1, rel=1e-9)
    check = runner.invoke(app, ["validate", str(out / "schedule.json"), "--json"])
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["makespan_s"] == pytest.approx(summary["objective_s"], rel=1e-9)


def test_better_json_is_json_alone():
    res = runner.invoke(app, ["better", "-s", "vllm", "--margin", "0.05", "--I", "64", "--O", "8", "--B", "32",
                              "--time-limit", "10", "--json"])
    assert res.exit_code == 0, res.output
    ans = json.loads(res.stdout)
    assert ans["answer"] in ("yes", "no", "unknown")
    assert ans["lower_bound_s"] <= ans["scheduler_objective_s"] * (1 + TOL)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([Objective(makespan=1), Objective(latency=1), Objective(ttft=1)]),
       st.sampled_from([Policies(), Policies(eviction_free=True), Policies(no_hybrid=True)]))
def test_search_results_replay_and_stay_above_the_bound(case, objective, policies):
    reqs, limits = case
    found = search(reqs, limits, COST, objective, time_limit_s=3, policies=policies)
    assert found.schedule is not None
    again = replay(found.schedule, COST)
    assert objective.value(again) == pytest.approx(found.value_s, rel=1e-9)
    assert not policy_violations(found.schedule, policies, COST)
    lb = LowerBounder(reqs, limits, COST, policies).of(objective).value_s
    assert lb <= found.value_s * (1 + TOL) + 1e-12


def test_json_stdout_has_no_solver_banner():
    """HiGHS prints its copyright banner from native code to file descriptor 1, which CliRunner cannot see:
    run the real command in a subprocess and parse its whole stdout as JSON."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "infermax", "better", "-s", "vllm", "--margin", "0.1", "--I", "1",
                          "--O", "3", "--B", "2", "--M", "3", "--C", "8", "--time-limit", "30", "--json"],
                         capture_output=True, text=True, check=True)
    ans = json.loads(out.stdout)
    assert ans["answer"] == "no"
    assert "HiGHS" not in out.stdout


def test_json_stdout_has_no_banner_when_the_bound_lps_create_highs_first():
    """The latency bound's LPs go straight to highspy (solvers/lower_bound.py) before any MILP is built; the
    first HiGHS instance of the process is created there, and its banner must not reach stdout either."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "infermax", "optimize", "--objective", "latency", "--I", "64", "--O",
                          "4", "--B", "4", "--time-limit", "20", "--json"], capture_output=True, text=True, check=True)
    summary = json.loads(out.stdout)
    assert summary["objective"] == "latency" and summary["lower_bound_s"] > 0
    assert "HiGHS" not in out.stdout


def test_optimize_without_a_usable_warm_start():
    """vLLM, named as the warm start, cannot batch a 100-token prompt with C = 64 (no chunking): optimize goes on
    without its warm start."""
    res = runner.invoke(app, ["optimize", "--I", "100", "--O", "2", "--B", "4", "--C", "64", "--time-limit", "20",
                              "--warm-start", "vllm", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert "warm_start_error" in summary and summary["objective_s"] is not None
    assert summary["lower_bound_s"] <= summary["objective_s"] * (1 + TOL)


def test_the_solver_gets_what_is_left_after_the_model_is_built(monkeypatch):
    """The MILP's own time limit is what remains of the command's deadline after building the model (less a
    reserve for the hand-over and the polishing LP), not the limit the command started with."""
    import importlib

    from infermax.limits import Limits
    from infermax.workload import fixed
    from solvers.backends import SolveOptions
    from solvers.scale import Deadline

    optimize_module = importlib.import_module("solvers.optimize")  # the package re-exports a function of that name
    given_limits = []
    real_solve = optimize_module.solve

    def spy(prob, options, warm=False):
        given_limits.append(options.time_limit_s)
        return real_solve(prob, options, warm=warm)

    monkeypatch.setattr(optimize_module, "solve", spy)
    deadline = Deadline(30.0)
    res = optimize_module.optimize(fixed(4, 2, 2), Limits(C=64, M=64), COST, slots=4,
                                   options=SolveOptions(time_limit_s=30.0), deadline=deadline)
    assert res.status == "optimal"
    assert len(given_limits) == 1 and 1.0 <= given_limits[0] < 30.0


@pytest.mark.parametrize("command", ["better", "optimize"])
def test_forced_policies_that_exclude_every_schedule_are_refused(command):
    """Without chunked prefills a 200-token prompt cannot be prefilled under P = 64: there is no schedule to bound or
    search (before, `better` answered "no" with a "bound" of 0.53 s above vllm-v1's own 0.18 s)."""
    args = [command, "--I", "200", "--O", "1", "--B", "5", "--P", "64", "--M", "3000", "--no-chunked-prefill",
            "--time-limit", "10", "--json"] + (["-s", "vllm-v1", "--margin", "0.05"] if command == "better" else [])
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "no schedule obeys the forced policies" in res.output and "min(C, P) = 64" in res.output
    ok = runner.invoke(app, [a if a != "64" else "256" for a in args])  # P = 256: every prompt fits one batch
    assert ok.exit_code == 0, ok.output


def test_forced_policies_refused_by_the_python_api_too():
    reqs = [Request(0, 0.0, 200, 2), Request(1, 0.0, 10, 2)]
    limits = Limits(C=4096, P=64, M=3000)
    policies = Policies(no_chunked_prefill=True)
    for call in (lambda: check_policies_feasible(reqs, limits, policies),
                 lambda: LowerBounder(reqs, limits, COST, policies),
                 lambda: analyse(reqs, limits, COST, Objective(makespan=1), policies, time_limit_s=5),
                 lambda: better(reqs, limits, COST, "sarathi", 0.05, Objective(makespan=1), policies, time_limit_s=5)):
        with pytest.raises(ValueError, match="request 0: its 200-token prompt exceeds min"):
            call()
    check_policies_feasible(reqs, limits, Policies(no_hybrid=True, eviction_free=True))  # always some schedule
    assert Policies().scope() == "" and Policies(eviction_free=True).scope() == " without evictions"
    assert Policies(True, True, True).scope() == " without hybrid batches, chunked prefills or evictions"


def test_better_keeps_the_scheduler_out_of_the_incumbents_when_it_breaks_a_forced_policy():
    """vLLM evicts on this instance (M = 100 for 8 requests of 16 + 16 tokens): asked for an eviction-free schedule,
    `better` must not report vLLM's own objective as the best schedule it knows (before: "the search's best is
    0.195926 s (vllm)", a schedule with evictions)."""
    reqs = [Request(i, 0.0, 16, 16) for i in range(8)]
    limits = Limits(C=4096, M=100)
    policies = Policies(eviction_free=True)
    assert policy_violations(simulate(reqs, "vllm", limits, COST).schedule, policies, COST)  # the premise
    ans = better(reqs, limits, COST, "vllm", 0.01, Objective(makespan=1), policies, time_limit_s=10)
    assert ans.methods["scheduler_obeys_policies"] is False
    assert ans.found_by != "vllm"
    if ans.schedule is not None:
        assert not policy_violations(ans.schedule, policies, COST)
        assert replay(ans.schedule, COST).summary["makespan_s"] == pytest.approx(ans.found_s, rel=1e-9)
    if ans.found_s is not None:
        assert ans.found_s >= ans.bound_s * (1 - TOL)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(1, 96), st.sampled_from(["sarathi", "sarathi-ef"]),
       st.sampled_from([Policies(), Policies(eviction_free=True), Policies(no_hybrid=True),
                        Policies(no_chunked_prefill=True)]),
       st.sampled_from([Objective(makespan=1), Objective(latency=1)]))
def test_better_answers_keep_their_promises(case, P, scheduler, policies, objective):
    """Whatever the question: "yes" comes with a replayed schedule at or below the target that obeys the forced
    policies, "no" with a bound above the target, the bound never exceeds a schedule the policies allow, and a
    question no schedule can obey is refused (P is drawn anywhere in 1..96, so prompts may exceed it)."""
    reqs, limits = case
    limits = replace(limits, P=min(P, limits.C))
    if policies.no_chunked_prefill and any(r.prompt_tokens > min(limits.C, limits.prefill_budget) for r in reqs):
        with pytest.raises(ValueError, match="no schedule obeys the forced policies"):
            better(reqs, limits, COST, scheduler, 0.05, objective, policies, time_limit_s=2)
        return
    ans = better(reqs, limits, COST, scheduler, 0.05, objective, policies, time_limit_s=2)
    obeys = ans.methods.get("scheduler_obeys_policies", True)
    if ans.answer == "yes":
        assert ans.found_s <= ans.target_s and ans.schedule is not None
        assert not policy_violations(ans.schedule, policies, COST)
        assert objective.value(replay(ans.schedule, COST)) == pytest.approx(ans.found_s, rel=1e-9)
    if ans.answer == "no":
        assert ans.bound_s > ans.target_s
    for allowed in ([ans.found_s] if ans.found_s is not None else []) + ([ans.scheduler_objective_s] if obeys else []):
        assert ans.methods["lower_bound_s"] <= allowed * (1 + TOL) + 1e-12
    if not obeys:
        assert ans.found_by != scheduler
    # a found schedule comes with what it does differently, read off both schedules
    assert (ans.differences is None) == (ans.schedule is None)
    if ans.schedule is not None:
        assert ans.differences["batches"][1] == len(ans.schedule.batches)
        assert ans.to_dict()["differences"] == ans.differences


def test_better_compares_with_a_scheduler_that_swaps():
    """BROS swaps KV when M is short; `better -s bros` failed with "no swap cost model" until the CLI passed the
    system's swap model to the scheduler's simulation. A swap only lengthens a batch, so the bound stays below."""
    res = runner.invoke(app, ["better", "-s", "bros", "--margin", "0.05", "--I", "3", "--O", "30", "--B", "20", "--M",
                              "40", "--time-limit", "5", "--json"])
    assert res.exit_code == 0, res.output
    ans = json.loads(res.stdout)
    assert ans["answer"] in ("yes", "no", "unknown")
    assert 0 < ans["lower_bound_s"] <= ans["scheduler_objective_s"] * (1 + TOL)
    # with a forced policy BROS obeys (it never chunks), its schedule, swaps included, is replayed to check it
    res = runner.invoke(app, ["better", "-s", "bros", "--margin", "0.05", "--I", "3", "--O", "30", "--B", "20", "--M",
                              "40", "--time-limit", "5", "--json", "--no-chunked-prefill"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scheduler_obeys_policies"] is True


def test_optimize_answers_when_the_bound_uses_up_the_time_limit():
    """A time limit the lower bound alone exceeds: the search is skipped (it used to be called with 0 s left and
    raise "time_limit_s must be > 0"), and the warm start and the bound are still reported."""
    reqs = [Request(i, 0.01 * i, 33, 2) for i in range(12)]
    res = analyse(reqs, Limits(C=4096, M=3000), COST, Objective(makespan=1), time_limit_s=1e-6)
    assert res.details["search_skipped"] == "too little time left after the lower bound for one simulation"
    assert res.incumbent_s is not None and 0 < res.bound_s <= res.incumbent_s * (1 + TOL)
    ans = better(reqs, Limits(C=4096, M=3000), COST, "vllm", 0.05, Objective(makespan=1), time_limit_s=1e-6)
    assert ans.answer in ("no", "unknown")


def test_simulations_stop_at_the_time_limit():
    """Simulations run under the command's deadline. At B = 20,000, I = O = 2,000 (Sarathi alone takes 23 s there),
    `better --time-limit 40` used to run 194 s and `optimize --time-limit 10` 48 s, their own and the search's
    simulations running on past the limit. Here with a limit far below what one simulation needs: `better` says its
    scheduler's own run (which sets the target) did not finish, `analyse` answers with the bound and names the
    warm start it cut, and the search records the candidate it stopped and returns no schedule."""
    from infermax.engine import SimulationTimeout
    from infermax.workload import fixed

    reqs, lim = fixed(512, 512, 3000), Limits(C=4096)
    with pytest.raises(SimulationTimeout, match="sarathi's own simulation, which sets the target, did not finish"):
        better(reqs, lim, COST, "sarathi", 0.1, Objective(latency=1), time_limit_s=0.05)
    res = analyse(reqs, lim, COST, Objective(latency=1), time_limit_s=0.05)
    assert "stopped at its deadline" in res.details["warm_start_error"]
    assert res.incumbent_s is None and res.bound_s > 0
    found = search(reqs, lim, COST, Objective(latency=1), time_limit_s=0.05)
    assert found.schedule is None
    assert any("SimulationTimeout" in c.get("error", "") for c in found.candidates)


def test_better_cli_reports_a_simulation_cut_by_the_time_limit():
    result = CliRunner().invoke(app, ["better", "-s", "sarathi", "--I", "512", "--O", "512", "--B", "3000",
                                      "--objective", "latency", "--time-limit", "0.05"])
    assert result.exit_code == 1
    assert "did not finish within the time limit of 0.05 s" in result.output and "raise the time limit" in result.output
    assert "Traceback" not in result.output


def test_time_limit_covers_building_the_workload(monkeypatch):
    """`optimize` / `better` refuse a workload whose building and lower bound alone would outlast --time-limit,
    before building it (1,000,000 requests under 1 s ran 16 s), with the estimate and the limit to raise it to."""
    from infermax.config import RunConfig

    def never(self):
        raise AssertionError("the workload was built")

    monkeypatch.setattr(RunConfig, "requests", never)
    for cmd in (["optimize"], ["better", "-s", "vllm"]):
        res = runner.invoke(app, [*cmd, "--B", "1000000", "--time-limit", "1"])
        assert res.exit_code == 2, res.output
        assert "1,000,000 requests" in res.output and "raise --time-limit to at least" in res.output


def test_large_simulations_are_not_started_without_time_for_their_set_up(monkeypatch):
    """`simulation_setup_refusal`: a simulation of more than the engine's `LARGE_RUN_REQUESTS` whose set-up alone
    outlasts the time left is not started (the warm start is reported as not run, the search skipped, `better`
    stops with the reason); a small one always starts. The threshold is lowered so that 12 requests are large."""
    from infermax import engine
    from infermax.engine import SimulationTimeout
    from solvers.scale import simulation_setup_refusal

    assert simulation_setup_refusal(12, 0.0) is None
    monkeypatch.setattr(engine, "LARGE_RUN_REQUESTS", 1)
    assert "setting up a simulation of 12 requests" in simulation_setup_refusal(12, 0.0)
    assert simulation_setup_refusal(12, 1.0) is None
    reqs = [Request(i, 0.01 * i, 33, 2) for i in range(12)]
    res = analyse(reqs, Limits(C=4096, M=3000), COST, Objective(makespan=1), time_limit_s=1e-6)
    assert res.details["warm_start_error"].startswith("not run: setting up a simulation of 12 requests")
    assert res.incumbent_s is None and "search_skipped" in res.details and res.bound_s > 0
    with pytest.raises(SimulationTimeout, match="cannot finish within the time limit"):
        better(reqs, Limits(C=4096, M=3000), COST, "vllm", 0.05, Objective(makespan=1), time_limit_s=1e-6)


def test_optimize_says_what_its_schedule_does_differently_from_the_warm_start():
    """A.3's LISO+SISO at B = 8 (linear model), sum of latencies: the search beats vLLM's warm start, and the
    comparison reads both schedules (vLLM's as simulated here); where the warm start stays the best, none."""
    from infermax.workload import heterogeneous_mix

    cost, limits = load_cost_model(kind="linear"), Limits(C=4096, M=100_000)
    reqs = heterogeneous_mix("LISO+SISO", 8, seed=0)
    res = analyse(reqs, limits, cost, Objective(latency=1), time_limit_s=60)
    assert res.incumbent_by != "vllm" and res.differences is not None
    vllm = simulate(reqs, "vllm", limits, cost).schedule
    assert res.differences["batches"] == [len(vllm.batches), len(res.schedule.batches)]
    assert res.summary()["differences"] == res.differences
    # shortest first: the short requests finish before the long ones in the schedule found
    assert res.differences["length_order"][1] > res.differences["length_order"][0]
    tiny = analyse([Request(0, 0.0, 1, 3), Request(1, 0.0, 1, 3)], Limits(C=8, M=3), cost, time_limit_s=60)
    assert tiny.incumbent_by == "vllm" and tiny.differences is None and "differences" not in tiny.summary()


def test_default_warm_start_chunks_a_prompt_vllm_cannot_prefill():
    """'auto' runs vLLM unless a prompt is longer than min(C, P): then Sarathi, whose schedule is the warm start and
    the comparison's baseline (vLLM would stop with an error and leave neither). Named explicitly, vLLM still runs,
    and fails, as named; with chunked prefills forbidden, no schedule can serve the prompt and 'auto' stays vLLM."""
    cost, limits = load_cost_model(kind="linear"), Limits(C=64, M=4000)
    reqs = [Request(0, 0.0, 100, 4), Request(1, 0.0, 8, 12), Request(2, 0.0, 40, 2)]
    res = analyse(reqs, limits, cost, Objective(latency=1), time_limit_s=2)
    assert res.details["warm_start"] == "sarathi" and "warm_start_error" not in res.details
    sarathi = simulate(reqs, "sarathi", limits, cost)
    assert res.incumbent_s <= sum(r.latency_s for r in sarathi.requests.itertuples()) + TOL
    named = analyse(reqs, limits, cost, Objective(latency=1), warm_start="vllm", time_limit_s=2)
    assert "4096" not in named.details["warm_start_error"] and "100-token" in named.details["warm_start_error"]
    fits = [Request(0, 0.0, 60, 4), Request(1, 0.0, 8, 12)]
    assert analyse(fits, limits, cost, Objective(latency=1), time_limit_s=2).details["warm_start"] == "vllm"
    from solvers.analyse import default_warm_start
    assert default_warm_start(reqs, limits, Policies(no_chunked_prefill=True)) == "vllm"
    assert default_warm_start(reqs, replace(limits, P=32), Policies()) == "sarathi"
    assert default_warm_start(fits, replace(limits, P=32), Policies()) == "sarathi"  # 60 > min(C, P) = 32
    cli = runner.invoke(app, ["optimize", "--I", "100", "--O", "4", "--B", "2", "--C", "64", "--M", "4000",
                              "--objective", "latency", "--time-limit", "5", "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["warm_start"] == "sarathi" and "warm_start_error" not in json.loads(cli.stdout)


def test_latency_sums_are_also_given_per_request():
    """A sum of latencies is also reported as the mean latency per request it stands for (each sum over the
    workload's requests, with the objective's weight), in the text and in --json; not for other objectives."""
    from infermax.workload import heterogeneous_mix
    from solvers.objective import Objective as Obj

    assert Obj(latency=2).mean_latency_s(12.0, 3) == 2.0 and Obj(latency=1).mean_latency_s(None, 3) is None
    assert Obj(makespan=1).mean_latency_s(12.0, 3) is None and Obj(latency=1, ttft=1).mean_latency_s(12.0, 3) is None
    base = ["--mix", "LISO+SISO", "--B", "8", "--cost-model", "linear", "--time-limit", "10"]
    ans = json.loads(runner.invoke(app, ["better", "-s", "vllm", "--margin", "0.05", "--objective", "latency", *base,
                                         "--json"]).stdout)
    for key in ("scheduler_objective_s", "target_s", "found_s", "bound_s"):
        assert ans[key.removesuffix("_s") + "_mean_latency_s"] == pytest.approx(ans[key] / 8, rel=1e-12), key
    vllm = simulate(heterogeneous_mix("LISO+SISO", 8, seed=0), "vllm", Limits(), load_cost_model(kind="linear"))
    assert ans["scheduler_objective_mean_latency_s"] == pytest.approx(vllm.summary["mean_latency_s"], rel=1e-9)
    opt = json.loads(runner.invoke(app, ["optimize", "--objective", "latency=2", *base, "--json"]).stdout)
    assert opt["objective_mean_latency_s"] == pytest.approx(opt["objective_s"] / 16, rel=1e-12)
    assert opt["lower_bound_mean_latency_s"] == pytest.approx(opt["lower_bound_s"] / 16, rel=1e-12)
    text = runner.invoke(app, ["better", "-s", "vllm", "--margin", "0.05", "--objective", "latency", *base]).output
    assert f"mean latency per request: {ans['scheduler_objective_mean_latency_s']:.4g} s (vllm)" in text
    makespan = json.loads(runner.invoke(app, ["optimize", *base, "--json"]).stdout)
    assert not [k for k in makespan if "mean_latency" in k]


def test_better_answer_to_dict_leaves_the_schedule_alone():
    """`BetterAnswer.to_dict` reads its fields one by one: `dataclasses.asdict` deep-copied the schedule before
    dropping it (11.5 s for the whole azure-conv trace's, past `better`'s time limit)."""
    from solvers.better import BetterAnswer

    class NotToCopy:
        def __deepcopy__(self, memo):
            raise AssertionError("the schedule was copied")

    ans = BetterAnswer("yes", "why", "vllm", 2.0, 1.8, 1.5, 1.0, 3, 3, None, schedule=NotToCopy(),
                       methods={"lower_bound_method": "m"}, differences={"batches": [1, 2]})
    out = ans.to_dict()
    assert "schedule" not in out and out["found_s"] == 1.5 and out["lower_bound_method"] == "m"
    assert out["differences"] == {"batches": [1, 2]}


def test_python_api_checks_its_inputs_and_defaults_the_time_limit():
    """Found by probing the Python API (2026-12-02): `better` and `analyse` without a time limit ended in a TypeError
    (the deadline was None); a margin of NaN in a ValueError about integers, one of 0 or 2 answered; a list of tuples
    in an AttributeError inside the solvers. Now: the command line's 60 s by default, a finite limit > 0 required, a
    margin in (0, 1), Request objects."""
    from solvers.scale import DEFAULT_TIME_LIMIT_S, command_deadline

    reqs = [Request(i, 0.0, 16, 2) for i in range(3)]
    limits = Limits(C=64, M=200)
    ans = better(reqs, limits, COST, "vllm", 0.05)  # no time limit given anywhere
    assert ans.answer in ("yes", "no", "unknown")
    assert command_deadline(None, None, None).limit_s == DEFAULT_TIME_LIMIT_S == 60.0
    assert command_deadline(None, 7.0, None).limit_s == 7.0 and command_deadline(3.0, 7.0, None).limit_s == 3.0
    for limit in (0, -1.0, math.nan, math.inf, "10", True):
        with pytest.raises(ValueError, match="time limit must be a finite number of seconds > 0"):
            better(reqs, limits, COST, "vllm", 0.05, time_limit_s=limit)
        with pytest.raises(ValueError, match="time limit must be a finite number of seconds > 0"):
            analyse(reqs, limits, COST, time_limit_s=limit)
    for margin in (0, 0.0, 1, 2.0, -0.1, math.nan, "0.1", None):
        with pytest.raises(ValueError, match=r"margin must be a fraction in \(0, 1\)"):
            better(reqs, limits, COST, "vllm", margin, time_limit_s=5)
    for call in (lambda rs: better(rs, limits, COST, "vllm", 0.05, time_limit_s=5),
                 lambda rs: analyse(rs, limits, COST, time_limit_s=5), lambda rs: optimize(rs, limits, COST)):
        with pytest.raises(TypeError, match="requests must be infermax.request.Request objects, got tuple"):
            call([(0, 0.0, 16, 2)])
        with pytest.raises(ValueError, match="the workload has no requests"):
            call([])


def test_python_api_refuses_wrong_argument_types_and_reads_an_objective_text():
    """Found by probing the Python API (2026-12-02, later): limits as a dict, a cost model's name, options as a dict
    and the text of an objective ended in AttributeErrors inside `optimize`, `analyse` and `better`; a margin of
    np.float32(0.05) was refused. Now the types are checked first and an objective may be given as its text."""
    import numpy as np

    from solvers import SolveOptions

    reqs = [Request(i, 0.0, 16, 2) for i in range(3)]
    limits = Limits(C=64, M=200)
    calls = {"better": lambda **kw: better(reqs, kw.get("limits", limits), kw.get("cost", COST), "vllm", 0.05,
                                           objective=kw.get("objective", Objective(makespan=1)),
                                           options=kw.get("options"), time_limit_s=5),
             "analyse": lambda **kw: analyse(reqs, kw.get("limits", limits), kw.get("cost", COST),
                                             objective=kw.get("objective", Objective(makespan=1)),
                                             options=kw.get("options"), time_limit_s=5),
             "optimize": lambda **kw: optimize(reqs, kw.get("limits", limits), kw.get("cost", COST),
                                               objective=kw.get("objective", Objective(makespan=1)),
                                               options=kw.get("options") or SolveOptions(time_limit_s=5))}
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"limits must be an infermax.limits.Limits, got dict"):
            call(limits={"C": 64})
        with pytest.raises(TypeError, match="cost_model must be a cost model with milp_terms .* got str 'linear'"):
            call(cost="linear")
        with pytest.raises(TypeError, match="objective must be a solvers.objective.Objective or its text"):
            call(objective=3)
        with pytest.raises(ValueError, match="unknown objective component 'fast'"):
            call(objective="fast")
        if name != "optimize":
            with pytest.raises(TypeError, match="options must be a solvers.SolveOptions or None, got dict"):
                call(options={"time_limit_s": 5})
    assert analyse(reqs, limits, COST, objective="makespan=1,ttft=0.5", time_limit_s=5).objective == \
        Objective(makespan=1, ttft=0.5)
    assert better(reqs, limits, COST, "vllm", np.float32(0.05), time_limit_s=5).answer in ("yes", "no", "unknown")
    from solvers.lower_bound import lower_bound_report

    assert lower_bound_report(reqs, limits, COST, "latency").value_s == \
        lower_bound_report(reqs, limits, COST, Objective(latency=1)).value_s > 0
    with pytest.raises(TypeError, match="limits must be an infermax.limits.Limits, got dict"):
        lower_bound_report(reqs, {"C": 64}, COST, "latency")
    with pytest.raises(TypeError, match="requests must be infermax.request.Request objects, got tuple"):
        lower_bound_report([(0, 0.0, 16, 2)], limits, COST, "latency")
