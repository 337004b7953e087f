"""A measured run against a cost model: per-batch errors and the simulated vs measured request timelines.

No PyTorch here: ``gpu-replay`` measures (``execute``), this module scores. Scoring needs only the Schedule and
each batch's measured time, so a run measured once on a GPU can be scored again against any other cost model
(``rescore``; ``infermax gpu-replay SCHEDULE --measured RUN``) on a machine without one, e.g. the linear and
the piecewise fit of the same profile.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..costmodel import load_cost_model
from ..costmodel.base import BatchFeatures, CostModel
from ..costmodel.measurements import read_csv_file
from ..jsonio import read_json
from ..replay import Replayer, replay
from ..schedule import Schedule

BATCHES_CSV, REQUESTS_CSV, SUMMARY_JSON = "batches.csv", "requests.csv", "summary.json"
# The run's provenance in summary.json, kept when the run is scored again (the rest is recomputed).
RUN_KEYS = ("model", "device", "dtype", "torch", "scheduler", "requests", "warmup_batches", "cuda_graphs",
            "decode_kernel", "prefill_kernel", "decode_padding")


class Recorder:
    """A cost model that records each batch's features and the wrapped model's prediction."""

    def __init__(self, inner: CostModel):
        self.inner, self.name = inner, inner.name
        self.features: list[BatchFeatures] = []
        self.predicted_s: list[float] = []

    def batch_time_s(self, features: BatchFeatures) -> float:
        t = self.inner.batch_time_s(features)
        self.features.append(features)
        self.predicted_s.append(t)
        return t


class Measured:
    """A cost model that returns the measured batch times in order (to time the measured run's timeline)."""

    name = "measured"

    def __init__(self, times_s: list[float]):
        self._times = iter(times_s)

    def batch_time_s(self, features: BatchFeatures) -> float:
        return next(self._times)


@dataclass
class ReplayCheck:
    """Measured against predicted: per-batch table, per-request table and summary."""

    batches: pd.DataFrame
    requests: pd.DataFrame
    summary: dict

    def save(self, out: str | Path) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.batches.to_csv(out / BATCHES_CSV, index=False, float_format="%.6g")
        self.requests.to_csv(out / REQUESTS_CSV, index=False, float_format="%.6g")
        (out / SUMMARY_JSON).write_text(json.dumps(self.summary, indent=2) + "\n")
        return out


def _pct_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return 100.0 * np.abs(predicted - measured) / measured


def compare(schedule: Schedule, cost_model: CostModel, measured_s: list[float], rec: Recorder, info: dict) -> ReplayCheck:
    """Tables and summary of a run: per-batch MAPE; simulated vs measured latency per request."""
    feats = pd.DataFrame([asdict(f) for f in rec.features])
    pred, meas = np.array(rec.predicted_s), np.array(measured_s)
    kind = np.where(feats["n_prefill_seqs"] == 0, "decode", np.where(feats["n_decode_seqs"] == 0, "prefill", "mixed"))
    batches = pd.concat([pd.DataFrame({"batch": np.arange(len(meas)), "kind": kind, "measured_s": meas,
                                       "predicted_s": pred, "error_pct": 100.0 * (pred - meas) / meas}), feats], axis=1)
    simulated, real = replay(schedule, cost_model), replay(schedule, Measured(measured_s))
    req = simulated.requests[["id", "arrival_s", "prompt_tokens", "output_tokens"]].copy()
    for name, res in (("simulated", simulated), ("measured", real)):
        req[f"{name}_latency_s"] = res.requests["latency_s"].to_numpy()
        req[f"{name}_ttft_s"] = res.requests["ttft_s"].to_numpy()
    sim_lat, real_lat = req["simulated_latency_s"].to_numpy(), req["measured_latency_s"].to_numpy()
    errors = _pct_errors(pred, meas)
    summary = {
        **info, "batches": int(len(meas)), "cost_model": cost_model.name,
        "per_batch_mape_pct": float(errors.mean()),
        "per_batch_mape_pct_by_kind": {k: float(errors[kind == k].mean()) for k in ("prefill", "decode", "mixed")
                                       if (kind == k).any()},
        "busy_time_s": {"measured": float(meas.sum()), "predicted": float(pred.sum())},
        "busy_time_error_pct": float(100.0 * (pred.sum() - meas.sum()) / meas.sum()),
        "mean_latency_s": {"measured": float(real_lat.mean()), "simulated": float(sim_lat.mean())},
        "e2e_latency_error_pct": float(100.0 * (sim_lat.mean() - real_lat.mean()) / real_lat.mean()),
        "per_request_latency_mape_pct": float(_pct_errors(sim_lat, real_lat).mean()),
        "makespan_s": {"measured": real.summary["makespan_s"], "simulated": simulated.summary["makespan_s"]},
    }
    summary["makespan_error_pct"] = float(100.0 * (summary["makespan_s"]["simulated"] - summary["makespan_s"]["measured"])
                                          / summary["makespan_s"]["measured"]) if summary["makespan_s"]["measured"] else math.nan
    return ReplayCheck(batches, req, summary)


def rescore(schedule: Schedule, cost_model: CostModel, measured_s: list[float], info: dict | None = None) -> ReplayCheck:
    """Score measured batch times of ``schedule`` against ``cost_model`` without executing anything.

    The batches are applied through a ``Replayer`` exactly as the executor applies them, so the features (and
    so the predictions) are the ones a fresh ``gpu_replay`` with this cost model would record.
    """
    if len(measured_s) != len(schedule.batches):
        raise ValueError(f"{len(measured_s)} measured batch times for a schedule of {len(schedule.batches)} batches: "
                         f"not a measurement of this schedule")
    if not all(math.isfinite(t) and t > 0 for t in measured_s):
        raise ValueError("measured batch times must be positive and finite")
    rec = Recorder(cost_model)
    rp = Replayer(schedule.requests, schedule.limits, rec)
    for batch in schedule.batches:
        rp.apply(batch)
    return compare(schedule, cost_model, measured_s, rec, info or {})


def load_measured(run: str | Path) -> tuple[list[float], dict]:
    """The measured batch times and the run's provenance from a ``gpu-replay --out`` folder."""
    run = Path(run)
    path = run / BATCHES_CSV
    if not path.is_file():
        raise ValueError(f"{run} holds no {BATCHES_CSV}: not a `gpu-replay --out` folder")
    table = read_csv_file(path)
    if "measured_s" not in table.columns:
        raise ValueError(f"{path} has no measured_s column")
    info = {}
    if (run / SUMMARY_JSON).is_file():
        summary = read_json(run / SUMMARY_JSON)
        info = {k: summary[k] for k in RUN_KEYS if k in summary}
    return [float(t) for t in table["measured_s"]], info


FAMILIES = ("linear", "piecewise")


def rescore_records(replays: str | Path, profiles: str | Path, models: list[str] | None = None,
                    cases: list[str] | None = None, families: tuple[str, ...] = FAMILIES):
    """Yield ``(model, case, family, check)`` for committed replay records ``replays/<model>/<case>/`` (each with
    ``sim/schedule.json`` and a ``replay/`` folder of ``gpu-replay --out``), every one re-scored (``rescore``) against
    ``profiles/<model>/tp1/infermax_<family>.json``: what a change of the fitting moves on the same measured batches,
    without a GPU. ``models``/``cases``: these, in this order (default: every record found, sorted)."""
    replays, profiles = Path(replays), Path(profiles)
    if models is None or cases is None:
        found = sorted(p.parent.parent for p in replays.glob("*/*/sim/schedule.json"))
        pairs = [(c.parent.name, c.name) for c in found
                 if (models is None or c.parent.name in models) and (cases is None or c.name in cases)]
    else:
        pairs = [(m, c) for m in models for c in cases]
    for model, case in pairs:
        folder = replays / model / case
        schedule = Schedule.load(folder / "sim" / "schedule.json")
        measured, info = load_measured(folder / "replay")
        for family in families:
            cost = load_cost_model(path=profiles / model / "tp1" / f"infermax_{family}.json")
            yield model, case, family, rescore(schedule, cost, measured, info)
