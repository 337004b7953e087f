"""The Ray backend: the same points, computed as Ray tasks on a local instance or a cluster.

Workers must import the same ``infermax`` as the driver: the driver's package directory is put on
the workers' ``PYTHONPATH`` (enough on one machine or a shared filesystem; elsewhere install
InferMax on every node). Results come back to the driver, which stores them, so workers need no
access to the results directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from .points import run_point

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _ray():
    try:
        import ray
    except ImportError:
        raise ValueError("the ray backend needs Ray: pip install 'infermax[ray]'") from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start a local Ray instance (``address`` None) or join a cluster, unless already connected."""
    ray = _ray()
    if ray.is_initialized():
        return
    path = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    options = {"runtime_env": {"env_vars": {"PYTHONPATH": path}}, "include_dashboard": False,
               "logging_level": "warning", "log_to_driver": False}
    if address is None:
        ray.init(num_cpus=num_cpus, **options)
    else:
        if num_cpus is not None:
            raise ValueError("--jobs applies to a local Ray instance; a cluster's size is its own")
        ray.init(address=address, **options)


def run(kind: str, configs: list[dict], address: str | None = None, num_cpus: int | None = None) -> Iterator[dict]:
    """Yield each point's record as its Ray task finishes."""
    if not configs:
        return
    ray = _ray()
    connect(address, num_cpus)
    task = ray.remote(num_cpus=1, max_retries=2)(run_point)
    pending = [task.remote(kind, c) for c in configs]
    try:
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                yield ray.get(ref)
    finally:
        for ref in pending:
            ray.cancel(ref)
