"""PyTorch profiler and real-execution replayer (issue 4), on a CPU with tiny shapes; no timing assertions."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings, strategies as st  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from infermax.cli import app  # noqa: E402
from infermax.costmodel import load_cost_model  # noqa: E402
from infermax.costmodel.fitting import fit_profile  # noqa: E402
from infermax.costmodel.measurements import COLUMNS, read_measurements  # noqa: E402
from infermax.limits import Limits  # noqa: E402
from infermax.request import Request  # noqa: E402
from infermax.schedule import Schedule, ScheduledBatch  # noqa: E402
from infermax.profiling import execute as E  # noqa: E402
from infermax.profiling import layers as L  # noqa: E402
from infermax.profiling.operators import GRIDS, decode_lengths  # noqa: E402
from infermax.profiling import runner as runner_mod  # noqa: E402
from infermax.profiling.runner import profile  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    """A tiny-shape CPU profile of Llama-3-8B's architecture, fitted."""
    out = tmp_path_factory.mktemp("prof")
    folder = profile("llama-3-8b", out, dtype="fp32", grid="tiny", tiny=True, device="cpu", progress=False)
    fit_profile(folder, plots=False)
    return folder


# ---- operators against hand-written attention ----

def _naive_attention(q, keys, values, visible):
    """Per query row and head: softmax(q·k/√d) over the visible keys; K/V head = head // group."""
    heads, hd = q.shape[1], q.shape[2]
    group = heads // keys.shape[1]
    out = torch.zeros(q.shape[0], heads * hd)
    for i in range(q.shape[0]):
        for h in range(heads):
            k, v = keys[visible(i), h // group], values[visible(i), h // group]
            out[i, h * hd:(h + 1) * hd] = torch.softmax(k @ q[i, h] / math.sqrt(hd), 0) @ v
    return out


def test_prefill_attention_attends_to_cached_context_and_causally():
    gen = torch.Generator().manual_seed(1)
    c, m, heads, kv_heads, hd = 5, 7, 4, 2, 8
    q = torch.randn(c, heads, hd, generator=gen)
    k, v = torch.randn(m + c, kv_heads, hd, generator=gen), torch.randn(m + c, kv_heads, hd, generator=gen)
    expected = _naive_attention(q, k, v, lambda i: slice(0, m + i + 1))
    assert torch.allclose(L.prefill_attention(q, k, v), expected, atol=1e-5)
    # no context: plain causal
    expected0 = _naive_attention(q, k[:c], v[:c], lambda i: slice(0, i + 1))
    assert torch.allclose(L.prefill_attention(q, k[:c], v[:c]), expected0, atol=1e-5)


def test_decode_attention_reads_each_sequence_rows_only():
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, hd = 4, 1, 8
    k_pool, v_pool = torch.randn(40, kv_heads, hd, generator=gen), torch.randn(40, kv_heads, hd, generator=gen)
    starts, lengths = [3, 20, 11], [5, 9, 1]
    q = torch.randn(3, heads, hd, generator=gen)
    index, valid = L.decode_index(starts, lengths, "cpu")
    assert index.shape == (3, 16)  # longest 9 rounded up to 8's
    got = L.decode_attention(q, k_pool, v_pool, index, valid)
    for b, (s, n) in enumerate(zip(starts, lengths)):
        expected = _naive_attention(q[b:b + 1], k_pool[s:s + n], v_pool[s:s + n], lambda i: slice(0, n))
        assert torch.allclose(got[b], expected[0], atol=1e-5)


def test_decode_lengths_spread_and_sum():
    assert decode_lengths(1, 100) == [100]
    assert decode_lengths(4, 100) == [75, 92, 108, 125]  # 75, 91.7, 108.3, 125
    lengths = decode_lengths(7, 33)
    assert sum(lengths) == 7 * 33 and min(lengths) >= 24 and max(lengths) <= 42


def test_tiny_shapes_keep_head_ratio_and_shard_by_tp():
    s = L.shard_shapes("llama-3-8b", tiny=True)
    assert (s.num_heads, s.num_kv_heads, s.num_layers, s.name) == (4, 1, 2, "llama-3-8b-tiny")
    full = L.shard_shapes("llama-3-8b", tp=2)
    assert (full.num_heads, full.num_kv_heads, full.ffn, full.vocab, full.head_dim) == (16, 4, 7168, 64128, 128)
    with pytest.raises(ValueError, match="Llama-style"):
        L.shard_shapes("opt-13b")


def test_token_pool_first_fit_and_coalescing():
    pool = E.TokenPool(10)
    a, b, c = pool.alloc(3), pool.alloc(4), pool.alloc(3)
    assert (a, b, c) == (0, 3, 7) and pool.free == []
    pool.release(a, 3)
    pool.release(c, 3)
    with pytest.raises(ValueError, match="KV pool exhausted"):
        pool.alloc(4)
    pool.release(b, 4)
    assert pool.free == [(0, 10)]


# ---- profile -> fit -> cost model ----

def test_profile_tiny_is_fitted_unchanged(tiny_profile):
    table = read_measurements(tiny_profile / "measurements.csv")
    assert list(table.columns) == list(COLUMNS)
    grid = GRIDS["tiny"]
    ops = table["operator"].value_counts()
    assert ops["attn_pre_proj"] == ops["emb"] == ops["lm_head"] == len(grid.tokens)
    prefill = table[table["operator"] == "attn_prefill"]
    assert set(zip(prefill["prefill_chunk_size"], prefill["kv_cache_size"])) == {
        (c, m) for c in grid.prefill_chunks for m in grid.prefill_contexts}
    decode = table[table["operator"] == "attn_decode"]
    assert (decode["batch_size"] * decode["kv_cache_size"]).max() <= grid.max_decode_tokens
    assert (table["median_ms"] > 0).all()
    swap = table[table["operator"].str.startswith("swap_")]
    assert len(swap) == 2 * len(grid.swap_tokens) and swap["derivation"].str.contains("stand-in").all()
    assert (table.loc[~table["operator"].str.startswith("swap_"), "derivation"] == "").all()
    doc = json.loads((tiny_profile / "profile.json").read_text())
    assert (doc["gpu"], doc["model"], doc["num_layers"], doc["hidden_size"]) == ("cpu", "llama-3-8b-tiny", 2, 64)
    assert doc["profiled"]["torch"] == torch.__version__ and doc["groups"] == [
        "non_attention", "prefill_attention_kernel", "prefill_kv_save", "decode_attention"]
    for kind in ("linear", "piecewise"):
        cost = load_cost_model(path=tiny_profile / f"infermax_{kind}.json")
        from infermax.costmodel import BatchFeatures

        assert cost.batch_time_s(BatchFeatures(n_tokens=8, n_decode_seqs=8, decode_kv_tokens=256)) > 0


def test_profile_cli_and_fit_cli(tmp_path):
    result = runner.invoke(app, ["profile", "--model", "llama-2-7b", "--tiny", "--grid", "tiny", "--dtype", "fp32",
                                 "--device", "cpu", "--out", str(tmp_path / "m"), "--no-progress"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["fit", str(tmp_path / "m"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m" / "tp1" / "infermax_piecewise.json").is_file()


@pytest.mark.parametrize("args, message", [
    (["--dtype", "fp8"], "unknown dtype"), (["--grid", "huge"], "unknown grid"),
    (["--model", "opt-13b"], "Llama-style"), (["--device", "tpu"], "device must be")])
def test_profile_cli_rejects_bad_input(tmp_path, args, message):
    result = runner.invoke(app, ["profile", "--tiny", "--grid", "tiny", "--device", "cpu", "--out", str(tmp_path),
                                 "--no-progress", *args])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_requested_without_gpu_is_an_error(tmp_path):
    result = runner.invoke(app, ["profile", "--tiny", "--device", "cuda", "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 2 and "no CUDA GPU" in result.output


# ---- execution: cached chunked prefill / decode / eviction equals one full causal pass ----

def _reference_logits(net: E.Transformer, tokens: list[int]) -> torch.Tensor:
    """Logits at every position from one no-cache causal pass, written independently of ``layers``:
    explicit score matrices, complex-number rotary embedding, hand-written RMSNorm."""
    s = net.s
    hd, group, n = s.head_dim, s.num_heads // s.num_kv_heads, len(tokens)

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + L.NORM_EPS) * w

    freq = L.ROPE_THETA ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    turn = torch.polar(torch.ones(n, hd // 2, dtype=torch.float64), torch.arange(n, dtype=torch.float64)[:, None] * freq)

    def rotate(t):  # pairs (i, i + hd/2) as complex numbers, multiplied by e^{i·pos·freq}
        z = torch.complex(t[..., :hd // 2].double(), t[..., hd // 2:].double()) * turn[:, None, :]
        return torch.cat([z.real, z.imag], -1).float()

    x = net.emb.table[torch.tensor(tokens)]
    future = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    for w in net.layers:
        qkv = norm(x, w.ln1) @ w.wqkv.T
        q = rotate(qkv[:, :s.q_dim].reshape(n, s.num_heads, hd))
        k = rotate(qkv[:, s.q_dim:s.q_dim + s.kv_dim].reshape(n, s.num_kv_heads, hd)).repeat_interleave(group, 1)
        v = qkv[:, s.q_dim + s.kv_dim:].reshape(n, s.num_kv_heads, hd).repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        p = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        x = x + torch.einsum("hqk,khd->qhd", p, v).reshape(n, -1) @ w.wo.T
        gate_up = norm(x, w.ln2) @ w.w_gate_up.T
        gate, up = gate_up[:, :s.ffn], gate_up[:, s.ffn:]
        x = x + (gate * torch.sigmoid(gate) * up) @ w.w_down.T
    return norm(x, net.emb.final_norm) @ net.emb.lm_head.T


def _assert_full_forward_logits(net: E.Transformer, sched: Schedule, ex: "E.Executor") -> None:
    """Every token ``ex`` (run with ``keep_logits``) generated came with the logits of one full causal pass."""
    for r in sched.requests:
        ref = _reference_logits(net, ex.tokens[r.id][:-1])
        assert torch.allclose(torch.stack(ex.logits[r.id]), ref[r.prompt_tokens - 1:], atol=2e-4, rtol=1e-4), r.id


def _hand_schedule() -> Schedule:
    """Chunked prefills with prior context, hybrid batches, a decode-phase eviction (request 1 after 2
    tokens: refill of I + 2 = 7 tokens) and a mid-prefill eviction (request 3 after 3 of 6 tokens)."""
    reqs = [Request(0, 0.0, 7, 4), Request(1, 0.0, 5, 3), Request(2, 0.0, 3, 5), Request(3, 0.0, 6, 2)]
    b = ScheduledBatch
    batches = [b([(0, 4), (1, 5)]), b([(0, 3), (1, 1), (2, 2)]), b([(0, 1), (2, 1)], evict=[1]),
               b([(1, 7), (0, 1), (2, 1), (3, 3)]), b([(0, 1), (2, 1)], evict=[3]), b([(3, 6), (2, 1)]),
               b([(3, 1), (2, 1)])]
    return Schedule(reqs, Limits(C=64, M=64), batches)


class _Flat:
    name = "flat"

    def batch_time_s(self, features):
        return 0.001 * features.n_tokens


def test_cached_execution_equals_full_forward_through_chunks_and_evictions():
    sched = _hand_schedule()
    torch.manual_seed(0)
    net = E.Transformer(L.shard_shapes("llama-3-8b", tiny=True), "cpu", torch.float32,
                        E.pool_rows_for(sched, L.shard_shapes("llama-3-8b", tiny=True), "cpu", torch.float32), seed=3)
    ex = E.Executor(net, sched, keep_logits=True)
    measured, rec = ex.run(_Flat())
    assert len(measured) == len(sched.batches) and all(t > 0 for t in measured)
    for r in sched.requests:
        tokens = ex.tokens[r.id]
        assert len(tokens) == r.prompt_tokens + r.output_tokens
        ref = _reference_logits(net, tokens[:-1])
        got = torch.stack(ex.logits[r.id])
        # request 1 produced token 2 in its refill, request 3 token 0 after its restart: same logits as no eviction
        assert got.shape == (r.output_tokens, net.s.vocab)
        assert torch.allclose(got, ref[r.prompt_tokens - 1:], atol=2e-4, rtol=1e-4), r.id
        assert tokens[r.prompt_tokens:] == got.argmax(-1).tolist()
    assert ex.slot == {} and ex.pool.free == [(0, ex.pool.rows)]  # every cache freed at finish
    # the recorder saw the Replayer's features: batch 3 refills request 1 (7 tokens) and starts request 3
    f3 = rec.features[3]
    assert (f3.prefill_tokens, f3.n_prefill_seqs, f3.n_decode_seqs, f3.prefill_ctx_tokens) == (10, 2, 2, 0)


@pytest.mark.parametrize("make, kernel, prefill_kernel, decode_groups", [
    ("hand", "sdpa", "sdpa", 1), ("spread", "sdpa", "sdpa", 3), ("spread", "varlen", "sdpa", 0),
    ("hand", "sdpa", "varlen", 1), ("hand", "varlen", "varlen", 0)])
def test_graph_replay_path_gives_the_eager_tokens(make, kernel, prefill_kernel, decode_groups):
    # The timed pass replays batch j's capture with batch j's index values copied in: the same tokens as eager runs.
    # "spread": batch 1's decodes run in three decode groups, three fixed index tensors of their own; or, "varlen",
    # in one call whose ragged key rows and offsets are fixed tensors too. A "varlen" prefill kernel's chunk rows and
    # offsets (the hand schedule's batch 1 holds two chunks and a decode) are fixed tensors as well.
    sched = _hand_schedule() if make == "hand" else _spread_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cpu", torch.float32, E.pool_rows_for(sched, shapes, "cpu", torch.float32), seed=3)
    kernels = dict(decode_kernel=kernel, prefill_kernel=prefill_kernel)
    eager = E.Executor(net, sched, **kernels)
    eager.run(_Flat())
    graphs = E.EagerBatchGraphs()
    E.Executor(net, sched, **kernels).run(_Flat(), graphs=graphs)
    assert len(graphs._graphs) == len(sched.batches) and len(graphs._graphs[1][1].index) == decode_groups
    assert (graphs._graphs[1][1].ragged is not None) == (kernel == "varlen")
    assert (graphs._graphs[1][1].chunks is not None) == (prefill_kernel == "varlen")
    graphs.capturing = False
    with torch.inference_mode():  # stale index values: each replay must copy its own batch's in
        for _, fixed, _, _ in graphs._graphs:
            for x in fixed.tensors():
                x.zero_()
    timed = E.Executor(net, sched, **kernels)
    measured, _ = timed.run(_Flat(), graphs=graphs)
    assert len(measured) == len(sched.batches) and timed.tokens == eager.tokens
    # a batch laid out otherwise than when captured is refused, not replayed with stale indices
    graphs._next = 1
    with pytest.raises(RuntimeError, match="batch 1 is laid out differently"):
        graphs.replay(E.Executor(net, sched, **kernels).plan(sched.batches[0].items, {r: (0, 99) for r, _ in
                                                                                     sched.batches[0].items}), None)
    # and so is a batch planned with the other prefill kernel: its tensors differ
    other = "sdpa" if prefill_kernel == "varlen" else "varlen"
    graphs._next = 0
    before = {rid: (0, r.prompt_tokens) for rid, r in ((r.id, r) for r in sched.requests)}
    with pytest.raises(RuntimeError, match="batch 0 is laid out differently"):
        graphs.replay(E.Executor(net, sched, decode_kernel=kernel, prefill_kernel=other).plan(
            sched.batches[0].items, before), None)


# ---- decode groups: a batch of very different cache lengths runs as groups of similar ones ----

def test_decode_groups_by_hand():
    # a 4,000-token conversation beside thirty 400-token ones: padding the thirty to 4,000 reads 5.5x their keys
    assert L.decode_groups([4000] + [400] * 30) == [1, 30]
    assert L.decode_groups([4000] + [400] * 30, padding=math.inf) == [31]
    # 125, 108, 92, 75 (the profile's +-25% spread): 4 x 125 = 500 <= 1.25 x 400, one call as profiled
    assert L.decode_groups([125, 108, 92, 75]) == [4]
    # 100, 80: 2 x 100 = 200 <= 1.25 x 180 = 225; then 60: 3 x 100 = 300 <= 1.25 x 240 = 300 (equal: kept);
    # then 10: 4 x 100 = 400 > 1.25 x 250 = 312.5: a new group
    assert L.decode_groups([100, 80, 60, 10]) == [3, 1]
    assert L.decode_groups([7]) == [1] and L.decode_groups([]) == []
    with pytest.raises(ValueError, match="longest first"):
        L.decode_groups([5, 9])
    with pytest.raises(ValueError, match="at least 1"):
        L.decode_groups([9, 5], padding=0.9)


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=60), st.sampled_from([1.0, 1.1, 1.25, 2.0, 4.0]))
@settings(max_examples=200, deadline=None)
def test_decode_groups_partition_bound_and_greedy(lengths, padding):
    lengths = sorted(lengths, reverse=True)
    sizes = L.decode_groups(lengths, padding)
    assert sum(sizes) == len(lengths) and all(n > 0 for n in sizes)
    first = 0
    for k, n in enumerate(sizes):
        group = lengths[first:first + n]
        assert n * group[0] <= padding * sum(group) + 1e-9  # within the bound
        if k + 1 < len(sizes):  # and no longer: the next sequence would break it
            assert (n + 1) * group[0] > padding * (sum(group) + lengths[first + n])
        first += n


def _spread_schedule() -> Schedule:
    """Decodes of very different cache lengths in one batch: request 0's prompt is 300 tokens, 1-4's are 3 to 20."""
    reqs = [Request(0, 0.0, 300, 4), Request(1, 0.0, 3, 4), Request(2, 0.0, 20, 4), Request(3, 0.0, 12, 4),
            Request(4, 0.0, 5, 4)]
    b = ScheduledBatch
    return Schedule(reqs, Limits(C=512, M=1024), [b([(r.id, r.prompt_tokens) for r in reqs])]
                    + [b([(r.id, 1) for r in reqs]) for _ in range(3)])


def test_grouped_decodes_give_the_full_forward_logits():
    sched = _spread_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cpu", torch.float32, E.pool_rows_for(sched, shapes, "cpu", torch.float32), seed=5)
    plans = []
    grouped = E.Executor(net, sched, keep_logits=True)
    plan = grouped.plan
    grouped.plan = lambda items, before: plans.append(plan(items, before)) or plans[-1]
    grouped.run(_Flat())
    # longest cache first, then groups: request 0 alone (301 keys), then 20, 12 (2 x 21 <= 1.25 x 34), then 5, 3
    assert [rid for rid in plans[1].gen_ids] == [0, 2, 3, 4, 1]
    assert plans[1].decode_groups == [1, 2, 2]
    _assert_full_forward_logits(net, sched, grouped)
    # one padded call per batch (as before 2026-11-29) picks the same tokens
    single = E.Executor(net, sched, decode_padding=math.inf)
    single.run(_Flat())
    assert single.tokens == grouped.tokens


@given(st.lists(st.integers(1, 90), min_size=1, max_size=12), st.sampled_from([(4, 4), (4, 2), (8, 2), (4, 1)]),
       st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_varlen_decode_attention_is_the_masked_padded_call(lengths, heads, seed):
    # One variable-length call over unpadded keys (its GQA packing: g query heads per KV head as g query rows)
    # gives what the masked, padded SDPA call gives, whatever the lengths and the head ratio.
    num_heads, kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n + 3)  # gaps between sequences, as in the token pool
    rows = starts[-1] + lengths[-1]
    k_pool, v_pool = torch.randn(rows, kv_heads, 8, generator=gen), torch.randn(rows, kv_heads, 8, generator=gen)
    q = torch.randn(len(lengths), num_heads, 8, generator=gen)
    index, valid = L.decode_index(starts, lengths, "cpu")
    padded = L.decode_attention(q, k_pool, v_pool, index, valid)
    keys = L.ragged_keys(starts, lengths, num_heads // kv_heads, "cpu")
    assert keys.rows.numel() == sum(lengths) and keys.max_k == max(lengths)
    assert torch.allclose(L.decode_attention_varlen(q, k_pool, v_pool, keys), padded, atol=1e-5, rtol=1e-5)


def test_varlen_decodes_give_the_full_forward_logits():
    sched = _spread_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cpu", torch.float32, E.pool_rows_for(sched, shapes, "cpu", torch.float32), seed=5)
    plans = []
    ragged = E.Executor(net, sched, keep_logits=True, decode_kernel="varlen")
    plan = ragged.plan
    ragged.plan = lambda items, before: plans.append(plan(items, before)) or plans[-1]
    ragged.run(_Flat())
    assert plans[1].decode_groups == [5] and plans[1].decode_kernel == "varlen"  # one call for the five decodes
    _assert_full_forward_logits(net, sched, ragged)
    grouped = E.Executor(net, sched)
    grouped.run(_Flat())
    assert grouped.tokens == ragged.tokens


# ---- the "varlen" prefill kernel: one causal variable-length call for every chunk of a batch ----

@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 24)), min_size=1, max_size=6),
       st.sampled_from([(4, 4), (4, 2), (8, 2), (4, 1)]), st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_varlen_prefill_attention_is_causal_per_chunk(chunks, heads, seed):
    # Chunks of c tokens after m cached ones, scattered over the pool: each query row sees its own sequence's
    # keys up to its position (m + i), no other sequence's, whatever the head ratio (hand-written attention).
    num_heads, kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    prefills, start = [], 0
    for m, c in chunks:
        prefills.append((start, m, c))
        start += m + c + 3  # gaps between sequences, as in the token pool
    k_pool, v_pool = torch.randn(start, kv_heads, 8, generator=gen), torch.randn(start, kv_heads, 8, generator=gen)
    q = torch.randn(sum(c for _, c in chunks), num_heads, 8, generator=gen)
    plan = L.ragged_chunks(prefills, "cpu")
    assert plan.write_rows.tolist() == [st + m + i for st, m, c in prefills for i in range(c)]
    assert (plan.max_q, plan.max_k) == (max(c for _, c in chunks), max(m + c for m, c in chunks))
    got = L.prefill_attention_varlen(q, k_pool, v_pool, plan)
    row = 0
    for st_, m, c in prefills:
        want = _naive_attention(q[row:row + c], k_pool[st_:st_ + m + c], v_pool[st_:st_ + m + c],
                                lambda i, m=m: slice(0, m + i + 1))
        assert torch.allclose(got[row:row + c], want, atol=1e-5, rtol=1e-5)
        row += c


def _fake_varlen_attn(signature: str):
    """A stand-in for ``torch.nn.attention.varlen.varlen_attn`` with one of its versions' signatures (2.10's
    ``is_causal``, 2.12's ``window_size`` and ``enable_gqa``), computing what that version computes and refusing
    what it refuses: keys with fewer heads than the queries without ``enable_gqa``."""

    def attend(q, k, v, cu_q, cu_k, max_q, max_k, causal, gqa):
        if k.shape[1] != q.shape[1] and not gqa:
            raise RuntimeError("key heads differ from query heads")
        if causal:
            return L.causal_varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k)
        return L.varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k)

    if signature == "2.10":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, False)
    elif signature == "2.12":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False):
            assert window_size in ((-1, -1), (-1, 0))
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size == (-1, 0), enable_gqa)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
            return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, False, False)
    return varlen_attn


