"""Options and output helpers shared by the command modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from sparkserve.commands.jsonschema import JSON_SCHEMA
from sparkserve.config import Config, load_config, refuse_placeholders
from sparkserve.errors import BadInput

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="sparkserve.yaml (default: $SPARKSERVE_CONFIG, else ./sparkserve.yaml)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]

console = Console()
err_console = Console(stderr=True)


AcceptNew = Annotated[bool, typer.Option("--accept-new-host-keys",
                                         help="add unknown SSH host keys to known_hosts (default: refuse them)")]


def config_from(path: Path | None, *, accept_new: bool = False, check: bool = False, nodes: bool = True,
                replicas: bool = False) -> Config:
    """The config a command runs with. ``accept_new`` is ``--accept-new-host-keys`` (ssh trusts a host key
    it has never seen and records it) for this run only; ``check`` applies the config's own rules too, so
    a bad config fails (BadInput, exit 2) before any node is touched. ``nodes``: the command reaches the
    nodes, so it needs a config file (never the embedded default) whose hosts are not init's placeholders."""
    cfg = load_config(path, require_file=nodes)
    if cfg.replicas > 1 and not replicas:  # a command that would treat N stacks as one: refused (exit 2)
        raise BadInput("replicas", f"this command is not replica-aware yet (replicas: {cfg.replicas}); run it with a "
                       "config holding one replica's nodes and replicas: 1 (`up`, `down`, `status`, `swap-drafter`, "
                       "`supervise`, `render`, `doctor`, `image`, `bench` and `ab` know replicas)")
    if nodes:
        refuse_placeholders(cfg)
    if accept_new:
        cfg.ssh.accept_new_host_keys = True
    if check:
        from sparkserve.plan.validate import check_config

        check_config(cfg).raise_first()
    return cfg


def emit_json(obj: Any) -> None:
    """Print ``obj`` as the command's --json output: one document, ``"schema": JSON_SCHEMA`` first."""
    if isinstance(obj, dict) and "schema" not in obj:
        obj = {"schema": JSON_SCHEMA, **obj}
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
