"""The operator cases ``infermax profile`` times: each a measurement-table key and a closure at real shapes.

Grids (``GRIDS``) set the sizes: tokens per batch for the per-layer operators, chunk × prior context
for prefill attention, batch × mean KV length for decode attention, tokens for host↔device copies.
Decode batches hold sequences of different lengths (``decode_lengths``: evenly spread over ±25% of
the mean, summing to exactly ``batch × mean``); the row records the mean as ``kv_cache_size``, so
``batch_size × kv_cache_size`` is the KV read the cost model's feature counts. Decode attention is timed with the
kernel the replay will use (``decode_kernel``: one padded SDPA call, or one variable-length call, ``layers``), and
so are prefill attention and its K/V write (``prefill_kernel``: a causal SDPA call and a slice copy per chunk, or a
variable-length call and an indexed copy, here of one chunk: the replay makes one of each for a batch's chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from . import layers as L

torch = L.torch


@dataclass(frozen=True)
class Grid:
    """Sizes to profile (operators at ``c + m`` or a KV length beyond the model's ``max_position`` are skipped)."""

    tokens: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    prefill_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_kv: tuple[int, ...]
    swap_tokens: tuple[int, ...]
    max_decode_tokens: int  # skip decode cases with batch × KV above this (memory)
    warmup: int
    reps: int


GRIDS = {
    # About 50 s per 7-8B model on an H100 (see benchmarks/gpu_check.sh).
    "full": Grid(tokens=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096),
                 prefill_chunks=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
                 prefill_contexts=(0, 256, 512, 1024, 2048, 4096, 6144),
                 decode_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), decode_kv=(32, 64, 128, 256, 512, 1024, 2048, 4096),
                 swap_tokens=(16, 128, 1024, 4096), max_decode_tokens=131072, warmup=3, reps=10),
    "small": Grid(tokens=(1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096), prefill_chunks=(32, 128, 512, 1024, 2048),
                  prefill_contexts=(0, 512, 2048), decode_batches=(1, 4, 16, 64, 128), decode_kv=(64, 256, 1024, 4096),
                  swap_tokens=(128, 4096), max_decode_tokens=131072, warmup=2, reps=5),
    # For CPU tests with --tiny shapes (seconds).
    "tiny": Grid(tokens=(1, 2, 4, 8, 16, 32, 64, 128), prefill_chunks=(4, 8, 16, 32, 64), prefill_contexts=(0, 16, 64),
                 decode_batches=(1, 2, 4, 8), decode_kv=(8, 16, 32, 64), swap_tokens=(16, 64), max_decode_tokens=512,
                 warmup=1, reps=3),
}


def get_grid(name: str) -> Grid:
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; choose one of {', '.join(GRIDS)}")
    return GRIDS[name]


def decode_lengths(batch: int, mean: int) -> list[int]:
    """``batch`` KV lengths evenly spread over ``mean × [0.75, 1.25]`` (each ≥ 1), summing to ``batch × mean``."""
    if batch == 1:
        return [mean]
    lengths = [max(1, round(mean * (0.75 + 0.5 * i / (batch - 1)))) for i in range(batch)]
    lengths[-1] += batch * mean - sum(lengths)
    return lengths


@dataclass(frozen=True)
class Case:
    """One timing to take: the measurement-table key columns and the work (a closure)."""

    operator: str
    num_tokens: int
    batch_size: int
    prefill_chunk_size: int
    kv_cache_size: int
    run: Callable[[], object]


