"""``infermax gpu-replay``: execute a Schedule batch by batch with a real transformer and time every batch.

The model is built from a registered ModelSpec with random weights (nothing is downloaded) out of the
operators in ``layers``. Its KV cache is a token pool per layer: a request gets a contiguous range of
``I + O − 1`` rows (its peak) when its cache starts (``m = 0``), fills it as it is processed, and
gives the range back when it finishes or is evicted (recompute: the cache is dropped and later
rebuilt from its tokens). Prompts are random token ids; every generated token is the greedy pick of
the real logits, so a recomputed request sees the tokens it generated.

The Schedule's semantics are not re-implemented: a ``Replayer`` applies each batch first (validating
it, and giving each item's ``m`` and ``Icur`` before the batch and the batch's features), then the
batch runs on the device. The measured timeline is ``replay`` again with each batch's measured time
in place of the cost model, so arrivals and idle waits are honoured exactly as in the simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..costmodel.base import CostModel
from ..replay import Replayer
from ..schedule import Schedule
from . import layers as L
from .scoring import Recorder, ReplayCheck, compare
from .timer import Stopwatch, capture, require_graphs_device

torch = L.torch


class TokenPool:
    """First-fit allocator of contiguous row ranges of a KV pool with ``rows`` rows."""

    def __init__(self, rows: int):
        self.rows = rows
        self.free: list[tuple[int, int]] = [(0, rows)]  # (start, length), sorted, coalesced

    def alloc(self, n: int) -> int:
        for i, (start, length) in enumerate(self.free):
            if length >= n:
                self.free[i:i + 1] = [(start + n, length - n)] if length > n else []
                return start
        largest = max((length for _, length in self.free), default=0)
        raise ValueError(f"KV pool exhausted: {n} rows needed, largest free range {largest} of {self.rows} rows; "
                         "replay a schedule with a smaller M or use a device with more memory")

    def release(self, start: int, n: int) -> None:
        self.free.append((start, n))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for s, length in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self.free = merged


@dataclass
class BatchPlan:
    """One batch laid out for the model: prefill chunks first, then decodes; rows of ``ids`` are tokens."""

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    prefills: list[tuple[int, int, int]] = field(default_factory=list)  # (pool start, m, c)
    decodes: list[tuple[int, int]] = field(default_factory=list)  # (pool start, m), longest cache first
    decode_groups: list[int] = field(default_factory=list)  # sizes of consecutive decodes, one attention call each
    decode_kernel: str = "sdpa"  # layers.DECODE_KERNELS: "varlen" makes one call of every decode (one group)
    prefill_kernel: str = "sdpa"  # layers.PREFILL_KERNELS: "varlen" makes one call of every prefill chunk
    gen_rows: list[int] = field(default_factory=list)  # token rows whose logits pick the next token
    gen_ids: list[int] = field(default_factory=list)  # request ids of gen_rows


@dataclass
class PlanTensors:
    """A BatchPlan's index tensors: token ids, positions, the rows whose logits generate, and for decodes the
    pool rows to write (``write_rows``) and the keys to read: per decode group, the padded rows (``index``,
    ``valid``: ``layers.decode_index``), or for the "varlen" kernel every decode's rows (``ragged``:
    ``layers.ragged_keys``); for the "varlen" prefill kernel, the chunks' rows to write and keys (``chunks``:
    ``layers.ragged_chunks``)."""

    ids: object
    positions: object
    gen_rows: object
    index: list = field(default_factory=list)
    valid: list = field(default_factory=list)
    write_rows: object = None
    ragged: "L.RaggedKeys | None" = None
    chunks: "L.RaggedChunks | None" = None

    @classmethod
    def of(cls, plan: BatchPlan, device, queries_per_kv_head: int = 1) -> "PlanTensors":
        t = cls(torch.tensor(plan.ids, device=device), torch.tensor(plan.positions, device=device),
                torch.tensor(plan.gen_rows, device=device, dtype=torch.long))
        if plan.prefills and plan.prefill_kernel == "varlen":
            t.chunks = L.ragged_chunks(plan.prefills, device)
        if not plan.decodes:
            return t
        t.write_rows = torch.tensor([st + m for st, m in plan.decodes], device=device)
        if plan.decode_kernel == "varlen":
            t.ragged = L.ragged_keys([st for st, _ in plan.decodes], [m + 1 for _, m in plan.decodes],
                                     queries_per_kv_head, device)
            return t
        first = 0
        for size in plan.decode_groups:
            group = plan.decodes[first:first + size]
            index, valid = L.decode_index([st for st, _ in group], [m + 1 for _, m in group], device)
            t.index.append(index)
            t.valid.append(valid)
            first += size
        return t

    def tensors(self) -> list:
        ragged = self.ragged.tensors() if self.ragged is not None else []
        chunks = self.chunks.tensors() if self.chunks is not None else []
        return [x for x in (self.ids, self.positions, self.gen_rows, *self.index, *self.valid, *ragged, *chunks,
                            self.write_rows) if x is not None]

    def copy_from(self, other: "PlanTensors") -> None:
        """Fill these (fixed) tensors with ``other``'s values of the same shapes."""
        for mine, theirs in zip(self.tensors(), other.tensors()):
            mine.copy_(theirs)


