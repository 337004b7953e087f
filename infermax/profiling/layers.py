"""A Llama-style transformer layer as separate PyTorch operators, at a model's real (per-GPU) shapes.

The profiler times these functions one by one; the executor (``execute``) runs a whole model out of
the same functions, so both measure the same code. Attention is PyTorch's
``scaled_dot_product_attention`` (SDPA): a prefill chunk of ``c`` tokens after ``m`` cached tokens
attends causally with the mask aligned to the lower right (query ``i`` sees keys ``0..m+i``);
decode attention gathers each sequence's KV from the token pool into a padded batch and runs one
masked SDPA call with the query heads of each KV head as its query rows (grouped-query attention
without copying KV heads); the executor splits a batch whose lengths differ widely into groups of similar
lengths (``decode_groups``), one such call each. Or (``decode_kernel="varlen"``) decode attention gathers
every sequence's keys back to back, unpadded, and makes one variable-length FlashAttention call for the whole batch
(``decode_attention_varlen``), as a paged-attention server makes one call over ragged keys. vLLM's paged
FlashAttention/FlashInfer kernels read the pool in place; these gather first, so absolute times differ from vLLM's.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass

from ..models import ModelSpec, get_model
from . import import_torch

torch = import_torch()
F = torch.nn.functional
from torch.nn.attention.bias import causal_lower_right  # noqa: E402  (needs torch imported first)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
TINY = dict(num_layers=2, hidden_size=64, num_heads=4, ffn_size=176, vocab_size=512, max_position=512)


@dataclass(frozen=True)
class Shapes:
    """Per-GPU shapes of one tensor-parallel shard of a Llama-style model (heads, FFN, vocab split by ``tp``)."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_position: int
    tp: int

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


