"""The engine's flag dialect — which `vllm serve` options the image's vLLM has — as a fact of the image.

    d = dialect_for(cfg)             # serve.vllm_version, else the image's facts, else the shipped table
    d.accepts("--kv-cache-memory")   # the fork: True; vLLM 0.33.0: False (it says --kv-cache-memory-bytes)
    d.kv_flag                        # the flag the plan renders the KV pin with
    d.options                        # the serve-args dump: what OptionList judges argvs with

Dialects are data files, ``sparkserve/data/dialects/*.json``: a name (the engine's version string), the
option list (a committed dump, or a base dump with removed/added options, each fact with its source), the
image refs known to carry it, and the signature lines the engine prints on every rank. ``image verify``
(and ``up`` for an image it has not seen) runs the image's own `vllm serve` parser in the image and keeps
its option list and version with the image facts (:mod:`sparkserve.image.dialect`, a local file
next to the journal); that list then wins over the shipped one for that image.

Resolution, first match wins: ``serve.vllm_version`` (a dialect name: the config override); the stored
facts of ``image.ref`` (what ``image verify`` found; for ``runtime: process`` there is no image and this
step is skipped); the shipped table (the dialect whose ``images`` lists ``image.ref``); vLLM 0.33.0.

Pure apart from reading the packaged data files and the stored facts file (read-only, never a node).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkserve.config import Config

DEFAULT_DIALECT = "0.33.0"
DIALECTS_DIR = "data/dialects"
FACTS_ENV = "SPARKSERVE_IMAGE_FACTS"  # the stored image facts file (default: next to the journal)
KV_FLAGS = ("--kv-cache-memory-bytes", "--kv-cache-memory")  # upstream's spelling, the card fork's


class UnknownDialect(ValueError):
    """No shipped dialect has that name."""


@dataclass(frozen=True)
class SignatureLine:
    """A line the engine prints on every rank when the profile's path is in use (``{drafter_layers}`` is
    filled from the drafter's config)."""

    name: str
    line: str
    proves: str = ""

    def text(self, drafter_layers: int | None) -> str | None:
        """The line to look for, None when it needs a fact that is not known."""
        if "{drafter_layers}" in self.line:
            return None if drafter_layers is None else self.line.replace("{drafter_layers}", str(drafter_layers))
        return self.line


@dataclass(frozen=True)
class Dialect:
    name: str
    vllm_version: str
    options: dict[str, Any] = field(repr=False, compare=False)
    signature: tuple[SignatureLine, ...] = ()
    source: str = ""
    images: tuple[str, ...] = ()
    list_origin: str = "committed dump"  # how its option list was made (the judge's name says it)
    title: str = ""  # a derived dialect in words ("the model card's vLLM fork"): the judge's name leads with it
    flags: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flags", frozenset(s for o in self.options["options"] for s in o["option_strings"]))

    def accepts(self, flag: str) -> bool:
        """``flag`` (exactly, not a prefix) is an option of this dialect."""
        return flag in self.flags

    @property
    def kv_flag(self) -> str | None:
        """The flag that pins the KV pool in bytes, None when the dialect has none."""
        return next((f for f in KV_FLAGS if self.accepts(f)), None)

    def describe(self) -> str:
        return f"vLLM {self.vllm_version}" + (f" ({self.source})" if self.source else "")


#: the first vLLM release without the V1 model runner: 0.34 removed it (``vllm/v1/worker/gpu_model_runner.py``
#: and ``VLLM_USE_V2_MODEL_RUNNER`` are gone) and with it the ``Using V2 Model Runner`` line (a real 0.34.0 boot,
#: tests/fixtures/logs/real-0.34.0-gpu/)
V1_RUNNER_REMOVED_IN = (0, 34)
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?(?![\w.])")