class OperatorBench:
    """One layer's weights, the embeddings and a KV pool at ``shapes`` on ``device``, and the cases of ``grid``."""

    def __init__(self, shapes: L.Shapes, grid: Grid, device, dtype, seed: int = 0, decode_kernel: str = "sdpa",
                 prefill_kernel: str = "sdpa"):
        self.s, self.grid, self.device, self.dtype = shapes, grid, torch.device(device), dtype
        self.decode_kernel, self.prefill_kernel = decode_kernel, prefill_kernel
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.layer = L.LayerWeights(shapes, self.device, dtype, gen)
        self.emb = L.Embeddings(shapes, self.device, dtype, gen)
        self.gen = gen

    def _randn(self, *shape):
        return torch.randn(*shape, device=self.device, generator=self.gen).to(self.dtype)

    def prefill_shapes(self) -> list[tuple[int, int]]:
        g = self.grid
        return [(c, m) for c in g.prefill_chunks for m in g.prefill_contexts if c + m <= self.s.max_position]

    def decode_shapes(self) -> list[tuple[int, int]]:
        g = self.grid
        return [(b, k) for b in g.decode_batches for k in g.decode_kv
                if b * k <= g.max_decode_tokens and round(1.25 * k) <= self.s.max_position]

    def count(self) -> int:
        g = self.grid
        decode = self.decode_shapes()
        return (11 * len(g.tokens) + 2 * len(self.prefill_shapes()) + len(decode) + len({b for b, _ in decode})
                + 2 * len(g.swap_tokens))

    def cases(self) -> Iterator[Case]:
        """Every case of the grid, built lazily (inputs of one size at a time)."""
        yield from self._token_cases()
        yield from self._prefill_cases()
        yield from self._decode_cases()
        yield from self._swap_cases()

    def _token_cases(self) -> Iterator[Case]:
        s, w, e = self.s, self.layer, self.emb
        for n in self.grid.tokens:
            ids = torch.randint(0, s.vocab, (n,), device=self.device, generator=self.gen)
            positions = torch.randint(0, s.max_position, (n,), device=self.device, generator=self.gen)
            x, y = self._randn(n, s.hidden), self._randn(n, s.hidden)
            attn, a = self._randn(n, s.q_dim), self._randn(n, s.ffn)
            q, k, _ = L.split_qkv(self._randn(n, s.q_dim + 2 * s.kv_dim), s)
            gate_up = self._randn(n, 2 * s.ffn)
            ops = {
                "emb": lambda: L.embed(ids, e),
                "input_layernorm": lambda: L.rms_norm(x, w.ln1),
                "attn_pre_proj": lambda: L.linear(x, w.wqkv),
                "attn_rope": lambda: L.rope(q, k, positions, e),
                "attn_post_proj": lambda: L.linear(attn, w.wo),
                "post_attention_layernorm": lambda: L.rms_norm(x, w.ln2),
                "mlp_up_proj": lambda: L.linear(x, w.w_gate_up),
                "mlp_act": lambda: L.silu_mul(gate_up),
                "mlp_down_proj": lambda: L.linear(a, w.w_down),
                "add": lambda: L.add(x, y),
                # Final norm + LM head + greedy pick for n generating sequences (the fit charges its n = 1 time
                # once per batch: fitting.lm_head_floor_ms).
                "lm_head": lambda: L.linear(L.rms_norm(x, e.final_norm), e.lm_head).argmax(-1),
            }
            for op, fn in ops.items():
                yield Case(op, n, 0, 0, 0, fn)

    def _prefill_cases(self) -> Iterator[Case]:
        s = self.s
        shapes = self.prefill_shapes()
        if not shapes:
            return
        rows = max(c + m for c, m in shapes)
        k_pool, v_pool = self._randn(rows, s.num_kv_heads, s.head_dim), self._randn(rows, s.num_kv_heads, s.head_dim)
        for c, m in shapes:
            q = self._randn(c, s.num_heads, s.head_dim)
            k_new, v_new = self._randn(c, s.num_kv_heads, s.head_dim), self._randn(c, s.num_kv_heads, s.head_dim)
            if self.prefill_kernel == "varlen":
                chunks = L.ragged_chunks([(0, m, c)], self.device)
                yield Case("attn_prefill", c, 1, c, m,
                           lambda q=q, chunks=chunks: L.prefill_attention_varlen(q, k_pool, v_pool, chunks))
                yield Case("attn_kv_cache_save", c, 1, c, m,
                           lambda r=chunks.write_rows, k_new=k_new, v_new=v_new:
                           L.kv_write_rows(k_pool, v_pool, r, k_new, v_new))
                continue

            def save(k_new=k_new, v_new=v_new, m=m):
                L.kv_write(k_pool, m, k_new)
                L.kv_write(v_pool, m, v_new)

            yield Case("attn_prefill", c, 1, c, m,
                       lambda q=q, t=c + m: L.prefill_attention(q, k_pool[:t], v_pool[:t]))
            yield Case("attn_kv_cache_save", c, 1, c, m, save)

    def _decode_cases(self) -> Iterator[Case]:
        s = self.s
        shapes = self.decode_shapes()
        if not shapes:
            return
        rows = max(b * k for b, k in shapes)
        k_pool, v_pool = self._randn(rows, s.num_kv_heads, s.head_dim), self._randn(rows, s.num_kv_heads, s.head_dim)
        for b in sorted({b for b, _ in shapes}):
            # The decodes' new K and V written into the pool, one row per sequence (as gpu-replay writes them)
            write_rows = torch.arange(b, device=self.device) * (rows // b)
            k_new, v_new = self._randn(b, s.num_kv_heads, s.head_dim), self._randn(b, s.num_kv_heads, s.head_dim)
            yield Case("attn_decode_kv_save", b, b, 0, 0,
                       lambda r=write_rows, k_new=k_new, v_new=v_new: L.kv_write_rows(k_pool, v_pool, r, k_new, v_new))
        for b, k in shapes:
            lengths = decode_lengths(b, k)
            starts = [0]
            for n in lengths[:-1]:
                starts.append(starts[-1] + n)
            q = self._randn(b, s.num_heads, s.head_dim)
            if self.decode_kernel == "varlen":
                keys = L.ragged_keys(starts, lengths, s.num_heads // s.num_kv_heads, self.device)
                yield Case("attn_decode", b, b, 0, k,
                           lambda q=q, keys=keys: L.decode_attention_varlen(q, k_pool, v_pool, keys))
                continue
            index, valid = L.decode_index(starts, lengths, self.device)
            yield Case("attn_decode", b, b, 0, k,
                       lambda q=q, index=index, valid=valid: L.decode_attention(q, k_pool, v_pool, index, valid))

    def _swap_cases(self) -> Iterator[Case]:
        """One layer's K and V of ``n`` tokens copied out to host memory and back (pinned on CUDA)."""
        s, cuda = self.s, self.device.type == "cuda"
        for n in self.grid.swap_tokens:
            on_device = self._randn(2, n, s.num_kv_heads, s.head_dim)
            host = torch.empty(on_device.shape, dtype=self.dtype, pin_memory=cuda)
            yield Case("swap_out", n, 0, 0, 0, lambda h=host, d=on_device: h.copy_(d, non_blocking=cuda))
            yield Case("swap_in", n, 0, 0, 0, lambda h=host, d=on_device: d.copy_(h, non_blocking=cuda))
