"""Declarative sweeps: a TOML spec of axes over run configurations, run resumably in parallel
(local processes or Ray) into one tidy Parquet table."""

from .points import POINT_KINDS, PointKind, get_kind, point_id, register_kind, run_point
from .runner import BACKENDS, SweepReport, run_sweep
from .spec import SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["BACKENDS", "POINT_KINDS", "PointKind", "SpecError", "SweepReport", "SweepSpec", "get_kind", "load_spec",
           "parse_spec", "point_id", "register_kind", "run_point", "run_sweep"]
