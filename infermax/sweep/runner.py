"""Run a sweep's points on local processes or a Ray cluster, keeping every finished point.

The driver alone writes results: each backend hands back finished records, which the driver stores
one file per point (``store.ResultStore``) as soon as they arrive; when every point is done it writes
the consolidated table in the spec's point order. The table depends only on the spec (point files
are keyed by a hash of the full configuration), so local and Ray runs give identical tables.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .points import get_kind, point_id, run_point
from .spec import SweepSpec
from .store import RESULTS_FILE, ResultStore

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class SweepReport:
    """What a run did: points in the spec, found already finished, computed now, and errors."""

    table: Path
    points: int
    cached: int
    computed: int
    errors: int
    compute_s: float
    wall_s: float
    table_written: bool = True  # False: the table already held exactly these results and was left as it was


def run_sweep(spec: SweepSpec, out_dir: str | Path | None = None, backend: str = "local", jobs: int | None = None,
              address: str | None = None, progress: bool = False, retry_errors: bool = False) -> SweepReport:
    """Compute every unfinished point of ``spec`` and write ``results.parquet`` in ``out_dir``.

    A point the simulator rejected (status ``error``, e.g. a request that never fits ``M``) is a finished
    point like any other and is kept on resume; ``retry_errors`` computes such points again (after a fix
    to something outside the configuration: the code, a trace or cost-model file)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if backend == "local" and address is not None:  # (these two before the progress bar is drawn)
        raise ValueError("--address applies to the ray backend only")
    if backend == "ray":
        from .ray_backend import _ray

        _ray()  # Ray importable, or a ValueError naming the install
    started = time.perf_counter()
    configs = spec.points()
    ids = [point_id(spec.kind, c) for c in configs]
    unique = dict(zip(ids, configs))  # the axes' values are distinct, so every point is too
    with ResultStore(out_dir or spec.default_out_dir()) as store:
        done = {pid: rec for pid, c in unique.items() if (rec := store.load(pid, spec.kind, c)) is not None
                and not (retry_errors and rec["result"]["status"] != "ok")}
        _check_inputs(spec.kind, done.values(), store.out_dir)
        todo = [(pid, c) for pid, c in unique.items() if pid not in done]
        cached, compute_s = len(done), 0.0
        execute = _run_ray if backend == "ray" else _run_local
        bar = _Bar(len(unique), cached, spec.name) if progress else nullcontext(None)
        with bar as tracker:
            for record in execute(spec.kind, [c for _, c in todo], jobs, address):
                store.save(record)
                done[record["id"]] = record
                compute_s += record["wall_s"]
                if tracker is not None:
                    tracker.advance(record["result"]["status"] != "ok")
        records = [done[pid] for pid in ids]
        written = not store.table_is_current(records)
        table = store.write_table(records) if written else store.out_dir / RESULTS_FILE
    errors = sum(r["result"]["status"] != "ok" for r in records)
    return SweepReport(table, len(unique), cached, len(todo), errors, compute_s, time.perf_counter() - started,
                       written)


def _check_inputs(kind: str, records, out_dir: Path) -> None:
    """Refuse to resume over points computed from other inputs (e.g. a refitted cost model)."""
    inputs = get_kind(kind).inputs
    stale = [r for r in records if r.get("inputs") != inputs(r["config"])]
    if stale:
        raise ValueError(f"{len(stale)} finished point(s) in {out_dir} were computed from other inputs than now "
                         f"(e.g. the cost model was refitted: {stale[0].get('inputs')} != {inputs(stale[0]['config'])}); "
                         f"use a new --out, or delete the folder to recompute")


def _run_local(kind: str, configs: list[dict], jobs: int | None, address: str | None) -> Iterator[dict]:
    jobs = min(jobs or os.cpu_count() or 1, max(len(configs), 1))
    if jobs == 1:
        for config in configs:
            yield run_point(kind, config)
        return
    with ProcessPoolExecutor(max_workers=jobs, initializer=_exit_with_parent, initargs=(os.getpid(),)) as pool:
        pending = {pool.submit(run_point, kind, c) for c in configs}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()


def _exit_with_parent(parent_pid: int) -> None:
    """Pool-worker initializer: exit as soon as the sweep process is gone (even after SIGKILL)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _run_ray(kind: str, configs: list[dict], jobs: int | None, address: str | None) -> Iterator[dict]:
    from . import ray_backend

    yield from ray_backend.run(kind, configs, address=address, num_cpus=jobs)


class _Bar:
    """Rich progress bar over points (finished ones already counted)."""

    def __init__(self, total: int, cached: int, name: str):
        from rich.markup import escape
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self.errors = 0
        self.progress = Progress(TextColumn(f"sweep {escape(name)}"), BarColumn(), MofNCompleteColumn(), TextColumn("points"),
                                 TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn(), TimeRemainingColumn())
        self.task = self.progress.add_task(name, total=total, completed=cached, errors=0)

    def advance(self, error: bool) -> None:
        self.errors += error
        self.progress.update(self.task, advance=1, errors=self.errors)

    def __enter__(self) -> "_Bar":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