@pytest.mark.parametrize("signature", ["2.10", "2.12", "no causal mask"])
def test_varlen_prefill_reads_the_kernels_signature(monkeypatch, signature):
    # On CUDA the kernel's causal mask and GQA are passed the way this PyTorch's varlen_attn takes them (or the keys
    # are repeated to the query heads); a varlen_attn that cannot mask causally is refused with the way out.
    monkeypatch.setattr(L, "varlen_function", lambda device, phase="decode": _fake_varlen_attn(signature))
    L.causal_varlen_function.cache_clear()
    try:
        cuda = torch.device("cuda")
        if signature == "no causal mask":
            with pytest.raises(ValueError, match="neither window_size nor is_causal.*--prefill-kernel sdpa"):
                L.causal_varlen_function(cuda, 2, 8)
            return
        gen = torch.Generator().manual_seed(1)
        prefills = [(0, 9, 4), (20, 0, 6)]
        k_pool, v_pool = torch.randn(30, 2, 8, generator=gen), torch.randn(30, 2, 8, generator=gen)
        q = torch.randn(10, 8, 8, generator=gen)
        plan = L.ragged_chunks(prefills, "cpu")
        fn = L.causal_varlen_function(cuda, 2, 8)
        got = fn(q, k_pool[plan.key_rows], v_pool[plan.key_rows], plan.cu_q, plan.cu_k, plan.max_q, plan.max_k)
        want = L.prefill_attention_varlen(q, k_pool, v_pool, plan).view(10, 8, 8)  # the CPU path
        assert torch.allclose(got, want, atol=1e-6)
    finally:
        L.causal_varlen_function.cache_clear()


