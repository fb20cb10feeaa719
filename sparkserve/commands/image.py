"""`sparkserve image build|verify|ship|series-check`: make the image, and the same image on every node
(logic: sparkserve.image.build, sparkserve.image.verify, sparkserve.image.series)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from sparkserve.commands._common import ConfigOpt, JsonOpt, config_from, emit_json, err_console
from sparkserve.errors import BadInput

image_app = typer.Typer(help="The engine image: build it, ship it node to node, verify one image everywhere.",
                        no_args_is_help=True)

RecipeOpt = Annotated[Path | None, typer.Option("--recipe", help="recipe YAML (default: docker/recipe.yaml)")]


def _say(line: str) -> None:
    err_console.print(f"· {line}", highlight=False)


BUILD_HELP = """Build the recipe's image on the head over SSH (or --local), smoke-test it, tag it <name>:<lock>.

Lanes, by recipe: docker/recipe.yaml (the default) is the model card's image rebuilt from its fork base,
pinned by digest, with its two sha256-gated overlay files and its build gate; docker/recipes/card-prebuilt.yaml
uses the card's published image as it is (pulled by digest, checked with the same facts, no build);
docker/recipes/upstream-0.33.0.yaml is EXPERIMENTAL (stock vLLM 0.33.0, overlay or --lane source): it is known
to die on SM121 at FlashInfer sparse-MLA warmup ("Failed to run MLA, error: invalid argument"). The source
lane builds only natively on an aarch64 SM12x node. After the build a GPU smoke stage runs the image with
--gpus all; on a node without a GPU it says so and the image stays marked "not GPU-verified".
"""


@image_app.command("build", help=BUILD_HELP)
def build_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    recipe: RecipeOpt = None,
    lane: Annotated[str | None, typer.Option("--lane", help="overlay | prebuilt | source (default: the recipe's; "
                                             "source: only with a recipe that has a source section, such as the "
                                             "EXPERIMENTAL upstream-0.33.0)")] = None,
    local: Annotated[bool, typer.Option("--local", help="build on this machine instead of the head node")] = False,
    relock: Annotated[bool, typer.Option("--relock", help="resolve the pins (base or CUDA images, vLLM commit) and "
                                         "read the lock's facts from the image first, rewriting the lock")] = False,
    lock_only: Annotated[bool, typer.Option("--lock-only", help="re-lock (implies --relock) and stop: no "
                                            "build")] = False,
    push: Annotated[str | None, typer.Option("--push", help="also push the image as this reference")] = None,
    platform: Annotated[str | None, typer.Option("--platform", help="e.g. linux/arm64 (qemu on x86)")] = None,
    no_smoke_import: Annotated[bool, typer.Option("--no-smoke-import",
                                                  help="skip `import vllm` in the smoke test (an image "
                                                  "without torch, such as a test stand-in)")] = False,
    gpu_capability: Annotated[str, typer.Option("--gpu-capability", help="the compute capability the GPU smoke "
                                                "stage requires of the build node's GPU")] = "12.1",
    log: Annotated[Path | None, typer.Option("--log", help="where to save the full build log")] = None,
) -> None:
    import os

    from sparkserve.image.build import build_image
    from sparkserve.image.context import default_recipe, load_recipe_files, overlay_bytes, write_lock
    from sparkserve.image.relock import effective_recipe, require_lock
    from sparkserve.image.relock import relock as do_relock

    if lane not in (None, "overlay", "prebuilt", "source"):
        raise BadInput("--lane", f"{lane!r} is not overlay, prebuilt or source")
    if not re.fullmatch(r"\d+\.\d+|auto", gpu_capability):
        raise BadInput("--gpu-capability", f"{gpu_capability!r} is not major.minor (e.g. 12.1) or auto")
    relock = relock or lock_only
    files = load_recipe_files(recipe or default_recipe())
    effective_recipe(files, lane)  # a lane the recipe cannot build is exit 2 before any node is touched
    lock = None if relock else require_lock(files, lane)  # so is a stale lock
    overlays = overlay_bytes(files)  # and an overlay whose bytes are not its sha256
    cfg = config_from(config, nodes=not local, replicas=True)  # --local: this machine, no node (no hosts needed)
    say = None if json_out else _say
    if files.recipe.experimental:
        err_console.print(f"warning: {files.path.name} is EXPERIMENTAL: {files.recipe.experimental}",
                          highlight=False, markup=False, soft_wrap=True)

    def on(node):  # type: ignore[no-untyped-def]
        locked = lock
        if locked is None:
            locked = do_relock(node, files, lane=lane, say=say, overlays=overlays)
            write_lock(files, locked)
            if say:
                say(f"wrote {files.lock_path}")
        if lock_only:
            return locked
        if (lane or files.recipe.lane) == "prebuilt":
            from sparkserve.image.prebuilt import use_prebuilt

            return use_prebuilt(node, files, locked, overlays=overlays, push=push, say=say,
                                gpu_capability=gpu_capability)
        return build_image(node, files, locked, lane=lane, push=push, platform=platform, log_path=log,
                           smoke_import=None if no_smoke_import else "vllm", say=say, overlays=overlays,
                           gpu_capability=gpu_capability)

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
    _print_build(result, files.lock_path, json_out)


def _print_build(result, lock_path: Path, json_out: bool) -> None:  # type: ignore[no-untyped-def]
    from sparkserve.image.build import BuildResult
    from sparkserve.image.recipe import lock_digest

    if not isinstance(result, BuildResult):  # --lock-only: the lock
        if json_out:
            emit_json({"lock": str(lock_path), "lane": result.lane, "lock_sha256": lock_digest(result)})
        else:
            print(f"{lock_path}: {result.lane} lane, lock sha256 {lock_digest(result)[:12]}")
        return
    gpu = result.gpu or {}
    if not gpu.get("ran"):  # loud on stderr even with --json: the image is not proven on a GPU
        err_console.print(f"warning: the GPU smoke stage did not run ({gpu.get('why') or 'no GPU'}): {result.tag} "
                          "is NOT GPU-verified (image verify shows it)", highlight=False, markup=False, soft_wrap=True)
    if json_out:
        emit_json(result.as_json())
    else:
        verified = "GPU smoke passed" if gpu.get("ok") else "NOT GPU-verified"
        print(f"{result.tag} built on {result.node} in {result.seconds:.1f}s: {result.image_id[:19]} "
              f"(fingerprint {result.fingerprint[:19]}); smoke test passed; {verified}; log {result.log_path}")
        if result.pushed:
            print(f"pushed {result.pushed}")


@image_app.command("verify")
def verify_cmd(config: ConfigOpt = None, json_out: JsonOpt = False,
               no_facts: Annotated[bool, typer.Option("--no-facts", help="compare fingerprints only")] = False
               ) -> None:
    """Print the fingerprint (and raw ID) of image.ref on every node and compare the image facts; exit 1
    unless they are all present and equal."""
    from sparkserve.image.verify import verify_image
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config, replicas=True)
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
        if check.base:
            print(check.base["line"])
        if check.gpu_line:
            print(check.gpu_line)
        if check.requires_warning:
            print(f"warning: {check.requires_warning}")
        if check.ok:
            print("same image on every node")
        elif check.problem is None:
            print("same image on every node, but its facts are not what they must be (above)")
        else:
            print("NOT the same image on every node")
    if not check.ok:
        raise typer.Exit(1)


@dataclass(frozen=True)
class ShipRow:
    """One target's transfer so far: bytes sent, layer bytes it lacks (the total), seconds since the start."""

    sent: int
    total: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    @property
    def percent(self) -> float:  # tar headers (stream) or compression (registry) move it off 100 at the end
        return min(100.0, 100.0 * self.sent / self.total) if self.total else 100.0


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def ship_line(source: str, node: str, row: ShipRow) -> str:
    """The plain progress line (not a terminal): ``node-a → node-b: 12.3 MB of 45.6 MB (27%), 5.1 MB/s``."""
    return (f"{source} → {node}: {_mb(row.sent)} of {_mb(row.total)} ({row.percent:.0f}%), "
            f"{_mb(row.rate)}/s")


