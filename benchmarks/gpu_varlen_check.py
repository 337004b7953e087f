"""Does the "varlen" decode kernel work on this machine? (issue 20; gpu_session.sh runs it before a DECODE_KERNEL=varlen
pass, so that a PyTorch whose variable-length attention fails costs one probe, not the pass.)

Checks, at Llama-3-8B's heads (32 query, 8 KV, 128 wide), on one decode batch of widely spread lengths, that
``layers.decode_attention_varlen`` gives what the masked, padded SDPA call gives, and on CUDA that it can be captured
in a CUDA graph and replayed to the same result. Exits 0 and prints one line when it works, 1 with the reason when
not.

    python benchmarks/gpu_varlen_check.py                  (CUDA, bf16)
    python benchmarks/gpu_varlen_check.py --device cpu     (the CPU stand-in, fp32)
"""

from __future__ import annotations

import argparse
import sys

from infermax.profiling import layers as L

torch = L.torch


def check(device: str) -> str:
    cuda = torch.device(device).type == "cuda"
    dtype, tol = (torch.bfloat16, 2e-2) if cuda else (torch.float32, 1e-5)
    L.check_decode_kernel("varlen", device)
    gen = torch.Generator(device=device).manual_seed(0)
    lengths, starts = [3000, 420, 37, 1], [0, 3010, 3440, 3480]
    rows = starts[-1] + lengths[-1]
    k_pool, v_pool = (torch.randn(rows, 8, 128, device=device, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(len(lengths), 32, 128, device=device, generator=gen).to(dtype)
    keys = L.ragged_keys(starts, lengths, 4, device)
    index, valid = L.decode_index(starts, lengths, device)
    ragged = L.decode_attention_varlen(q, k_pool, v_pool, keys).float()
    padded = L.decode_attention(q, k_pool, v_pool, index, valid).float()
    worst = (ragged - padded).abs().max().item()
    if not torch.allclose(ragged, padded, atol=tol, rtol=tol):
        raise AssertionError(f"varlen decode attention differs from the padded call by up to {worst:.3g}")
    if not cuda:
        return f"varlen decode attention (CPU stand-in) matches the padded call (max difference {worst:.3g})"
    from infermax.profiling.timer import capture

    graph, out = capture(lambda: L.decode_attention_varlen(q, k_pool, v_pool, keys))
    graph.replay()
    torch.cuda.synchronize()
    if not torch.equal(out.float(), ragged):
        raise AssertionError("varlen decode attention replayed from a CUDA graph differs from the eager call")
    return (f"varlen decode attention works on {torch.cuda.get_device_name()} (max difference from the padded call "
            f"{worst:.3g}), and replays from a CUDA graph")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    try:
        with torch.inference_mode():
            print(check(args.device))
    except Exception as exc:  # any failure means: do not use the kernel on this machine (the reason is printed)
        print(f"varlen decode attention does not work here: {type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