def test_varlen_prefills_give_the_full_forward_logits():
    # Chunked prefills with prior context, refills after evictions and mixed batches (the hand schedule), every
    # batch's chunks in one call: the logits of one full causal pass, and the tokens of per-chunk SDPA calls.
    sched = _hand_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cpu", torch.float32, E.pool_rows_for(sched, shapes, "cpu", torch.float32), seed=3)
    for decode_kernel in ("sdpa", "varlen"):
        ragged = E.Executor(net, sched, keep_logits=True, decode_kernel=decode_kernel, prefill_kernel="varlen")
        ragged.run(_Flat())
        _assert_full_forward_logits(net, sched, ragged)
        per_chunk = E.Executor(net, sched)
        per_chunk.run(_Flat())
        assert per_chunk.tokens == ragged.tokens


def test_decode_kernel_is_checked(monkeypatch):
    import sys

    with pytest.raises(ValueError, match="unknown decode kernel 'paged'; choose one of sdpa, varlen"):
        L.check_decode_kernel("paged", "cpu")
    L.check_decode_kernel("varlen", "cpu")  # the CPU stand-in
    assert L.varlen_function(torch.device("cpu")) is L.varlen_reference
    with pytest.raises(ValueError, match="unknown prefill kernel 'paged'; choose one of sdpa, varlen"):
        L.check_prefill_kernel("paged", "cpu")
    L.check_prefill_kernel("varlen", "cpu")
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)  # a PyTorch without it (before 2.10)
    with pytest.raises(ValueError, match="needs torch.nn.attention.varlen .PyTorch 2.10 or later.*--decode-kernel sdpa"):
        L.varlen_function(torch.device("cuda"))
    with pytest.raises(ValueError, match="prefill kernel 'varlen' needs torch.nn.attention.varlen.*--prefill-kernel sdpa"):
        L.check_prefill_kernel("varlen", "cuda")


