"""What makes two images the same image, and whether an image's facts are its lock's. Pure.

    fp = fingerprint(inspect_attrs)        # "sha256:…" of canonical JSON: OS/arch/RootFS layers/config
    chain = chain_ids(diff_ids)            # docker's ChainIDs: what a node already holds, layer by layer
    problems = facts_problems(facts, lock_patches)   # [] when the image is what its lock says

The raw image ID is the sha256 of the config blob on the classic image store but may name a manifest or an
index on the containerd store, so the same image reads as two IDs on two nodes (eugr/spark-vllm-docker
#327). The fingerprint hashes only what the image is — its OS and architecture, the ordered layer
``diff_id``s and the runtime config with empty fields dropped — so both stores agree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

#: Config fields that say how an image was made, not what it runs (the classic builder writes the parent
#: image ID into ``Image`` and a container ID into ``Hostname`` for ``docker commit``).
_NOT_CONTENT = {"Image", "Hostname"}


def _prune(value: Any) -> Any:
    if isinstance(value, Mapping):
        out = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, "", [], {})}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def fingerprint_document(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical content of an image from ``docker image inspect`` (the docker SDK's ``image.attrs``)."""
    config = {k: v for k, v in (attrs.get("Config") or {}).items() if k not in _NOT_CONTENT}
    doc = {
        "Os": attrs.get("Os"),
        "Architecture": attrs.get("Architecture"),
        "Variant": attrs.get("Variant"),
        "OsVersion": attrs.get("OsVersion"),
        "Layers": list((attrs.get("RootFS") or {}).get("Layers") or []),
        "Config": config,
    }
    return _prune(doc)


def fingerprint(attrs: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of :func:`fingerprint_document` as canonical JSON (sorted keys, no spaces)."""
    blob = json.dumps(fingerprint_document(attrs), sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """Docker's ChainIDs for an ordered list of layer diff_ids: a layer is present on a node only when its
    whole chain is (the same diff_id on another parent is another layer)."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def facts_problems(facts: Mapping[str, Any], lock: Mapping[str, Any] | None) -> list[str]:
    """How an image's facts (``docker/tools/image_facts.py`` output) disagree with its lock (a
    :class:`~sparkserve.image.recipe.Lock` dumped to a dict), or with themselves; empty when fine.

    Checked: vLLM imports as the locked version and commit; the files that differ from the wheel's RECORD
    are the files the applied patches touch plus the overlays (the known-dirty set), nothing else; each
    touched file's digest is the lock's "after" and each overlay's is its sha256; every architecture the
    lock's registry checks name is registered with its class defined; every DFlash2 architecture of the
    registry resolves to a defined class (and, for a lock without registry checks, ``DFlash2DraftModel`` is
    there; an image without a lock — not built by sparkserve — is held to what its own facts show); every
    distribution the installed vLLM requires is installed (:mod:`sparkserve.image.requires`; a version outside
    its pins is not a problem here)."""
    from sparkserve.image.requires import parse_requires

    out: list[str] = []
    requires = parse_requires(facts.get("requires"))
    missing = requires.missing_line("in the image") if requires is not None else None
    if missing:
        out.append(missing)
    vllm = facts.get("vllm") or {}
    if not vllm.get("version"):
        out.append("no vLLM in the image (vllm/_version.py not found)")
    lock = dict(lock) if lock is not None else None
    if lock is not None:
        want = lock.get("vllm") or {}
        for key in ("version", "commit"):
            if want.get(key) and want.get(key) != "unresolved" and vllm.get(key) != want.get(key):
                out.append(f"vLLM {key} is {vllm.get(key)!r}, the lock says {want.get(key)!r}")
    patches = (lock or {}).get("patches", [])
    overlays: dict[str, str] = dict((lock or {}).get("overlays") or {})
    touched = sorted({f for p in patches for f in p.get("touches", {})})
    applied = facts.get("applied") or {}
    status = {p["name"]: p.get("status") for p in applied.get("patches", [])}
    really_touched = sorted({f for p in patches if status.get(p["name"]) != "already-upstream"
                             for f in p.get("touches", {})})
    differing = sorted((facts.get("record") or {}).get("differing") or [])
    if lock is not None:
        extra = sorted(set(differing) - set(really_touched) - set(overlays))
        lacking = sorted(set(really_touched) - set(differing))
        if extra:
            out.append(f"files differ from the wheel's RECORD that no patch or overlay touches: {', '.join(extra[:5])}")
        if lacking:
            out.append(f"files the series patches still match the wheel: {', '.join(lacking[:5])}")
    if lock is not None and applied:
        got = {f: t.get("after") for p in applied.get("patches", []) for f, t in p.get("touches", {}).items()}
        for p in patches:
            for f, t in p.get("touches", {}).items():
                if f in got and got[f] != t.get("after"):
                    out.append(f"{f} is {str(got[f])[:12]} in the image, the lock says {str(t.get('after'))[:12]}")
    elif lock is not None and touched and not applied:
        out.append("the image has no series manifest (/opt/sparkserve/applied.json)")
    in_image = facts.get("overlays") or {}
    for rel, sha in overlays.items():
        if in_image.get(rel) != sha:
            out.append(f"overlay {rel} is {str(in_image.get(rel))[:12]} in the image, the recipe says {sha[:12]}")
    wanted = list(((lock or {}).get("checks") or {}).get("registry") or [])
    registry = facts.get("registry") or {}
    for arch in wanted:
        if arch not in registry:
            out.append(f"vLLM's registry has no {arch}")
        elif not registry[arch].get("defined"):
            out.append(f"{arch} → {registry[arch].get('module')}.{registry[arch].get('class')} is not defined")
    dflash = facts.get("dflash2") or {}
    if lock is not None and not wanted and "DFlash2DraftModel" not in dflash:
        out.append("vLLM's registry has no DFlash2DraftModel")
    out += [f"{arch} → {v.get('module')}.{v.get('class')} is not defined" for arch, v in dflash.items()
            if not v.get("defined")]
    return out
