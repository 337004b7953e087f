"""Tests for the linear cost model, its fitting from Vidur profiles and profile loading."""

import json

import numpy as np
import pytest

from infermax.costmodel import (BatchFeatures, CostModel, LinearCostModel, features_frame, load_cost_model, profiles_dir,
                                terms_time_s)
import pandas as pd

from infermax.costmodel import PiecewiseCostModel, profile_folder, roofline_model
from infermax.costmodel.measurements import NON_ATTENTION_OPS, read_measurements

COEFFS = {  # chosen so every term is distinguishable; ms
    "kind": "infermax-linear", "version": 1, "gpu": "toy", "model": "toy", "tp": 1, "num_layers": 2,
    "per_layer_ms": {"non_attention": {"intercept": 1.0, "per_token": 0.1},
                     "prefill_attention": {"intercept": 2.0, "per_c2": 0.001, "per_c_ctx": 0.0005, "per_token": 0.05},
                     "decode_attention": {"intercept": 3.0, "per_kv_token": 0.01}},
    "per_batch_ms": {"intercept": 0.5, "per_token": 0.02},
}
PROFILE = profile_folder("a100", "llama-2-7b", 1)


def batch(prefills=(), decodes=()) -> BatchFeatures:
    f = BatchFeatures()
    for c, m in prefills:
        f.add_prefill(c, m)
    for m in decodes:
        f.add_decode(m)
    return f


@pytest.fixture
def toy() -> LinearCostModel:
    return LinearCostModel(COEFFS)


@pytest.fixture(scope="module")
def fitted() -> LinearCostModel:
    return load_cost_model(kind="linear")


def test_toy_model_hand_computed(toy):
    assert isinstance(toy, CostModel)
    assert toy.batch_time_s(BatchFeatures()) == 0.0
    # prefill c=10 after m=20: 2*(1 + 0.1*10) + 2*(2 + 0.001*100 + 0.0005*200 + 0.05*10) + 0.5 + 0.02*10
    #   = 4 + 5.4 + 0.7 ms
    assert toy.batch_time_s(batch(prefills=[(10, 20)])) == pytest.approx(10.1e-3)
    # two chunks (10 after 20, 5 after 0): 15 prefill tokens, sum c^2 = 125, sum c*m = 200, one intercept
    #   2*(1 + 1.5) + 2*(2 + 0.125 + 0.1 + 0.75) + 0.5 + 0.3 = 5 + 5.95 + 0.8 ms
    assert toy.batch_time_s(batch(prefills=[(10, 20), (5, 0)])) == pytest.approx(11.75e-3)
    # decodes at m=9 and m=29 read 10 + 30 KV; no prefill per-token (KV save) term: 2*(1 + 0.2) + 2*(3 + 0.4) + 0.5 + 0.04 ms
    assert toy.batch_time_s(batch(decodes=[9, 29])) == pytest.approx(9.74e-3)
    # hybrid: both attention terms, shared non-attention line over 12 tokens, per_token on the 10 prefill tokens only
    hybrid = 2 * (1 + 1.2) + 2 * (2 + 0.1 + 0.1 + 0.5) + 2 * (3 + 0.4) + 0.5 + 0.24
    assert toy.batch_time_s(batch(prefills=[(10, 20)], decodes=[9, 29])) == pytest.approx(hybrid * 1e-3)


def test_predict_matches_scalar(toy, fitted):
    rng = np.random.default_rng(1)
    batches = [BatchFeatures(), batch(prefills=[(7, 0)]), batch(decodes=[5])]
    for _ in range(30):
        batches.append(batch(prefills=[(int(c), int(m)) for c, m in rng.integers(1, 3000, (rng.integers(0, 3), 2))],
                             decodes=[int(m) for m in rng.integers(0, 8000, rng.integers(0, 40))]))
    table = features_frame(batches)
    models = (toy, fitted, PiecewiseCostModel.from_json(PROFILE / "infermax_piecewise.json"),
              roofline_model("h100", "llama-2-70b", 4))
    for model in models:
        assert model.predict_s(table) == pytest.approx([model.batch_time_s(f) for f in batches], rel=1e-12)
        terms = model.milp_terms()
        assert [terms_time_s(terms, f) for f in batches] == pytest.approx([model.batch_time_s(f) for f in batches], rel=1e-12)


