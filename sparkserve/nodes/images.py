"""The engine image on the nodes: its ID on each node, the same ID everywhere, and shipping it.

    ids = image_ids(nodes, ref)                 # {node: "sha256:…" or None}
    image_id = ensure_same_image(nodes, ref)    # NodeError naming the node that lacks it / differs
    report = ship_image(src, dst, ref)          # docker save | docker load, node to node (no registry)

Every failure is a :class:`~sparkserve.nodes.NodeError` naming the node and the step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import docker.errors

from sparkserve.errors import RemoteFailure
from sparkserve.nodes import interrupts
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.docker_client import docker_errors
from sparkserve.nodes.parallel import on_all

SHIP_CHUNK = 8 * 2**20
SHIP_HINT = "run `sparkserve image ship` to copy it from a node that has it"


@dataclass(frozen=True)
class ShipReport:
    """One ``docker save`` → ``docker load`` stream: what was sent and how fast."""

    ref: str
    image_id: str
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0


def normalize_ref(ref: str) -> str:
    """``foo`` → ``foo:latest`` (what docker lists in an image's tags); digests are left alone."""
    if "@" in ref:
        return ref
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last else f"{ref}:latest"


def image_id(node: Node, ref: str) -> str | None:
    """The image ID (``sha256:…``) ``ref`` names on ``node``, or None if the node lacks it."""
    with docker_errors(node, "image", ref):
        try:
            return str(node.docker().images.get(ref).id)
        except docker.errors.ImageNotFound:
            return None


def image_ids(nodes: Sequence[Node], ref: str) -> dict[str, str | None]:
    """:func:`image_id` on every node in parallel, keyed by node name in the given order."""
    return on_all(list(nodes), lambda n: image_id(n, ref), name=lambda n: n.name)


def same_image_problem(ids: dict[str, str | None], ref: str) -> NodeError | None:
    """Why ``ids`` (from :func:`image_ids`) are not one image on every node, or None when they are.

    The first node (the head) is the reference when IDs differ."""
    names = list(ids)
    missing = [n for n in names if ids[n] is None]
    if missing:
        have = [n for n in names if ids[n]]
        where = f" ({', '.join(have)} {'has' if len(have) == 1 else 'have'} it)" if have else ""
        err = NodeError(missing[0], "image", f"image {ref} is not on this node{where}; {SHIP_HINT}")
        err.details += [f"also missing on {m}" for m in missing[1:]]
        return err
    ref_node = names[0]
    want = ids[ref_node]
    for name in names[1:]:
        got = ids[name]
        if got != want:
            return NodeError(name, "image", f"image {ref} is {_short(got)} here but {_short(want)} on "
                             f"{ref_node}; every node must run the same image ID — {SHIP_HINT}")
    return None


def ensure_same_image(nodes: Sequence[Node], ref: str) -> str:
    """The image ID ``ref`` has on every node; NodeError naming a node that lacks it or differs."""
    ids = image_ids(nodes, ref)
    problem = same_image_problem(ids, ref)
    if problem is not None:
        raise problem
    want = ids[nodes[0].name]
    assert want is not None
    return want


def _short(image_id: str | None) -> str:
    return (image_id or "?").removeprefix("sha256:")[:12]


def ship_image(src: Node, dst: Node, ref: str, *, chunk_size: int = SHIP_CHUNK) -> ShipReport:
    """Stream ``docker save`` of ``ref`` on ``src`` into ``docker load`` on ``dst`` (tags kept).

    Every layer is sent (no registry). Verifies the ID after."""
    named = normalize_ref(ref)
    with docker_errors(src, "ship", ref):
        try:
            img = src.docker().images.get(ref)
        except docker.errors.ImageNotFound:
            what = f"image {ref} is not on this node either; nothing to ship"
            raise NodeError(src.name, "ship", what) from None
        stream = img.save(chunk_size=chunk_size, named=named if named in img.tags else True)
    sent = 0

    def counted() -> Iterator[bytes]:
        nonlocal sent
        with docker_errors(src, "ship", f"docker save {ref}"):
            for chunk in stream:
                sent += len(chunk)
                yield chunk

    t0 = time.monotonic()
    with docker_errors(dst, "ship", f"docker load {ref}"):
        try:
            dst.docker().images.load(counted())
        except docker.errors.ImageLoadError as e:
            raise NodeError(dst.name, "ship", f"docker load failed: {e}") from None
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: docker discards a load whose stream ends early
            interrupts.note(e)
            raise RemoteFailure("image ship", f"interrupted ({interrupts.signal_name()}) while shipping {ref} to "
                                f"{dst.name}; the partial load was discarded, {dst.name} is as it was",
                                node=dst.name, step="interrupted") from None
    seconds = time.monotonic() - t0
    got = image_id(dst, ref)
    if got != img.id:
        raise NodeError(dst.name, "ship", f"after loading, {ref} is {_short(got)} here, not {_short(img.id)}")
    return ShipReport(ref=ref, image_id=str(img.id), bytes=sent, seconds=seconds)
