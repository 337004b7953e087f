"""The ``infermax`` command line. Each module registers its commands on the shared ``app``."""

from .common import app
from . import capacity, costmodel, info, optimize, plot, profile, run, sweep  # noqa: F401  (importing registers the commands)

__all__ = ["app"]