def release_of(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a release version (``0.34.0``); None for a dev build such as the card's fork
    (``0.1.dev20051+g487ecf187``) or anything else."""
    m = _RELEASE.match(version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def has_no_v1_runner(version: str) -> bool:
    """This vLLM release has only the V2 model runner (and prints no runner line)."""
    r = release_of(version)
    return r is not None and r >= V1_RUNNER_REMOVED_IN


# ------------------------------------------------------------------------------------------ shipped files


def _data(rel: str) -> str:
    return resources.files("sparkserve").joinpath(rel).read_text()


@cache
def _shipped_files() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(resources.files("sparkserve").joinpath(DIALECTS_DIR).iterdir(), key=lambda p: p.name):
        if f.name.endswith(".json"):
            spec = json.loads(f.read_text())
            out[spec["name"]] = spec
    return out


def shipped_names() -> tuple[str, ...]:
    return tuple(_shipped_files())


def _build_options(spec: dict[str, Any]) -> dict[str, Any]:
    how = spec["options"]
    if "file" in how:
        return json.loads(_data(f"data/{how['file']}"))
    base = json.loads(json.dumps(shipped(how["base"]).options))  # a deep copy
    gone = {r["flag"] for r in how.get("remove", [])}
    base["options"] = [o for o in base["options"] if not gone & set(o["option_strings"])]
    for add in how.get("add", []):
        base["options"].append({k: v for k, v in add.items() if k != "source"})
    base["vllm_version"] = spec["vllm_version"]
    base["generator"] = f"{spec['name']}: vLLM {how['base']}'s dump, less/plus the facts in data/dialects"
    return base


@cache
def shipped(name: str) -> Dialect:
    """The shipped dialect ``name`` (UnknownDialect when there is none)."""
    files = _shipped_files()
    if name not in files:
        raise UnknownDialect(f"no engine dialect {name!r} (shipped: {', '.join(files)})")
    spec = files[name]
    return Dialect(name=spec["name"], vllm_version=spec["vllm_version"], options=_build_options(spec),
                   signature=tuple(SignatureLine(**s) for s in spec.get("signature", [])),
                   source=f"shipped dialect data/dialects ({spec['name']})", images=tuple(spec.get("images", [])),
                   **({} if "file" in spec["options"] else _derived_words(spec)))


def _derived_words(spec: dict[str, Any]) -> dict[str, str]:
    """A dialect derived from a base dump, in words: its description's head, and its flags against the base."""
    how = spec["options"]
    less, plus = len(how.get("remove", [])), len(how.get("add", []))
    origin = f"vLLM {how['base']}'s options" + (f" less {less} flag{'s' * (less != 1)}" if less else "") + (
        f", plus {plus}" if plus else "")
    return {"list_origin": origin, "title": str(spec.get("description", "")).split(" (")[0].split(":")[0]}


def shipped_for_image(ref: str) -> Dialect | None:
    """The shipped dialect whose ``images`` names ``ref`` (with or without a ``@sha256:`` digest)."""
    bare = ref.split("@", 1)[0]
    for name, spec in _shipped_files().items():
        if ref in spec.get("images", []) or bare in spec.get("images", []):
            return shipped(name)
    return None


# ------------------------------------------------------------------------------------------ image facts


def facts_path() -> Path:
    """Where ``image verify`` keeps each image's dialect facts (next to the journal)."""
    env = os.environ.get(FACTS_ENV)
    if env:
        return Path(env).expanduser()
    journal = os.environ.get("SSJOURNAL_PATH")
    if journal:
        return Path(journal).expanduser().parent / "image-facts.json"
    from platformdirs import user_state_dir

    return Path(user_state_dir("sparkserve")) / "image-facts.json"


def stored_facts() -> dict[str, Any]:
    """Every stored image's dialect facts: ``{"by_ref": {ref: {...}}}`` (empty when none or unreadable)."""
    try:
        data = json.loads(facts_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_facts(data: dict[str, Any]) -> Path:
    """Replace the stored image facts with ``data``, atomically (a reader sees the old file or the new one);
    returns the file. OSError when it cannot be written."""
    path = facts_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".image-facts.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def dialect_from_facts(ref: str, entry: dict[str, Any]) -> Dialect | None:
    """The dialect an image's stored facts describe: its own parser's option list when the dump has one,
    else the shipped dialect of its vLLM version; None when neither is known."""
    version = str(entry.get("vllm_version") or "")
    known = shipped(version) if version in _shipped_files() else None
    options = entry.get("options")
    if isinstance(options, dict) and options.get("options"):
        return Dialect(name=version or "image", vllm_version=version or "?", options=options,
                       signature=known.signature if known else (),
                       source=f"image facts of {ref} ({str(entry.get('image_id', '?'))[:19]})",
                       images=(ref,), list_origin="the image's own parser, dumped by image verify")
    return known


def dialect_for(cfg: Config, *, image_id: str | None = None) -> Dialect:
    """The dialect the plan renders and validate checks with (module docstring: the order). ``image_id``
    (known once ``up`` asked the nodes): stored facts of another image ID under the same ref are stale and
    not used."""
    override = cfg.serve.vllm_version
    if override:
        return shipped(override)
    if cfg.runtime == "docker":
        entry = (stored_facts().get("by_ref") or {}).get(cfg.image.ref)
        if isinstance(entry, dict) and (image_id is None or entry.get("image_id") == image_id):
            found = dialect_from_facts(cfg.image.ref, entry)
            if found is not None:
                return found
        by_ref = shipped_for_image(cfg.image.ref)
        if by_ref is not None:
            return by_ref
    return shipped(DEFAULT_DIALECT)
