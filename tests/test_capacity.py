"""Effective-throughput search, dataset-like workloads, SLO configuration and the `capacity` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from infermax.capacity import attainment_at, search_capacity
from infermax.cli import app
from infermax.config import RunConfig
from infermax.workload import DATASETS, dataset_like


def step(boundary: float, below: float = 1.0, above: float = 0.5):
    return lambda r: below if r <= boundary else above


@pytest.mark.parametrize("start", [0.3, 1.0, 13.7, 50.0, 400.0])
def test_search_finds_a_known_boundary_within_tolerance(start):
    res = search_capacity(step(13.7), [0.9], start_rate=start, rel_tol=0.05)
    r = res.rates[0.9]
    assert 13.7 * 0.95 <= r <= 13.7 and not res.capped[0.9]
    # Bracket: some evaluated rate above the answer misses the threshold within the tolerance.
    assert min(x for x, a in res.evaluations.items() if a < 0.9) <= r / 0.95 + 1e-9


def test_two_thresholds_share_evaluations_and_are_ordered():
    calls = []

    def attainment(r):
        calls.append(r)
        return float(np.clip(1.2 - r / 10, 0, 1))  # 0.9 at r = 3, 0.6 at r = 6

    res = search_capacity(attainment, [0.6, 0.9], start_rate=1.0, rel_tol=0.01)
    assert res.rates[0.9] == pytest.approx(3.0, rel=0.011) and res.rates[0.9] <= 3.0
    assert res.rates[0.6] == pytest.approx(6.0, rel=0.011) and res.rates[0.6] <= 6.0
    assert len(calls) == len(set(calls)) == len(res.evaluations)  # memoised


def test_search_edges_and_errors():
    never = search_capacity(lambda r: 0.0, [0.9], start_rate=1.0, min_rate=0.1)
    assert never.rates[0.9] is None
    always = search_capacity(lambda r: 1.0, [0.9], start_rate=1.0, max_rate=64.0)
    assert always.rates[0.9] == 64.0 and always.capped[0.9]
    with pytest.raises(ValueError, match="fractions"):
        search_capacity(lambda r: 1.0, [90], start_rate=1.0)


def test_dataset_like_lengths_filter_and_determinism():
    for name in DATASETS:
        reqs = dataset_like(name, 500, seed=4)
        assert reqs == dataset_like(name, 500, seed=4) and len(reqs) == 500
        assert all(r.prompt_tokens >= 4 and r.output_tokens >= 4 and r.prompt_tokens + r.output_tokens <= 2048
                   for r in reqs)
    share = dataset_like("sharegpt", 2000)
    long = dataset_like("longbench", 2000)
    human = dataset_like("humaneval", 2000)
    mean = lambda rs, f: np.mean([getattr(r, f) for r in rs])  # noqa: E731
    # The qualitative ordering the paper states: LongBench prompts longest, HumanEval outputs shortest.
    assert mean(long, "prompt_tokens") > 4 * mean(share, "prompt_tokens")
    assert mean(human, "output_tokens") < mean(share, "output_tokens") / 3
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_like("mmlu", 3)


def test_runconfig_slo_presets_and_overrides():
    reqs = RunConfig(dataset="humaneval", B=5, slo="humaneval").requests()
    assert {(r.ttft_slo_s, r.tbt_slo_s) for r in reqs} == {(0.5, 0.5)}  # Table 3, 13B column
    reqs = RunConfig(B=3, slo="longbench", slo_tbt_s=0.2).requests()
    assert {(r.ttft_slo_s, r.tbt_slo_s) for r in reqs} == {(4.0, 0.2)}
    assert all(not r.has_slo for r in RunConfig(B=3).requests())
    with pytest.raises(ValueError, match="unknown SLO preset .* slo_ttft_s and slo_tbt_s, --slo-ttft and --slo-tbt"):
        RunConfig(slo="x").requests()
    with pytest.raises(ValueError, match="choose one workload source"):
        RunConfig(dataset="sharegpt", mix="LILO").requests()


def test_attainment_uses_common_random_numbers():
    cfg = RunConfig(scheduler="vllm", I=64, O=16, B=40, arrival="poisson", rate=1.0, slo_ttft_s=0.2, slo_tbt_s=0.5)
    a, b = (RunConfig(**{**cfg.to_dict(), "rate": r}).requests() for r in (2.0, 8.0))
    assert [4 * y.arrival_s for y in b] == pytest.approx([x.arrival_s for x in a])
    assert attainment_at(cfg, 1.0, [0]) >= attainment_at(cfg, 500.0, [0])
    with pytest.raises(ValueError, match="no latency targets"):
        attainment_at(RunConfig(arrival="poisson", rate=1.0, B=3), 1.0, [0])


def test_capacity_command():
    runner = CliRunner()
    args = ["capacity", "-s", "aptserve", "--I", "64", "--O", "16", "--B", "40", "--slo-ttft", "0.2",
            "--slo-tbt", "0.5", "--attainment", "0.9", "--attainment", "0.6", "--rel-tol", "0.2", "--json"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    r90, r60 = doc["effective_rate"]["0.9"], doc["effective_rate"]["0.6"]
    assert r90 is not None and r60 >= r90
    assert doc["evaluations"][str(float(r90))] >= 0.9 and doc["evaluations"][str(float(r60))] >= 0.6
    bad = runner.invoke(app, ["capacity", "--I", "64", "--O", "16", "--B", "5"])
    assert bad.exit_code == 2 and "no latency targets" in bad.output
    bad = runner.invoke(app, ["capacity", "--B", "5", "--slo", "sharegpt", "--arrival", "offline"])
    assert bad.exit_code == 2 and "Poisson or Gamma" in bad.output
    for flags, said in ((["--rel-tol", "0"], "--rel-tol must be in (0, 1)"),
                        (["--start-rate", "5", "--max-rate", "2"], "need 0 < --start-rate <= --max-rate")):
        bad = runner.invoke(app, ["capacity", "--B", "5", "--slo", "sharegpt", *flags])
        assert bad.exit_code == 2 and said in bad.output, bad.output  # named by their flags, before any simulation
