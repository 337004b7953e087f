"""Point kinds: what one sweep point computes from its configuration.

A point kind names its configuration fields (with types and defaults), checks a configuration
before anything runs, and turns one configuration into a flat record of result columns. ``simulate``
is the only kind so far; another (e.g. ``optimize``) is added with one ``register_kind`` call.
"""

from __future__ import annotations

import hashlib
import json
import time
import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Callable

from ..config import RunConfig, plain_values


@dataclass(frozen=True)
class PointKind:
    """``config_cls``: a dataclass with ``from_dict``; ``check(config)`` raises ValueError on a bad
    configuration; ``run(config)`` returns the point's result columns (a flat dict of scalars);
    ``inputs(config)`` fingerprints what the result depends on beyond the configuration (for
    ``simulate``: the cost model's fitted coefficients), so a resumed sweep never mixes points
    computed from different inputs. ``id_omits_default``: configuration fields that a point's id leaves
    out while they hold their default (fields added after results were committed, so that adding them
    keeps every earlier point's id)."""

    name: str
    config_cls: type
    check: Callable[[dict], None]
    run: Callable[[dict], dict]
    inputs: Callable[[dict], str]
    id_omits_default: tuple[str, ...] = ()

    def defaults(self) -> dict:
        return {f.name: f.default for f in fields(self.config_cls) if f.default is not MISSING}

    def field_types(self) -> dict[str, tuple[type, ...]]:
        """Each field's allowed Python types (``int | None`` -> ``(int, NoneType)``)."""
        hints = typing.get_type_hints(self.config_cls)
        out = {}
        for f in fields(self.config_cls):
            hint = hints[f.name]
            out[f.name] = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        return out


POINT_KINDS: dict[str, PointKind] = {}


def register_kind(kind: PointKind) -> None:
    """Make a point kind usable as a spec's ``kind``."""
    if kind.name in POINT_KINDS:
        raise ValueError(f"point kind {kind.name!r} is already registered")
    POINT_KINDS[kind.name] = kind


def get_kind(name: str) -> PointKind:
    kind = POINT_KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown point kind {name!r}; known: {', '.join(POINT_KINDS)}")
    return kind


def point_id(kind: str, config: dict) -> str:
    """A stable identifier of a point: a hash of its kind and full configuration, less the kind's
    ``id_omits_default`` fields that hold their default."""
    point_kind = POINT_KINDS.get(kind)
    if point_kind is not None and point_kind.id_omits_default:
        defaults = point_kind.defaults()
        config = {k: v for k, v in config.items() if not (k in point_kind.id_omits_default and v == defaults.get(k))}
    text = json.dumps({"kind": kind, "config": config}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_point(kind: str, config: dict) -> dict:
    """Compute one point: ``{"id", "kind", "config", "inputs", "result", "wall_s"}``.

    ``result`` holds ``status`` ("ok" or "error"), ``error`` (the message of a configuration the
    simulator rejects, e.g. a request that never fits ``M``) and the kind's result columns.
    """
    started = time.perf_counter()
    point_kind = get_kind(kind)
    config = plain_values(config)  # (a results table's row: numpy numbers, NaN for unset fields)
    result = point_kind.run(config)
    return {"id": point_id(kind, config), "kind": kind, "config": config, "inputs": point_kind.inputs(config),
            "result": result, "wall_s": time.perf_counter() - started}


def _check_simulate(config: dict) -> None:
    from ..schedulers import get_spec

    run_config = RunConfig.from_dict(config)
    get_spec(run_config.scheduler)
    run_config.limits()


def _run_simulate(config: dict) -> dict:
    from ..schedulers import SchedulerError

    try:
        result = RunConfig.from_dict(config).simulate()
    except (ValueError, FileNotFoundError, SchedulerError) as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    limits = result.schedule.limits
    return {"status": "ok", "error": None, "limit_P": limits.prefill_budget, "limit_M": limits.M,
            "cost_model_name": result.meta.get("cost_model"), **result.summary}


def _inputs_simulate(config: dict) -> str:
    """A hash of the cost model's fitted JSON (an unloadable model hashes its error; the point reports it)."""
    try:
        doc = RunConfig.from_dict(config).cost().to_dict()
    except (ValueError, FileNotFoundError) as exc:
        doc = {"error": str(exc)}
    return "cost-model:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


register_kind(PointKind("simulate", RunConfig, _check_simulate, _run_simulate, _inputs_simulate,
                        RunConfig.ID_OMITS_DEFAULT))
