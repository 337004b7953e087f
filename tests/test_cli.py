"""The command line: defaults work on a fresh install, bad input gets a clear error (no traceback)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from infermax.cli import app
from infermax.schedulers import available

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_simulate_defaults_print_a_summary():
    res = invoke("simulate", "--no-progress", "--B", "64")
    assert res.exit_code == 0, res.output
    assert "tps" in res.output and "makespan_s" in res.output


@pytest.mark.parametrize("name", available())
def test_every_scheduler_runs_from_the_cli(name):
    res = invoke("simulate", "--scheduler", name, "--I", "64", "--O", "8", "--B", "16", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["generated_tokens"] == 16 * 8


def test_out_dir_and_validate_roundtrip(tmp_path):
    out = tmp_path / "run"
    res = invoke("simulate", "--I", "32", "--O", "4", "--B", "8", "--M", "200", "--json", "--out", str(out))
    assert res.exit_code == 0, res.output
    original = json.loads(res.output)
    for name in ("summary.json", "requests.parquet", "batches.parquet", "schedule.json"):
        assert (out / name).is_file()
    res = invoke("validate", str(out / "schedule.json"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == original


def test_validate_times_a_schedule_with_the_cost_model_it_records(tmp_path):
    """A schedule simulated on the H100 profile was replayed on the default A100 one, 67% slower, without a word; it
    now replays on its own model unless another is given, and then says that the two differ."""
    out = tmp_path / "run"
    res = invoke("simulate", "--I", "64", "--O", "8", "--B", "4", "--gpu", "h100", "--json", "--out", str(out))
    assert res.exit_code == 0, res.output
    original = json.loads(res.output)
    same = invoke("validate", str(out / "schedule.json"), "--json")
    assert same.exit_code == 0 and json.loads(same.output) == original
    other = CliRunner().invoke(app, ["validate", str(out / "schedule.json"), "--gpu", "a100"])
    assert other.exit_code == 0, other.output
    assert "note: the schedule was timed with piecewise:h100/llama-2-7b/tp1" in other.output
    again = invoke("validate", str(out / "schedule.json"), "--gpu", "a100", "--json")
    assert json.loads(again.output)["makespan_s"] != pytest.approx(original["makespan_s"], rel=1e-3)


def test_validate_rejects_a_tampered_schedule(tmp_path):
    out = tmp_path / "run"
    assert invoke("simulate", "--I", "8", "--O", "4", "--B", "2", "--json", "--out", str(out)).exit_code == 0
    data = json.loads((out / "schedule.json").read_text())
    data["batches"][1]["items"][0][1] = 3  # a decode processing 3 tokens
    (out / "schedule.json").write_text(json.dumps(data))
    res = invoke("validate", str(out / "schedule.json"))
    assert res.exit_code == 1
    assert "batch 1" in res.output and "[decode]" in res.output


@pytest.mark.parametrize("tamper,message", [
    (lambda d: d.update(meta=3), "meta must be an object"),
    (lambda d: d["meta"].update(config=[1]), "meta.config must be an object"),
    (lambda d: d["requests"].append(list(d["requests"][0])), "duplicate request id 0"),
    (lambda d: d.update(format=None), "not an InferMax schedule"),
    # (2026-12-01, a second fuzz of `validate`: each of these ended in a traceback)
    (lambda d: d["meta"]["config"].update(model=[]), "meta.config.model must be a string or null, got []"),
    (lambda d: d["meta"]["config"].update(costmodel_path=0), "meta.config.costmodel_path must be a string or null"),
    (lambda d: d["meta"]["config"].update(costmodel_path="/"), "meta.config.costmodel_path '/': is a directory"),
    (lambda d: d["meta"]["config"].update(tp=True), "meta.config.tp must be an integer >= 1 or null, got True"),
    (lambda d: d["meta"].update(swap_cost="0"), "meta.swap_cost: swap cost must be an object with per_token_s"),
    (lambda d: d["meta"]["swap_cost"].pop("per_token_s"), "meta.swap_cost: swap cost must be an object"),
    (lambda d: d["meta"]["swap_cost"].update(extra=1), "meta.swap_cost: swap cost must be an object"),
    (lambda d: d["meta"]["swap_cost"].update(per_token_s="0"), "swap cost must be finite non-negative numbers"),
    (lambda d: d["meta"]["swap_cost"].update(fixed_s=-1.0), "swap cost must be finite non-negative numbers"),
], ids=["meta", "config", "duplicate-id", "format", "model-list", "path-int", "path-dir", "tp-bool", "swap-str",
        "swap-missing", "swap-extra", "swap-token-str", "swap-negative"])
def test_validate_refuses_a_malformed_schedule_without_a_traceback(tmp_path, tamper, message):
    # Found by fuzzing `validate` with mutated schedule files: each of these ended in a Python traceback (TypeError,
    # AttributeError, or the replayer's ValueError for a duplicate id).
    out = tmp_path / "run"
    assert invoke("simulate", "--I", "8", "--O", "4", "--B", "2", "--json", "--out", str(out)).exit_code == 0
    data = json.loads((out / "schedule.json").read_text())
    tamper(data)
    (out / "schedule.json").write_text(json.dumps(data))
    res = invoke("validate", str(out / "schedule.json"))
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_optimize_and_better_write_schedules_that_validate_on_their_own_cost_model(tmp_path):
    # Found by fuzzing optimize/better --out then validate: the schedules carried no configuration, so `validate`
    # re-timed a schedule found on the linear model with the default piecewise one (0.0359 s reported, 0.0615 s).
    opt = invoke("optimize", "--I", "107", "--O", "6", "--B", "1", "--cost-model", "linear", "--objective", "latency",
                 "--time-limit", "3", "--json", "--out", str(tmp_path / "opt"))
    assert opt.exit_code == 0, opt.output
    replayed = invoke("validate", str(tmp_path / "opt" / "schedule.json"), "--json")
    assert json.loads(replayed.output)["mean_latency_s"] == pytest.approx(json.loads(opt.output)["objective_s"],
                                                                         rel=1e-9)
    ans = invoke("better", "-s", "bros", "--margin", "0.05", "--I", "3", "--O", "30", "--B", "20", "--M", "40",
                 "--cost-model", "linear", "--time-limit", "4", "--json", "--out", str(tmp_path / "better"))
    assert ans.exit_code == 0, ans.output
    found = json.loads(ans.output)["found_s"]
    assert found is not None and (tmp_path / "better" / "schedule.json").is_file()
    replayed = invoke("validate", str(tmp_path / "better" / "schedule.json"), "--json")
    assert json.loads(replayed.output)["makespan_s"] == pytest.approx(found, rel=1e-9)


def test_validate_refuses_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    res = invoke("validate", str(path))
    assert res.exit_code == 2 and "not an InferMax schedule" in res.output
    path.write_text("[" * 5000 + "]" * 5000)  # deeper than Python's JSON parser recurses: a RecursionError
    res = invoke("validate", str(path))
    assert res.exit_code == 2 and "JSON nested too deeply to read" in res.output
    res = invoke("validate", str(tmp_path))  # a folder where the file should be (was an IsADirectoryError traceback)
    assert res.exit_code == 2 and "is a directory, not a file" in res.output


def test_time_scale_without_trace_arrivals_is_refused():
    """`--time-scale` scales a trace's own arrival times; with a fixed or Poisson workload it was ignored silently,
    out-of-range values included (0, NaN), though `with_arrivals` refuses what a process does not use. Found by
    probing by hand (2026-12-02)."""
    res = invoke("simulate", "--I", "8", "--O", "2", "--B", "2", "--time-scale", "0.5")
    assert res.exit_code == 2 and "time_scale only applies to arrival process 'trace', not 'offline'" in res.output
    res = invoke("simulate", "--I", "8", "--O", "2", "--B", "2", "--arrival", "poisson", "--rate", "2",
                 "--time-scale", "2")
    assert res.exit_code == 2 and "not 'poisson'" in res.output
    res = invoke("simulate", "--I", "8", "--O", "2", "--B", "2", "--time-scale", "nan")
    assert res.exit_code == 2 and "time_scale must be a positive finite number" in res.output


def test_trace_replay_with_time_scaling():
    res = invoke("simulate", "--scheduler", "sarathi", "--trace", "azure-conv", "--trace-limit", "20",
                 "--time-scale", "0.5", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["num_requests"] == 20


@pytest.mark.parametrize("args,message", [
    (["--I", "0"], "--I must be an integer >= 1, got 0"),
    (["--O", "-3"], "--O must be an integer >= 1, got -3"),
    (["--B", "0"], "--B must be an integer >= 1, got 0"),
    (["--C", "0"], "--C must be an integer >= 1, got 0"),
    (["--P", "5000"], "P (prefill tokens per batch) = 5000 must not exceed C = 4096"),
    (["--scheduler", "nope"], "unknown scheduler 'nope'"),
    (["--seed", "-1"], "--seed must be an integer >= 0, got -1"),
    (["--cost-model-file", "/missing.json"], "--cost-model-file /missing.json: no such file"),
    (["--input-dist", "lognormal:abc"], "--input-dist: bad length distribution 'lognormal:abc'"),
    (["--output-dist", "uniform:9:1"], "--output-dist: bad length distribution 'uniform:9:1': LO must be <= HI"),
    (["--scheduler", "vllm-ef", "--M", "100", "--I", "512"], "no schedule can finish it"),
    (["--scheduler", "vllm", "--I", "5000", "--B", "2"], "does not chunk prefills"),
    (["--model", "gpt-5"], "unknown model"),
    (["--arrival", "poisson"], "needs rate_per_s"),
    (["--M", "100", "--gpu-mem-util", "0.9"], "either --M or --gpu-mem-util"),
])
def test_bad_input_gets_a_clear_error(args, message):
    res = runner.invoke(app, ["simulate", "--no-progress", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_a_prompt_above_min_c_p_names_the_longest_prompt(tmp_path):
    """Raising C to the first failing prompt alone would fail again at the next, longer one: the message says how far
    (Algorithm 1, Apt-Serve and BROS alike)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,5\n0.5,5000,5\n1.0,9000,3\n")
    for scheduler in ("vllm", "aptserve", "bros"):
        res = runner.invoke(app, ["simulate", "--no-progress", "--trace", str(trace), "--M", "20000", "-s", scheduler])
        assert res.exit_code == 2, res.output
        assert "5000-token" in res.output and "longest prompt has 9,000 tokens" in res.output, (scheduler, res.output)