def test_default_model_reproduces_a_measured_prefill(fitted):
    """A 4096-token prefill = 32 layers of measured ops (add twice) + attention + KV save, plus embedding.
    For A100 Llama-2-7B the prefill rows are the sample's unchanged (q_scale 1, same GPU)."""
    table = read_measurements(PROFILE / "measurements.csv")
    ops = table[table.num_tokens.eq(4096) & table.operator.isin(NON_ATTENTION_OPS + ("emb",))].drop_duplicates("operator")
    per_op = dict(zip(ops.operator, ops.median_ms))
    sample = pd.read_csv(profiles_dir() / "_sources" / "a100_llama3_8b_attention_sample.csv")
    row = sample[sample.is_prefill & (sample.prefill_chunk_size == 4096) & (sample.kv_cache_size == 0)].iloc[0]
    per_layer = sum(per_op[op] for op in NON_ATTENTION_OPS) + per_op["add"] + row.attn_prefill_median_ms \
        + row.attn_kv_cache_save_median_ms
    measured_s = (32 * per_layer + per_op["emb"]) / 1e3
    for model in (fitted, load_cost_model(kind="piecewise")):
        assert model.batch_time_s(batch(prefills=[(4096, 0)])) == pytest.approx(measured_s, rel=0.10)


def test_decode_batch_excludes_kv_save_per_token(fitted):
    """A decode-only batch = ops line + decode attention + embedding; no per-token KV save."""
    layers, ms = fitted.num_layers, fitted.coefficient_ms
    for n, m in ((1, 512), (100, 640), (512, 4000)):
        expected_ms = (layers * (ms("per_layer_ms.non_attention.intercept") + ms("per_layer_ms.non_attention.per_token") * n)
                       + layers * (ms("per_layer_ms.decode_attention.intercept")
                                   + ms("per_layer_ms.decode_attention.per_kv_token") * n * (m + 1))
                       + ms("per_batch_ms.intercept") + ms("per_batch_ms.per_token") * n)
        assert fitted.batch_time_s(batch(decodes=[m] * n)) == pytest.approx(expected_ms / 1e3, rel=1e-12)
        # the prefill save rate would add layers * per_token * n (~1.8 ms at n=100), far above the tolerance
        assert layers * ms("per_layer_ms.prefill_attention.per_token") * n > 1e-6 * expected_ms
    # one more decode token adds the ops and KV-read slopes only
    step_ms = 1e3 * (fitted.batch_time_s(batch(decodes=[640] * 101)) - fitted.batch_time_s(batch(decodes=[640] * 100)))
    expected_step_ms = (layers * (ms("per_layer_ms.non_attention.per_token") + ms("per_layer_ms.decode_attention.per_kv_token") * 641)
                        + ms("per_batch_ms.per_token"))
    assert step_ms == pytest.approx(expected_step_ms, rel=1e-9)


def test_monotone_in_tokens_and_kv(fitted):
    for model, strictly in ((fitted, True), (load_cost_model(kind="piecewise"), False)):
        by_tokens = [model.batch_time_s(batch(prefills=[(c, 0)])) for c in range(1, 8193, 64)]
        by_ctx = [model.batch_time_s(batch(prefills=[(512, m)])) for m in range(0, 16384, 256)]
        by_kv = [model.batch_time_s(batch(decodes=[m] * 16)) for m in range(0, 16384, 256)]
        by_batch = [model.batch_time_s(batch(decodes=[1024] * b)) for b in range(1, 257)]
        for series in (by_tokens, by_ctx, by_kv, by_batch):
            assert np.all(np.diff(series) > 0) if strictly else np.all(np.diff(series) >= 0)
        assert by_tokens[-1] > by_tokens[0] and by_kv[-1] > by_kv[0]


