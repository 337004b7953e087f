"""Per-request, per-batch and summary metrics of a run, as DataFrames and plain dicts.

Definitions (design.md): TTFT = first token − arrival; TPOT = (finish − first
token)/(O − 1), undefined (NaN) for O = 1; latency = finish − arrival; makespan =
last batch end − first arrival (the paper's offline *total latency*); TPS =
generated tokens / makespan. Running size and KV use are the state *after* each
batch (Algorithm 1's ``Rr`` once completed requests left), averaged over batches;
``kv_tokens_peak``/``running_peak`` are the values *during* the batch that the
``M``/``Rmax`` limits bound.

Latency targets: when requests carry ``ttft_slo_s``/``tbt_slo_s``/``tpot_slo_s`` the request table
gains ``p99_tbt_s`` (99th percentile, linear interpolation, of the request's own gaps between
consecutive tokens; NaN for O = 1), ``ttft_ok``, ``tbt_ok``, ``tpot_ok`` (mean TPOT within target)
and ``slo_met`` (all met; a missing target, or a request with no gap, counts as met; ``≤`` meets),
``tpot_gap_ok_share`` (share of the request's gaps between tokens within its TPOT target; NaN without
a target or a gap),
and the summary gains ``slo_attainment`` (requests meeting all / requests with a target) and the
per-target shares.

Swapping: the request table always has ``swapped_out_tokens``/``swapped_in_tokens`` (KV tokens
copied to and from host memory); requests with a ``request_class`` add that column.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .jsonio import nan_to_null
from .schedule import Schedule

REQUEST_COLUMNS = (
    "id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
    "ttft_s", "tpot_s", "latency_s", "generated_tokens", "evictions", "refilled_tokens",
    "swapped_out_tokens", "swapped_in_tokens",
)
SLO_COLUMNS = ("ttft_slo_s", "tbt_slo_s", "tpot_slo_s", "p99_tbt_s", "ttft_ok", "tbt_ok", "tpot_ok", "slo_met",
               "tpot_gap_ok_share")


@dataclass
class SimResult:
    """Everything a run produced: tables, summary and the Schedule that reproduces it."""

    requests: pd.DataFrame
    batches: pd.DataFrame
    summary: dict
    schedule: Schedule
    meta: dict = field(default_factory=dict)

    @classmethod
    def from_replayer(cls, rp, meta: dict | None = None) -> "SimResult":
        from .replay import BATCH_COLUMNS

        rp.materialize()  # lazy decode-cohort members' progress
        rows = []
        for s in rp.states.values():
            r = s.req
            ttft = s.first_token_s - r.arrival_s
            tpot = (s.finish_s - s.first_token_s) / (r.output_tokens - 1) if r.output_tokens > 1 else math.nan
            rows.append((r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, s.first_token_s, s.finish_s,
                         ttft, tpot, s.finish_s - r.arrival_s, s.generated, s.evictions, s.prefill_processed + s.prefix_hit_tokens - r.prompt_tokens,
                         s.swapped_out_tokens, s.swapped_in_tokens))
        requests = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
        if any(s.req.request_class is not None for s in rp.states.values()):
            requests.insert(1, "request_class", [s.req.request_class for s in rp.states.values()])
        if any(s.req.has_slo for s in rp.states.values()):
            requests = pd.concat([requests, slo_table(rp.states.values())], axis=1)
        batches = pd.DataFrame(rp.batch_rows, columns=list(BATCH_COLUMNS))
        summary = summarize(requests, batches, rp.limits.M)
        if rp.prefix_cache is not None:
            requests["prefix_hit_tokens"] = [s.prefix_hit_tokens for s in rp.states.values()]
            summary.update(prefix_cache_summary(rp))
        schedule = Schedule([s.req for s in rp.states.values()], rp.limits, rp.batches, dict(meta or {}))
        return cls(requests, batches, summary, schedule, dict(meta or {}))

    def save(self, out_dir: str | Path) -> Path:
        """Write summary.json, requests.parquet, batches.parquet and schedule.json to ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps({"summary": nan_to_null(self.summary), "meta": self.meta}, indent=2))
        self.requests.to_parquet(out / "requests.parquet", index=False)
        self.batches.to_parquet(out / "batches.parquet", index=False)
        self.schedule.save(out / "schedule.json")
        return out