def ship_table(source: str, rows: dict[str, ShipRow], elapsed: float, via: str = "stream") -> Table:
    """The live view on a terminal: per target a bar, bytes sent of the total, bytes/s (pure)."""
    t = Table(title=f"shipping from {source} ({via}) — {elapsed:.0f}s", title_justify="left")
    t.add_column("target", no_wrap=True)
    t.add_column("", no_wrap=True, min_width=22)
    t.add_column("sent", no_wrap=True, justify="right")
    t.add_column("of", no_wrap=True, justify="right")
    t.add_column("rate", no_wrap=True, justify="right")
    for node, row in rows.items():
        t.add_row(node, ProgressBar(total=100.0, completed=row.percent, width=20), _mb(row.sent), _mb(row.total),
                  f"{_mb(row.rate)}/s")
    return t


class ShipView:
    """`image ship`'s progress on stderr: a live table on a terminal, else one line per target every
    ``every_s`` (and the first); nothing when disabled (--json)."""

    def __init__(self, source: str, via: str, *, enabled: bool = True, console: Console | None = None,
                 every_s: float = 5.0) -> None:
        self.source, self.via, self.enabled, self.every_s = source, via, enabled, every_s
        self.console = console or err_console
        self.rows: dict[str, ShipRow] = {}
        self._printed: dict[str, float] = {}
        self._live: Live | None = None
        self._t0 = time.monotonic()

    def __enter__(self) -> ShipView:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()  # not transient: the last table stays as the summary
            self._live = None

    def update(self, node: str, sent: int, total: int, seconds: float) -> None:
        if not self.enabled:
            return
        row = self.rows[node] = ShipRow(sent, total, seconds)
        if self.console.is_terminal:
            table = ship_table(self.source, self.rows, time.monotonic() - self._t0, self.via)
            if self._live is None:
                self._live = Live(table, console=self.console, refresh_per_second=4, transient=False)
                self._live.start()
            else:
                self._live.update(table)
            return
        last = self._printed.get(node)
        if last is None or seconds - last >= self.every_s:
            self._printed[node] = seconds
            self.console.print(ship_line(self.source, node, row), highlight=False, markup=False, soft_wrap=True)


