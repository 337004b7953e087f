"""Batch-time cost models: the shared interface, the InferMax linear model, and loading fitted profiles."""

from __future__ import annotations

import os
from pathlib import Path

import infermax

from .base import FEATURE_COLUMNS, AffinePiece, BatchFeatures, CostModel, CostTerm, features_frame, terms_time_s
from .linear import LinearCostModel

__all__ = ["AffinePiece", "BatchFeatures", "CostModel", "CostTerm", "terms_time_s", "FEATURE_COLUMNS", "LinearCostModel", "features_frame",
           "available_profiles", "load_cost_model", "profiles_dir"]

LINEAR_JSON = "infermax_linear.json"


def profiles_dir() -> Path:
    """The profiles folder: ``$INFERMAX_PROFILES`` if set, else ``profiles/`` at the repository root."""
    env = os.environ.get("INFERMAX_PROFILES")
    return Path(env) if env else Path(infermax.__file__).resolve().parent.parent / "profiles"


def available_profiles() -> list[tuple[str, str]]:
    """``(gpu, model)`` pairs that have a fitted ``infermax_linear.json`` on disk, sorted."""
    return sorted((p.parent.parent.name, p.parent.name) for p in profiles_dir().glob(f"*/*/{LINEAR_JSON}"))


COST_MODEL_KINDS = ("auto", "linear")


def load_cost_model(gpu: str = "a100", model: str = "llama-2-7b", tp: int = 1, path: str | Path | None = None,
                    kind: str = "auto") -> LinearCostModel:
    """The fitted model of family ``kind`` for ``gpu``/``model`` (TP=1), or the one in an explicit JSON ``path``.

    ``kind``: ``linear`` (the paper's model) or ``auto`` (the most accurate family fitted).
    """
    if kind not in COST_MODEL_KINDS:
        raise ValueError(f"unknown cost-model kind {kind!r}; choose one of {', '.join(COST_MODEL_KINDS)}")
    if path is not None:
        return LinearCostModel.from_json(path)
    file = profiles_dir() / gpu / model / LINEAR_JSON
    if tp == 1 and file.is_file():
        return LinearCostModel.from_json(file)
    found = ", ".join(f"{g}/{m}" for g, m in available_profiles()) or "none"
    raise ValueError(
        f"no fitted cost model for gpu={gpu!r} model={model!r} tp={tp} (only tp=1 profiles exist) in {profiles_dir()}; "
        f"available gpu/model: {found}. To add one, put vidur_mlp.csv and a vidur_attention*.csv in "
        f"profiles/{gpu}/{model}/ and run: python -m infermax.costmodel.fitting profiles/{gpu}/{model}")