def tiny_spec(spec: ModelSpec) -> ModelSpec:
    """A 2-layer, 64-wide model with ``spec``'s query/KV head ratio, for CPU tests (named ``<name>-tiny``)."""
    group = spec.num_heads // spec.num_kv_heads
    heads = TINY["num_heads"]
    return ModelSpec(f"{spec.name}-tiny", TINY["num_layers"], TINY["hidden_size"], heads, max(1, heads // group),
                     TINY["ffn_size"], TINY["vocab_size"], max_position=TINY["max_position"])


def shard_shapes(model: str | ModelSpec, tp: int = 1, tiny: bool = False) -> Shapes:
    """Shapes of one of ``tp`` GPUs for a registered Llama-style model (``tiny``: see ``tiny_spec``)."""
    spec = get_model(model)
    if not spec.gated_mlp or spec.learned_positions:
        raise ValueError(f"model {spec.name!r}: only Llama-style models (gated MLP, rotary positions) can be built")
    if tiny:
        spec = tiny_spec(spec)
    for what, n in (("num_heads", spec.num_heads), ("num_kv_heads", spec.num_kv_heads), ("ffn_size", spec.ffn_size)):
        if n % tp:
            raise ValueError(f"model {spec.name!r}: tp={tp} does not divide {what}={n}")
    return Shapes(spec.name, spec.num_layers, spec.hidden_size, spec.num_heads // tp, spec.num_kv_heads // tp,
                  spec.head_dim, spec.ffn_size // tp, -(-spec.vocab_size // tp), spec.max_position, tp)


def _linear_weight(out_dim: int, in_dim: int, device, dtype, gen):
    return (torch.randn(out_dim, in_dim, device=device, generator=gen) / in_dim ** 0.5).to(dtype)


class LayerWeights:
    """Random weights of one decoder layer (fused QKV and gate/up projections, as vLLM stores them)."""

    def __init__(self, s: Shapes, device, dtype, gen):
        self.ln1 = torch.ones(s.hidden, device=device, dtype=dtype)
        self.wqkv = _linear_weight(s.q_dim + 2 * s.kv_dim, s.hidden, device, dtype, gen)
        self.wo = _linear_weight(s.hidden, s.q_dim, device, dtype, gen)
        self.ln2 = torch.ones(s.hidden, device=device, dtype=dtype)
        self.w_gate_up = _linear_weight(2 * s.ffn, s.hidden, device, dtype, gen)
        self.w_down = _linear_weight(s.hidden, s.ffn, device, dtype, gen)


class Embeddings:
    """Token embedding, final norm, LM head and the rotary tables (``cos``, ``sin``: ``[max_position, head_dim/2]``)."""

    def __init__(self, s: Shapes, device, dtype, gen):
        self.table = torch.randn(s.vocab, s.hidden, device=device, generator=gen).to(dtype)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = _linear_weight(s.vocab, s.hidden, device, dtype, gen)
        inv_freq = ROPE_THETA ** (-torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim)
        angles = torch.outer(torch.arange(s.max_position, device=device, dtype=torch.float32), inv_freq)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)


# ---- operators (x: [tokens, hidden]) ----

def embed(ids, e: Embeddings):
    return F.embedding(ids, e.table)


def rms_norm(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, NORM_EPS)


def linear(x, weight):
    return F.linear(x, weight)


def split_qkv(qkv, s: Shapes):
    """Views ``q [n, heads, hd]``, ``k``, ``v [n, kv_heads, hd]`` of the fused projection's output."""
    n = qkv.shape[0]
    q, k, v = qkv.split((s.q_dim, s.kv_dim, s.kv_dim), dim=-1)
    return (q.view(n, s.num_heads, s.head_dim), k.view(n, s.num_kv_heads, s.head_dim),
            v.view(n, s.num_kv_heads, s.head_dim))


def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope(q, k, positions, e: Embeddings):
    """Rotary embedding (rotate-half form) of ``q`` and ``k`` at token ``positions``."""
    cos, sin = e.cos[positions].unsqueeze(1), e.sin[positions].unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def silu_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add(x, y):
    return x + y


def kv_write(pool, start: int, values) -> None:
    """Store ``values`` (``[c, kv_heads, hd]``) at pool rows ``start .. start + c - 1``."""
    pool[start:start + values.shape[0]].copy_(values)


def kv_write_rows(k_pool, v_pool, rows, k_new, v_new) -> None:
    """Store new keys and values (``[n, kv_heads, hd]``) at pool ``rows`` (``n`` of them, anywhere in the pool), one
    copy each: the decodes' new rows (one per sequence), or with the "varlen" prefill kernel every chunk's."""
    k_pool.index_copy_(0, rows, k_new)
    v_pool.index_copy_(0, rows, v_new)


def prefill_attention(q, k, v):
    """Causal attention of a chunk ``q [c, heads, hd]`` over ``k, v [m + c, kv_heads, hd]`` (its ``m``
    cached tokens then itself), the mask aligned to the lower right; returns ``[c, heads * hd]``."""
    c, total = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    if total == c:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(c, total), enable_gqa=True)
    return out[0].transpose(0, 1).reshape(c, -1)


