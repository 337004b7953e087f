"""EcoServe's evaluation: its datasets' length statistics, its JCT SLO, and its metrics.

- :func:`ecoserve_workload`: Alpaca- and ShareGPT-like lengths with the EcoServe paper's Table 2
  statistics (log-normal, clipped to the table's min/max, medians chosen so the means match).
- :func:`slo_params` / :func:`jct_slo_s`: SLO = ``scale · (t_p + t_g · O)`` with ``t_p`` the mean
  solo-prefill time of the workload's prompts and ``t_g`` the mean solo decode-step time at the
  requests' mean context, both from the cost model (a low-load calibration, specs §6.14).
- :func:`ecoserve_metrics`: normalized latency, SLO satisfaction ratio (SSR), allocation failures,
  per-iteration KV use and forward size, and (for an EcoServe scheduler instance) the JCT
  decomposition and the scheduler's decision time.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from .costmodel.base import BatchFeatures, CostModel
from .request import Request

# name -> ((median, sigma, min, max) for prompts, (...) for outputs). Table 2 of the paper:
# Alpaca 19.31 / 9 / 2.47K in, 58.41 / 13 / 292 out; ShareGPT 161.31 / 16 / 3.2K in, 337.99 / 19 / 991
# out. ShareGPT prompts are capped at 3,000 (not 3.2K) so that any request's recompute refill
# (I + O − 1) fits vLLM's unchunked 4,096-token batch. Realised means (400,000 draws): Alpaca 19.3 /
# 58.5, ShareGPT 161.3 / 338.0.
ECOSERVE_LENGTHS = {
    "alpaca": ((15.8, 0.6, 9, 2470), (49.0, 0.6, 13, 292)),
    "sharegpt": ((98.4, 1.0, 16, 3000), (262.4, 0.8, 19, 991)),
}


def ecoserve_workload(name: str, num_requests: int, seed: int = 0) -> list[Request]:
    """``num_requests`` requests with ``name``'s EcoServe-paper length statistics, all arriving at 0."""
    spec = ECOSERVE_LENGTHS.get(str(name).lower())
    if spec is None:
        raise ValueError(f"unknown EcoServe dataset {name!r}; known: {', '.join(ECOSERVE_LENGTHS)}")
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    rng = np.random.default_rng(seed)
    cols = [np.clip(np.rint(rng.lognormal(math.log(med), s, num_requests)), lo, hi).astype(int)
            for med, s, lo, hi in spec]
    return [Request(i, 0.0, int(p), int(o)) for i, (p, o) in enumerate(zip(*cols))]


def solo_prefill_s(cost_model: CostModel, prompt: int) -> float:
    """Time of a batch holding one whole ``prompt``-token prefill."""
    features = BatchFeatures()
    features.add_prefill(prompt, 0)
    return cost_model.batch_time_s(features)


def solo_decode_s(cost_model: CostModel, context: int) -> float:
    """Time of a batch holding one decode at ``context`` cached tokens."""
    features = BatchFeatures()
    features.add_decode(context)
    return cost_model.batch_time_s(features)


def slo_params(requests: Sequence[Request], cost_model: CostModel) -> tuple[float, float]:
    """(t_p, t_g): mean solo-prefill time over the prompts; solo decode-step time at the mean context
    ``mean I + mean O / 2``."""
    prompts = np.array([r.prompt_tokens for r in requests])
    outputs = np.array([r.output_tokens for r in requests])
    t_p = float(np.mean([solo_prefill_s(cost_model, int(p)) for p in prompts]))
    t_g = solo_decode_s(cost_model, int(round(prompts.mean() + outputs.mean() / 2)))
    return t_p, t_g


def jct_slo_s(output_tokens: np.ndarray, t_p: float, t_g: float, scale: float = 2.0) -> np.ndarray:
    """EcoServe's JCT SLO per request: ``scale · (t_p + t_g · O)``. ``t_p`` and ``t_g`` are times (finite, >= 0, not
    both 0) and ``scale`` > 0 (a negative t_p or a scale of 0 had given an SSR of 0 without a word, text a numpy
    error)."""
    for name, value, least in (("t_p", t_p, 0.0), ("t_g", t_g, 0.0), ("scale", scale, None)):
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
                or (value < least if least is not None else value <= 0):
            raise ValueError(f"{name} must be a finite number {'>= 0' if least is not None else '> 0'}, got {value!r}")
    if not t_p and not t_g:
        raise ValueError("t_p and t_g are both 0: every JCT SLO would be 0")
    return scale * (t_p + t_g * np.asarray(output_tokens, dtype=float))


def ecoserve_metrics(result, t_p: float, t_g: float, scale: float = 2.0, scheduler=None) -> dict:
    """Summary of EcoServe's metrics for one run (see the module docstring).

    ``allocation_failure_share``: requests preempted at least once (recompute-evicted, swapped out, or
    resident-preempted by EcoServe) / requests. ``mean_forward_size``: tokens per iteration;
    ``mean_kv_used``: GPU KV in use after each iteration / M (averaged over iterations).
    With an EcoServe ``scheduler`` (the instance that ran), adds its JCT decomposition (mean seconds
    per request in each state), its mean allocated-KV share per iteration and its decision time.
    """
    req, bat = result.requests, result.batches
    lat = req["latency_s"].to_numpy(float)
    out = req["output_tokens"].to_numpy(float)
    slo = jct_slo_s(out, t_p, t_g, scale)
    preempted = (req["evictions"] > 0) | (req["swapped_out_tokens"] > 0)
    stats = getattr(scheduler, "stats", None)
    if stats is not None:
        resident = req["id"].map(lambda i: stats.preemptions.get(i, 0)).to_numpy() > 0
        preempted = preempted | resident
    fwd = (bat["prefill_tokens"] + bat["decode_tokens"]).to_numpy(float)
    m = result.schedule.limits.M
    summary = {
        "normalized_latency_s": float(np.mean(lat / out)),
        "ssr": float(np.mean(lat <= slo)),
        "mean_jct_s": float(lat.mean()),
        "p95_jct_s": float(np.percentile(lat, 95)),
        "tps": result.summary["tps"],
        "allocation_failure_share": float(np.mean(preempted)),
        "mean_forward_size": float(fwd.mean()),
        "mean_kv_used": float(bat["kv_tokens"].mean() / m),
        "swapped_out_tokens": int(req["swapped_out_tokens"].sum()),
        "evictions": int(req["evictions"].sum()),
    }
    if stats is not None:
        parts = stats.jct_parts()
        for col in parts.columns:
            summary[f"jct_{col}_s"] = float(parts[col].mean())
        summary["resident_preemptions"] = int(sum(stats.preemptions.values()))
        summary["mean_kv_allocated"] = float(np.mean(stats.ledger_per_iteration) / m) if stats.ledger_per_iteration else 0.0
        summary["decision_time_per_iteration_us"] = 1e6 * stats.decision_s / max(stats.decisions, 1)
        summary["decision_time_share"] = stats.decision_s / float(bat["duration_s"].sum())
    return summary


def per_iteration(result) -> pd.DataFrame:
    """Per iteration: forward size (tokens) and GPU KV in use (share of M, during and after the batch)."""
    import pandas as pd

    bat, m = result.batches, result.schedule.limits.M
    return pd.DataFrame({"batch": bat["batch"], "forward_size": bat["prefill_tokens"] + bat["decode_tokens"],
                         "kv_used_peak": bat["kv_tokens_peak"] / m, "kv_used": bat["kv_tokens"] / m})
