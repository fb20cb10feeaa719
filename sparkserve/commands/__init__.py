"""Typer command groups. Each module exposes ``register(app)`` and keeps commands thin.

May import: everything below it (ground through operate/); never ``cli.py`` (the process entry stands on this
stage) nor ``docgen/`` (it documents this stage from above)."""