@image_app.command("ship")
def ship_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    source: Annotated[str | None, typer.Option("--from", help="node to copy from (default: the head)")] = None,
    via: Annotated[str, typer.Option("--via", help="stream (docker save, only missing layers) | registry (a "
                                     "temporary registry on the source node, removed afterwards)")] = "stream",
) -> None:
    """Copy image.ref from one node (default: the head) to every other node in parallel, node to node,
    sending each only the layers it lacks; then verify the fingerprint on each."""
    from sparkserve.image.verify import ship_image_everywhere, ship_source, ship_via
    from sparkserve.nodes.factory import open_nodes

    ship_via(via)  # usage errors (exit 2) before any node is touched
    cfg = config_from(config, replicas=True)
    src = ship_source(cfg, source)
    with open_nodes(cfg) as nodes, ShipView(src, via, enabled=not json_out) as view:
        result = ship_image_everywhere(cfg, nodes, source, say=None if json_out else _say, progress=view.update,
                                       via=via)
    if json_out:
        emit_json(result.as_json())
        return
    for name, r in result.shipped.items():
        if r.how == "registry":
            print(f"{name}: {r.bytes / 1e6:.1f} MB pulled from {result.source}'s temporary registry in "
                  f"{r.seconds:.2f}s ({r.mb_per_s:.1f} MB/s; push into it {r.push_seconds:.2f}s)")
        elif r.how == "stream":
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
    from sparkserve.image.context import default_recipe, load_recipe_files
    from sparkserve.image.series import check_series_on_wheel

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