@pytest.mark.parametrize("command", ["profile", "gpu-replay"])
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_an_unknown_kernel_is_refused(tiny_profile, tmp_path, command, phase):
    path = _spread_schedule().save(tmp_path / "s.json")
    args = (["profile", "--out", str(tmp_path / "p"), "--grid", "tiny"] if command == "profile" else
            ["gpu-replay", str(path), "--cost-model-file", str(tiny_profile / "infermax_linear.json"), "--no-progress"])
    result = runner.invoke(app, [*args, "--model", "llama-3-8b", "--tiny", "--device", "cpu", f"--{phase}-kernel",
                                 "paged"])
    assert result.exit_code != 0 and f"unknown {phase} kernel 'paged'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "p").exists()


@pytest.mark.parametrize("decode_kernel, prefill_kernel", [("varlen", "sdpa"), ("sdpa", "varlen"), ("varlen", "varlen")])
def test_a_varlen_profile_says_so(tmp_path, decode_kernel, prefill_kernel):
    folder = profile("llama-3-8b", tmp_path, dtype="fp32", grid="tiny", tiny=True, device="cpu", progress=False,
                     decode_kernel=decode_kernel, prefill_kernel=prefill_kernel)
    doc = json.loads((folder / "profile.json").read_text())
    assert (doc["decode_kernel"], doc["prefill_kernel"]) == (decode_kernel, prefill_kernel)
    for phase, kernel in (("decode", decode_kernel), ("prefill", prefill_kernel)):
        assert (f"--{phase}-kernel varlen" in doc["profiled"]["command"]) == (kernel == "varlen")
        assert (f"{phase} attention: torch.nn.attention.varlen" in doc["attention"]) == (kernel == "varlen")
    table = read_measurements(folder / "measurements.csv")
    # on a CPU the varlen attention is a per-sequence stand-in, and its rows say so; the K/V writes are real copies
    stand_in = {op for op, kernel in (("attn_decode", decode_kernel), ("attn_prefill", prefill_kernel))
                if kernel == "varlen"}
    noted = table.derivation == runner_mod.CPU_VARLEN_NOTE
    assert (noted == table.operator.isin(stand_in)).all() and noted.any()
    assert (table.operator == "attn_kv_cache_save").sum() == (table.operator == "attn_prefill").sum() > 0
    fit_profile(folder, plots=False)  # the varlen rows fit like any others
    sdpa = json.loads((profile("llama-3-8b", tmp_path / "sdpa", dtype="fp32", grid="tiny", tiny=True, device="cpu",
                               progress=False) / "profile.json").read_text())
    assert (sdpa["decode_kernel"], sdpa["prefill_kernel"]) == ("sdpa", "sdpa")


