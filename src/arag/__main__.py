"""``python -m arag`` runs the CLI."""

from arag.cli.main import app

app()
