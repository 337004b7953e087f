"""Model and GPU specifications, and the KV-cache capacity ``M`` they imply.

A :class:`ModelSpec` holds the transformer shapes needed to size weights and the
KV cache; a :class:`GPUSpec` holds memory size and datasheet peaks. Both have a
registry (``MODELS``, ``GPUS``) with case-insensitive lookup. Tensor parallelism
(``tp``) is modelled as an even split of weights and KV heads over ``tp`` GPUs;
all byte counts are per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import floor
from numbers import Integral, Real

GiB = 1 << 30


def _check_tp(tp: int, num_kv_heads: int, model: str) -> int:
    """``tp`` as a plain int (numpy's accepted: a results table's np.int64 had been refused), if it is a positive
    integer that divides the model's KV heads."""
    if isinstance(tp, bool) or not isinstance(tp, Integral) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    if num_kv_heads % tp:
        raise ValueError(f"tp={tp} does not divide num_kv_heads={num_kv_heads} of model {model!r}")
    return int(tp)


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a decoder-only transformer.

    ``gated_mlp``: Llama-style gate+up+down projections (3 matrices) instead of
    OPT-style fc1+fc2 (2). ``learned_positions``: OPT-style learned positional
    embedding table of ``max_position`` rows (Llama uses rotary, no weights).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    dtype_bytes: int = 2
    gated_mlp: bool = True
    tied_embeddings: bool = False
    max_position: int = 4096
    learned_positions: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"model {self.name!r}: {f.name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model {self.name!r}: hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model {self.name!r}: num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head."""
        return self.hidden_size // self.num_heads

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes of K and V cached per token on each of ``tp`` GPUs."""
        tp = _check_tp(tp, self.num_kv_heads, self.name)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes // tp

    @property
    def num_params(self) -> int:
        """Parameter count from the shapes: embeddings, LM head, attention and MLP matrices.

        Norm weights and linear biases are left out (under 0.1% for every registered model).
        """
        h, kv_dim = self.hidden_size, self.num_kv_heads * self.head_dim
        embed = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        if self.learned_positions:
            embed += self.max_position * h
        attention = 2 * h * h + 2 * h * kv_dim  # q, o and k, v
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_size
        return embed + self.num_layers * (attention + mlp)

    def weight_bytes(self, tp: int = 1) -> int:
        """Bytes of weights on each of ``tp`` GPUs (weights split evenly)."""
        tp = _check_tp(tp, self.num_kv_heads, self.name)
        return -(-self.num_params * self.dtype_bytes // tp)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
           vocab: int = 32000, max_position: int = 4096) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, ffn, vocab, max_position=max_position)


def _opt(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, ffn, vocab_size=50272, gated_mlp=False,
                     tied_embeddings=True, max_position=2048, learned_positions=True)


# Shapes from the models' Hugging Face config.json files. OPT's position table
# really has max_position + 2 rows (an offset of 2); the 2 rows are ignored here.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008),
        _llama("llama-2-13b", 40, 5120, 40, 40, 13824),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672),
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, vocab=128256, max_position=8192),
        _llama("codellama-34b", 48, 8192, 64, 8, 22016, max_position=16384),
        _opt("opt-13b", 40, 5120, 40, 20480),
        _opt("opt-30b", 48, 7168, 56, 28672),
        _opt("opt-66b", 64, 9216, 72, 36864),
    ]
}
DEFAULT_MODEL = "llama-2-7b"


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: memory capacity, dense FP16/BF16 tensor-core peak, memory bandwidth and the
    per-direction bandwidth of its host link (PCIe), which bounds KV swapping."""

    name: str
    memory_bytes: int
    peak_fp16_tflops: float
    memory_bandwidth_gbps: float  # GB/s (10^9 bytes per second)
    host_link_gbps: float = 32.0  # GB/s per direction; PCIe 4.0 x16

    def __post_init__(self) -> None:
        for f in ("memory_bytes", "peak_fp16_tflops", "memory_bandwidth_gbps", "host_link_gbps"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"gpu {self.name!r}: {f} must be positive, got {value!r}")


# Numbers from NVIDIA's datasheets (A100: "NVIDIA A100 Tensor Core GPU" datasheet,
# SXM variants; H100 and H200: the "NVIDIA H100/H200 Tensor Core GPU" datasheets,
# SXM variants). TFLOPs are dense FP16/BF16 tensor-core peaks (without sparsity).
# "80GB" parts expose 80 GiB to CUDA; the H200's 141 GB is taken as 141e9 bytes. Host link: PCIe 4.0
# x16 (A100, 32 GB/s per direction) and PCIe 5.0 x16 (H100/H200, 64 GB/s per direction).
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("a100", 80 * GiB, 312.0, 2039.0),
        GPUSpec("a100-40gb", 40 * GiB, 312.0, 1555.0),
        GPUSpec("h100", 80 * GiB, 989.0, 3350.0, 64.0),
        GPUSpec("h200", 141 * 10**9, 989.0, 4800.0, 64.0),
    ]
}
DEFAULT_GPU = "a100"


def gpu_named_in(device_name: str, keys) -> str | None:
    """The key of ``keys`` (short GPU names such as ``a100-40gb``) that names ``device_name`` (a device's name, e.g.
    "NVIDIA A100-SXM4-40GB"): every part of the key between hyphens is in the name, and the longest such key wins
    ("a100-40gb" before "a100", "l40s" before "l4"); None when none does."""
    lowered = device_name.lower()
    matches = [key for key in keys if all(part in lowered for part in key.split("-"))]
    return max(matches, key=len) if matches else None