@pytest.mark.parametrize("padding, message", [("0.5", "at least 1"), ("abc", "Invalid value for '--decode-padding'")])
def test_gpu_replay_rejects_a_bad_decode_padding(tiny_profile, tmp_path, padding, message):
    path = _spread_schedule().save(tmp_path / "s.json")
    result = runner.invoke(app, ["gpu-replay", str(path), "--model", "llama-3-8b", "--tiny", "--device", "cpu",
                                 "--cost-model-file", str(tiny_profile / "infermax_linear.json"), "--no-progress",
                                 "--decode-padding", padding])
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_gpu_replay_summary_records_the_decode_padding(tiny_profile):
    cost = load_cost_model(path=tiny_profile / "infermax_linear.json")
    sched = _spread_schedule()
    kwargs = dict(device="cpu", tiny=True, progress=False, warmup_batches=0)
    assert E.gpu_replay(sched, "llama-3-8b", cost, **kwargs).summary["decode_padding"] == L.DECODE_PADDING
    assert E.gpu_replay(sched, "llama-3-8b", cost, decode_padding=math.inf, **kwargs).summary["decode_padding"] is None
    varlen = E.gpu_replay(sched, "llama-3-8b", cost, decode_kernel="varlen", **kwargs).summary
    assert varlen["decode_kernel"] == "varlen" and varlen["decode_padding"] is None
    assert varlen["prefill_kernel"] == "sdpa"
    assert E.gpu_replay(sched, "llama-3-8b", cost, prefill_kernel="varlen", **kwargs).summary["prefill_kernel"] == "varlen"


def test_a_batch_that_cannot_be_captured_is_a_clear_error(monkeypatch):
    sched = _hand_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cpu", torch.float32, E.pool_rows_for(sched, shapes, "cpu", torch.float32))
    monkeypatch.setattr(E.BatchGraphs, "_new_pool", staticmethod(lambda: None))  # (a pool needs CUDA)
    graphs = E.BatchGraphs()  # its capture itself is replaced below

    def refuse(fn, pool=None):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(E, "capture", refuse)
    with torch.inference_mode():
        plan = E.Executor(net, sched).plan(sched.batches[0].items, {r: (0, 99) for r, _ in sched.batches[0].items})
    with pytest.raises(ValueError, match="batch 0 could not be captured in a CUDA graph .operation not permitted"):
        graphs.capture(net, plan)


