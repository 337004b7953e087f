"""Batch-time cost models: the shared interface, the InferMax linear model, and loading fitted profiles."""

from __future__ import annotations

import os
from numbers import Integral
from pathlib import Path

import infermax

from .base import FEATURE_COLUMNS, AffinePiece, BatchFeatures, CostModel, CostTerm, features_frame, terms_time_s
from ..jsonio import read_json
from .files import LINEAR_JSON, PIECEWISE_JSON
from .linear import LinearCostModel
from .piecewise import FAMILIES as PIECEWISE_FAMILIES, KIND as PIECEWISE_KIND, PiecewiseCostModel
from .roofline import roofline_model

__all__ = ["AffinePiece", "BatchFeatures", "CostModel", "CostTerm", "terms_time_s", "FEATURE_COLUMNS", "LinearCostModel",
           "PiecewiseCostModel", "features_frame", "available_combinations", "available_profiles", "load_cost_model", "profile_folder", "profiles_dir",
           "roofline_model", "COST_MODEL_KINDS"]

PROFILE_LAYOUT = "<gpu>/<model>/tp<N>/"
COST_MODEL_KINDS = ("auto", "linear", "piecewise", "roofline")


def profiles_dir() -> Path:
    """The profiles folder: ``$INFERMAX_PROFILES`` if set, else ``profiles/`` at the repository root."""
    env = os.environ.get("INFERMAX_PROFILES")
    return Path(env) if env else Path(infermax.__file__).resolve().parent.parent / "profiles"


def profile_folder(gpu: str, model: str, tp: int = 1) -> Path:
    """Where the profile of ``gpu``/``model``/``tp`` lives (whether or not it exists)."""
    return profiles_dir() / gpu / model / f"tp{tp}"


def available_combinations() -> list[tuple[str, str, int]]:
    """``(gpu, model, tp)`` of every fitted profile on disk (a ``tp<N>`` folder with a fitted linear model), sorted."""
    found = []
    for path in profiles_dir().glob(f"*/*/tp*/{LINEAR_JSON}"):
        tp = path.parent.name[2:]
        if tp.isdigit():
            found.append((path.parent.parent.parent.name, path.parent.parent.name, int(tp)))
    return sorted(found)


def available_profiles() -> list[tuple[str, str]]:
    """``(gpu, model)`` pairs with at least one fitted profile, sorted (``available_combinations`` adds TP)."""
    return sorted({(g, m) for g, m, _ in available_combinations()})


def _missing_profile(gpu: str, model: str, tp: int) -> ValueError:
    found = ", ".join(f"{g}/{m}/tp{t}" for g, m, t in available_combinations()) or "none"
    return ValueError(
        f"no fitted profile for gpu={gpu!r} model={model!r} tp={tp} in {profiles_dir()}; available gpu/model/tp: "
        f"{found}. Use --cost-model roofline (kind='roofline') for a datasheet estimate instead (its error against "
        f"the measured profiles is in profiles/README.md), or add a profile: put Vidur-format mlp.csv "
        f"(+ attention.csv, all_reduce.csv) in a folder and run: infermax fit FOLDER --out "
        f"profiles/{gpu}/{model}")


def load_cost_model(gpu: str = "a100", model: str = "llama-2-7b", tp: int = 1, path: str | Path | None = None,
                    kind: str = "auto") -> CostModel:
    """The cost model of family ``kind`` for ``gpu``/``model``/``tp``, or the one in an explicit JSON ``path``.

    ``kind``: ``linear`` (the paper's model), ``piecewise`` (convex piecewise-linear fit), ``auto``
    (whichever of the two had the lower held-out error when the profile was fitted, recorded in its
    ``profile.json``), or ``roofline`` (datasheet estimate; needs no profile). With no profile for the
    combination, every kind but ``roofline`` raises a ``ValueError`` listing what exists: we do not
    fall back silently. With ``path`` the file's own kind is used (``kind`` must be auto or match it).
    """
    if kind not in COST_MODEL_KINDS:
        raise ValueError(f"unknown cost-model kind {kind!r}; choose one of {', '.join(COST_MODEL_KINDS)}")
    if path is not None:
        return _load_file(Path(path), kind)
    tp = _check_combination(gpu, model, tp)
    if kind == "roofline":
        return roofline_model(gpu, model, tp)
    folder = profile_folder(gpu, model, tp)
    if not (folder / LINEAR_JSON).is_file():
        raise _missing_profile(gpu, model, tp)
    if kind == "auto":
        kind = read_json(folder / "profile.json").get("auto", "linear")
    if kind == "piecewise":
        return PiecewiseCostModel.from_json(folder / PIECEWISE_JSON)
    return LinearCostModel.from_json(folder / LINEAR_JSON)


def _check_combination(gpu: object, model: object, tp: object) -> int:
    """``gpu`` and ``model`` must be names and ``tp`` an integer >= 1 (returned as a plain int; numpy's are accepted):
    ``gpu=None`` ended in a TypeError about path division, and ``tp="2"`` was read as TP 2 by accident."""
    for name, value in (("gpu", gpu), ("model", model)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a name (see `infermax models`), got {value!r}")
    if isinstance(tp, bool) or not isinstance(tp, Integral) or tp < 1:
        raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
    return int(tp)


def _load_file(path: Path, kind: str) -> CostModel:
    doc = read_json(path)
    file_kind = doc.get("kind") if isinstance(doc, dict) else None
    if file_kind == "infermax-linear":  # (compared, not looked up: a 'kind' holding an object had raised "unhashable")
        family = "linear"
    elif file_kind == PIECEWISE_KIND:
        family = doc.get("family")
        if family not in PIECEWISE_FAMILIES:
            raise ValueError(f"{path}: key 'family' must be one of {', '.join(PIECEWISE_FAMILIES)}, got {family!r:.60}")
    else:
        raise ValueError(f"{path}: key 'kind' must be 'infermax-linear' or {PIECEWISE_KIND!r}, got {file_kind!r:.60}")
    if kind not in ("auto", family):
        raise ValueError(f"{path} holds a {family} model, not {kind}")
    return LinearCostModel.from_json(path) if family == "linear" else PiecewiseCostModel.from_json(path)
