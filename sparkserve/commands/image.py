"""`sparkserve image ship|verify`: the same image ID on every node."""

from __future__ import annotations

from typing import Annotated

import typer

from sparkserve.commands._common import ConfigOpt, JsonOpt, config_from, emit_json, err_console
from sparkserve.errors import RemoteFailure
from sparkserve.nodes.engine import Engine, ship_image
from sparkserve.nodes.factory import open_nodes
from sparkserve.nodes.parallel import on_all

image_app = typer.Typer(help="The engine image on every node: ship it, verify the same ID everywhere.",
                        no_args_is_help=True)


@image_app.command("verify")
def verify_cmd(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    """Print the image ID of image.ref on every node; exit 1 unless they are all present and equal."""
    cfg = config_from(config)
    with open_nodes(cfg) as nodes:
        ids = on_all([nodes[n.name] for n in cfg.nodes], lambda n: Engine(n).image_id(cfg.image.ref),
                     name=lambda n: n.name)
    ok = all(ids.values()) and len(set(ids.values())) == 1
    if json_out:
        emit_json({"ok": ok, "ref": cfg.image.ref, "image_ids": ids})
    else:
        for name, i in ids.items():
            print(f"{name}: {i or 'MISSING'}")
        print("same image on every node" if ok else "NOT the same image on every node")
    if not ok:
        raise typer.Exit(1)


@image_app.command("ship")
def ship_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    source: Annotated[str | None, typer.Option("--from", help="node to copy from (default: the head)")] = None,
) -> None:
    """Copy image.ref from one node (default: the head) to every node that lacks it or has another ID."""
    cfg = config_from(config)
    src_name = source or cfg.head.name
    if src_name not in {n.name for n in cfg.nodes}:
        raise RemoteFailure("--from", f"no node named {src_name!r}")
    with open_nodes(cfg) as nodes:
        ids = on_all([nodes[n.name] for n in cfg.nodes], lambda n: Engine(n).image_id(cfg.image.ref),
                     name=lambda n: n.name)
        want = ids[src_name]
        if want is None:
            raise RemoteFailure(f"{src_name}: image", f"{cfg.image.ref} is not on {src_name}; nothing to ship")
        targets = [n for n in cfg.nodes if ids[n.name] != want]
        reports = {}
        for n in targets:
            if not json_out:
                err_console.print(f"· shipping {cfg.image.ref} {src_name} → {n.name}", highlight=False)
            r = ship_image(nodes[src_name], nodes[n.name], cfg.image.ref)
            reports[n.name] = {"bytes": r.bytes, "seconds": round(r.seconds, 2), "mb_per_s": round(r.mb_per_s, 1)}
    if json_out:
        emit_json({"ref": cfg.image.ref, "image_id": want, "shipped": reports})
    elif not reports:
        print(f"{cfg.image.ref} is already {want[:19]} on every node")
    else:
        for name, r in reports.items():
            print(f"{name}: {r['bytes'] / 1e6:.0f} MB in {r['seconds']}s ({r['mb_per_s']} MB/s)")


def register(app: typer.Typer) -> None:
    app.add_typer(image_app, name="image")
