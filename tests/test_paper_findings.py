"""Qualitative findings of the InferMax paper, checked on the default model (A100, Llama-2-7B, C=4096, M=100K)."""

from __future__ import annotations

import pytest

from infermax.costmodel import load_cost_model
from infermax.engine import simulate
from infermax.limits import Limits
from infermax.workload import fixed


@pytest.fixture(scope="module")
def cost():
    return load_cost_model()


@pytest.mark.parametrize("I", [1, 1024])
def test_eviction_free_running_size_is_near_M_over_I_plus_O(cost, I):
    # Section 4.3: with O=B=1024, eviction-free schedulers run about M/(I+O) requests (~98 at I=1, ~49 at I=1024).
    res = simulate(fixed(I, 1024, 1024), "vllm-ef", Limits(M=100_000), cost)
    expected = 100_000 / (I + 1024)
    assert res.summary["evictions"] == 0
    assert 0.85 * expected <= res.summary["mean_running"] <= expected


@pytest.mark.parametrize("name", ["vllm", "sarathi"])
def test_evictions_raise_tps_when_memory_is_tiny(cost, name):
    # Section 4.4: at M=100, O=32, B=1024 evicting schedulers beat their eviction-free variants.
    work = fixed(16, 32, 1024)
    evicting = simulate(work, name, Limits(M=100), cost).summary
    free = simulate(work, f"{name}-ef", Limits(M=100), cost).summary
    assert evicting["evictions"] > 0 and free["evictions"] == 0
    assert evicting["tps"] > free["tps"]


def test_vllm_has_lower_latency_than_sarathi_at_low_contention(cost):
    work = fixed(512, 128, 32)
    vllm = simulate(work, "vllm", Limits(), cost).summary
    sarathi = simulate(work, "sarathi", Limits(), cost).summary
    assert vllm["makespan_s"] < sarathi["makespan_s"]
