"""Reading text and JSON files, shared by the file formats (schedules, cost models, results, sweep specs, traces)."""

from __future__ import annotations

import json
import math
from numbers import Integral, Real
from pathlib import Path
from typing import Any


def read_utf8(path: str | Path) -> str:
    """A text file's contents, read as UTF-8 with a leading byte-order mark dropped (editors and spreadsheets on
    Windows write one); a file that is not UTF-8 text (a binary file given by mistake) raises a ValueError naming it."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(not_utf8_message(path, exc)) from None
    except IsADirectoryError:  # (`validate DIR` ended in this traceback)
        raise ValueError(f"{path}: is a directory, not a file") from None


def not_utf8_message(path: str | Path, exc: UnicodeDecodeError) -> str:
    return f"{path}: not a UTF-8 text file (byte {exc.start} cannot be decoded)"


def read_json(path: str | Path) -> Any:
    """Parse a JSON file (`read_utf8`); a syntax error, or arrays and objects nested deeper than Python's parser
    recurses (about a thousand levels; no InferMax file nests beyond six), becomes a ValueError naming the file."""
    path = Path(path)
    text = read_utf8(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    except RecursionError:
        raise ValueError(f"{path}: not an InferMax file (JSON nested too deeply to read)") from None


def nan_to_null(d: dict) -> dict:
    """A copy of a flat dict with NaN and infinite floats replaced by None (JSON has neither)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def plain_number(value: object) -> int | float:
    """``json.dumps``'s ``default``: a number from numpy or pandas (a Python-built schedule's np.int64 chunk sizes)
    as the Python number it equals; anything else is refused as json refuses it."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
