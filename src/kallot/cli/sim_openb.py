"""CLI commands: placeholder until its issue lands (owned by one engineer; see docs/)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    del app
