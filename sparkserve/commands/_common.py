"""Options and output helpers shared by the command modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from sparkserve.config import Config, load_config

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="sparkserve.yaml (default: ./sparkserve.yaml or the embedded default)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]

console = Console()
err_console = Console(stderr=True)


def config_from(path: Path | None) -> Config:
    return load_config(path)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