def prefix_cache_summary(rp) -> dict:
    """Prefix-caching metrics of a replayer's run (``Limits.prefix_caching``).

    ``prefill_computed_tokens``: input tokens computed (prompts and refills); ``prefix_hit_tokens``: input
    tokens taken from the cache instead; ``prefix_hit_rate_tokens`` = hit tokens / input tokens at every
    admission (a request's first start and every restart after an eviction);
    ``prefix_hit_rate_blocks`` = hit blocks / the full blocks that could have hit
    (``⌊(Icur − 1)/block_size⌋`` per admission); ``cached_blocks_evicted``: cached, unreferenced blocks
    dropped to make room; ``cached_blocks_end``: blocks still cached at the end.
    """
    cache = rp.prefix_cache
    return {
        "prefill_computed_tokens": sum(s.prefill_processed for s in rp.states.values()),
        "prefix_hit_tokens": cache.hit_tokens_total,
        "prefix_hit_rate_tokens": cache.hit_tokens_total / cache.admitted_tokens if cache.admitted_tokens else 0.0,
        "prefix_hit_rate_blocks": cache.hit_blocks_total / cache.admitted_blocks if cache.admitted_blocks else 0.0,
        "cached_blocks_evicted": cache.evicted_blocks,
        "cached_blocks_end": cache.cached_blocks,
    }


def p99_tbt_s(token_times: list[float]) -> float:
    """99th percentile (linear interpolation) of the gaps between consecutive token times; NaN if none."""
    if len(token_times) < 2:
        return math.nan
    return float(np.percentile(np.diff(np.asarray(token_times, dtype=float)), 99))


def slo_table(states) -> pd.DataFrame:
    """Per request: targets, P99 TBT and whether each target (and both) is met; see the module docstring."""
    rows = []
    for s in states:
        r = s.req
        p99 = p99_tbt_s(s.token_times) if s.token_times is not None else math.nan
        ttft_ok = r.ttft_slo_s is None or s.first_token_s - r.arrival_s <= r.ttft_slo_s
        tbt_ok = r.tbt_slo_s is None or math.isnan(p99) or p99 <= r.tbt_slo_s
        tpot_ok = (r.tpot_slo_s is None or r.output_tokens == 1
                   or (s.finish_s - s.first_token_s) / (r.output_tokens - 1) <= r.tpot_slo_s)
        gap_share = math.nan
        if r.tpot_slo_s is not None and len(s.token_times) > 1:
            gap_share = float(np.mean(np.diff(np.asarray(s.token_times, dtype=float)) <= r.tpot_slo_s))
        rows.append((r.ttft_slo_s, r.tbt_slo_s, r.tpot_slo_s, p99, ttft_ok, tbt_ok, tpot_ok, ttft_ok and tbt_ok and tpot_ok,
                     gap_share))
    table = pd.DataFrame(rows, columns=list(SLO_COLUMNS))
    return table.astype({"ttft_slo_s": float, "tbt_slo_s": float, "tpot_slo_s": float, "p99_tbt_s": float,
                         "tpot_gap_ok_share": float})


