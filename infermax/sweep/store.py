"""A sweep's results directory: one small JSON file per finished point, and the consolidated table.

Layout of ``out_dir``::

    points/<point id>.json    one per finished point, written atomically (temp file, fsync, rename)
    results.parquet           the consolidated table, rewritten atomically when the sweep completes
    .lock                     held (flock) while a sweep runs, so two runs never share a directory

A point file exists only once its point is complete, so a sweep killed at any instant (even by
SIGKILL) leaves only whole files; a rerun reads them and computes only the missing points.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import pandas as pd

RESULTS_FILE = "results.parquet"


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(temp_path)``, fsync, and rename over ``path``: readers see the old or the whole new file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultStore:
    """The finished points of one results directory."""

    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        self.points_dir = self.out_dir / "points"
        self._lock_file = None

    def __enter__(self) -> "ResultStore":
        self.points_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.out_dir / ".lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise RuntimeError(f"{self.out_dir} is in use by another running sweep") from None
        for folder in (self.out_dir, self.points_dir):  # temp files of a writer killed mid-write
            for stale in folder.glob(".*.tmp"):
                stale.unlink()
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        self._lock_file.close()

    def path(self, pid: str) -> Path:
        return self.points_dir / f"{pid}.json"

    def load(self, pid: str, kind: str, config: dict) -> dict | None:
        """The stored record of a point, or None if it is not finished (or its file does not match)."""
        try:
            record = json.loads(self.path(pid).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if record.get("kind") != kind or record.get("config") != config or "result" not in record:
            return None
        return record

    def save(self, record: dict) -> None:
        atomic_write(self.path(record["id"]), lambda tmp: Path(tmp).write_text(json.dumps(record)))

    def write_table(self, records: list[dict]) -> Path:
        """Write the consolidated table (one row per record, in the given order) atomically."""
        path = self.out_dir / RESULTS_FILE
        atomic_write(path, lambda tmp: results_table(records).to_parquet(tmp, index=False))
        return path


def results_table(records: list[dict]) -> pd.DataFrame:
    """One row per point: ``point_id``, every configuration field, then every result column."""
    rows = [{"point_id": r["id"], **r["config"], **r["result"]} for r in records]
    return pd.DataFrame(rows)
