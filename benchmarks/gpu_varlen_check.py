"""Does a "varlen" attention kernel work on this machine? (issue 20; gpu_session.sh runs it before a pass with
DECODE_KERNEL=varlen or PREFILL_KERNEL=varlen, so that a PyTorch whose variable-length attention fails costs one
probe, not the pass.)

At Llama-3-8B's heads (32 query, 8 KV, 128 wide), ``--phase decode`` checks that ``layers.decode_attention_varlen``
gives what the masked, padded SDPA call gives on one decode batch of widely spread lengths; ``--phase prefill`` that
``layers.prefill_attention_varlen`` gives, for chunks with and without cached context (so a causal mask aligned to the
upper left, not the lower right, fails it), what one causal SDPA call per chunk gives. On CUDA it also checks that the
call can be captured in a CUDA graph and replayed to the same result. Exits 0 and prints one line when it works, 1
with the reason when not.

    python benchmarks/gpu_varlen_check.py [--phase decode|prefill]             (CUDA, bf16)
    python benchmarks/gpu_varlen_check.py --device cpu [--phase ...]           (the CPU stand-in, fp32)
"""

from __future__ import annotations

import argparse
import sys

from infermax.profiling import layers as L

torch = L.torch


def _decode_case(device, dtype, gen):
    """(varlen call, SDPA result) for one decode batch."""
    lengths, starts = [3000, 420, 37, 1], [0, 3010, 3440, 3480]
    rows = starts[-1] + lengths[-1]
    k_pool, v_pool = (torch.randn(rows, 8, 128, device=device, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(len(lengths), 32, 128, device=device, generator=gen).to(dtype)
    keys = L.ragged_keys(starts, lengths, 4, device)
    index, valid = L.decode_index(starts, lengths, device)
    return (lambda: L.decode_attention_varlen(q, k_pool, v_pool, keys)), L.decode_attention(q, k_pool, v_pool, index,
                                                                                             valid)


def _prefill_case(device, dtype, gen):
    """(varlen call, SDPA result) for one batch of prefill chunks: (pool start, cached tokens m, chunk c)."""
    prefills = [(0, 0, 512), (600, 1500, 300), (2500, 37, 1), (2600, 0, 3)]
    rows = 2700
    k_pool, v_pool = (torch.randn(rows, 8, 128, device=device, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(sum(c for _, _, c in prefills), 32, 128, device=device, generator=gen).to(dtype)
    chunks = L.ragged_chunks(prefills, device)
    outs, row = [], 0
    for start, m, c in prefills:
        end = start + m + c
        outs.append(L.prefill_attention(q[row:row + c], k_pool[start:end], v_pool[start:end]))
        row += c
    return (lambda: L.prefill_attention_varlen(q, k_pool, v_pool, chunks)), torch.cat(outs)


def check(device: str, phase: str = "decode") -> str:
    cuda = torch.device(device).type == "cuda"
    dtype, tol = (torch.bfloat16, 2e-2) if cuda else (torch.float32, 1e-5)
    (L.check_decode_kernel if phase == "decode" else L.check_prefill_kernel)("varlen", device)
    gen = torch.Generator(device=device).manual_seed(0)
    call, reference = (_decode_case if phase == "decode" else _prefill_case)(device, dtype, gen)
    ragged, reference = call().float(), reference.float()
    worst = (ragged - reference).abs().max().item()
    if not torch.allclose(ragged, reference, atol=tol, rtol=tol):
        raise AssertionError(f"varlen {phase} attention differs from the SDPA calls by up to {worst:.3g}")
    if not cuda:
        return f"varlen {phase} attention (CPU stand-in) matches the SDPA calls (max difference {worst:.3g})"
    from infermax.profiling.timer import capture

    graph, out = capture(call)
    graph.replay()
    torch.cuda.synchronize()
    if not torch.equal(out.float(), ragged):
        raise AssertionError(f"varlen {phase} attention replayed from a CUDA graph differs from the eager call")
    return (f"varlen {phase} attention works on {torch.cuda.get_device_name()} (max difference from the SDPA calls "
            f"{worst:.3g}), and replays from a CUDA graph")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--phase", default="decode", choices=("decode", "prefill"))
    args = ap.parse_args()
    try:
        with torch.inference_mode():
            print(check(args.device, args.phase))
    except Exception as exc:  # any failure means: do not use the kernel on this machine (the reason is printed)
        print(f"varlen {args.phase} attention does not work here: {type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
