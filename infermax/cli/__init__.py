"""The ``infermax`` command line. Each module registers its commands on the shared ``app``."""

from .common import app
from . import costmodel, info, plot, run, sweep  # noqa: F401  (importing registers the commands)
from . import capacity  # noqa: F401,E402  (Apt-Serve issue: effective throughput)

__all__ = ["app"]