@pytest.mark.parametrize("command", ["profile", "gpu-replay"])
def test_cuda_graphs_need_a_cuda_device(tiny_profile, tmp_path, command):
    if command == "profile":
        args = ["profile", "--model", "llama-3-8b", "--tiny", "--grid", "tiny", "--out", str(tmp_path / "p")]
    else:
        sched = Schedule([Request(0, 0.0, 4, 2)], Limits(C=8, M=16),
                         [ScheduledBatch([(0, 4)]), ScheduledBatch([(0, 1)])])
        args = ["gpu-replay", str(sched.save(tmp_path / "s.json")), "--model", "llama-3-8b", "--tiny",
                "--cost-model-file", str(tiny_profile / "infermax_linear.json")]
    result = runner.invoke(app, args + ["--device", "cpu", "--dtype", "fp32", "--cuda-graphs", "--no-progress"])
    assert result.exit_code == 2 and "--cuda-graphs needs a CUDA device" in result.output


def test_eviction_drops_the_cache():
    sched = _hand_schedule()
    shapes = L.shard_shapes("llama-2-7b", tiny=True)
    net = E.Transformer(shapes, "cpu", torch.float32, E.pool_rows_for(sched, shapes, "cpu", torch.float32))
    ex = E.Executor(net, sched)
    ex.run(_Flat(), batches=2)
    assert set(ex.slot) == {0, 1, 2}
    ex2 = E.Executor(net, sched)
    ex2.run(_Flat(), batches=3)  # batch 2 evicts request 1
    assert set(ex2.slot) == {0, 2}
    held = sum(sched.requests[i].peak_kv_tokens for i in (0, 2))
    assert sum(length for _, length in ex2.pool.free) == ex2.pool.rows - held


