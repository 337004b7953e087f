"""The ``infermax`` command line. Each module registers its commands on the shared ``app``."""

from .common import app
from . import info, optimize, run  # noqa: F401  (importing registers the commands)

__all__ = ["app"]
