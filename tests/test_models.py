import math

import pytest
from hypothesis import given, strategies as st

from infermax.models import (
    GPUS, MODELS, GPUSpec, ModelSpec, get_gpu, get_model, kv_capacity_tokens,
)

GiB = 2**30


def test_llama2_7b_matches_public_numbers():
    m = get_model("llama-2-7b")
    assert m.head_dim == 128
    # HF reports 6,738,415,616 parameters (incl. 266k norm weights we leave out).
    assert m.num_params == pytest.approx(6.74e9, rel=0.01)
    assert abs(m.num_params - 6_738_415_616) < 300_000
    assert m.kv_bytes_per_token() == 524288  # 2 * 32 layers * 4096 * 2 bytes
    assert m.weight_bytes() == 2 * m.num_params


@pytest.mark.parametrize("name, params", [
    ("llama-2-70b", 68.98e9), ("llama-3-8b", 8.03e9), ("codellama-34b", 33.74e9),
    ("opt-13b", 12.85e9), ("opt-30b", 29.97e9), ("opt-66b", 65.7e9),
])
def test_param_counts_match_published_sizes(name, params):
    assert get_model(name).num_params == pytest.approx(params, rel=0.01)


def test_gqa_shrinks_kv():
    assert get_model("llama-3-8b").kv_bytes_per_token() * 4 == get_model("llama-2-7b").kv_bytes_per_token()
    assert get_model("llama-2-70b").kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2


def test_opt_has_tied_embeddings_and_learned_positions():
    m = get_model("opt-13b")
    h = m.hidden_size
    per_layer = 4 * h * h + 2 * h * m.ffn_size
    assert m.num_params == m.vocab_size * h + m.max_position * h + m.num_layers * per_layer


def test_kv_capacity_llama2_7b_a100_hand_computed():
    weights = 2 * get_model("llama-2-7b").num_params
    expected = math.floor((80 * GiB * 0.9 - weights) / 524288)
    assert kv_capacity_tokens("llama-2-7b", "a100") == expected
    assert 120_000 < expected < 125_000


def test_kv_capacity_grows_with_tp_and_memory():
    assert kv_capacity_tokens("llama-2-70b", "h100", tp=4) > 0
    assert kv_capacity_tokens("llama-2-7b", "h200") > kv_capacity_tokens("llama-2-7b", "h100")
    assert kv_capacity_tokens("llama-2-7b", "a100", tp=2) > 2 * kv_capacity_tokens("llama-2-7b", "a100")


def test_weights_that_do_not_fit_are_an_error_naming_model_and_gpu():
    with pytest.raises(ValueError, match=r"llama-2-70b.*a100"):
        kv_capacity_tokens("llama-2-70b", "a100")


@pytest.mark.parametrize("util", [0, -0.1, 1.01, float("nan")])
def test_bad_utilization(util):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_capacity_tokens("llama-2-7b", "a100", gpu_memory_utilization=util)


@pytest.mark.parametrize("tp", [0, 3, 1.5, True])
def test_bad_tp(tp):
    with pytest.raises(ValueError, match="tp"):
        get_model("llama-2-70b").kv_bytes_per_token(tp)


def test_lookup_is_case_insensitive_and_lists_names():
    assert get_model("LLaMA-2-7B") is MODELS["llama-2-7b"]
    assert get_gpu(" H100 ") is GPUS["h100"]
    with pytest.raises(ValueError, match="llama-2-7b") as e:
        get_model("gpt-5")
    assert "gpt-5" in str(e.value)
    with pytest.raises(ValueError, match="a100.*h100"):
        get_gpu("tpu")


def test_registries_have_required_entries():
    assert {"llama-2-7b", "llama-2-70b", "llama-3-8b", "codellama-34b", "opt-13b", "opt-30b", "opt-66b"} <= set(MODELS)
    assert {"a100", "a100-40gb", "h100", "h200"} <= set(GPUS)
    assert GPUS["a100"].memory_bytes == 80 * GiB and GPUS["h200"].memory_bytes == 141e9


def test_invalid_specs_name_the_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelSpec("x", 2, 64, 8, 3, 128, 100)
    with pytest.raises(ValueError, match="hidden_size"):
        ModelSpec("x", 2, 65, 8, 8, 128, 100)
    with pytest.raises(ValueError, match="num_layers"):
        ModelSpec("x", 0, 64, 8, 8, 128, 100)
    with pytest.raises(ValueError, match="memory_bandwidth_gbps"):
        GPUSpec("g", GiB, 1.0, 0)


@given(st.sampled_from(sorted(MODELS)), st.sampled_from(sorted(GPUS)), st.floats(0.05, 1.0))
def test_capacity_formula_holds(model, gpu, util):
    m, g = MODELS[model], GPUS[gpu]
    free = g.memory_bytes * util - m.weight_bytes()
    if free < m.kv_bytes_per_token():
        with pytest.raises(ValueError):
            kv_capacity_tokens(m, g, util)
    else:
        M = kv_capacity_tokens(m, g, util)
        assert M * m.kv_bytes_per_token() <= free < (M + 1) * m.kv_bytes_per_token()
