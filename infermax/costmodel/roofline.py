"""Roofline fallback: batch time from FLOPs and bytes against a GPU's datasheet peaks, for a
GPU/model/TP with no measurements.

Per layer and GPU (weights and heads split evenly over ``tp``), each operator group takes the longer
of its compute time ``FLOPs / (peak × compute_efficiency)`` and its memory time
``bytes / (bandwidth × memory_efficiency)``; both are affine in the batch features, so the model is
a ``PiecewiseCostModel`` (family ``roofline``) and a MILP can use it like any fitted model:

* non-attention: FLOPs ``2 × matmul weights × n_tokens``; bytes: the weights once plus the
  activations each matmul, norm and add reads and writes per token.
* prefill attention (causal): FLOPs ``4 · q_dim · (Σc·m + Σc²/2)``; bytes: each prefill token's
  Q, K, V and output vectors.
* decode attention: FLOPs ``4 · q_dim`` and bytes ``2 · kv_dim · dtype`` per KV token read.
* communication (``tp > 1``): two ring all-reduces per layer, each moving ``2(tp−1)/tp ×`` the
  batch's activations (``n_tokens × hidden × dtype``) over the GPU's NVLink bandwidth per direction.

The efficiencies are a priori round numbers (not fitted to any profile): 0.7 of peak FLOP/s, 0.8 of
memory and link bandwidth. Its error against every measured profile is in ``profiles/README.md``.
"""

from __future__ import annotations

from .base import AffinePiece, CostTerm
from .piecewise import PiecewiseCostModel

COMPUTE_EFFICIENCY = 0.7
MEMORY_EFFICIENCY = 0.8
# NVLink bandwidth per direction per GPU (bytes/s): A100 SXM NVLink 3 600 GB/s and H100/H200 SXM
# NVLink 4 900 GB/s bidirectional (NVIDIA datasheets).
NVLINK_BYTES_PER_S = {"a100": 300e9, "a100-40gb": 300e9, "h100": 450e9, "h200": 450e9}


def roofline_model(gpu: str, model: str, tp: int = 1, compute_efficiency: float = COMPUTE_EFFICIENCY,
                   memory_efficiency: float = MEMORY_EFFICIENCY) -> PiecewiseCostModel:
    """The roofline cost model of registered ``model`` on registered ``gpu`` with ``tp``-way tensor parallelism."""
    from ..models import get_gpu, get_model

    spec, device = get_model(model), get_gpu(gpu)
    spec.kv_bytes_per_token(tp)  # validates tp against the KV heads
    if tp > 1 and device.name not in NVLINK_BYTES_PER_S:
        raise ValueError(f"no NVLink bandwidth known for gpu {device.name!r}; known: {', '.join(NVLINK_BYTES_PER_S)}")
    flops_s = device.peak_fp16_tflops * 1e12 * compute_efficiency
    bytes_s = device.memory_bandwidth_gbps * 1e9 * memory_efficiency
    layers, dtype, h = spec.num_layers, spec.dtype_bytes, spec.hidden_size
    q_dim, kv_dim, ffn = spec.num_heads * spec.head_dim // tp, spec.num_kv_heads * spec.head_dim // tp, spec.ffn_size // tp
    up_width = (2 if spec.gated_mlp else 1) * ffn
    weights = h * (q_dim + 2 * kv_dim) + q_dim * h + h * up_width + ffn * h
    activations = (h + q_dim + 2 * kv_dim) + (q_dim + h) + (h + up_width) + (ffn + h) + 6 * h  # matmul in/out, norms, adds
    terms = [
        CostTerm("non_attention", "n_tokens", (
            AffinePiece(0.0, {"n_tokens": layers * 2 * weights / flops_s}),
            AffinePiece(layers * weights * dtype / bytes_s, {"n_tokens": layers * activations * dtype / bytes_s}))),
        CostTerm("prefill_attention", "n_prefill_seqs", (
            AffinePiece(0.0, {"prefill_ctx_tokens": layers * 4 * q_dim / flops_s,
                              "prefill_sq_tokens": layers * 2 * q_dim / flops_s}),
            AffinePiece(0.0, {"prefill_tokens": layers * 2 * (q_dim + kv_dim) * dtype / bytes_s}))),
        CostTerm("decode_attention", "n_decode_seqs", (
            AffinePiece(0.0, {"decode_kv_tokens": layers * 2 * kv_dim * dtype / bytes_s}),
            AffinePiece(0.0, {"decode_kv_tokens": layers * 4 * q_dim / flops_s}))),
    ]
    if tp > 1:
        link_s = NVLINK_BYTES_PER_S[device.name] * memory_efficiency
        terms.append(CostTerm("communication", "n_tokens", (
            AffinePiece(0.0, {"n_tokens": layers * 2 * 2 * (tp - 1) / tp * h * dtype / link_s}),)))
    fit = {"method": "roofline: max(FLOPs / (peak x compute_efficiency), bytes / (bandwidth x memory_efficiency)) "
                     "per operator group; see infermax/costmodel/roofline.py",
           "compute_efficiency": compute_efficiency, "memory_efficiency": memory_efficiency,
           "peak_fp16_tflops": device.peak_fp16_tflops, "memory_bandwidth_gbps": device.memory_bandwidth_gbps,
           "nvlink_bytes_per_s": NVLINK_BYTES_PER_S.get(device.name)}
    return PiecewiseCostModel.from_terms(tuple(terms), family="roofline", gpu=device.name, model=spec.name, tp=tp, fit=fit)
