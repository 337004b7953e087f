"""Scoring a measured run against a cost model (infermax/profiling/scoring.py, `gpu-replay --measured`); no GPU and
no PyTorch needed: the "measured" times here are made from a cost model, so the expected errors follow by hand."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from infermax.cli import app
from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.profiling.scoring import load_measured, rescore
from infermax.replay import replay
from infermax.workload import fixed, with_arrivals

runner = CliRunner()


@pytest.fixture(scope="module")
def schedule():
    requests = with_arrivals(fixed(96, 12, 10), "poisson", rate_per_s=20.0, seed=1)
    return simulate(requests, "sarathi", Limits(C=128, M=2_000), load_cost_model("a100", "llama-2-7b")).schedule


def _batch_times(schedule, cost_model) -> np.ndarray:
    return replay(schedule, cost_model).batches["duration_s"].to_numpy()


def test_scaled_measurements_give_the_hand_computed_errors(schedule):
    linear = load_cost_model("a100", "llama-2-7b", kind="linear")
    measured = list(1.1 * _batch_times(schedule, linear))  # every batch measured 10% slower than predicted
    check = rescore(schedule, linear, measured, {"device": "hand"})
    s = check.summary
    assert s["device"] == "hand" and s["batches"] == len(schedule.batches)
    assert s["per_batch_mape_pct"] == pytest.approx(100 * 0.1 / 1.1)  # |pred - 1.1 pred| / (1.1 pred)
    assert s["busy_time_error_pct"] == pytest.approx(-100 * 0.1 / 1.1)
    assert (check.batches["error_pct"] < 0).all()
    # Online arrivals: the measured timeline waits for arrivals the same way, so latencies are not simply 1.1x.
    assert check.requests["measured_latency_s"].ge(check.requests["simulated_latency_s"] - 1e-12).all()


def test_predictions_are_the_cost_models_own_batch_times(schedule):
    linear = load_cost_model("a100", "llama-2-7b", kind="linear")
    piecewise = load_cost_model("a100", "llama-2-7b", kind="piecewise")
    measured = list(_batch_times(schedule, linear))
    check = rescore(schedule, piecewise, measured)
    assert np.allclose(check.batches["predicted_s"], _batch_times(schedule, piecewise), rtol=1e-12)
    exact = rescore(schedule, linear, measured)
    assert exact.summary["per_batch_mape_pct"] == pytest.approx(0, abs=1e-9)
    assert exact.summary["e2e_latency_error_pct"] == pytest.approx(0, abs=1e-9)


def test_wrong_length_or_bad_times_are_refused(schedule):
    linear = load_cost_model("a100", "llama-2-7b", kind="linear")
    with pytest.raises(ValueError, match="not a measurement of this schedule"):
        rescore(schedule, linear, [0.01] * (len(schedule.batches) + 1))
    with pytest.raises(ValueError, match="positive and finite"):
        rescore(schedule, linear, [0.0] * len(schedule.batches))


def test_cli_scores_a_saved_run_against_another_model(schedule, tmp_path):
    linear = load_cost_model("a100", "llama-2-7b", kind="linear")
    run = tmp_path / "run"
    rescore(schedule, linear, list(1.25 * _batch_times(schedule, linear)), {"device": "H-test", "torch": "x"}).save(run)
    path = schedule.save(tmp_path / "schedule.json")
    assert load_measured(run)[1] == {"device": "H-test", "torch": "x"}
    out = tmp_path / "linear"
    result = runner.invoke(app, ["gpu-replay", str(path), "--measured", str(run), "--gpu", "a100",
                                 "--cost-model", "linear", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"] == "H-test" and summary["per_batch_mape_pct"] == pytest.approx(20.0, rel=1e-4)
    # A run of another schedule (one batch fewer) and a folder that is no run: exit 2 with the reason.
    short = tmp_path / "short"
    short.mkdir()
    pd.read_csv(run / "batches.csv").iloc[:-1].to_csv(short / "batches.csv", index=False)
    result = runner.invoke(app, ["gpu-replay", str(path), "--measured", str(short), "--no-progress"])
    assert result.exit_code == 2 and "not a measurement of this schedule" in result.output
    result = runner.invoke(app, ["gpu-replay", str(path), "--measured", str(tmp_path), "--no-progress"])
    assert result.exit_code == 2 and "not a `gpu-replay --out` folder" in result.output


def test_a_measured_run_whose_files_are_not_text_is_refused_by_name(tmp_path):
    """`gpu-replay --measured RUN` read RUN's batches.csv and summary.json without naming a file that is not UTF-8
    text (the codec's message only)."""
    from infermax.profiling.scoring import BATCHES_CSV, SUMMARY_JSON

    run = tmp_path / "run"
    run.mkdir()
    (run / BATCHES_CSV).write_bytes(b"\x15\x04\x15\xb8\x01\xff\xfe")
    with pytest.raises(ValueError, match="not a UTF-8 text file") as e:
        load_measured(run)
    assert BATCHES_CSV in str(e.value)
    (run / BATCHES_CSV).write_text("measured_s\n0.01\n")
    (run / SUMMARY_JSON).write_bytes(b"{\xff}")
    with pytest.raises(ValueError, match="not a UTF-8 text file") as e:
        load_measured(run)
    assert SUMMARY_JSON in str(e.value)


def test_rescore_records_walks_the_replay_tree_against_each_fit(schedule, tmp_path):
    # Records <model>/<case>/ measured 25% slower than the linear fit of a100/llama-2-7b, re-scored against fits copied
    # into <profiles>/<model>/tp1/: the linear fit gives the hand-computed 20% per batch, the piecewise one its own
    # predictions; a filter by model or case keeps only those, and the order given is kept.
    import shutil

    from infermax.costmodel import profile_folder
    from infermax.profiling.scoring import rescore_records

    linear = load_cost_model("a100", "llama-2-7b", kind="linear")
    replays, profiles = tmp_path / "replays", tmp_path / "profiles"
    for model, case in (("m1", "vllm"), ("m1", "sarathi"), ("m2", "vllm")):
        folder = replays / model / case
        rescore(schedule, linear, list(1.25 * _batch_times(schedule, linear))).save(folder / "replay")
        (folder / "sim").mkdir()
        schedule.save(folder / "sim" / "schedule.json")
        (profiles / model / "tp1").mkdir(parents=True, exist_ok=True)
        for family in ("linear", "piecewise"):
            name = f"infermax_{family}.json"
            shutil.copy(profile_folder("a100", "llama-2-7b") / name, profiles / model / "tp1" / name)
    got = list(rescore_records(replays, profiles))
    assert [(m, c, f) for m, c, f, _ in got] == [(m, c, f) for m, c in (("m1", "sarathi"), ("m1", "vllm"), ("m2", "vllm"))
                                                 for f in ("linear", "piecewise")]
    piecewise = load_cost_model("a100", "llama-2-7b", kind="piecewise")
    for _, _, family, check in got:
        if family == "linear":
            assert check.summary["per_batch_mape_pct"] == pytest.approx(20.0, rel=1e-6)
        else:
            assert np.allclose(check.batches["predicted_s"], _batch_times(schedule, piecewise), rtol=1e-12)
    assert [(m, c) for m, c, _, _ in rescore_records(replays, profiles, cases=["vllm"], families=("linear",))] == [
        ("m1", "vllm"), ("m2", "vllm")]
    assert [(m, c) for m, c, _, _ in rescore_records(replays, profiles, ["m2", "m1"], ["vllm"], ("linear",))] == [
        ("m2", "vllm"), ("m1", "vllm")]
