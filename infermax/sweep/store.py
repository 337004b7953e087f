"""A sweep's results directory: one small JSON file per finished point, and the consolidated table.

Layout of ``out_dir``::

    points/<point id>.json    one per finished point, written atomically (temp file, fsync, rename)
    results.parquet           the consolidated table, rewritten atomically when the sweep completes
    .lock                     held (flock) while a sweep runs, so two runs never share a directory

A point file exists only once its point is complete, so a sweep killed at any instant (even by
SIGKILL) leaves only whole files; a rerun reads them and computes only the missing points. A point
without a file is also finished when the consolidated table holds its row computed from the same
inputs (the table's ``inputs`` column): committed results (``experiments/results/``, whose point
files are not in git) resume without recomputing, and a table that would come out unchanged is not
rewritten. Files get the mode the umask gives (not ``mkstemp``'s 0600).
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call ``write(temp_path)``, fsync, and rename over ``path``: readers see the old or the whole new file,
    with the mode a plain ``open`` would give it (0666 less the umask)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
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
        self._table: dict[str, dict] | None = None  # rows of the existing results table by point id

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
        """The stored record of a point, or None if it is not finished (or its file is damaged or does not
        match). Without a point file, the row of the consolidated table (``from_table`` in the record; the caller checks its
        ``inputs`` as for a file)."""
        try:
            record = json.loads(self.path(pid).read_text())
        except FileNotFoundError:
            return self._table_record(pid, kind, config)
        except json.JSONDecodeError:
            return None
        if record.get("kind") != kind or record.get("config") != config or "result" not in record:
            return None
        return record

    def _table_record(self, pid: str, kind: str, config: dict) -> dict | None:
        if self._table is None:
            self._table = {}
            path = self.out_dir / RESULTS_FILE
            if path.is_file():
                table = pd.read_parquet(path)
                if {"point_id", "inputs"} <= set(table.columns):
                    rows = table.astype(object).where(table.notna(), None).to_dict("records")
                    self._table = {row["point_id"]: row for row in rows}
        row = self._table.get(pid)  # the id hashes the kind and the whole configuration
        if row is None:
            return None
        result = {k: v for k, v in row.items() if k != "point_id" and k != "inputs" and k not in config}
        return {"id": pid, "kind": kind, "config": config, "inputs": row["inputs"], "result": result,
                "from_table": True}

    def table_is_current(self, records: list[dict]) -> bool:
        """Whether the consolidated table already holds exactly ``records`` (every one read from it, same order)."""
        return (self._table is not None and all(r.get("from_table") for r in records)
                and list(self._table) == [r["id"] for r in records])

    def save(self, record: dict) -> None:
        atomic_write(self.path(record["id"]), lambda tmp: Path(tmp).write_text(json.dumps(record)))

    def write_table(self, records: list[dict]) -> Path:
        """Write the consolidated table (one row per record, in the given order) atomically."""
        path = self.out_dir / RESULTS_FILE
        atomic_write(path, lambda tmp: results_table(records).to_parquet(tmp, index=False))
        return path


def results_table(records: list[dict]) -> pd.DataFrame:
    """One row per point: ``point_id``, every configuration field, every result column, then ``inputs`` (what
    the result was computed from beyond its configuration, e.g. the cost model's hash; see ``PointKind``)."""
    rows = [{"point_id": r["id"], **r["config"], **r["result"], "inputs": r["inputs"]} for r in records]
    return pd.DataFrame(rows)
