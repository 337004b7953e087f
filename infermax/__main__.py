"""``python -m infermax`` runs the command line."""

from .cli import app

app(prog_name="infermax")