def test_decode_slope_is_kv_head_scaled(fitted):
    """Decode rows are the Llama-3-8B sample with KV lengths / 4 (32 vs 8 KV heads), so the OLS slope per
    KV token is 4x the slope fitted to the raw sample (numpy polyfit), the intercept the same."""
    sample = pd.read_csv(profiles_dir() / "_sources" / "a100_llama3_8b_attention_sample.csv")
    dec = sample[~sample.is_prefill]
    slope, intercept = np.polyfit(dec.batch_size * dec.kv_cache_size, dec.attn_decode_median_ms, 1)
    assert fitted.coefficient_ms("per_layer_ms.decode_attention.per_kv_token") == pytest.approx(4 * slope, rel=1e-6)
    assert fitted.coefficient_ms("per_layer_ms.decode_attention.intercept") == pytest.approx(intercept, rel=1e-6)


def test_fit_records_heldout_errors():
    doc = json.loads((PROFILE / "profile.json").read_text())
    table = doc["heldout_error"]
    for group in ("non_attention", "prefill_attention", "decode_attention"):
        for family in ("linear", "piecewise"):
            assert set(table[group][family]) == {"all", "1-16", "17-128", "129-1024", "1025-4096", "4097-16384"}
    assert table["non_attention"]["piecewise"]["1025-4096"]["mape_pct"] < 5
    assert doc["auto"] in ("linear", "piecewise")


def test_json_round_trip(toy, tmp_path):
    toy.save(tmp_path / "m.json")
    again = LinearCostModel.from_json(tmp_path / "m.json")
    assert again.to_dict() == toy.to_dict()
    assert load_cost_model(path=tmp_path / "m.json").batch_time_s(batch(decodes=[3])) == toy.batch_time_s(batch(decodes=[3]))


@pytest.mark.parametrize("edit, key", [
    (lambda d: d["per_layer_ms"]["decode_attention"].pop("per_kv_token"), "per_layer_ms.decode_attention.per_kv_token"),
    (lambda d: d["per_layer_ms"]["prefill_attention"].pop("per_token"), "per_layer_ms.prefill_attention.per_token"),
    (lambda d: d["per_batch_ms"].update(intercept=float("nan")), "per_batch_ms.intercept"),
    (lambda d: d["per_layer_ms"]["non_attention"].update(per_token="0.1"), "per_layer_ms.non_attention.per_token"),
    (lambda d: d.update(kind="vidur"), "kind"),
    (lambda d: d.pop("num_layers"), "num_layers"),
])
def test_malformed_json_names_file_and_key(tmp_path, edit, key):
    doc = json.loads(json.dumps(COEFFS))
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"bad.json.*'{key}'"):
        LinearCostModel.from_json(path)


def test_unknown_profile_lists_available(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"a100/llama-2-7b/tp1.*--cost-model roofline.*infermax fit"):
        load_cost_model(gpu="tpu", model="llama-2-7b")
    with pytest.raises(ValueError, match="tp=16.*a100/llama-2-7b/tp1"):
        load_cost_model(tp=16)
    folder = tmp_path / "x1" / "m1" / "tp1"
    folder.mkdir(parents=True)
    (folder / "infermax_linear.json").write_text(json.dumps(COEFFS))
    (folder / "profile.json").write_text(json.dumps({"auto": "linear"}))
    monkeypatch.setenv("INFERMAX_PROFILES", str(tmp_path))
    assert load_cost_model("x1", "m1").num_layers == 2
    with pytest.raises(ValueError, match="available gpu/model/tp: x1/m1/tp1"):
        load_cost_model()
    assert load_cost_model(kind="roofline").name == "roofline:a100/llama-2-7b/tp1"  # needs no profile


