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
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from .floatstats import mean, percentiles
from .jsonio import nan_to_null, plain_number
from .schedule import Schedule

if TYPE_CHECKING:
    import pandas as pd

REQUEST_COLUMNS = (
    "id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
    "ttft_s", "tpot_s", "latency_s", "generated_tokens", "evictions", "refilled_tokens",
    "swapped_out_tokens", "swapped_in_tokens",
)
SLO_COLUMNS = ("ttft_slo_s", "tbt_slo_s", "tpot_slo_s", "p99_tbt_s", "ttft_ok", "tbt_ok", "tpot_ok", "slo_met",
               "tpot_gap_ok_share")
SLO_FLOAT_COLUMNS = ("ttft_slo_s", "tbt_slo_s", "tpot_slo_s", "p99_tbt_s", "tpot_gap_ok_share")


@dataclass
class RequestRows:
    """The request table as plain rows: ``rows`` (``REQUEST_COLUMNS``), ``classes`` (each request's
    ``request_class``; None when no request has one) and ``slo`` (``SLO_COLUMNS``; None when no request
    has a latency target), ``prefix_hits`` (with prefix caching)."""

    rows: list[tuple]
    classes: list | None = None
    slo: list[tuple] | None = None
    prefix_hits: list[int] | None = None  # each request's ``prefix_hit_tokens`` (prefix caching on)

    def columns(self) -> "Columns":
        """The columns ``summarize`` reads (the SLO ones as floats, a missing target as NaN)."""
        if self.slo is None:
            return Columns(REQUEST_COLUMNS, self.rows)
        return Columns(REQUEST_COLUMNS + SLO_COLUMNS, [r + s for r, s in zip(self.rows, self.slo)], SLO_FLOAT_COLUMNS)


class Columns:
    """Named columns of plain row tuples, each read as a list (what ``summarize`` needs of a table: indexing,
    ``len`` and ``in`` as on a DataFrame, without importing pandas or numpy). ``floats`` names columns whose
    None values read as NaN (a DataFrame's ``astype(float)``)."""

    def __init__(self, names: tuple[str, ...], rows: list[tuple], floats: tuple[str, ...] = ()):
        self._index = {name: i for i, name in enumerate(names)}
        self._rows, self._floats = rows, floats

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> list:
        i = self._index[name]
        if name in self._floats:
            return [math.nan if r[i] is None else float(r[i]) for r in self._rows]
        return [r[i] for r in self._rows]


