"""Commands (placeholder: filled by the owning work item)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
