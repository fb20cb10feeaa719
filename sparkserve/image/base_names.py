"""A base image is its digest, not its name: the names each known digest has been published under.

The card's fork base has had three names for one digest (docs/card-now-2026-12.md §1.3): radixark's on Docker Hub
(the card's NOTICE@00d42fa: "now 404 on Docker Hub"), tonyd2wild's (the card's Dockerfile@121cecc) and the card's
own re-host ``ghcr.io/canada-quant/vllm-glm53-flash-base:sm121-v11-dflash2`` (the newer Dockerfile: "re-hosted
community DGX-Spark GLM-5.3-Flash bring-up image"). The lock, ``image build --relock`` and the prebuilt lane compare
bases by digest, and a pull that fails names the other names of that digest.

    digest_of("ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v11-dflash2")   # "sha256:4def0ef644cb…" (a known name)
    same_base(a, b)          # by digest when both are known, else by name
    pull_hint(ref)           # "; the same image … is also published as …" ("" for a digest with no other names)

Data and string functions, and :func:`pull_errors` (docker_errors with the hint on a failed pull).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkserve.nodes.base import Node

DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")


@dataclass(frozen=True)
class Name:
    ref: str  # repo:tag
    note: str  # where the name comes from, and whether it still answers


CARD_BASE = "sha256:4def0ef644cb2e9814136dcffd5e385e21bc594f48f3b292234051904abe85a6"
#: digest -> every name it is known under, the one to prefer first
KNOWN: dict[str, tuple[Name, ...]] = {
    CARD_BASE: (
        Name("ghcr.io/canada-quant/vllm-glm53-flash-base:sm121-v11-dflash2",
             "the card's re-host (its newer Dockerfile)"),
        Name("ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v11-dflash2", "the card's Dockerfile@121cecc"),
        Name("radixark/vllm-glm53-flash:sm121-v11-dflash2", "gone: \"now 404 on Docker Hub\" (the card's NOTICE)"),
    ),
}


def bare(ref: str) -> str:
    """``repo:tag`` without its ``@sha256:…`` pin."""
    return ref.split("@", 1)[0]


def digest_of(ref: str) -> str | None:
    """The digest ``ref`` pins, else the digest of a known name, else None."""
    m = DIGEST.search(ref)
    if m:
        return m.group(1)
    return next((d for d, names in KNOWN.items() if any(n.ref == ref for n in names)), None)


def same_base(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name the same image: their digests when both are known, else the exact names."""
    da, db = digest_of(a), digest_of(b)
    return da == db if da and db else a == b


def other_names(ref: str) -> list[Name]:
    """The other known names of ``ref``'s digest."""
    d = digest_of(ref)
    return [n for n in KNOWN.get(d or "", ()) if n.ref != bare(ref)]


def describe(ref: str) -> str:
    """``sha256:4def0ef644cb… (a, b; c: gone …)``: the base as its digest, with every name it is known under."""
    d = digest_of(ref)
    if d is None:
        return ref
    names = KNOWN.get(d) or (Name(bare(ref), ""),)
    return f"{d[:19]}… (" + "; ".join(n.ref + (f": {n.note}" if "gone" in n.note else "") for n in names) + ")"


def pull_hint(ref: str) -> str:
    """What to add to a failed pull of ``ref``: the other names of its digest, each pullable by that digest."""
    others = other_names(ref)
    d = digest_of(ref)
    if not others or d is None:
        return ""
    live = [n for n in others if "gone" not in n.note]
    gone = [n for n in others if "gone" in n.note]
    out = f"; the same image ({d[:19]}…) is also published as " + ", ".join(f"{n.ref}@{d}" for n in live)
    if gone:
        out += " (" + "; ".join(f"{n.ref}: {n.note}" for n in gone) + ")"
    return out + " — set base.image to one of them (the digest, and so the lock, stays the same)"


@contextlib.contextmanager
def pull_errors(node: Node, step: str, ref: str) -> Iterator[None]:
    """:func:`~sparkserve.nodes.docker_client.docker_errors` for a block that may pull ``ref``: a failure names
    the other names of its digest (:func:`pull_hint`)."""
    from sparkserve.nodes.base import NodeError  # here: the recipe's lock rules import this module, docker-free
    from sparkserve.nodes.docker_client import docker_errors

    try:
        with docker_errors(node, step, ref):
            yield
    except NodeError as e:
        hint = pull_hint(ref)
        if not hint or hint in e.what or e.step_name != step:
            raise
        raise NodeError(e.node_name, e.step_name, e.what + hint, argv=e.argv, last_lines=e.last_lines) from None
