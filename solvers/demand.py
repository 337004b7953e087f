"""What every schedule of an instance must do, per request and in aggregate: the demand the scalable lower
bounds (`lower_bound.py`) price. ``DemandArrays`` holds one entry per request; ``Demand`` the sums (and the
maxima) over a set of requests, as the aggregate LP (`aggregate_lp.py`) reads them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from infermax.costmodel.base import CAPPED_FEATURES, PREFILL_CTX_CAPS, kv_cap
from infermax.limits import Limits
from infermax.request import Request

DECODE_KV_CAPS = tuple(kv_cap(f) for f in CAPPED_FEATURES)  # caps of the longest-read features a model may use


def _capped_read_sum(prompt: np.ndarray, decodes: np.ndarray, cap: int) -> np.ndarray:
    """Σ_{k=1}^{decodes} min(prompt + k, cap) per request (the reads below the cap, then cap per decode)."""
    below = np.clip(cap - prompt, 0, decodes)
    return below * prompt + below * (below + 1) // 2 + (decodes - below) * cap


def _block_prefix(n: np.ndarray, b: int) -> np.ndarray:
    """Σ_{x=1}^{n} ⌈x/b⌉·b (elementwise, exact integers)."""
    q, r = n // b, n % b
    return b * (b * q * (q + 1) // 2 + r * (q + 1))


@dataclass(frozen=True)
class DemandArrays:
    """Per-request components of the work every schedule must do (one entry per request).

    ``first_token_only`` restricts the work to each request's first token (the prefill of ``I`` and the
    batch that generates token 1), which bounds the time to first tokens."""

    prompt: np.ndarray          # I
    decode_items: np.ndarray    # O − 1 (0 when first_token_only)
    generated: np.ndarray       # O (1)
    prompt_sq: np.ndarray       # I²
    prompt_sq_cap: dict         # K -> min(I, K)²
    decode_read: np.ndarray     # Σ_{k=1}^{O−1} (I + k)
    decode_read_cap: dict       # K -> Σ_{k=1}^{O−1} min(I + k, K), K of the capped longest-read features
    kv_area: np.ndarray         # Σ_{j=1}^{O} blocks(I + j − 1)
    chain: np.ndarray           # ⌈I / chunk⌉ + O − 1: batches the request needs one after another
    prefill_per_batch: int      # min(C, P): prompt tokens one batch can prefill
    min_decode_read: int        # min over requests with decodes of I + 1
    min_output: int             # min O
    max_peak: int               # max I + O − 1
    min_refill: int             # min I + 1

    @classmethod
    def of(cls, requests: list[Request], limits: Limits, first_token_only: bool = False) -> "DemandArrays":
        I = np.array([r.prompt_tokens for r in requests], dtype=np.int64)
        O = np.array([r.output_tokens for r in requests], dtype=np.int64)
        if first_token_only:
            O = np.ones_like(O)
        chunk = min(limits.C, limits.prefill_budget, limits.M)
        b = limits.block_size
        dec = O - 1
        has_dec = dec > 0
        return cls(
            prompt=I, decode_items=dec, generated=O, prompt_sq=I * I,
            prompt_sq_cap={k: np.minimum(I, k) ** 2 for k in PREFILL_CTX_CAPS},
            decode_read=dec * I + dec * (dec + 1) // 2,
            decode_read_cap={k: _capped_read_sum(I, dec, k) for k in DECODE_KV_CAPS},
            kv_area=_block_prefix(I + O - 1, b) - _block_prefix(I - 1, b),
            chain=-(-I // chunk) + O - 1, prefill_per_batch=min(limits.C, limits.prefill_budget),
            min_decode_read=int((I[has_dec] + 1).min()) if has_dec.any() else 0, min_output=int(O.min()),
            max_peak=int((I + O - 1).max()),
            min_refill=int((I + 1).min()),
        )

    def __len__(self) -> int:
        return len(self.prompt)

    def subset(self, index: np.ndarray) -> "DemandArrays":
        """The arrays of the requests at ``index`` (instance-wide constants kept: they stay valid, weaker)."""
        take = {f: getattr(self, f)[index] for f in ("prompt", "decode_items", "generated", "prompt_sq", "decode_read",
                                                        "kv_area", "chain")}
        return replace(self, prompt_sq_cap={k: v[index] for k, v in self.prompt_sq_cap.items()},
                       decode_read_cap={k: v[index] for k, v in self.decode_read_cap.items()}, **take)

    def total(self) -> "Demand":
        """The demand of all requests together."""
        return self.smallest(len(self))

    def smallest(self, k: int) -> "Demand":
        """A demand no larger, component by component, than that of *any* k of the requests: each sum
        over the k smallest values, each maximum the k-th smallest value."""
        def low(a):
            return int(np.partition(a, k - 1)[:k].sum()) if k < len(a) else int(a.sum())

        def kth(a):
            return int(np.partition(a, k - 1)[k - 1])

        # The j-th last of the k requests to get its first token gets it no earlier than the batch by which the
        # k − j + 1 smallest prompts can have been prefilled, and one of the last j still needs >= (j-th
        # smallest O) − 1 more batches.
        prompts = np.cumsum(np.sort(np.partition(self.prompt, k - 1)[:k] if k < len(self) else self.prompt))
        outputs = np.sort(np.partition(self.generated, k - 1)[:k] if k < len(self) else self.generated)
        j = np.arange(1, k + 1)
        first_token_chain = int((-(-prompts[k - j] // self.prefill_per_batch) + outputs[j - 1] - 1).max())

        return Demand(requests=k, prompt_tokens=low(self.prompt), decode_items=low(self.decode_items),
                      generated=low(self.generated), prompt_sq=low(self.prompt_sq),
                      prompt_sq_cap={c: low(v) for c, v in self.prompt_sq_cap.items()},
                      decode_read=low(self.decode_read), kv_area=low(self.kv_area),
                      longest_read=kth(self.decode_read),
                      longest_read_cap={c: kth(v) for c, v in self.decode_read_cap.items()},
                      longest_chain=max(kth(self.chain), first_token_chain),
                      longest_output=kth(self.generated), min_decode_read=self.min_decode_read,
                      min_output=self.min_output,
                      max_peak=self.max_peak, min_refill=self.min_refill)


@dataclass(frozen=True)
class Demand:
    """Aggregate work of a set of requests (see `DemandArrays`)."""

    requests: int
    prompt_tokens: int
    decode_items: int
    generated: int
    prompt_sq: int
    prompt_sq_cap: dict
    decode_read: int
    kv_area: int
    longest_read: int        # one request's Σ_{k=1}^{O−1} (I + k): its decodes are in distinct batches
    longest_read_cap: dict   # K -> the same with each read capped at K
    longest_chain: int
    longest_output: int
    min_decode_read: int
    min_output: int
    max_peak: int
    min_refill: int
