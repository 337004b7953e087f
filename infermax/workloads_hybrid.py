"""Hybrid real-time / best-effort workloads (BROS's evaluation, specs/bros.md §5).

- RT: Poisson arrivals at ``rt_rate`` req/s over ``duration_s`` seconds, prompt and output lengths
  lognormal with the mean and standard deviation of the paper's Table 2 (``RT_DATASETS``; these
  are matched moments, not the datasets), rounded and clipped to ``[1, RT_MAX_TOKENS]``; TTFT and
  TPOT targets (paper: 0.4 s / 0.2 s); class ``"rt"``.
- BE: closed-loop batches of ``be_batch`` requests (``closed_loop_group`` k = batch k), prompts
  uniform on 512..1024 and outputs on 32..128 (FlexGen's ranges, as the paper); class ``"be"``.
  Batch 0 arrives at 0; batch k+1 is submitted when batch k has finished (the engine does this);
  ``be_groups`` batches are generated, and pass ``closed_loop_until_s=duration_s`` to `simulate` so
  that no batch is submitted after the RT trace ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .request import Request


@dataclass(frozen=True)
class LengthMoments:
    """Mean and standard deviation of prompt and output lengths (tokens)."""

    prompt_mean: float
    prompt_std: float
    output_mean: float
    output_std: float


# BROS Table 2 (tokens).
RT_DATASETS: dict[str, LengthMoments] = {
    "sharegpt": LengthMoments(222.76, 256.36, 234.51, 268.50),
    "lmsys": LengthMoments(90.50, 148.52, 237.04, 228.21),
}
RT_MAX_TOKENS = 2048
BE_PROMPT = (512, 1024)
BE_OUTPUT = (32, 128)


def lognormal_lengths(rng: np.random.Generator, mean: float, std: float, n: int,
                      max_tokens: int = RT_MAX_TOKENS) -> np.ndarray:
    """``n`` lengths from the lognormal with this mean and std, rounded and clipped to ``[1, max_tokens]``."""
    sigma2 = math.log1p((std / mean) ** 2)
    mu = math.log(mean) - sigma2 / 2
    return np.clip(np.rint(rng.lognormal(mu, math.sqrt(sigma2), n)), 1, max_tokens).astype(np.int64)


def hybrid(rt_dataset: str, rt_rate: float, duration_s: float, be_batch: int, be_groups: int | None = None,
           seed: int = 0, ttft_slo_s: float = 0.4, tpot_slo_s: float = 0.2) -> list[Request]:
    """RT Poisson stream plus closed-loop BE batches (module docstring); ids: RT first, then BE.

    ``be_groups`` defaults to ``ceil(duration_s) + 1`` batches (more than can run in the trace: a batch
    of hundreds of 512..1024-token prompts takes longer than a second on any profiled GPU)."""
    moments = RT_DATASETS.get(str(rt_dataset).lower())
    if moments is None:
        raise ValueError(f"unknown RT dataset {rt_dataset!r}; known: {', '.join(RT_DATASETS)}")
    for name, value in (("rt_rate", rt_rate), ("duration_s", duration_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if isinstance(be_batch, bool) or not isinstance(be_batch, int) or be_batch < 0:
        raise ValueError(f"be_batch must be an integer >= 0, got {be_batch!r}")
    groups = math.ceil(duration_s) + 1 if be_groups is None else be_groups
    rng = np.random.default_rng(seed)
    arrivals = []
    t = 0.0
    while True:
        arrivals.append(t)
        t += rng.exponential(1.0 / rt_rate)
        if t >= duration_s:
            break
    n = len(arrivals)
    prompts = lognormal_lengths(rng, moments.prompt_mean, moments.prompt_std, n)
    outputs = lognormal_lengths(rng, moments.output_mean, moments.output_std, n)
    reqs = [Request(i, float(a), int(p), int(o), ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, request_class="rt")
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]
    if be_batch:
        m = be_batch * groups
        be_prompts = rng.integers(BE_PROMPT[0], BE_PROMPT[1] + 1, m)
        be_outputs = rng.integers(BE_OUTPUT[0], BE_OUTPUT[1] + 1, m)
        reqs += [Request(n + k, 0.0, int(p), int(o), request_class="be", closed_loop_group=k // be_batch)
                 for k, (p, o) in enumerate(zip(be_prompts, be_outputs))]
    return reqs
