"""`infermax fit` for a GPU the project does not list (an "A40"), with batches past 16,384 tokens, then
`infermax simulate --gpu a40` on the fit (issue 18). The profile is synthetic, in Vidur's format."""

from __future__ import annotations

import json
from math import floor

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from infermax.cli import app
from infermax.costmodel.measurements import NON_ATTENTION_OPS
from infermax.models import GiB, GPUSpec, get_model, kv_capacity_tokens

runner = CliRunner()
TOKENS = [1, 2, 4, 8, 16] + list(range(64, 1025, 64)) + list(range(1536, 4097, 512)) + list(range(8192, 32769, 4096))
A40 = "memory_gib=48,peak_fp16_tflops=149.7,memory_bandwidth_gbps=696"


def write_vidur_a40(folder, decode_ms=lambda b, m: 0.005 + 1e-7 * b * m,
                    prefill_ms=lambda c, m: 0.002 + 1e-9 * c * c + 1e-9 * c * m + 1e-6 * c, op_base_ms=0.004) -> None:
    """mlp.csv (Llama-2-7B shapes, every operator affine in the tokens, ``op_base_ms`` at 0 tokens) and
    attention.csv (prefill and decode; a decode row of ``b`` sequences of ``m`` KV tokens takes ``decode_ms(b, m)``
    per layer, the attention kernel of a ``c``-token chunk after ``m`` cached tokens ``prefill_ms(c, m)``)."""
    folder.mkdir(parents=True)
    n = np.array(TOKENS, dtype=float)
    mlp = pd.DataFrame({"num_tokens": TOKENS, "num_tensor_parallel_workers": 1, "n_head": 32, "n_kv_head": 32,
                        "n_embd": 4096, "n_expanded_embd": 11008, "vocab_size": 32000, "use_gated_mlp": True})
    for k, op in enumerate(("emb",) + NON_ATTENTION_OPS):
        median = op_base_ms + (k + 1) * 2e-6 * n + 1e-3 * (n > 4096)
        for stat, value in (("median", median), ("mean", median), ("std", 0.01 * median), ("min", median),
                            ("max", median)):
            mlp[f"time_stats.{op}.{stat}"] = value
    mlp.to_csv(folder / "mlp.csv", index=False)
    rows = []
    for c in (16, 64, 256, 1024, 4096, 16384, 32768):
        for m in (0, 2048):
            rows.append((True, 1, c, m, prefill_ms(c, m), 0.0, 0.001 + 2e-6 * c))
    for b in (1, 4, 16, 64, 256):
        for m in (128, 1024, 4096):
            rows.append((False, b, 0, m, 0.0, decode_ms(b, m), 0.0))
    pd.DataFrame(rows, columns=["is_prefill", "batch_size", "prefill_chunk_size", "kv_cache_size",
                                "attn_prefill_median_ms", "attn_decode_median_ms", "attn_kv_cache_save_median_ms"]) \
        .assign(num_tensor_parallel_workers=1).to_csv(folder / "attention.csv", index=False)


@pytest.fixture(scope="module")
def a40_profiles(tmp_path_factory):
    root = tmp_path_factory.mktemp("a40")
    write_vidur_a40(root / "vidur" / "a40" / "Llama-2-7b-hf")
    return root