def _lookup(kind: str, registry: dict, name: str):
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in registry:
        raise ValueError(f"unknown {kind} {name!r}; available: {', '.join(sorted(registry))}")
    return registry[key]


def get_model(name: str | ModelSpec) -> ModelSpec:
    """Registered model by name (case-insensitive); a ModelSpec is returned as is."""
    return name if isinstance(name, ModelSpec) else _lookup("model", MODELS, name)


GPU_SPEC_KEY = "gpu_spec"  # where a fitted profile's profile.json keeps the spec of an unregistered GPU
GPU_SPEC_FIELDS = ("memory_gib", "peak_fp16_tflops", "memory_bandwidth_gbps", "host_link_gbps")


def gpu_spec_from_dict(doc: dict, name: str | None = None, source: str = "gpu spec") -> GPUSpec:
    """A GPUSpec from plain data: ``name`` (or the argument), ``memory_gib`` (or ``memory_bytes``),
    ``peak_fp16_tflops``, ``memory_bandwidth_gbps`` (GB/s) and optionally ``host_link_gbps`` (default PCIe 4.0 x16)."""
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: must be an object of {', '.join(('name',) + GPU_SPEC_FIELDS)}")
    known = {"name", "memory_bytes", *GPU_SPEC_FIELDS}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    name = (name or doc.get("name") or "").strip().lower()
    if not name:
        raise ValueError(f"{source}: needs a GPU name")
    if ("memory_gib" in doc) == ("memory_bytes" in doc):
        raise ValueError(f"{source}: give exactly one of memory_gib, memory_bytes")
    missing = [k for k in ("peak_fp16_tflops", "memory_bandwidth_gbps") if k not in doc]
    if missing:
        raise ValueError(f"{source}: missing key(s) {', '.join(missing)}")
    memory = doc["memory_bytes"] if "memory_bytes" in doc else doc["memory_gib"] * GiB
    if isinstance(memory, (int, float)) and not isinstance(memory, bool):
        memory = int(memory)
    try:
        return GPUSpec(name, memory, doc["peak_fp16_tflops"], doc["memory_bandwidth_gbps"],
                       doc.get("host_link_gbps", GPUSpec.host_link_gbps))
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def gpu_spec_to_dict(gpu: GPUSpec) -> dict:
    """The plain-data form ``gpu_spec_from_dict`` reads (memory in bytes, exact)."""
    return {"name": gpu.name, "memory_bytes": gpu.memory_bytes, "peak_fp16_tflops": gpu.peak_fp16_tflops,
            "memory_bandwidth_gbps": gpu.memory_bandwidth_gbps, "host_link_gbps": gpu.host_link_gbps}


def saved_gpus() -> dict[str, GPUSpec]:
    """Specs of unregistered GPUs saved with fitted profiles (``profiles/<gpu>/<model>/tp<N>/profile.json``,
    key ``gpu_spec``; written by ``infermax fit --gpu-spec``). The first profile of a GPU (sorted) is used."""
    from .jsonio import read_json

    from .costmodel import profiles_dir

    found: dict[str, GPUSpec] = {}
    for path in sorted(profiles_dir().glob("*/*/tp*/profile.json")):
        gpu = path.parent.parent.parent.name.lower()
        if gpu in GPUS or gpu in found:
            continue
        try:
            doc = read_json(path)
        except (OSError, ValueError):  # (not UTF-8, not JSON: that profile names no GPU)
            continue
        if isinstance(doc, dict) and GPU_SPEC_KEY in doc:
            found[gpu] = gpu_spec_from_dict(doc[GPU_SPEC_KEY], gpu, f"{path}: {GPU_SPEC_KEY}")
    return found


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Registered GPU by name (case-insensitive), else one whose spec was saved with a fitted profile
    (``saved_gpus``); a GPUSpec is returned as is."""
    if isinstance(name, GPUSpec):
        return name
    key = name.strip().lower() if isinstance(name, str) else name
    if key in GPUS:
        return GPUS[key]
    known = {**GPUS, **saved_gpus()}
    if key not in known:
        raise ValueError(f"unknown gpu {name!r}; available: {', '.join(sorted(known))} (another GPU: save its figures "
                         f"with a fitted profile, infermax fit --gpu-spec)")
    return known[key]


def kv_capacity_tokens(model: str | ModelSpec, gpu: str | GPUSpec,
                       gpu_memory_utilization: float = 0.9, tp: int = 1) -> int:
    """KV-cache capacity ``M`` in tokens: ``floor((memory * util - weights) / kv_bytes_per_token)``.

    The InferMax paper's formula (section 2.2), per GPU under ``tp``-way tensor parallelism.
    Activations and other runtime buffers are not subtracted.
    """
    model, gpu = get_model(model), get_gpu(gpu)
    if isinstance(gpu_memory_utilization, bool) or not isinstance(gpu_memory_utilization, Real) \
            or not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    gpu_memory_utilization = float(gpu_memory_utilization)  # (np.float32 arithmetic had given another M)
    available_bytes = gpu.memory_bytes * gpu_memory_utilization
    weight_bytes, kv_bytes = model.weight_bytes(tp), model.kv_bytes_per_token(tp)
    tokens = floor((available_bytes - weight_bytes) / kv_bytes)
    if tokens < 1:
        raise ValueError(
            f"model {model.name!r} does not fit on gpu {gpu.name!r} with tp={tp}: weights need "
            f"{weight_bytes / GiB:.2f} GiB per GPU, {available_bytes / GiB:.2f} GiB available "
            f"({gpu_memory_utilization:.0%} of {gpu.memory_bytes / GiB:.2f} GiB), "
            f"leaving no room for one token's KV ({kv_bytes} bytes)"
        )
    return tokens
