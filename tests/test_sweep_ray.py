"""The Ray backend gives the same table as local processes (one local Ray instance, 2 CPUs)."""

from __future__ import annotations

import pandas as pd
import pytest

ray = pytest.importorskip("ray")  # not in the `test` extra: runs where `pip install -e ".[ray]"` put it

from infermax.sweep import parse_spec, run_sweep  # noqa: E402
from infermax.sweep import ray_backend  # noqa: E402

SPEC = {"name": "ray", "base": {"B": 16, "O": 8, "M": 300, "cost_model": "linear"},
        "axes": {"scheduler": ["vllm", "sarathi-ef"], "I": [8, 64, 300]}}  # I=300 never fits M: an error row


@pytest.fixture(scope="module")
def local_ray():
    ray_backend.connect(num_cpus=2)
    yield
    ray.shutdown()


def test_ray_and_local_tables_are_identical(local_ray, tmp_path):
    spec = parse_spec(SPEC)
    local = run_sweep(spec, tmp_path / "local", jobs=2)
    remote = run_sweep(spec, tmp_path / "ray", backend="ray")
    assert (remote.points, remote.computed, remote.errors) == (6, 6, 2)
    table = pd.read_parquet(remote.table)
    pd.testing.assert_frame_equal(pd.read_parquet(local.table), table)
    assert list(table.status) == ["ok", "ok", "error"] * 2
    resumed = run_sweep(spec, tmp_path / "ray", backend="ray")
    assert (resumed.cached, resumed.computed) == (6, 0)


def test_workers_import_this_checkout(local_ray):
    @ray.remote
    def where():
        import infermax

        return infermax.__file__

    assert ray.get(where.remote()).startswith(ray_backend.PACKAGE_ROOT)