def test_fit_an_unlisted_gpu_with_its_spec_then_simulate_on_it(a40_profiles, monkeypatch):
    profiles = a40_profiles / "profiles"
    monkeypatch.setenv("INFERMAX_PROFILES", str(profiles))
    fitted = runner.invoke(app, ["fit", str(a40_profiles / "vidur" / "a40" / "Llama-2-7b-hf"), "--out",
                                 str(profiles / "a40" / "llama-2-7b"), "--gpu-spec", A40, "--no-plots"],
                           env={"COLUMNS": "250"})
    assert fitted.exit_code == 0, fitted.output
    assert "16385-65536" in fitted.output and "roofline" in fitted.output  # a range past 16,384; compared
    doc = json.loads((profiles / "a40" / "llama-2-7b" / "tp1" / "profile.json").read_text())
    assert doc["attention"] == "measured" and "16385-65536" in doc["heldout_error"]["non_attention"]["piecewise"]
    assert doc["heldout_error"]["non_attention"]["piecewise"]["16385-65536"]["rows"] == sum(t > 16384 for t in TOKENS)
    assert doc["gpu_spec"]["memory_bytes"] == 48 * GiB and "roofline" in doc["heldout_error"]["decode_attention"]
    linear = json.loads((profiles / "a40" / "llama-2-7b" / "tp1" / "infermax_linear.json").read_text())
    assert "prefill_intercept_held" not in linear["fit"]

    res = runner.invoke(app, ["simulate", "--gpu", "a40", "--model", "llama-2-7b", "--I", "64", "--O", "4", "--B", "8",
                              "--gpu-mem-util", "0.9", "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["makespan_s"] > 0
    expected_m = floor((48 * GiB * 0.9 - get_model("llama-2-7b").weight_bytes()) / get_model("llama-2-7b").kv_bytes_per_token())
    assert kv_capacity_tokens("llama-2-7b", "a40", 0.9) == expected_m
    assert kv_capacity_tokens("llama-2-7b", GPUSpec("x", 48 * GiB, 1.0, 1.0), 0.9) == expected_m


def test_linear_fit_holds_a_whole_groups_intercept_at_zero_so_every_batch_takes_positive_time(tmp_path, monkeypatch):
    """Decode attention convex in the KV read (as timing noise made a CI smoke profile): least squares alone puts
    the decode plane's intercept below zero, and the fit then timed a batch of one decode token at < 0 s and
    refused its own result. The intercept is held at 0, the fit loads, and a decode-only run simulates."""
    from infermax.costmodel.fitting import ProfileSpec, _ols, build_groups, read_measurements

    source = tmp_path / "vidur" / "a40" / "Llama-2-7b-hf"
    write_vidur_a40(source, decode_ms=lambda b, m: 2e-12 * (b * m) ** 2)
    profiles = tmp_path / "profiles"
    monkeypatch.setenv("INFERMAX_PROFILES", str(profiles))
    fitted = runner.invoke(app, ["fit", str(source), "--out", str(profiles / "a40" / "llama-2-7b"), "--gpu-spec", A40,
                                 "--no-plots"], env={"COLUMNS": "250"})
    assert fitted.exit_code == 0, fitted.output
    folder = profiles / "a40" / "llama-2-7b" / "tp1"
    decode = next(g for g in build_groups(read_measurements(folder / "measurements.csv"), ProfileSpec.read(folder))
                  if g.name == "decode_attention")
    assert _ols(decode.columns(decode.linear_features), decode.y_ms).intercept_ < 0  # what plain least squares gives
    linear = json.loads((folder / "infermax_linear.json").read_text())["per_layer_ms"]
    assert linear["decode_attention"]["intercept"] == 0.0 and linear["decode_attention"]["per_kv_token"] > 0
    res = runner.invoke(app, ["simulate", "--gpu", "a40", "--model", "llama-2-7b", "--cost-model", "linear", "--I", "1",
                              "--O", "4", "--B", "2", "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["makespan_s"] > 0


def test_linear_fit_holds_the_prefill_intercept_only_where_a_one_token_prefill_would_take_no_time(tmp_path,
                                                                                                  monkeypatch):
    """Prefill attention cubic in the chunk (convex beyond the plane's c² term) and non-attention nearly free at 0
    tokens: the composite prefill plane's least-squares intercept is negative enough that a batch of one prefill
    token would take < 0 s. Its intercept is then held at 0, the fit says so, and a run with prefills simulates.
    (The default synthetic profile keeps its free intercept: the other tests' fits are unchanged.)"""
    source = tmp_path / "vidur" / "a40" / "Llama-2-7b-hf"
    write_vidur_a40(source, prefill_ms=lambda c, m: 1e-13 * c ** 3 + 1e-9 * c * m, op_base_ms=1e-4)
    profiles = tmp_path / "profiles"
    monkeypatch.setenv("INFERMAX_PROFILES", str(profiles))
    fitted = runner.invoke(app, ["fit", str(source), "--out", str(profiles / "a40" / "llama-2-7b"), "--gpu-spec", A40,
                                 "--no-plots"], env={"COLUMNS": "250"})
    assert fitted.exit_code == 0, fitted.output
    assert "linear fit: least squares timed a batch of one prefill token at -" in fitted.output.replace("\n", "")
    doc = json.loads((profiles / "a40" / "llama-2-7b" / "tp1" / "infermax_linear.json").read_text())
    assert doc["per_layer_ms"]["prefill_attention"]["intercept"] == 0.0
    assert "a batch of one prefill token at -" in doc["fit"]["prefill_intercept_held"]
    res = runner.invoke(app, ["simulate", "--gpu", "a40", "--model", "llama-2-7b", "--cost-model", "linear", "--I", "1",
                              "--O", "2", "--B", "3", "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["makespan_s"] > 0


def test_fit_an_unlisted_gpu_without_a_spec_skips_the_roofline(a40_profiles, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERMAX_PROFILES", str(tmp_path))
    out = tmp_path / "a40" / "llama-2-7b"
    fitted = runner.invoke(app, ["fit", str(a40_profiles / "vidur" / "a40" / "Llama-2-7b-hf"), "--out", str(out),
                                 "--no-plots"], env={"COLUMNS": "250"})
    assert fitted.exit_code == 0, fitted.output
    assert "roofline not compared: unknown gpu 'a40'" in fitted.output.replace("\n", "")
    doc = json.loads((out / "tp1" / "profile.json").read_text())
    assert "gpu_spec" not in doc and all("roofline" not in e for e in doc["heldout_error"].values())
    assert (out / "tp1" / "infermax_piecewise.json").is_file()
    # simulating on it needs the GPU's figures (for M and the swap cost): a clear error naming --gpu-spec
    res = runner.invoke(app, ["simulate", "--gpu", "a40", "--B", "4", "--no-progress"])
    assert res.exit_code == 2 and "--gpu-spec" in res.output, res.output


@pytest.mark.parametrize("spec, message", [
    ("memory_gib=48,peak_fp16_tflops=149.7", "missing key(s) memory_bandwidth_gbps"),
    ("memory_gib=48,peak_fp16_tflops=-1,memory_bandwidth_gbps=696", "peak_fp16_tflops must be positive"),
    ("memory=48", "unknown key(s) memory"), ("fast", "not key=number")])
def test_bad_gpu_spec_is_a_clear_error(a40_profiles, tmp_path, spec, message):
    res = runner.invoke(app, ["fit", str(a40_profiles / "vidur" / "a40" / "Llama-2-7b-hf"), "--out", str(tmp_path),
                              "--gpu-spec", spec, "--no-plots"], env={"COLUMNS": "250"})
    assert res.exit_code == 2 and message in res.output, res.output


def test_token_ranges_extend_past_the_profiled_sizes():
    from infermax.costmodel.fitting import TOKEN_RANGES, token_ranges

    assert token_ranges(4096) == TOKEN_RANGES
    assert token_ranges(32768)[-1] == (16385, 65536)
    assert token_ranges(100_000)[-1] == (65537, 262144)


@pytest.mark.parametrize("device, expected", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                              ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
                                              ("NVIDIA L4", None), ("", None)])
def test_a_profile_of_a_registered_device_under_another_name_gets_its_figures(device, expected):
    from dataclasses import replace

    from infermax.costmodel.fitting import recorded_device_spec
    from infermax.models import GPUS

    spec = recorded_device_spec({"profiled": {"device": device}}, "H200-graphs")
    assert spec == (None if expected is None else replace(GPUS[expected], name="h200-graphs"))
    assert recorded_device_spec({}, "x") is None and recorded_device_spec({"profiled": "?"}, "x") is None


def test_fit_of_a_graph_timed_h200_profile_compares_the_roofline_and_saves_the_h200_figures(tmp_path, monkeypatch):
    # The committed CUDA-graph profile (profiles/h200-graphs: an H200 timed through graphs) refitted from its
    # measurements alone: the folder's GPU name is not registered, its recorded device is.
    import shutil
    from dataclasses import replace

    from infermax.costmodel import profiles_dir
    from infermax.costmodel.fitting import fit_profile
    from infermax.models import GPUS, get_gpu, gpu_spec_to_dict

    source = profiles_dir() / "h200-graphs" / "llama-3-8b" / "tp1"
    folder = tmp_path / "h200-graphs" / "llama-3-8b" / "tp1"
    folder.mkdir(parents=True)
    shutil.copy(source / "measurements.csv", folder)
    doc = json.loads((source / "profile.json").read_text())
    kept = {k: doc[k] for k in ("gpu", "model", "tp", "num_layers", "hidden_size", "attention", "communication",
                                "profiled")}
    (folder / "profile.json").write_text(json.dumps(kept))
    fitted = fit_profile(folder, plots=False)
    assert fitted["gpu_spec"] == gpu_spec_to_dict(replace(GPUS["h200"], name="h200-graphs"))
    assert "roofline" not in fitted and "roofline" in fitted["heldout_error"]["decode_attention"]
    monkeypatch.setenv("INFERMAX_PROFILES", str(tmp_path))
    assert get_gpu("h200-graphs").memory_bytes == GPUS["h200"].memory_bytes