def decode_attention(q, k_pool, v_pool, index, valid):
    """One query token per sequence, ``q [b, heads, hd]``, over pool rows ``index [b, L]`` (padding
    where ``valid`` is False); returns ``[b, heads * hd]``."""
    b, heads, hd = q.shape
    kv_heads = k_pool.shape[1]
    keys, values = k_pool[index].transpose(1, 2), v_pool[index].transpose(1, 2)  # [b, kv_heads, L, hd]
    out = F.scaled_dot_product_attention(q.view(b, kv_heads, heads // kv_heads, hd), keys, values,
                                         attn_mask=valid[:, None, None, :])
    return out.reshape(b, heads * hd)


DECODE_ALIGN = 8  # decode batches are padded to a multiple of this many keys
# The most padding a decode group may carry: count × longest KV ≤ DECODE_PADDING × the group's KV. The operator
# profile's decode batches spread lengths over ±25% of their mean (operators.decode_lengths), so their one call reads
# up to 1.25× the keys: groups held to the same bound run the shapes the cost model was fitted on.
DECODE_PADDING = 1.25


def decode_groups(lengths: list[int], padding: float = DECODE_PADDING) -> list[int]:
    """Sizes of consecutive groups of ``lengths`` (longest first) whose padded keys stay within ``padding`` times
    their real keys: each group takes the longest sequence left and then, in order, every next one while
    ``count × longest ≤ padding × sum`` holds. ``padding = inf`` gives one group (one padded call for the batch).

    Why: one padded call reads ``b × max`` keys. On a trace slice a decode batch can hold a 4,000-token
    conversation beside thirty 400-token ones, and on an H200 (2026-11-29, CUDA graphs) the batches padded more
    than 3× took up to twice their predicted time while the others were within 10%
    (``benchmarks/gpu_replay_padding.py``). A paged-attention server reads each sequence's own keys; grouping is
    the nearest this replayer's SDPA calls come to that, at one call per group."""
    if any(a < b for a, b in zip(lengths, lengths[1:])):
        raise ValueError("decode_groups needs lengths ordered longest first")
    if padding < 1:
        raise ValueError(f"decode padding must be at least 1, got {padding}")
    sizes, i = [], 0
    while i < len(lengths):
        longest, total, j = lengths[i], lengths[i], i + 1
        while j < len(lengths) and (j - i + 1) * longest <= padding * (total + lengths[j]):
            total += lengths[j]
            j += 1
        sizes.append(j - i)
        i = j
    return sizes


def decode_index(starts: list[int], lengths: list[int], device, align: int = DECODE_ALIGN):
    """Pool rows ``index [b, L]`` and mask ``valid [b, L]`` for sequences stored at ``starts`` with
    ``lengths`` tokens; ``L`` is the longest length rounded up to ``align`` (padding repeats row ``start``)."""
    width = -(-max(lengths) // align) * align
    offsets = torch.arange(width)
    lens = torch.tensor(lengths)
    valid = offsets[None, :] < lens[:, None]
    index = torch.tensor(starts)[:, None] + torch.where(valid, offsets[None, :], 0)
    return index.to(device), valid.to(device)


# How a batch's decode attention runs: "sdpa", masked SDPA calls over padded keys in groups (``decode_groups``), or
# "varlen", one variable-length FlashAttention call over unpadded keys (``decode_attention_varlen``).
DECODE_KERNELS = ("sdpa", "varlen")
# How a batch's prefill chunks attend: "sdpa", one causal SDPA call per chunk (``prefill_attention``), or "varlen", one
# causal variable-length FlashAttention call for every chunk of the batch (``prefill_attention_varlen``).
PREFILL_KERNELS = ("sdpa", "varlen")


def check_decode_kernel(kernel: str, device) -> None:
    """Refuse an unknown kernel, and "varlen" on a CUDA device whose PyTorch lacks ``torch.nn.attention.varlen``."""
    _check_kernel("decode", kernel, DECODE_KERNELS, device)


def check_prefill_kernel(kernel: str, device) -> None:
    """``check_decode_kernel`` for the prefill chunks' kernel."""
    _check_kernel("prefill", kernel, PREFILL_KERNELS, device)


def _check_kernel(phase: str, kernel: str, choices: tuple[str, ...], device) -> None:
    if kernel not in choices:
        raise ValueError(f"unknown {phase} kernel {kernel!r}; choose one of {', '.join(choices)}")
    if kernel == "varlen":
        varlen_function(torch.device(device), phase)


@dataclass
class RaggedKeys:
    """A decode batch's keys for one variable-length call: the pool rows of every sequence's keys, sequence after
    sequence (``rows``, Σ lengths of them, no padding); the cumulative offsets of the queries (``cu_q``: ``g`` query
    rows per sequence, see ``decode_attention_varlen``) and of the keys (``cu_k``), int32 as FlashAttention wants
    them; and the longest sequence's length (``max_k``, a host integer, fixed in a captured graph)."""

    rows: object
    cu_q: object
    cu_k: object
    max_k: int

    def tensors(self) -> list:
        return [self.rows, self.cu_q, self.cu_k]


def ragged_keys(starts: list[int], lengths: list[int], queries_per_kv_head: int, device) -> RaggedKeys:
    """``RaggedKeys`` of sequences stored at pool rows ``starts .. starts + length − 1``."""
    rows = torch.cat([torch.arange(st, st + n) for st, n in zip(starts, lengths)])
    cu_k = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    cu_q = torch.arange(len(lengths) + 1, dtype=torch.int32) * queries_per_kv_head
    return RaggedKeys(rows.to(device), cu_q.to(device), cu_k.to(device), max(lengths))


def varlen_reference(q, k, v, cu_q, cu_k, max_q: int, max_k: int):
    """``torch.nn.attention.varlen.varlen_attn``'s result (no causal mask, default scale) one sequence at a time
    with SDPA: the stand-in on a CPU, where FlashAttention does not run, and the tests' reference."""
    out = torch.empty_like(q)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        qi, ki, vi = (x.transpose(0, 1) for x in (q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]))
        out[cq[i]:cq[i + 1]] = F.scaled_dot_product_attention(qi, ki, vi).transpose(0, 1)
    return out


def varlen_function(device, phase: str = "decode"):
    """PyTorch's variable-length FlashAttention on CUDA (``torch.nn.attention.varlen.varlen_attn``, PyTorch 2.10 or
    later), ``varlen_reference`` elsewhere. ``phase`` names the option to fall back on in the error."""
    if device.type != "cuda":
        return varlen_reference
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise ValueError(f"{phase} kernel 'varlen' needs torch.nn.attention.varlen (PyTorch 2.10 or later); this is "
                         f"PyTorch {torch.__version__}: use --{phase}-kernel sdpa") from exc
    return varlen_attn


def decode_attention_varlen(q, k_pool, v_pool, keys: RaggedKeys):
    """One query token per sequence, ``q [b, heads, hd]``, over each sequence's own keys (``keys``), in one
    variable-length attention call; returns ``[b, heads * hd]``.

    Grouped-query attention without copying KV heads, as ``decode_attention`` does it: the ``g = heads / kv_heads``
    query heads that share a KV head become ``g`` query rows of their sequence over ``kv_heads`` heads (query head
    ``kv · g + j`` is row ``j`` of head ``kv``), so the call sees ``b · g`` queries in ``b`` sequences of ``g``."""
    b, heads, hd = q.shape
    kv_heads = k_pool.shape[1]
    g = heads // kv_heads
    packed = q.view(b, kv_heads, g, hd).transpose(1, 2).reshape(b * g, kv_heads, hd)
    out = varlen_function(q.device)(packed, k_pool[keys.rows], v_pool[keys.rows], keys.cu_q, keys.cu_k, g, keys.max_k)
    return out.view(b, g, kv_heads, hd).transpose(1, 2).reshape(b, heads * hd)


@dataclass
class RaggedChunks:
    """A batch's prefill chunks for one variable-length causal call. Chunk ``i`` of ``c_i`` tokens after ``m_i``
    cached ones, its sequence at pool rows ``start_i …``: its new keys go to rows ``start_i + m_i …`` (``write_rows``,
    Σc of them, chunk after chunk, as the batch's token rows are laid out), and it attends to rows ``start_i …
    start_i + m_i + c_i − 1`` (``key_rows``, Σ(m + c) of them). ``cu_q``/``cu_k``: the cumulative chunk and key
    lengths (int32); ``max_q``/``max_k``: the largest of each (host integers, fixed in a captured graph)."""

    write_rows: object
    key_rows: object
    cu_q: object
    cu_k: object
    max_q: int
    max_k: int

    def tensors(self) -> list:
        return [self.write_rows, self.key_rows, self.cu_q, self.cu_k]


def ragged_chunks(prefills: list[tuple[int, int, int]], device) -> RaggedChunks:
    """``RaggedChunks`` of chunks ``(pool start, m, c)``."""
    write = torch.cat([torch.arange(st + m, st + m + c) for st, m, c in prefills])
    keys = torch.cat([torch.arange(st, st + m + c) for st, m, c in prefills])
    cu_q = torch.tensor([0, *itertools.accumulate(c for _, _, c in prefills)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(m + c for _, m, c in prefills)], dtype=torch.int32)
    return RaggedChunks(write.to(device), keys.to(device), cu_q.to(device), cu_k.to(device),
                        max(c for _, _, c in prefills), max(m + c for _, m, c in prefills))


def causal_varlen_reference(q, k, v, cu_q, cu_k, max_q: int, max_k: int):
    """Causal variable-length attention, the mask aligned to the lower right of each sequence (query ``i`` of a chunk
    of ``c`` over ``t`` keys sees keys ``0 .. t − c + i``), with ``k``/``v`` of fewer heads shared by consecutive query
    heads: one SDPA call per sequence. The stand-in on a CPU and the tests' reference."""
    out = torch.empty_like(q)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        out[cq[i]:cq[i + 1]] = prefill_attention(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]],
                                                 v[ck[i]:ck[i + 1]]).view(-1, *q.shape[1:])
    return out


