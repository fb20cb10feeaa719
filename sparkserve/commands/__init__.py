"""Typer command groups. Each module exposes ``register(app)`` and keeps commands thin."""
