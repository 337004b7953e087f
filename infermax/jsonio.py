"""JSON helpers shared by the file formats (schedules, cost models, results)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; a syntax error becomes a ValueError naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def nan_to_null(d: dict) -> dict:
    """A copy of a flat dict with NaN and infinite floats replaced by None (JSON has neither)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
