"""`sparkserve image build|verify|ship|series-check`: make the image, and the same image on every node
(logic: sparkserve.deploy.image_build, sparkserve.deploy.image, sparkserve.deploy.image_series)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sparkserve.commands._common import ConfigOpt, JsonOpt, config_from, emit_json, err_console
from sparkserve.errors import BadInput

image_app = typer.Typer(help="The engine image: build it, ship it node to node, verify one image everywhere.",
                        no_args_is_help=True)

RecipeOpt = Annotated[Path | None, typer.Option("--recipe", help="recipe YAML (default: docker/recipe.yaml)")]


def _say(line: str) -> None:
    err_console.print(f"· {line}", highlight=False)


@image_app.command("build")
def build_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    recipe: RecipeOpt = None,
    lane: Annotated[str | None, typer.Option("--lane", help="overlay | source (default: the recipe's)")] = None,
    local: Annotated[bool, typer.Option("--local", help="build on this machine instead of the head node")] = False,
    relock: Annotated[bool, typer.Option("--relock", help="resolve the base and re-digest the series first, "
                                         "rewriting the lock")] = False,
    push: Annotated[str | None, typer.Option("--push", help="also push the image as this reference")] = None,
    platform: Annotated[str | None, typer.Option("--platform", help="e.g. linux/arm64 (qemu on x86)")] = None,
    no_smoke_import: Annotated[bool, typer.Option("--no-smoke-import",
                                                  help="skip `import vllm` in the smoke test (an image "
                                                  "without torch, such as a test stand-in)")] = False,
    log: Annotated[Path | None, typer.Option("--log", help="where to save the full build log")] = None,
) -> None:
    """Build the recipe's image on the head over SSH (or --local), smoke-test it, tag it <name>:<lock>."""
    import os

    from sparkserve.deploy.image_build import (
        build_image,
        default_recipe,
        load_recipe_files,
        require_lock,
        write_lock,
    )
    from sparkserve.deploy.image_build import (
        relock as do_relock,
    )

    if lane not in (None, "overlay", "source"):
        raise BadInput("--lane", f"{lane!r} is not overlay or source")
    files = load_recipe_files(recipe or default_recipe())
    lock = None if relock else require_lock(files)  # a stale lock is exit 2 before any node is touched
    cfg = config_from(config)
    say = None if json_out else _say

    def on(node):  # type: ignore[no-untyped-def]
        locked = lock
        if locked is None:
            locked = do_relock(node, files, say=say)
            write_lock(files, locked)
            if say:
                say(f"wrote {files.lock_path}")
        return build_image(node, files, locked, lane=lane, push=push, platform=platform, log_path=log,
                           smoke_import=None if no_smoke_import else "vllm", say=say)

    if local:
        from sparkserve.nodes.local import LocalNode

        node = LocalNode(cfg.head.name, docker_host=os.environ.get("DOCKER_HOST"))
        try:
            result = on(node)
        finally:
            node.close()
    else:
        from sparkserve.nodes.factory import open_nodes

        with open_nodes(cfg, names=[cfg.head.name]) as nodes:
            result = on(nodes[cfg.head.name])
    if json_out:
        emit_json(result.as_json())
    else:
        print(f"{result.tag} built on {result.node} in {result.seconds:.1f}s: {result.image_id[:19]} "
              f"(fingerprint {result.fingerprint[:19]}); smoke test passed; log {result.log_path}")
        if result.pushed:
            print(f"pushed {result.pushed}")


@image_app.command("verify")
def verify_cmd(config: ConfigOpt = None, json_out: JsonOpt = False,
               no_facts: Annotated[bool, typer.Option("--no-facts", help="compare fingerprints only")] = False
               ) -> None:
    """Print the fingerprint (and raw ID) of image.ref on every node and compare the image facts; exit 1
    unless they are all present and equal."""
    from sparkserve.deploy.image import verify_image
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config)
    with open_nodes(cfg) as nodes:
        check = verify_image(cfg, nodes, facts=not no_facts)
    if json_out:
        emit_json(check.as_json())
    else:
        for name, fp in check.fingerprints.items():
            raw = check.image_ids.get(name)
            print(f"{name}: {fp or 'MISSING'}" + (f" (id {raw[:19]})" if raw else ""))
        for p in check.problems():
            print(f"  {p}")
        if check.ok:
            print("same image on every node")
        elif check.problem is None:
            print("same image on every node, but its facts are not what they must be (above)")
        else:
            print("NOT the same image on every node")
    if not check.ok:
        raise typer.Exit(1)


@image_app.command("ship")
def ship_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    source: Annotated[str | None, typer.Option("--from", help="node to copy from (default: the head)")] = None,
) -> None:
    """Copy image.ref from one node (default: the head) to every other node in parallel, node to node,
    sending each only the layers it lacks; then verify the fingerprint on each."""
    from sparkserve.deploy.image import ship_image_everywhere, ship_source
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config)
    ship_source(cfg, source)  # a wrong --from is usage (exit 2): before any node is touched
    with open_nodes(cfg) as nodes:
        result = ship_image_everywhere(cfg, nodes, source, say=None if json_out else _say)
    if json_out:
        emit_json(result.as_json())
        return
    for name, r in result.shipped.items():
        if r.how == "stream":
            print(f"{name}: {r.bytes / 1e6:.1f} MB sent ({r.skipped_bytes / 1e6:.1f} MB of layers it had "
                  f"left out) in {r.seconds:.2f}s ({r.mb_per_s:.1f} MB/s)")
        else:
            print(f"{name}: {r.how}, 0 bytes")
    print(f"{result.ref} is {result.fingerprint[:19]} on every node")


@image_app.command("series-check")
def series_check_cmd(
    wheel: Annotated[list[Path], typer.Option("--wheel", help="a vllm wheel to apply the series to (repeat)")],
    recipe: RecipeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Apply the recipe's series to each wheel (unpacked in a temp dir) with the lock's digests; the files
    that then differ from the wheel's RECORD must be exactly the series' files. Exit 1 on any difference."""
    from sparkserve.deploy.image_build import default_recipe, load_recipe_files
    from sparkserve.deploy.image_series import check_series_on_wheel

    files = load_recipe_files(recipe or default_recipe())
    results = [check_series_on_wheel(files, w) for w in wheel]
    if json_out:
        emit_json({"ok": all(r.ok for r in results), "wheels": [r.as_json() for r in results]})
    else:
        for r in results:
            print(f"{r.wheel.name}: {'ok' if r.ok else 'FAILED'}: {r.summary}")
    if not all(r.ok for r in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(image_app, name="image")