def test_gpu_replay_cli_compares_with_the_simulation(tiny_profile, tmp_path):
    cost_file = tiny_profile / "infermax_linear.json"
    sim = tmp_path / "sim"
    result = runner.invoke(app, ["simulate", "-s", "sarathi", "--B", "5", "--I", "40", "--O", "4", "--C", "64",
                                 "--P", "32", "--M", "120", "--cost-model-file", str(cost_file), "--out", str(sim),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "rep"
    result = runner.invoke(app, ["gpu-replay", str(sim / "schedule.json"), "--model", "llama-3-8b", "--tiny",
                                 "--device", "cpu", "--dtype", "fp32", "--cost-model-file", str(cost_file),
                                 "--warmup", "2", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    batches, requests = pd.read_csv(out / "batches.csv"), pd.read_csv(out / "requests.csv")
    summary = json.loads((out / "summary.json").read_text())
    sim_batches, sim_requests = pd.read_parquet(sim / "batches.parquet"), pd.read_parquet(sim / "requests.parquet")
    assert len(batches) == len(sim_batches) == summary["batches"]
    # predictions are the simulation's batch times; the features are the simulation's batches
    assert np.allclose(batches["predicted_s"], sim_batches["duration_s"], rtol=1e-5)
    assert (batches["prefill_tokens"] == sim_batches["prefill_tokens"]).all()
    # offline arrivals: a request's measured latency is the sum of measured batch times up to the batch it finished in
    ends = sim_batches["end_s"].to_numpy()
    cumulative = batches["measured_s"].cumsum().to_numpy()
    for rid, finish in zip(sim_requests["id"], sim_requests["finish_s"]):
        j = int(np.argmin(np.abs(ends - finish)))
        assert requests.set_index("id").loc[rid, "measured_latency_s"] == pytest.approx(cumulative[j], rel=1e-4)
        assert requests.set_index("id").loc[rid, "simulated_latency_s"] == pytest.approx(finish, rel=1e-5)  # CSV keeps 6 digits
    errors = 100 * (batches["predicted_s"] - batches["measured_s"]).abs() / batches["measured_s"]
    assert summary["per_batch_mape_pct"] == pytest.approx(errors.mean(), rel=1e-3)
    lat = requests["measured_latency_s"].mean()
    assert summary["e2e_latency_error_pct"] == pytest.approx(100 * (requests["simulated_latency_s"].mean() - lat) / lat, rel=1e-3)


def test_gpu_replay_rejects_an_invalid_schedule(tiny_profile, tmp_path):
    sched = Schedule([Request(0, 0.0, 4, 2)], Limits(C=8, M=16), [ScheduledBatch([(0, 5)])])
    path = sched.save(tmp_path / "bad.json")
    result = runner.invoke(app, ["gpu-replay", str(path), "--model", "llama-3-8b", "--tiny", "--device", "cpu",
                                 "--cost-model-file", str(tiny_profile / "infermax_linear.json"), "--no-progress"])
    assert result.exit_code == 1 and "chunk" in result.output


def test_gpu_replay_refuses_swapping_schedules(tiny_profile):
    sched = Schedule([Request(0, 0.0, 4, 3)], Limits(C=8, M=16), [
        ScheduledBatch([(0, 4)]), ScheduledBatch([(0, 1)], swap_out=[(0, 2)])])
    with pytest.raises(ValueError, match="batch 1 swaps"):
        E.gpu_replay(sched, "llama-3-8b", load_cost_model(path=tiny_profile / "infermax_linear.json"),
                     device="cpu", tiny=True, progress=False)


@pytest.mark.parametrize("warmup, untimed", [(None, 12), (2, 2), (0, 0)])
def test_gpu_replay_warms_up_on_the_whole_schedule_by_default(tiny_profile, monkeypatch, warmup, untimed):
    # Every batch runs untimed once by default (kernels that plan per shape are warm when timed); the summary says so.
    sched = Schedule([Request(0, 0.0, 8, 12)], Limits(C=8, M=32),
                     [ScheduledBatch([(0, 8)])] + [ScheduledBatch([(0, 1)]) for _ in range(11)])
    calls = []
    forward = E.Transformer.forward
    monkeypatch.setattr(E.Transformer, "forward", lambda self, plan: calls.append(plan) or forward(self, plan))
    given = {} if warmup is None else {"warmup_batches": warmup}  # None: the default
    check = E.gpu_replay(sched, "llama-3-8b", load_cost_model(path=tiny_profile / "infermax_linear.json"),
                         device="cpu", tiny=True, progress=False, **given)
    assert len(calls) == untimed + 12 and check.summary["warmup_batches"] == untimed
    # the timed pass starts from a fresh cache: its first batches are the warm-up's again, token for token
    assert [p.ids for p in calls[untimed:2 * untimed]] == [p.ids for p in calls[:untimed]]


@pytest.mark.parametrize("prompt, output, refused", [(500, 13, False), (500, 14, True)])
def test_gpu_replay_refuses_requests_past_the_models_positions(tiny_profile, prompt, output, refused):
    # The tiny model has 512 positions: I + O - 1 = 512 KV rows fit (last fed position 511), 513 do not.
    assert L.shard_shapes("llama-3-8b", 1, tiny=True).max_position == 512
    sched = Schedule([Request(0, 0.0, prompt, output)], Limits(C=512, M=1024),
                     [ScheduledBatch([(0, prompt)])] + [ScheduledBatch([(0, 1)]) for _ in range(output - 1)])
    cost = load_cost_model(path=tiny_profile / "infermax_linear.json")

    def replay():
        return E.gpu_replay(sched, "llama-3-8b", cost, device="cpu", tiny=True, warmup_batches=0, progress=False)

    if refused:
        with pytest.raises(ValueError, match="need more than llama-3-8b-tiny's 512 positions .*513"):
            replay()
    else:
        assert replay().summary["batches"] == output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_profile_and_replay_on_cuda(tmp_path):
    folder = profile("llama-3-8b", tmp_path, dtype="bf16", grid="tiny", tiny=True, device="cuda", progress=False)
    table = read_measurements(folder / "measurements.csv")
    assert (table["derivation"] == "").all() and (table["median_ms"] > 0).all()
    sched = _hand_schedule()
    check = E.gpu_replay(sched, "llama-3-8b", _Flat(), device="cuda", dtype="bf16", tiny=True, warmup_batches=2,
                         progress=False)
    assert check.summary["batches"] == len(sched.batches)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_profile_and_replay_on_cuda(tmp_path):
    # Every operator of the tiny grid is captured (none falls back to eager timing), and the graph replay gives the
    # eager run's tokens (greedy picks are a deterministic function of the same inputs on the same kernels).
    folder = profile("llama-3-8b", tmp_path, dtype="fp32", grid="tiny", tiny=True, device="cuda", progress=False,
                     cuda_graphs=True)
    table = read_measurements(folder / "measurements.csv")
    assert table["software"].str.endswith(", CUDA graph").all() and (table["median_ms"] > 0).all()
    sched = _hand_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cuda", torch.float32, E.pool_rows_for(sched, shapes, "cuda", torch.float32), seed=3)
    eager = E.Executor(net, sched)
    eager.run(_Flat())
    graphs = E.BatchGraphs()
    E.Executor(net, sched).run(_Flat(), graphs=graphs)
    graphs.capturing = False
    timed = E.Executor(net, sched)
    measured, _ = timed.run(_Flat(), graphs=graphs)
    assert timed.tokens == eager.tokens and all(t > 0 for t in measured)
    check = E.gpu_replay(sched, "llama-3-8b", _Flat(), device="cuda", dtype="fp32", tiny=True, progress=False,
                         cuda_graphs=True)
    assert check.summary["cuda_graphs"] and check.summary["batches"] == len(sched.batches)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_varlen_decode_attention_on_cuda(tmp_path):
    # FlashAttention's variable-length kernel against the masked, padded SDPA call on one batch of widely spread
    # lengths at Llama-3-8B's heads (32 query, 8 KV, 128 wide; bf16, which FlashAttention needs); then the tiny
    # model profiled with it through graphs (every operator captured) and a graph replay giving the eager tokens.
    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths, starts = [4100, 900, 420, 400, 37, 1], [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n + 5)
    rows = starts[-1] + lengths[-1]
    k_pool, v_pool = (torch.randn(rows, 8, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(len(lengths), 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    index, valid = L.decode_index(starts, lengths, "cuda")
    padded = L.decode_attention(q, k_pool, v_pool, index, valid).float()
    ragged = L.decode_attention_varlen(q, k_pool, v_pool, L.ragged_keys(starts, lengths, 4, "cuda")).float()
    assert torch.allclose(ragged, padded, atol=2e-2, rtol=2e-2)
    folder = profile("llama-3-8b", tmp_path, dtype="bf16", grid="tiny", tiny=True, device="cuda", progress=False,
                     cuda_graphs=True, decode_kernel="varlen")
    table = read_measurements(folder / "measurements.csv")
    assert table["software"].str.endswith(", CUDA graph").all() and (table["derivation"] == "").all()
    sched = _spread_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cuda", torch.bfloat16, E.pool_rows_for(sched, shapes, "cuda", torch.bfloat16), seed=3)
    eager = E.Executor(net, sched, decode_kernel="varlen")
    eager.run(_Flat())
    graphs = E.BatchGraphs()
    E.Executor(net, sched, decode_kernel="varlen").run(_Flat(), graphs=graphs)
    graphs.capturing = False
    timed = E.Executor(net, sched, decode_kernel="varlen")
    measured, _ = timed.run(_Flat(), graphs=graphs)
    assert timed.tokens == eager.tokens and all(t > 0 for t in measured)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_varlen_prefill_attention_on_cuda(tmp_path):
    # FlashAttention's causal variable-length kernel against one causal SDPA call per chunk, with and without cached
    # context (a mask aligned to the upper left would fail the chunks after context), at Llama-3-8B's heads in bf16;
    # then the tiny model profiled with it through graphs and a graph replay giving the eager tokens, both kernels
    # varlen.
    gen = torch.Generator(device="cuda").manual_seed(0)
    prefills = [(0, 0, 700), (800, 2000, 256), (3100, 45, 1), (3200, 0, 5)]
    k_pool, v_pool = (torch.randn(3300, 8, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(sum(c for _, _, c in prefills), 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    ragged = L.prefill_attention_varlen(q, k_pool, v_pool, L.ragged_chunks(prefills, "cuda")).float()
    row = 0
    for start, m, c in prefills:
        want = L.prefill_attention(q[row:row + c], k_pool[start:start + m + c], v_pool[start:start + m + c]).float()
        assert torch.allclose(ragged[row:row + c], want, atol=2e-2, rtol=2e-2), (start, m, c)
        row += c
    kernels = dict(decode_kernel="varlen", prefill_kernel="varlen")
    folder = profile("llama-3-8b", tmp_path, dtype="bf16", grid="tiny", tiny=True, device="cuda", progress=False,
                     cuda_graphs=True, **kernels)
    table = read_measurements(folder / "measurements.csv")
    assert table["software"].str.endswith(", CUDA graph").all() and (table["derivation"] == "").all()
    sched = _hand_schedule()
    shapes = L.shard_shapes("llama-3-8b", tiny=True)
    net = E.Transformer(shapes, "cuda", torch.bfloat16, E.pool_rows_for(sched, shapes, "cuda", torch.bfloat16), seed=3)
    eager = E.Executor(net, sched, **kernels)
    eager.run(_Flat())
    graphs = E.BatchGraphs()
    E.Executor(net, sched, **kernels).run(_Flat(), graphs=graphs)
    graphs.capturing = False
    timed = E.Executor(net, sched, **kernels)
    measured, _ = timed.run(_Flat(), graphs=graphs)
    assert timed.tokens == eager.tokens and all(t > 0 for t in measured)


def test_graph_timing_captures_several_calls_and_reports_one(monkeypatch):
    # measure_graph's bookkeeping with the CUDA parts stood in for: `calls` calls captured in one graph, the replay
    # timed, the timing divided by `calls` (the replay's own fixed cost spread over them, as in a batch's graph).
    from types import SimpleNamespace

    from infermax.profiling import timer as T

    ran = []
    monkeypatch.setattr(T.torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(T, "capture", lambda fn, pool=None: (SimpleNamespace(replay=fn), fn()))
    monkeypatch.setattr(T, "measure", lambda fn, device, warmup, reps: fn() or T.Timing.of([8.0, 16.0, 12.0]))
    t = T.measure_graph(lambda: ran.append(1), "cuda", warmup=2, reps=3, calls=4)
    assert len(ran) == 2 + 4 + 4  # warm-up, the capture, one (stood-in) timed replay
    assert (t.median_ms, t.mean_ms, t.reps) == (3.0, 3.0, 3) and t.std_ms == pytest.approx(1.0)
    with pytest.raises(ValueError, match="calls >= 1"):
        T.measure_graph(lambda: None, "cuda", calls=0)


@pytest.mark.parametrize("name, key", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
                                       ("NVIDIA L40S", "l40s"), ("NVIDIA L4", "l4"), ("Some GPU X", "some-gpu-x")])
def test_gpu_key_names_the_profile_folder(name, key):
    from infermax.profiling.runner import gpu_key

    assert gpu_key(name, "cuda") == key and gpu_key(name, "cpu") == "cpu"


# ---- the LM head: charged once per batch at its one-row time ----

def test_lm_head_floor_is_the_fewest_rows_measured_time():
    from infermax.costmodel.fitting import lm_head_floor_ms

    rows = pd.DataFrame({"operator": ["lm_head", "lm_head", "lm_head", "emb", "lm_head"], "num_tokens": [4, 2, 8, 1, 1],
                         "median_ms": [0.31, 0.30, 0.33, 0.01, 0.28], "derivation": ["", "", "", "", "scaled"]})
    assert lm_head_floor_ms(rows) == 0.30  # the derived 1-row time is not a measurement
    assert lm_head_floor_ms(rows[rows.operator == "emb"]) == 0.0


def test_fit_charges_the_lm_head_floor_once_per_batch(tiny_profile, tmp_path):
    # The same profile fitted with and without its lm_head rows: the linear non-attention line moves up by exactly
    # the head's one-row time per batch and nothing else changes; the fit records the charge only where it is made.
    import shutil

    from infermax.costmodel.base import BatchFeatures
    from infermax.costmodel.fitting import lm_head_floor_ms

    without = tmp_path / "without" / "tp1"
    shutil.copytree(tiny_profile, without)
    table = read_measurements(without / "measurements.csv")
    floor_ms = lm_head_floor_ms(table)
    assert floor_ms == table[(table.operator == "lm_head") & (table.num_tokens == 1)].median_ms.item() > 0
    table[table.operator != "lm_head"].to_csv(without / "measurements.csv", index=False)
    fit_profile(without, plots=False)
    docs = [json.loads((folder / "infermax_linear.json").read_text()) for folder in (tiny_profile, without)]
    (with_head, no_head), layers = [d["per_layer_ms"] for d in docs], docs[0]["num_layers"]
    assert (with_head["non_attention"]["intercept"] - no_head["non_attention"]["intercept"]) * layers == \
        pytest.approx(floor_ms, rel=1e-9)
    assert with_head["non_attention"]["per_token"] == pytest.approx(no_head["non_attention"]["per_token"], rel=1e-12)
    assert with_head["decode_attention"] == no_head["decode_attention"]
    assert docs[0]["fit"]["lm_head_per_batch_ms"] == floor_ms and "lm_head_per_batch_ms" not in docs[1]["fit"]
    decode = BatchFeatures(n_tokens=4, n_decode_seqs=4, decode_kv_tokens=40, decode_kv_max=12)
    times = [load_cost_model(path=folder / "infermax_linear.json").batch_time_s(decode) for folder in (tiny_profile, without)]
    assert (times[0] - times[1]) * 1e3 == pytest.approx(floor_ms, rel=1e-9)


def test_fit_command_reports_the_lm_head_charge(tiny_profile, tmp_path):
    import shutil

    folder = tmp_path / "p" / "tp1"
    shutil.copytree(tiny_profile, folder)
    result = runner.invoke(app, ["fit", str(folder), "--no-plots"])
    floor_ms = read_measurements(folder / "measurements.csv").query("operator == 'lm_head' and num_tokens == 1")
    assert result.exit_code == 0, result.output
    assert f"LM head: {floor_ms.median_ms.item():.4g} ms per batch" in result.output.replace("\n", " ")


def test_decode_attention_group_includes_the_decodes_kv_write(tiny_profile):
    # Each decode row is fitted as the attention call plus the write of its b sequences' new K and V (the profile's
    # attn_decode_kv_save row of the same b), as the replay runs both; a profile without those rows fits as before.
    from infermax.costmodel.fitting import ProfileSpec, build_groups

    spec, table = ProfileSpec.read(tiny_profile), read_measurements(tiny_profile / "measurements.csv")
    saves = table[table.operator == "attn_decode_kv_save"].set_index("batch_size").median_ms
    decode = table[table.operator == "attn_decode"]
    assert set(saves.index) == set(decode.batch_size) and (saves > 0).all()

    def decode_y(t):
        (group,) = [g for g in build_groups(t, spec) if g.name == "decode_attention"]
        return group.y_ms

    expected = spec.num_layers * (decode.median_ms.to_numpy() + saves.loc[decode.batch_size].to_numpy())
    assert np.allclose(decode_y(table), expected)
    assert np.allclose(decode_y(table[table.operator != "attn_decode_kv_save"]),
                       spec.num_layers * decode.median_ms.to_numpy())


def test_operator_bench_counts_its_cases():
    # the progress bar's total is the number of cases the grid yields
    from infermax.profiling.operators import OperatorBench

    bench = OperatorBench(L.shard_shapes("llama-3-8b", tiny=True), GRIDS["tiny"], "cpu", torch.float32)
    cases = list(bench.cases())
    assert bench.count() == len(cases)
    assert sum(c.operator == "attn_decode_kv_save" for c in cases) == len(GRIDS["tiny"].decode_batches)