def summarize(requests: pd.DataFrame, batches: pd.DataFrame, kv_capacity_tokens: int) -> dict:
    """The summary row: makespan, TPS, TTFT/TPOT/latency statistics, evictions, sizes."""
    makespan = float(batches["end_s"].max() - requests["arrival_s"].min()) if len(batches) else 0.0
    generated = int(requests["generated_tokens"].sum())
    out = {
        "num_requests": len(requests),
        "num_batches": len(batches),
        "makespan_s": makespan,
        "generated_tokens": generated,
        "tps": generated / makespan if makespan > 0 else math.nan,
    }
    for metric in ("ttft_s", "tpot_s", "latency_s"):
        values = requests[metric].to_numpy(dtype=float)
        values = values[~np.isnan(values)]
        base = metric[:-2]
        if len(values):
            p50, p90, p99 = np.percentile(values, [50, 90, 99])
            out.update({f"mean_{base}_s": float(values.mean()), f"p50_{base}_s": float(p50),
                        f"p90_{base}_s": float(p90), f"p99_{base}_s": float(p99)})
        else:
            out.update({f"{k}_{base}_s": math.nan for k in ("mean", "p50", "p90", "p99")})
    out.update({
        "evictions": int(requests["evictions"].sum()),
        "refilled_tokens": int(requests["refilled_tokens"].sum()),
        "mean_batch_size": float(batches["num_requests"].mean()) if len(batches) else 0.0,
        "mean_running": float(batches["running"].mean()) if len(batches) else 0.0,
        "mean_kv_util": float(batches["kv_tokens"].mean() / kv_capacity_tokens) if len(batches) else 0.0,
        "peak_kv_util": float(batches["kv_tokens_peak"].max() / kv_capacity_tokens) if len(batches) else 0.0,
        "hidden_item_share": (float(batches["hidden_seqs"].sum() / batches["num_requests"].sum())
                              if len(batches) else 0.0),
        "swapped_out_tokens": int(requests["swapped_out_tokens"].sum()),
        "swapped_in_tokens": int(requests["swapped_in_tokens"].sum()),
    })
    if "slo_met" in requests:
        with_slo = requests[requests["ttft_slo_s"].notna() | requests["tbt_slo_s"].notna()
                            | requests["tpot_slo_s"].notna()]
        out.update({"slo_attainment": float(with_slo["slo_met"].mean()),
                    "ttft_attainment": float(with_slo["ttft_ok"].mean()),
                    "tbt_attainment": float(with_slo["tbt_ok"].mean()),
                    "tpot_attainment": float(with_slo["tpot_ok"].mean())})
    return out


def class_summary(result: SimResult) -> dict[str, dict]:
    """Per request class (``request_class``), BROS's metrics; empty when no request has a class.

    Every class: ``num_requests``, ``mean_latency_s``, ``mean_normalized_latency_s`` (mean over requests
    of latency / output tokens), ``throughput_rps`` and ``throughput_tps`` (the class's requests and
    output tokens / the span from its first arrival to its last finish). With targets:
    ``ttft_attainment``, ``tpot_attainment`` (share of requests meeting the target) and
    ``tpot_gap_attainment`` (mean over requests of the share of on-time gaps between tokens).
    """
    q = result.requests
    if "request_class" not in q:
        return {}
    out = {}
    for cls, g in q.groupby(q["request_class"].fillna("none"), sort=True):
        span = float(g["finish_s"].max() - g["arrival_s"].min())
        row = {
            "num_requests": len(g),
            "mean_latency_s": float(g["latency_s"].mean()),
            "mean_normalized_latency_s": float((g["latency_s"] / g["output_tokens"]).mean()),
            "mean_ttft_s": float(g["ttft_s"].mean()),
            "throughput_rps": len(g) / span if span > 0 else math.nan,
            "throughput_tps": float(g["output_tokens"].sum()) / span if span > 0 else math.nan,
        }
        if "ttft_slo_s" in g and g["ttft_slo_s"].notna().any():
            row["ttft_attainment"] = float(g.loc[g["ttft_slo_s"].notna(), "ttft_ok"].mean())
        if "tpot_slo_s" in g and g["tpot_slo_s"].notna().any():
            row["tpot_attainment"] = float(g.loc[g["tpot_slo_s"].notna(), "tpot_ok"].mean())
            row["tpot_gap_attainment"] = float(g["tpot_gap_ok_share"].mean())
        out[str(cls)] = row
    return out