# A model JSON whose coefficients could time a batch at <= 0 s, or a larger batch faster, is rejected on load
# (issue 18: a negative slope gave makespan -0.06 s and an "optimal" objective of -0.06 s).
@pytest.mark.parametrize("edit, named", [
    (lambda d: d["per_layer_ms"]["non_attention"].update(per_token=-0.1), "'per_layer_ms.non_attention.per_token' is -0.1"),
    (lambda d: d["per_layer_ms"]["decode_attention"].update(per_kv_token=-1e-4), "per_kv_token' is -0.0001"),
    (lambda d: d["per_batch_ms"].update(per_token=-0.5), "'per_batch_ms.per_token' is -0.5"),
    (lambda d: d["per_layer_ms"]["non_attention"].update(intercept=-10.0),
     "one prefill token would take .*per_layer_ms.non_attention.intercept = -10"),
])
def test_negative_linear_coefficients_rejected_naming_file_and_key(tmp_path, edit, named):
    doc = json.loads(json.dumps(COEFFS))
    edit(doc)
    path = tmp_path / "neg.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"neg.json.*{named}"):
        load_cost_model(path=path)


def test_negative_intercept_allowed_while_every_batch_stays_positive(tmp_path):
    """Free intercepts are part of the fitted models (docs/design.md, issue-3 decisions 15 and 19): a
    negative group intercept is fine as long as the smallest batches still take positive time."""
    doc = json.loads(json.dumps(COEFFS))
    doc["per_layer_ms"]["prefill_attention"]["intercept"] = -0.5
    model = LinearCostModel(doc)
    assert model.batch_time_s(batch(prefills=[(1, 0)])) > 0


def test_negative_piecewise_coefficients_rejected_naming_file_and_key(tmp_path):
    doc = load_cost_model(kind="piecewise").to_dict()
    bad = json.loads(json.dumps(doc))
    bad["terms"][0]["pieces"][0]["coef_s"]["n_tokens"] = -1e-3
    path = tmp_path / "neg_slope.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"neg_slope.json: terms\[0\].pieces\[0\].coef_s.n_tokens is -0.001; .* >= 0"):
        load_cost_model(path=path)
    bad = json.loads(json.dumps(doc))
    for term in bad["terms"]:
        for piece in term["pieces"]:
            piece["intercept_s"] = -1.0
    path = tmp_path / "neg_intercept.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"neg_intercept.json: a batch of one prefill token would take -\d.*"
                                         r"terms\[0\].pieces\[0\].intercept_s = -1"):
        load_cost_model(path=path)


def test_every_bundled_profile_passes_the_load_checks():
    from infermax.costmodel import available_combinations

    combos = available_combinations()
    assert len(combos) >= 20
    for combo in combos:
        for kind in ("linear", "piecewise", "roofline"):
            model = load_cost_model(*combo, kind=kind)
            assert model.batch_time_s(batch(decodes=[0])) > 0, (combo, kind)


@pytest.mark.parametrize("command", [["costmodel", "show"], ["simulate", "--B", "4", "--no-progress"],
                                     ["optimize", "--I", "1", "--O", "2", "--B", "1"]])
def test_cli_rejects_a_negative_cost_model_file(tmp_path, command):
    from typer.testing import CliRunner

    from infermax.cli import app

    doc = json.loads(json.dumps(COEFFS))
    doc["per_layer_ms"]["non_attention"]["per_token"] = -0.1
    path = tmp_path / "neg.json"
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(app, command + ["--cost-model-file", str(path)])
    assert res.exit_code == 2, res.output
    assert "neg.json" in res.output and "per_layer_ms.non_attention.per_token" in res.output


def test_a_cost_model_file_s_kind_and_family_are_checked_by_value(tmp_path):
    """Found by benchmarks/file_fuzz.py --target costmodel --seed 17 (2026-12-02): a file whose 'kind' held an object
    ended in "TypeError: unhashable type: 'dict'"; a piecewise file without a family was said to have a bad kind."""
    doc = json.loads(json.dumps(COEFFS))
    for value in ({}, ["infermax-linear"], None):
        doc["kind"] = value
        path = tmp_path / "kind.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match="key 'kind' must be 'infermax-linear' or 'infermax-piecewise'"):
            load_cost_model(path=path)
    piecewise = load_cost_model(kind="piecewise").doc
    for family in (None, {}, "linear"):
        doc = {**piecewise, "family": family}
        path = tmp_path / "family.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match="key 'family' must be one of piecewise, roofline"):
            load_cost_model(path=path)
