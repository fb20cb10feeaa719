"""The recipe's files on this machine and the build context they make: what every lane sends to a node.

    files = load_recipe_files(Path("docker/recipe.yaml"))   # recipe, series + patches, upstream checks, lock
    overlays = overlay_bytes(files)                         # each overlay checked against its sha256 here
    tar = build_context(files, lock, overlays)              # Dockerfile, tools/, series/, lock.json, overlays/

Nothing here touches a node: a bad recipe, a missing patch or an overlay whose sha256 is not the recipe's is
BadInput (exit 2) before any node is. The build itself is :mod:`sparkserve.image.build`; relock, prebuilt and
series send the same context.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

from sparkserve.errors import BadInput
from sparkserve.image.recipe import (
    Lock,
    Recipe,
    lock_json,
    overlay_plan,
    parse_lock,
    parse_recipe,
    series_names,
    sha256_hex,
)
from sparkserve.image.run import _tar, docker_dir


@dataclass
class RecipeFiles:
    """A recipe and the files it names, read on this machine."""

    path: Path
    recipe: Recipe
    lock_path: Path
    lock: Lock | None
    series_text: str
    series: list[tuple[str, bytes]]
    checks: bytes | None


def default_recipe() -> Path:
    return docker_dir() / "recipe.yaml"


def lock_path_for(recipe: Path) -> Path:
    return recipe.with_name(recipe.stem + ".lock.json")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise BadInput(str(path), f"cannot read the {what}: {e.strerror or e}") from None


def load_recipe_files(path: Path) -> RecipeFiles:
    """Read a recipe, its series and patches, its upstream checks and its lock (if there is one)."""
    recipe = parse_recipe(_read(path, "recipe").decode(errors="replace"), str(path))
    series_text, series = "", []
    if recipe.series:
        series_path = (path.parent / recipe.series).resolve()
        series_text = _read(series_path, "series file").decode(errors="replace")
        series = [(name, _read(series_path.parent / name, "patch")) for name in series_names(series_text)]
    checks = _read((path.parent / recipe.upstream_checks).resolve(), "upstream checks") \
        if recipe.upstream_checks else None
    lock_path = lock_path_for(path)
    lock = parse_lock(lock_path.read_text(), str(lock_path)) if lock_path.is_file() else None
    return RecipeFiles(path, recipe, lock_path, lock, series_text, series, checks)


TOOLS = ("apply_series.py", "image_facts.py", "gpu_smoke.py", "wheel_pins.py")


def context_files(files: RecipeFiles, lock: Lock | None, overlays: dict[str, bytes] | None = None
                  ) -> dict[str, bytes]:
    """The build context: Dockerfile, tools/, series/, upstream-checks.json, lock.json, overlays.json and the
    overlays' bytes as ``overlays/<path>`` (``overlays``: from :func:`overlay_bytes`)."""
    d = docker_dir()
    out = {
        "Dockerfile": (d / "Dockerfile").read_bytes(),
        "series/series": files.series_text.encode(),
        "upstream-checks.json": files.checks if files.checks is not None else b"[]\n",
        "lock.json": lock_json(lock).encode() if lock is not None else b"{}\n",
        "overlays.json": (json.dumps(overlay_plan(files.recipe), indent=1, sort_keys=True) + "\n").encode(),
    }
    out |= {f"tools/{name}": (d / "tools" / name).read_bytes() for name in TOOLS}
    out |= {f"series/{name}": data for name, data in files.series}
    out |= {f"overlays/{rel}": data for rel, data in (overlays or {}).items()}
    return out


def build_context(files: RecipeFiles, lock: Lock, overlays: dict[str, bytes] | None = None) -> bytes:
    """The build context tar (see :func:`context_files`)."""
    return _tar(context_files(files, lock, overlays))


def _overlay_cache() -> Path:
    return Path(user_cache_dir("sparkserve")) / "overlays"


def overlay_bytes(files: RecipeFiles, *, fetch_timeout: float = 60.0) -> dict[str, bytes]:
    """Each overlay's bytes, checked against its sha256 here, before anything goes to a node: a local path
    (relative to the recipe) is read; an ``https://`` source is fetched once into the cache (by sha256).
    BadInput (exit 2) naming the overlay and its source when a file is missing or its sha256 is not the
    recipe's."""
    out: dict[str, bytes] = {}
    for o in files.recipe.overlays:
        if o.source is None:  # a prebuilt image's overlays are only checked in it, never copied
            continue
        where = f"{files.path}: overlays: {o.path}"
        if o.source.startswith(("https://", "http://")):
            cached = _overlay_cache() / o.sha256
            data = cached.read_bytes() if cached.is_file() else _fetch(o.source, where, fetch_timeout)
        else:
            data = _read((files.path.parent / o.source).resolve(), f"overlay {o.path}")
        got = sha256_hex(data)
        if got != o.sha256:
            raise BadInput(where, f"{o.source} is sha256 {got[:16]}…, the recipe says {o.sha256[:16]}… "
                           "(refused before the build)")
        if o.source.startswith(("https://", "http://")):
            with contextlib.suppress(OSError):
                _overlay_cache().mkdir(parents=True, exist_ok=True)
                (_overlay_cache() / o.sha256).write_bytes(data)
        out[o.path] = data
    return out


def _fetch(url: str, where: str, timeout: float) -> bytes:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (the recipe's https source)
            return bytes(r.read())
    except (urllib.error.URLError, OSError) as e:
        raise BadInput(where, f"cannot fetch {url}: {getattr(e, 'reason', e)}") from None


def write_lock(files: RecipeFiles, lock: Lock) -> None:
    files.lock_path.write_text(lock_json(lock))
    files.lock = lock