@dataclass
class SimResult:
    """Everything a run produced: tables, summary and the Schedule that reproduces it.

    A run keeps its tables as plain rows; ``requests`` and ``batches`` are the DataFrames built from them
    on first access (and kept), so a command that only prints the summary never imports pandas (about
    a third of a tiny run's start-up). The summary is computed from the rows in plain Python (``summarize``)."""

    request_rows: RequestRows
    batch_rows: list[tuple]
    summary: dict
    schedule: Schedule
    meta: dict = field(default_factory=dict)

    @cached_property
    def requests(self) -> "pd.DataFrame":
        """One row per request (``REQUEST_COLUMNS``, ``request_class`` second when any request has one, then
        ``SLO_COLUMNS`` when any has a target, ``prefix_hit_tokens`` last with prefix caching); see the module
        docstring."""
        import pandas as pd

        q = self.request_rows
        requests = pd.DataFrame(q.rows, columns=list(REQUEST_COLUMNS))
        if q.classes is not None:
            requests.insert(1, "request_class", q.classes)
        if q.slo is not None:
            slo = pd.DataFrame(q.slo, columns=list(SLO_COLUMNS)).astype(dict.fromkeys(SLO_FLOAT_COLUMNS, float))
            requests = pd.concat([requests, slo], axis=1)
        if q.prefix_hits is not None:
            requests["prefix_hit_tokens"] = q.prefix_hits
        return requests

    @cached_property
    def batches(self) -> "pd.DataFrame":
        """One row per batch (``replay.BATCH_COLUMNS``)."""
        import pandas as pd

        from .replay import BATCH_COLUMNS

        return pd.DataFrame(self.batch_rows, columns=list(BATCH_COLUMNS))

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
        requests = RequestRows(rows)
        if any(s.req.request_class is not None for s in rp.states.values()):
            requests.classes = [s.req.request_class for s in rp.states.values()]
        if any(s.req.has_slo for s in rp.states.values()):
            requests.slo = slo_rows(rp.states.values())
        if rp.prefix_cache is not None:
            requests.prefix_hits = [s.prefix_hit_tokens for s in rp.states.values()]
        batches = list(rp.batch_rows)
        schedule = Schedule([s.req for s in rp.states.values()], rp.limits, rp.batches, dict(meta or {}))
        summary = summarize(requests.columns(), Columns(BATCH_COLUMNS, batches), rp.limits.M)
        if rp.prefix_cache is not None:
            summary.update(prefix_cache_summary(rp))
        return cls(requests, batches, summary, schedule, dict(meta or {}))

    def save(self, out_dir: str | Path) -> Path:
        """Write summary.json, requests.parquet, batches.parquet and schedule.json to ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps({"summary": nan_to_null(self.summary), "meta": self.meta}, indent=2,
                                                     default=plain_number))  # (numpy numbers a caller put in meta)
        self.requests.to_parquet(out / "requests.parquet", index=False)
        self.batches.to_parquet(out / "batches.parquet", index=False)
        self.schedule.save(out / "schedule.json")
        return out


def prefix_cache_summary(rp) -> dict:
    """Prefix-caching metrics of a replayer's run (``Limits.prefix_caching``).

    ``prefill_computed_tokens``: input tokens computed (prompts and refills); ``prefix_hit_tokens``: input
    tokens taken from the cache instead (``prefix_hit_tokens_after_eviction``: by requests restarting after
    an eviction, i.e. refill that was not recomputed); ``prefix_hit_rate_tokens`` = hit tokens / input tokens at every
    admission (a request's first start and every restart after an eviction);
    ``prefix_hit_rate_blocks`` = hit blocks / the full blocks that could have hit
    (``⌊(Icur − 1)/block_size⌋`` per admission); ``cached_blocks_evicted``: cached, unreferenced blocks
    dropped to make room; ``cached_blocks_end``: blocks still cached at the end.
    """
    cache = rp.prefix_cache
    return {
        "prefill_computed_tokens": sum(s.prefill_processed for s in rp.states.values()),
        "prefix_hit_tokens": cache.hit_tokens_total,
        "prefix_hit_tokens_after_eviction": cache.restart_hit_tokens,
        "prefix_hit_rate_tokens": cache.hit_tokens_total / cache.admitted_tokens if cache.admitted_tokens else 0.0,
        "prefix_hit_rate_blocks": cache.hit_blocks_total / cache.admitted_blocks if cache.admitted_blocks else 0.0,
        "cached_blocks_evicted": cache.evicted_blocks,
        "cached_blocks_end": cache.cached_blocks,
    }


def p99_tbt_s(token_times: list[float]) -> float:
    """99th percentile (linear interpolation) of the gaps between consecutive token times; NaN if none."""
    if len(token_times) < 2:
        return math.nan
    return percentiles(_gaps(token_times), [99])[0]


def _gaps(token_times: list[float]) -> list[float]:
    """Times between consecutive tokens (``np.diff``)."""
    return [float(b) - float(a) for a, b in zip(token_times, token_times[1:])]


def slo_rows(states) -> list[tuple]:
    """Per request (``SLO_COLUMNS``): targets, P99 TBT and whether each target (and both) is met; see the
    module docstring."""
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
            gaps = _gaps(s.token_times)
            gap_share = sum(g <= r.tpot_slo_s for g in gaps) / len(gaps)
        rows.append((r.ttft_slo_s, r.tbt_slo_s, r.tpot_slo_s, p99, ttft_ok, tbt_ok, tpot_ok, ttft_ok and tbt_ok and tpot_ok,
                     gap_share))
    return rows


def _ratio(part: int, whole: int) -> float:
    """``part / whole``, NaN for 0 / 0 (as numpy divides)."""
    return part / whole if whole else math.nan


def summarize(requests: Columns, batches: Columns, kv_capacity_tokens: int) -> dict:
    """The summary row: makespan, TPS, TTFT/TPOT/latency statistics, evictions, sizes.

    Plain Python over the rows' columns (``Columns``), equal to the pandas/numpy reductions it replaced
    (kept by ``tests/test_floatstats.py``): float means and percentiles from ``floatstats``; a mean or ratio
    of integer counts is their exact integer sum divided once (numpy's float sum is exact below 2**53)."""
    makespan = float(max(batches["end_s"]) - min(requests["arrival_s"])) if len(batches) else 0.0
    generated = int(sum(requests["generated_tokens"]))
    out = {
        "num_requests": len(requests),
        "num_batches": len(batches),
        "makespan_s": makespan,
        "generated_tokens": generated,
        "tps": generated / makespan if makespan > 0 else math.nan,
    }
    for metric in ("ttft_s", "tpot_s", "latency_s"):
        values = [float(v) for v in requests[metric] if not math.isnan(v)]
        base = metric[:-2]
        if len(values):
            p50, p90, p99 = percentiles(values, [50, 90, 99])
            out.update({f"mean_{base}_s": mean(values), f"p50_{base}_s": p50, f"p90_{base}_s": p90, f"p99_{base}_s": p99})
        else:
            out.update({f"{k}_{base}_s": math.nan for k in ("mean", "p50", "p90", "p99")})
    n_batches = len(batches)
    out.update({
        "evictions": int(sum(requests["evictions"])),
        "refilled_tokens": int(sum(requests["refilled_tokens"])),
        "mean_batch_size": sum(batches["num_requests"]) / n_batches if n_batches else 0.0,
        "mean_running": sum(batches["running"]) / n_batches if n_batches else 0.0,
        "mean_kv_util": sum(batches["kv_tokens"]) / n_batches / kv_capacity_tokens if n_batches else 0.0,
        "peak_kv_util": max(batches["kv_tokens_peak"]) / kv_capacity_tokens if n_batches else 0.0,
        "hidden_item_share": _ratio(sum(batches["hidden_seqs"]), sum(batches["num_requests"])) if n_batches else 0.0,
        "swapped_out_tokens": int(sum(requests["swapped_out_tokens"])),
        "swapped_in_tokens": int(sum(requests["swapped_in_tokens"])),
    })
    if "slo_met" in requests:
        with_slo = [not (math.isnan(a) and math.isnan(b) and math.isnan(c))
                    for a, b, c in zip(requests["ttft_slo_s"], requests["tbt_slo_s"], requests["tpot_slo_s"])]
        n_slo = sum(with_slo)
        out.update({f"{name}_attainment": sum(ok for ok, w in zip(requests[column], with_slo) if w) / n_slo
                    if n_slo else math.nan
                    for name, column in (("slo", "slo_met"), ("ttft", "ttft_ok"), ("tbt", "tbt_ok"), ("tpot", "tpot_ok"))})
    return out


def class_summary(result: SimResult) -> dict[str, dict]:
    """Per request class (``request_class``), BROS's metrics; empty when no request has a class.

    Every class: ``num_requests``, ``mean_latency_s``, ``mean_normalized_latency_s`` (mean over requests
    of latency / output tokens), ``throughput_rps`` and ``throughput_tps`` (the class's requests and
    output tokens / the span from its first arrival to its last finish). With targets:
    ``ttft_attainment``, ``tpot_attainment`` (share of requests meeting the target) and
    ``tpot_gap_attainment`` (mean over requests of the share of on-time gaps between tokens).
    """
    if result.request_rows.classes is None:
        return {}
    q = result.requests
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