class Transformer:
    """A Llama-style model with random weights and a per-layer KV token pool of ``pool_rows`` rows."""

    def __init__(self, shapes: L.Shapes, device, dtype, pool_rows: int, seed: int = 0):
        self.s, self.device = shapes, torch.device(device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.layers = [L.LayerWeights(shapes, self.device, dtype, gen) for _ in range(shapes.num_layers)]
        self.emb = L.Embeddings(shapes, self.device, dtype, gen)
        shape = (shapes.num_layers, pool_rows, shapes.num_kv_heads, shapes.head_dim)
        self.k_pool = torch.zeros(shape, device=self.device, dtype=dtype)
        self.v_pool = torch.zeros(shape, device=self.device, dtype=dtype)

    def tensors(self, plan: BatchPlan, device) -> PlanTensors:
        """``plan``'s index tensors on ``device``, laid out for this model's heads."""
        return PlanTensors.of(plan, device, self.s.num_heads // self.s.num_kv_heads)

    def forward(self, plan: BatchPlan, t: "PlanTensors | None" = None):
        """Run one batch (writing its K/V into the pool); returns the logits of ``plan.gen_rows``. ``t``: the plan's
        tensors already on the device (a CUDA-graph capture reads them from fixed buffers); made here by default."""
        s = self.s
        t = t if t is not None else self.tensors(plan, self.device)
        positions = t.positions
        n_prefill = sum(c for _, _, c in plan.prefills)
        x = L.embed(t.ids, self.emb)
        for layer, w in enumerate(self.layers):
            k_pool, v_pool = self.k_pool[layer], self.v_pool[layer]
            q, k, v = L.split_qkv(L.linear(L.rms_norm(x, w.ln1), w.wqkv), s)
            q, k = L.rope(q, k, positions, self.emb)
            outs = (self._prefill_attention(plan, t, q, k, v, k_pool, v_pool)
                    + self._decode_attention(plan, t, q[n_prefill:], k[n_prefill:], v[n_prefill:], k_pool, v_pool))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = L.add(x, L.linear(attn, w.wo))
            x = L.add(x, L.linear(L.silu_mul(L.linear(L.rms_norm(x, w.ln2), w.w_gate_up)), w.w_down))
        last = x[t.gen_rows]
        return L.linear(L.rms_norm(last, self.emb.final_norm), self.emb.lm_head)

    @staticmethod
    def _prefill_attention(plan: BatchPlan, t: PlanTensors, q, k, v, k_pool, v_pool) -> list:
        """The prefill chunks' K/V written and their attention outputs (one layer): one write and one variable-length
        call for them all (``t.chunks``), or per chunk a write and a causal SDPA call."""
        if t.chunks is not None:
            n = t.chunks.write_rows.shape[0]
            L.kv_write_rows(k_pool, v_pool, t.chunks.write_rows, k[:n], v[:n])
            return [L.prefill_attention_varlen(q[:n], k_pool, v_pool, t.chunks)]
        outs, row = [], 0
        for start, m, c in plan.prefills:
            L.kv_write(k_pool, start + m, k[row:row + c])
            L.kv_write(v_pool, start + m, v[row:row + c])
            end = start + m + c
            outs.append(L.prefill_attention(q[row:row + c], k_pool[start:end], v_pool[start:end]))
            row += c
        return outs

    @staticmethod
    def _decode_attention(plan: BatchPlan, t: PlanTensors, q, k, v, k_pool, v_pool) -> list:
        """The decodes' K/V written (one row each) and their attention outputs (one layer; ``q``, ``k``, ``v``: the
        decodes' rows): one variable-length call for them all (``t.ragged``), or one padded call per decode group."""
        if not plan.decodes:
            return []
        L.kv_write_rows(k_pool, v_pool, t.write_rows, k, v)
        if t.ragged is not None:
            return [L.decode_attention_varlen(q, k_pool, v_pool, t.ragged)]
        outs, row = [], 0
        for size, index, valid in zip(plan.decode_groups, t.index, t.valid):
            outs.append(L.decode_attention(q[row:row + size], k_pool, v_pool, index, valid))
            row += size
        return outs


def prompt_tokens(request_id: int, length: int, vocab: int, seed: int = 0) -> list[int]:
    """The random prompt of a request (a fixed function of its id and the seed)."""
    rng = np.random.default_rng([seed, request_id])
    return rng.integers(0, vocab, length).tolist()


class Executor:
    """Runs a Schedule's batches on a ``Transformer``; ``tokens[id]`` holds prompt + generated tokens.

    A batch's decodes run longest cache first, in groups of at most ``decode_padding`` times their keys
    (``layers.decode_groups``; ``inf``: one padded call per batch, as before 2026-11-29), or with ``decode_kernel``
    "varlen" all in one variable-length call over unpadded keys (``layers.decode_attention_varlen``). Its prefill
    chunks run one causal SDPA call each, or with ``prefill_kernel`` "varlen" all in one variable-length call
    (``layers.prefill_attention_varlen``)."""

    def __init__(self, model: Transformer, schedule: Schedule, seed: int = 0, keep_logits: bool = False,
                 decode_padding: float = L.DECODE_PADDING, decode_kernel: str = "sdpa", prefill_kernel: str = "sdpa"):
        self.model, self.schedule, self.decode_padding = model, schedule, decode_padding
        self.decode_kernel, self.prefill_kernel = decode_kernel, prefill_kernel
        self.pool = TokenPool(model.k_pool.shape[1])
        self.tokens = {r.id: prompt_tokens(r.id, r.prompt_tokens, model.s.vocab, seed) for r in schedule.requests}
        self.peak = {r.id: r.peak_kv_tokens for r in schedule.requests}
        self.slot: dict[int, int] = {}
        self.logits: dict[int, list] | None = {r.id: [] for r in schedule.requests} if keep_logits else None

    def _drop(self, rid: int) -> None:
        self.pool.release(self.slot.pop(rid), self.peak[rid])

    def plan(self, items: list[tuple[int, int]], before: dict[int, tuple[int, int]]) -> BatchPlan:
        """Lay out ``items`` given each one's ``(m, Icur)`` before the batch; allocates starting caches."""
        plan, decodes = BatchPlan(), []
        for rid, c in items:
            m, icur = before[rid]
            if m == 0:
                self.slot[rid] = self.pool.alloc(self.peak[rid])
            if m < icur:
                plan.prefills.append((self.slot[rid], m, c))
                plan.ids += self.tokens[rid][m:m + c]
                plan.positions += range(m, m + c)
                if m + c == icur:
                    plan.gen_rows.append(len(plan.ids) - 1)
                    plan.gen_ids.append(rid)
            else:
                if m != len(self.tokens[rid]) - 1:
                    raise AssertionError(f"request {rid}: decode at m={m} but {len(self.tokens[rid])} tokens known")
                decodes.append(rid)
        decodes.sort(key=lambda rid: -before[rid][0])  # longest cache first (stable: ties keep the batch's order)
        for rid in decodes:
            m = before[rid][0]
            plan.decodes.append((self.slot[rid], m))
            plan.gen_rows.append(len(plan.ids))
            plan.gen_ids.append(rid)
            plan.ids.append(self.tokens[rid][m])
            plan.positions.append(m)
        plan.decode_kernel, plan.prefill_kernel = self.decode_kernel, self.prefill_kernel
        if self.decode_kernel == "varlen":
            plan.decode_groups = [len(plan.decodes)] if plan.decodes else []
        else:
            plan.decode_groups = L.decode_groups([m + 1 for _, m in plan.decodes], self.decode_padding)
        return plan

    def run(self, cost_model: CostModel, batches: int | None = None, progress=None,
            graphs: "BatchGraphs | None" = None):
        """Execute the first ``batches`` batches (all by default); returns (measured seconds, recorder).

        With ``graphs`` capturing, each batch also is captured into a CUDA graph after it ran; with ``graphs``
        replaying, each batch is its graph's replay (the timed pass of ``gpu_replay(cuda_graphs=True)``)."""
        rec = Recorder(cost_model)
        rp = Replayer(self.schedule.requests, self.schedule.limits, rec)
        watch = Stopwatch(self.model.device)
        measured = []
        with torch.inference_mode():
            for batch in self.schedule.batches[:batches]:
                before = {rid: (rp.states[rid].m, rp.states[rid].input_tokens) for rid, _ in batch.items}
                finished = rp.apply(batch)
                for rid in batch.evict:
                    self._drop(rid)
                plan = self.plan(batch.items, before)
                if graphs is not None and not graphs.capturing:
                    logits, picks = None, graphs.replay(plan, watch)
                else:
                    watch.start()
                    logits = self.model.forward(plan)
                    picks = logits.argmax(-1)
                    watch.stop()
                    if graphs is not None:
                        graphs.capture(self.model, plan)
                measured.append(watch.elapsed_ms() / 1e3)
                for rid, token in zip(plan.gen_ids, picks.tolist()):
                    self.tokens[rid].append(token)
                if self.logits is not None and logits is not None:
                    for rid, row in zip(plan.gen_ids, logits.float().cpu()):
                        self.logits[rid].append(row)
                for s in finished:
                    self._drop(s.id)
                if progress is not None:
                    progress()
        return measured, rec


class BatchGraphs:
    """One CUDA graph per batch of a schedule: captured in order during the warm-up pass (``capturing``), each right
    after its batch ran eagerly (so kernels have chosen and planned for its shapes), then replayed in the same order
    in the timed pass. A replay is one launch: its time is the GPU's work without the host's launch gaps, what a
    server that captures whole batches pays (vLLM captures its decode batches). The graphs share one memory pool,
    which is safe because they are replayed in their capture order, one at a time. The replayed batch must be laid out
    as the captured one (same pool rows, chunks and decodes); the values of its index tensors are copied into the
    graph's fixed tensors before the timed replay."""

    def __init__(self):
        self.pool = self._new_pool()
        self.capturing = True
        self._graphs: list[tuple] = []  # (graph, fixed PlanTensors, picks tensor, layout) per batch
        self._next = 0
        self._model: "Transformer | None" = None  # the captured one (lays out the replayed batches' tensors)

    @staticmethod
    def _new_pool():
        return torch.cuda.graph_pool_handle()

    @staticmethod
    def _layout(plan: BatchPlan) -> tuple:
        return (tuple(plan.prefills), tuple(plan.decodes), tuple(plan.decode_groups), plan.decode_kernel,
                plan.prefill_kernel, len(plan.ids), tuple(plan.gen_rows))

    def capture(self, model: "Transformer", plan: BatchPlan) -> None:
        fixed = model.tensors(plan, model.device)
        self._model = model
        graph, picks = self._record(lambda: model.forward(plan, fixed).argmax(-1))
        self._graphs.append((graph, fixed, picks, self._layout(plan)))

    def _record(self, fn):
        """``(graph, fn's result)``: ``fn`` captured into a CUDA graph."""
        try:
            return capture(fn, self.pool)
        except RuntimeError as exc:  # an operator that cannot be captured: say which batch, stop cleanly
            raise ValueError(f"--cuda-graphs: batch {len(self._graphs)} could not be captured in a CUDA graph "
                             f"({str(exc).splitlines()[0][:300]}); replay without --cuda-graphs") from exc

    def replay(self, plan: BatchPlan, watch: Stopwatch):
        """Copy ``plan``'s index values in, then time one replay of its batch's graph; returns the picks tensor."""
        if self._next >= len(self._graphs):
            raise RuntimeError(f"no graph captured for batch {self._next}")
        graph, fixed, picks, layout = self._graphs[self._next]
        if self._layout(plan) != layout:
            raise RuntimeError(f"batch {self._next} is laid out differently from when it was captured")
        self._next += 1
        fixed.copy_from(self._model.tensors(plan, "cpu"))
        watch.start()
        graph.replay()
        watch.stop()
        return picks


class EagerGraph:
    """Stands in for a CUDA graph: a replay reruns the recorded closure into its fixed output tensor."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


class EagerBatchGraphs(BatchGraphs):
    """``BatchGraphs``' bookkeeping (capture order, fixed index tensors filled before each replay, layout check) with
    each graph an ``EagerGraph``: the graph path where there are no CUDA graphs (a CPU: the tests, benchmarks' smoke
    runs). Its times are eager times."""

    @staticmethod
    def _new_pool():
        return None

    def _record(self, fn):
        out = fn()
        return EagerGraph(fn, out), out


def pool_rows_for(schedule: Schedule, shapes: L.Shapes, device, dtype, memory_fraction: float = 0.85) -> int:
    """KV pool rows: every request's peak at once if that fits, else what ``memory_fraction`` of the
    device's free memory holds (CUDA; a CPU gets the sum of peaks)."""
    need = sum(r.peak_kv_tokens for r in schedule.requests)
    if torch.device(device).type != "cuda":
        return need
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    row_bytes = 2 * shapes.num_layers * shapes.kv_dim * torch.tensor([], dtype=dtype).element_size()
    return max(1, min(need, int(free * memory_fraction) // row_bytes))


def check_positions(schedule: Schedule, shapes: L.Shapes) -> None:
    """Refuse a schedule with a request whose tokens reach past the model's positions (its rotary table).

    A request's last fed token sits at position ``I + O − 2``, so its ``I + O − 1`` KV rows must fit in
    ``max_position``; a server with that context length would refuse the request. Checked before any GPU work:
    on a GPU the out-of-range index is a device-side assert that reaches the user as an unrelated kernel error.
    """
    too_long = [r for r in schedule.requests if r.peak_kv_tokens > shapes.max_position]
    if too_long:
        worst = max(too_long, key=lambda r: r.peak_kv_tokens)
        raise ValueError(f"{len(too_long)} of {len(schedule.requests)} requests need more than {shapes.name}'s "
                         f"{shapes.max_position} positions (request {worst.id}: I + O - 1 = {worst.peak_kv_tokens}); "
                         f"drop them from the workload or replay with a model of a longer context")


def gpu_replay(schedule: Schedule, model: str, cost_model: CostModel, device: str | None = None, dtype: str = "bf16",
               tiny: bool = False, warmup_batches: int | None = None, seed: int = 0,
               progress: bool = True, cuda_graphs: bool = False,
               decode_padding: float = L.DECODE_PADDING, decode_kernel: str = "sdpa",
               prefill_kernel: str = "sdpa") -> ReplayCheck:
    """Execute ``schedule`` with ``model`` (random weights) on ``device``; compare with ``cost_model``.

    The first ``warmup_batches`` batches (by default all of them) run once untimed, then the whole schedule runs
    from a fresh cache and every batch is timed. The default warm-up is the whole schedule because kernels may
    build a plan the first time a process meets a shape: on an H200 (2026-11-27, PyTorch 2.11) SDPA chose cuDNN's
    attention, and a 64-sequence Llama-3-8B decode batch took about 100 ms the first time its shape ran against
    29 ms after. A replay meets new attention shapes at up to two thirds of its batches (Sarathi's chunks), the
    operator profile's warm-up runs hide the cost, and a serving engine's paged kernels never pay it, so timing
    it would charge the cost model for a one-off of this replayer (``benchmarks/gpu_replay_shapes.py``).

    ``cuda_graphs``: every batch is captured in the warm-up pass and the timed pass replays the graphs
    (``BatchGraphs``), so each batch's time is its GPU work without launch gaps; needs CUDA and the full warm-up.

    ``decode_padding``: the most padding a decode attention call may carry (``layers.decode_groups``); ``inf``
    runs each batch's decodes as one padded call, as replays did until 2026-11-29.

    ``decode_kernel``: "sdpa" (those groups) or "varlen", one variable-length FlashAttention call per batch over
    every decode's own keys (``layers.decode_attention_varlen``; ``decode_padding`` then has nothing to bound). On an
    H200 (2026-11-30, CUDA graphs) each decode group beyond the first cost a batch 0.7 to 1.2 ms more than its keys
    (``benchmarks/gpu_replay_padding.py --groups``); a paged-attention server makes one call. Replay with the kernel
    the profile was measured with (``profile.json``'s ``decode_kernel``), so that the cost model was fitted on the
    calls the replay makes.

    ``prefill_kernel``: "sdpa" (one causal SDPA call per chunk, and a K/V write per chunk) or "varlen", one causal
    variable-length FlashAttention call and one K/V write for every chunk of a batch
    (``layers.prefill_attention_varlen``), as a serving engine makes them. On an H200 (2026-11-30) a batch of eight
    64-token prompts took 16 to 23% longer than its per-chunk operators predicted (eight 512-token prompts: within 3%).
    The same rule: replay with the profile's ``prefill_kernel``.
    """
    from .runner import _progress, device_name, resolve_device

    if dtype not in L.DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(L.DTYPES)}")
    if not decode_padding >= 1:
        raise ValueError(f"--decode-padding must be at least 1 (inf: one padded call per batch), got {decode_padding}")
    for j, batch in enumerate(schedule.batches):
        if batch.swap_out or batch.swap_in or batch.hidden:
            raise ValueError(f"batch {j} swaps KV or holds a hidden-form cache; gpu-replay executes KV-form caches "
                             f"without host swapping only")
    shapes = L.shard_shapes(model, 1, tiny)
    check_positions(schedule, shapes)
    device = resolve_device(device)
    L.check_decode_kernel(decode_kernel, device)
    L.check_prefill_kernel(prefill_kernel, device)
    graphs = None
    if cuda_graphs:
        require_graphs_device(device)
        if warmup_batches is not None and warmup_batches < len(schedule.batches):
            raise ValueError("--cuda-graphs captures every batch in the warm-up pass: leave --warmup at its default")
        graphs, warmup_batches = BatchGraphs(), None
    net = Transformer(shapes, device, L.DTYPES[dtype], pool_rows_for(schedule, shapes, device, L.DTYPES[dtype]), seed)
    kernels = dict(decode_padding=decode_padding, decode_kernel=decode_kernel, prefill_kernel=prefill_kernel)
    if warmup_batches is None or warmup_batches > 0:
        Executor(net, schedule, seed, **kernels).run(cost_model, batches=warmup_batches, graphs=graphs)
    if graphs is not None:
        graphs.capturing = False
    with _progress(progress, len(schedule.batches), f"replaying {len(schedule.batches)} batches on {device}") as advance:
        measured, rec = Executor(net, schedule, seed, **kernels).run(cost_model, progress=advance, graphs=graphs)
    info = {"model": shapes.name, "device": device_name(device), "dtype": dtype, "torch": torch.__version__,
            "scheduler": schedule.meta.get("scheduler"), "requests": len(schedule.requests),
            "warmup_batches": len(schedule.batches) if warmup_batches is None else warmup_batches,
            "cuda_graphs": cuda_graphs, "decode_kernel": decode_kernel, "prefill_kernel": prefill_kernel,
            "decode_padding": None if math.isinf(decode_padding) or decode_kernel == "varlen" else decode_padding}
    return compare(schedule, cost_model, measured, rec, info)
