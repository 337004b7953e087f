"""Hidden-cache form: memory and cost accounting (hand-computed), validation, format, SLO metrics."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from conftest import AffineCost

from infermax.costmodel import BatchFeatures, features_frame, load_cost_model, roofline_model, terms_time_s
from infermax.costmodel.hidden import kv_projection_share
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.metrics import p99_tbt_s
from infermax.replay import BATCH_COLUMNS, Replayer, ScheduleViolation, replay
from infermax.request import Request
from infermax.schedule import Schedule, ScheduledBatch
from infermax.workload import fixed, with_arrivals


class HiddenCost(AffineCost):
    """1 s + 1 s per token + 0.5 s per hidden-recompute token."""

    def batch_time_s(self, f) -> float:
        return 0.0 if f.n_tokens == 0 else 1.0 + f.n_tokens + 0.5 * f.hidden_recompute_tokens


def test_hidden_prefill_and_decode_memory_and_time_by_hand():
    rp = Replayer([Request(0, 0.0, 5, 3)], Limits(C=16, M=100), HiddenCost())
    rp.apply(ScheduledBatch(items=[(0, 5)], hidden=frozenset({0})))  # prefill: 5 tokens, no recompute
    rp.apply(ScheduledBatch(items=[(0, 1)], hidden=frozenset({0})))  # decode: K/V of 5 past tokens
    rp.apply(ScheduledBatch(items=[(0, 1)], hidden=frozenset({0})))  # decode: 6 past tokens, finishes
    rows = pd.DataFrame(rp.batch_rows, columns=list(BATCH_COLUMNS))
    assert rows.duration_s.tolist() == [6.0, 1 + 1 + 2.5, 1 + 1 + 3.0]
    # Memory: ceil(5/2) = 3, ceil(6/2) = 3, ceil(7/2) = 4 during the last batch, then freed.
    assert rows.kv_tokens_peak.tolist() == [3, 3, 4]
    assert rows.kv_tokens.tolist() == [3, 3, 0]
    assert rows.hidden_seqs.tolist() == [1, 1, 1]
    assert rp.states[0].finish_s == 6.0 + 4.5 + 5.0


def test_hidden_memory_with_blocks_by_hand():
    # block 4: m = 5 is 2 KV blocks -> 1 hidden block (4 tokens); m = 9 is 3 blocks -> 2 (8 tokens).
    rp = Replayer([Request(0, 0.0, 5, 2), Request(1, 0.0, 9, 2)], Limits(C=32, M=12, block_size=4), AffineCost())
    rp.apply(ScheduledBatch(items=[(0, 5), (1, 9)], hidden=frozenset({0, 1})))
    assert rp.kv_tokens == 4 + 8
    # As KV the same prefills need 8 + 12 = 20 > M = 12.
    rp2 = Replayer([Request(0, 0.0, 5, 2), Request(1, 0.0, 9, 2)], Limits(C=32, M=12, block_size=4), AffineCost())
    with pytest.raises(ScheduleViolation, match=r"\[M\] KV 20 tokens > M=12"):
        rp2.apply(ScheduledBatch(items=[(0, 5), (1, 9)]))


def test_switching_form_needs_an_eviction():
    reqs = [Request(0, 0.0, 4, 4)]
    rp = Replayer(reqs, Limits(C=16, M=100), HiddenCost())
    rp.apply(ScheduledBatch(items=[(0, 4)], hidden=frozenset({0})))
    with pytest.raises(ScheduleViolation, match=r"\[cache-form\].*hidden form"):
        rp.apply(ScheduledBatch(items=[(0, 1)]))
    # Discard (while another request runs) and recompute in KV form: prompt + generated = 5 tokens.
    rp = Replayer(reqs + [Request(1, 0.0, 2, 1)], Limits(C=16, M=100), HiddenCost())
    rp.apply(ScheduledBatch(items=[(0, 4)], hidden=frozenset({0})))
    rp.apply(ScheduledBatch(items=[(1, 2)], evict=[0]))
    assert rp.kv_tokens == 0
    rp.apply(ScheduledBatch(items=[(0, 5)]))
    assert rp.kv_tokens == 5 and not rp.states[0].hidden
    with pytest.raises(ScheduleViolation, match=r"\[hidden-not-item\]"):
        rp.apply(ScheduledBatch(items=[(0, 1)], hidden=frozenset({7})))


def test_schedule_json_round_trip_and_old_files():
    reqs = [Request(0, 0.0, 4, 2, ttft_slo_s=1.0, tbt_slo_s=0.5), Request(1, 0.5, 3, 1)]
    sched = Schedule(reqs, Limits(C=16, M=100), [ScheduledBatch(items=[(0, 4)], hidden=frozenset({0})),
                                                 ScheduledBatch(items=[(0, 1), (1, 3)], hidden=frozenset({0}))])
    doc = sched.to_json()
    assert doc["requests"] == [[0, 0.0, 4, 2, 1.0, 0.5], [1, 0.5, 3, 1]]
    assert doc["batches"][1] == {"items": [[0, 1], [1, 3]], "hidden": [0]}
    again = Schedule.from_json(json.loads(json.dumps(doc)))
    assert again.requests == reqs and again.batches[1].hidden == frozenset({0})
    old = {"format": "infermax.schedule/1", "limits": {"C": 16, "P": None, "M": 100, "Rmax": None, "block_size": 1},
           "requests": [[0, 0.0, 4, 2]], "batches": [{"items": [[0, 4]]}, {"items": [[0, 1]]}]}
    res = replay(Schedule.from_json(old), AffineCost())
    assert res.requests.ttft_s.tolist() == [5.0] and "slo_met" not in res.requests


def test_cost_models_charge_hidden_recompute_by_hand():
    share = 2 * 4096 * 4096 / (4096 * 4096 * 4 + 3 * 4096 * 11008)  # Llama-2-7B: W_k, W_v of all matmuls
    assert kv_projection_share("llama-2-7b") == pytest.approx(share)
    base = BatchFeatures(n_tokens=3, n_decode_seqs=3, decode_kv_tokens=300)
    hidden = BatchFeatures(n_tokens=3, n_decode_seqs=3, decode_kv_tokens=300, hidden_recompute_tokens=500)
    linear = load_cost_model(kind="linear")
    a = linear.doc["per_layer_ms"]["non_attention"]
    assert linear.batch_time_s(hidden) - linear.batch_time_s(base) == pytest.approx(
        share * 32 * (a["intercept"] + a["per_token"] * 500) / 1000)
    piecewise = load_cost_model(kind="piecewise")
    pieces = next(t for t in piecewise.doc["terms"] if t["name"] == "non_attention")["pieces"]
    # the recompute GEMM is priced unpadded: a piece's padded-count slopes count as per-token slopes; its steps
    # [n_tokens > t] become steps of the recompute row count (500 > t)
    per_token = [sum(p["coef_s"].get(f, 0.0) for f in ("n_tokens", "n_tokens_pad32", "n_tokens_pad64", "n_tokens_pad128",
                                                               "n_tokens_pad256")) for p in pieces]
    steps = [sum(c for f, c in p["coef_s"].items() if f.startswith("n_tokens_gt") and int(f[len("n_tokens_gt"):]) < 500)
             for p in pieces]
    assert max(steps) > 0  # the default fit has steps below 500 tokens
    assert piecewise.batch_time_s(hidden) - piecewise.batch_time_s(base) == pytest.approx(
        share * max(p["intercept_s"] + c * 500 + s for p, c, s in zip(pieces, per_token, steps)))


@pytest.mark.parametrize("model", [load_cost_model(kind="linear"), load_cost_model(kind="piecewise"),
                                   roofline_model("a100", "llama-2-7b", 2)], ids=["linear", "piecewise", "roofline"])
def test_milp_terms_contract_with_hidden_recompute(model):
    batches = [BatchFeatures(n_tokens=n, n_decode_seqs=n, decode_kv_tokens=n * k, hidden_recompute_tokens=h)
               for n, k, h in [(1, 10, 0), (4, 100, 9), (64, 700, 20_000), (256, 1500, 100)]]
    assert [terms_time_s(model.milp_terms(), f) for f in batches] == pytest.approx(
        [model.batch_time_s(f) for f in batches], rel=1e-12)
    assert model.predict_s(features_frame(batches)) == pytest.approx([model.batch_time_s(f) for f in batches], rel=1e-12)
    assert [t.name for t in model.milp_terms()].count("hidden_recompute") == 1


def test_unregistered_model_cannot_time_hidden_recompute():
    doc = load_cost_model(kind="linear").to_dict()
    doc["model"] = "my-model"
    from infermax.costmodel import LinearCostModel

    m = LinearCostModel(doc)
    assert m.batch_time_s(BatchFeatures(n_tokens=1, n_decode_seqs=1, decode_kv_tokens=2)) > 0
    with pytest.raises(ValueError, match="K/V projection share is unknown"):
        m.batch_time_s(BatchFeatures(n_tokens=1, n_decode_seqs=1, decode_kv_tokens=2, hidden_recompute_tokens=1))


def test_p99_tbt_and_attainment_by_hand():
    assert p99_tbt_s([1.0, 2.0, 4.0]) == pytest.approx(1.99)  # gaps 1, 2: 1 + 0.99 * (2 - 1)
    assert math.isnan(p99_tbt_s([3.0]))
    # One request alone, affine cost 1 + tokens: prefill I=2 ends at 3, decodes end at 5 and 7.
    reqs = [Request(0, 0.0, 2, 3, ttft_slo_s=3.0, tbt_slo_s=1.5), Request(1, 100.0, 2, 1, ttft_slo_s=2.0)]
    res = simulate(reqs, "vllm", Limits(C=16, M=100), AffineCost())
    r = res.requests.set_index("id")
    assert r.loc[0, "p99_tbt_s"] == pytest.approx(2.0)
    assert (r.loc[0, "ttft_ok"], r.loc[0, "tbt_ok"], r.loc[0, "slo_met"]) == (True, False, False)
    assert (r.loc[1, "ttft_ok"], r.loc[1, "tbt_ok"], r.loc[1, "slo_met"]) == (False, True, False)  # TTFT 3 > 2
    assert res.summary["slo_attainment"] == 0.0 and res.summary["ttft_attainment"] == 0.5


def test_token_times_survive_fast_forward():
    reqs = [Request(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, 5.0, 0.05)
            for r in with_arrivals(fixed(64, 40, 30), "poisson", rate_per_s=20.0, seed=3)]
    fast = simulate(reqs, "vllm", Limits(M=3000))
    slow = simulate(reqs, "vllm", Limits(M=3000), fast_forward=False)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    assert fast.summary == slow.summary
