"""The ``infermax`` command line. Each module registers its commands on the shared ``app``."""

import inspect

from .common import app
from . import capacity, costmodel, info, optimize, plot, profile, run, sweep  # noqa: F401  (importing registers the commands)

__all__ = ["app"]


def _one_line_paragraphs(doc: str) -> str:
    """A command's docstring as its --help text: each paragraph on one line. Typer keeps the line breaks of every
    paragraph after the first, so a docstring wrapped at the source's width printed ragged lines ("the committed" /
    "results under experiments/results/ are not recomputed; …")."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


for _typer in [app] + [group.typer_instance for group in app.registered_groups]:
    for _command in _typer.registered_commands:
        if _command.help is None and _command.callback is not None and _command.callback.__doc__:
            _command.help = _one_line_paragraphs(_command.callback.__doc__)
