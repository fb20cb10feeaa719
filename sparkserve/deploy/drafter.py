"""The drafter on every node: where `up` copies it from, and making the bytes identical everywhere.

With a local source (``drafter.source``, or ``drafter.path`` when it is a directory on this machine), only
differing files are copied and then verified. Without one, the head's copy is the reference and a node that
differs is an error: there is nothing to copy from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkserve.config import Config
from sparkserve.config.profiles import NO_DRAFTER, uses_drafter
from sparkserve.deploy.sync import RemoteState, remote_manifest, sync_all
from sparkserve.deploy.teardown import Reporter
from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.models.manifest import manifest
from sparkserve.nodes.base import Node
from sparkserve.nodes.parallel import on_all


@dataclass(frozen=True)
class DrafterSync:
    """The drafter every node now holds: its manifest digest, and one summary line per node."""

    digest: str
    summary: dict[str, str]


def drafter_words(cfg: Config) -> str:
    return str(cfg.drafter.path) if cfg.drafter and uses_drafter(cfg) else "none (mtp: the target's built-in head)"


def sync_words(cfg: Config) -> str:
    """What `up`'s drafter step does, for `sparkserve plan`."""
    if not uses_drafter(cfg):
        return "none: speculative.method mtp serves the target's built-in head"
    return f"sync {drafter_words(cfg)} to every node (sha256 manifest, only differing files)"


def local_drafter(cfg: Config) -> Path | None:
    """The controller's copy of the drafter (the sync source), if there is one."""
    if not uses_drafter(cfg):
        return None
    if cfg.drafter.source is not None:
        src = cfg.drafter.source.expanduser()
        if not src.is_dir():
            raise BadInput("drafter.source", f"{src} is not a directory")
        return src
    p = Path(cfg.drafter.path)
    return p if p.is_dir() else None


def all_cached(cfg: Config, states: dict[str, RemoteState | None]) -> dict[str, RemoteState] | None:
    """Every node's drafter manifest as its cache answered it (deploy.doctor's ``manifest_out``: no file
    content read, so it may be asked before the drafter is validated), or None when a node could not
    answer or its cache could not answer for every file: then :func:`sync_drafter` reads them in full."""
    found = {n.name: states.get(n.name) for n in cfg.nodes}
    if any(s is None or s.uncached for s in found.values()):
        return None
    return {k: s for k, s in found.items() if s is not None}


def sync_drafter(cfg: Config, nodes: dict[str, Node], say: Reporter,
                 known: dict[str, RemoteState] | None = None) -> DrafterSync:
    """Make the drafter identical on every node (see the module docstring). ``known``: every node's
    manifest already read (:func:`all_cached`), used when there is nothing to copy."""
    if not uses_drafter(cfg):  # mtp: the target's own head, nothing to sync
        say("drafter: none (speculative.method mtp: the target's built-in head)")
        return DrafterSync(NO_DRAFTER, {n.name: f"{n.name}: no drafter (mtp)" for n in cfg.nodes})
    ordered = [nodes[n.name] for n in cfg.nodes]
    src = local_drafter(cfg)
    path = str(cfg.drafter.path)
    if src is not None:
        local = manifest(src)
        say(f"drafter: syncing {src} to {path} on every node")
        reports = sync_all(ordered, src, path, local_manifest=local)
        for r in reports.values():
            say(f"drafter: {r.summary()}")
        return DrafterSync(local.digest, {k: r.summary() for k, r in reports.items()})
    states = known or on_all(ordered, lambda n: remote_manifest(n, path), name=lambda n: n.name)
    digests = {k: s.manifest.digest for k, s in states.items()}
    ref = digests[cfg.head.name]
    for name, d in digests.items():
        if d != ref:
            raise RemoteFailure(
                f"{name}: drafter", f"drafter bytes at {path} differ from {cfg.head.name}'s "
                f"({d[:12]} vs {ref[:12]}); set drafter.source to a local copy to sync it", node=name,
                step="drafter")
    say(f"drafter: identical on every node ({ref[:12]})")
    return DrafterSync(ref, {k: f"{k}: identical ({d[:12]})" for k, d in digests.items()})
