"""`sparkserve image ship|verify`: the same image ID on every node (logic: sparkserve.deploy.image)."""

from __future__ import annotations

from typing import Annotated

import typer

from sparkserve.commands._common import ConfigOpt, JsonOpt, config_from, emit_json, err_console
from sparkserve.deploy.image import ship_image_everywhere, ship_source, verify_image
from sparkserve.nodes.factory import open_nodes

image_app = typer.Typer(help="The engine image on every node: ship it, verify the same ID everywhere.",
                        no_args_is_help=True)


@image_app.command("verify")
def verify_cmd(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    """Print the image ID of image.ref on every node; exit 1 unless they are all present and equal."""
    cfg = config_from(config)
    with open_nodes(cfg) as nodes:
        check = verify_image(cfg, nodes)
    if json_out:
        emit_json(check.as_json())
    else:
        for name, i in check.image_ids.items():
            print(f"{name}: {i or 'MISSING'}")
        print("same image on every node" if check.ok else "NOT the same image on every node")
    if not check.ok:
        raise typer.Exit(1)


@image_app.command("ship")
def ship_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    source: Annotated[str | None, typer.Option("--from", help="node to copy from (default: the head)")] = None,
) -> None:
    """Copy image.ref from one node (default: the head) to every node that lacks it or has another ID."""
    def say(line: str) -> None:
        err_console.print(f"· {line}", highlight=False)

    cfg = config_from(config)
    ship_source(cfg, source)  # a wrong --from is usage (exit 2): before any node is touched
    with open_nodes(cfg) as nodes:
        result = ship_image_everywhere(cfg, nodes, source, say=None if json_out else say)
    if json_out:
        emit_json(result.as_json())
    elif not result.shipped:
        print(f"{result.ref} is already {result.image_id[:19]} on every node")
    else:
        for name, r in result.shipped.items():
            print(f"{name}: {r.bytes / 1e6:.0f} MB in {round(r.seconds, 2)}s ({round(r.mb_per_s, 1)} MB/s)")


def register(app: typer.Typer) -> None:
    app.add_typer(image_app, name="image")