@functools.lru_cache(maxsize=None)
def causal_varlen_function(device, kv_heads: int, heads: int):
    """A callable ``(q [Tq, heads, hd], k, v [Tk, kv_heads, hd], cu_q, cu_k, max_q, max_k) → [Tq, heads, hd]``:
    causal variable-length FlashAttention on CUDA, ``causal_varlen_reference`` elsewhere.

    ``varlen_attn``'s signature changed across PyTorch versions, so it is read, not assumed: the causal mask is
    ``window_size=(-1, 0)`` where that exists (2.12's documentation) and ``is_causal=True`` where that does (2.10's);
    grouped-query keys pass as they are with ``enable_gqa`` (2.12), and are otherwise repeated to the query heads
    (query head ``h`` reads KV head ``h // (heads / kv_heads)``, as ``decode_attention`` groups them), a copy that
    costs the gather of the prompts' keys ``heads / kv_heads`` times over. FlashAttention aligns its causal mask to the
    lower right when a chunk has fewer queries than keys, as a chunked prefill needs; ``benchmarks/gpu_varlen_check.py``
    checks that on the GPU against ``prefill_attention`` before a session uses the kernel."""
    if device.type != "cuda":
        return causal_varlen_reference

    fn = varlen_function(device, "prefill")
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        raise ValueError(f"prefill kernel 'varlen': this PyTorch's varlen_attn ({torch.__version__}) takes neither "
                         "window_size nor is_causal, so it cannot mask causally; use --prefill-kernel sdpa")
    group = heads // kv_heads
    if group > 1 and "enable_gqa" in params:
        causal["enable_gqa"] = True
        group = 1

    def call(q, k, v, cu_q, cu_k, max_q, max_k):
        if group > 1:  # (expand and reshape: a copy whose size is known on the host, nothing to sync in a graph)
            t, kv, hd = k.shape
            k, v = (x[:, :, None, :].expand(t, kv, group, hd).reshape(t, kv * group, hd) for x in (k, v))
        return fn(q, k, v, cu_q, cu_k, max_q, max_k, **causal)

    return call


def prefill_attention_varlen(q, k_pool, v_pool, chunks: RaggedChunks):
    """Every prefill chunk of a batch, ``q [Σc, heads, hd]`` (chunk after chunk), attending causally over its own
    sequence's cached tokens and itself (``chunks``), in one variable-length call; returns ``[Σc, heads * hd]``. The
    chunks' keys must already be in the pool (``kv_write_rows`` with ``chunks.write_rows``)."""
    n, heads, hd = q.shape
    fn = causal_varlen_function(q.device, k_pool.shape[1], heads)
    out = fn(q, k_pool[chunks.key_rows], v_pool[chunks.key_rows], chunks.cu_q, chunks.cu_k, chunks.max_q, chunks.max_k)
    return out.reshape(n, heads * hd)