def test_malformed_trace_names_the_line(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,abc,5\n")
    res = runner.invoke(app, ["simulate", "--trace", str(trace)])
    assert res.exit_code == 2
    assert "line 3" in res.output


def test_gpu_memory_derives_M():
    res = invoke("simulate", "--gpu-mem-util", "0.9", "--I", "16", "--O", "2", "--B", "4", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "M=121752" in res.output.replace("\n", "").replace(" ", "")


def test_listing_commands():
    assert "sarathi-nohy-ef" in invoke("schedulers").output
    assert "llama-3-8b" in invoke("models").output


def test_run_config_round_trips_and_rejects_unknown_keys():
    from infermax.config import RunConfig

    config = RunConfig(scheduler="sarathi", I=16, O=4, B=3, M=500)
    assert RunConfig.from_dict(config.to_dict()) == config
    result = config.simulate()
    assert result.meta["config"] == config.to_dict()
    assert result.summary["generated_tokens"] == 12
    with pytest.raises(ValueError, match="unknown configuration key.*bogus"):
        RunConfig.from_dict({"bogus": 1})


def test_simulate_reports_slo_attainment():
    base = ("simulate", "-s", "aptserve", "--dataset", "humaneval", "--B", "40", "--arrival", "poisson", "--rate", "5",
            "--block-size", "16", "--json")
    loose = json.loads(invoke(*base, "--slo-ttft", "1000", "--slo-tbt", "1000").output)
    impossible = json.loads(invoke(*base, "--slo-ttft", "1e-9", "--slo-tbt", "1000").output)
    assert loose["slo_attainment"] == 1.0 and loose["num_requests"] == 40
    assert impossible["slo_attainment"] == 0.0 and impossible["tbt_attainment"] == 1.0
    assert "slo_attainment" not in json.loads(invoke("simulate", "--B", "4", "--I", "8", "--O", "2", "--json").output)
