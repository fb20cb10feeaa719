"""Is the engine on every node, the same everywhere: the image's identity on each node (docker runtime) or
the vLLM executable's (process runtime). ``up`` asks this before it boots; ``image verify`` reports it.

    ids = image_ids(nodes, ref)                 # {node: "sha256:…" or None}  (raw image IDs)
    fps = image_fingerprints(nodes, ref)        # {node: content fingerprint or None}: store-independent
    image_id = ensure_same_image(nodes, ref)    # NodeError naming the node that lacks it / differs
    engine_id = ensure_same_engine(cfg, nodes)  # the runtime's engine, the same on every node

"The same image" is the content fingerprint (:func:`sparkserve.image.identity.fingerprint`), not the
raw ID, which the containerd image store computes differently. Every failure is a
:class:`~sparkserve.nodes.NodeError` naming the node and the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import docker.errors

from sparkserve.config import Config
from sparkserve.image.identity import fingerprint
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.docker_client import docker_errors
from sparkserve.nodes.engine import SHIP_HINT
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.processes import ProcessEngine

__all__ = ["SHIP_HINT", "ensure_same_engine", "ensure_same_image", "identity_of", "image_fingerprints", "image_id",
           "image_identity", "image_ids", "normalize_ref", "same_image_problem", "short_id"]


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
            return NodeError(name, "image", f"image {ref} is {short_id(got)} here but {short_id(want)} on "
                             f"{ref_node}; every node must run the same image ID — {SHIP_HINT}")
    return None


def ensure_same_image(nodes: Sequence[Node], ref: str) -> str:
    """The head's image ID for ``ref`` once every node holds the same image (equal content fingerprints);
    NodeError naming a node that lacks it or differs (the message shows raw IDs)."""
    found = on_all(list(nodes), lambda n: image_identity(n, ref), name=lambda n: n.name)
    problem = same_image_problem({name: (f[1] if f else None) for name, f in found.items()}, ref)
    if problem is not None:  # say it with the raw IDs, which is what `docker images` shows
        raise same_image_problem({name: (f[0] if f else None) for name, f in found.items()}, ref) or problem
    want = found[nodes[0].name]
    assert want is not None
    return want[0]


def image_identity(node: Node, ref: str) -> tuple[str, str] | None:
    """(raw image ID, content fingerprint) of ``ref`` on ``node``, or None if the node lacks it."""
    with docker_errors(node, "image", ref):
        try:
            img = node.docker().images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        return str(img.id), fingerprint(img.attrs)


def image_fingerprints(nodes: Sequence[Node], ref: str) -> dict[str, str | None]:
    """The content fingerprint of ``ref`` on every node in parallel (None: the node lacks it)."""
    found = on_all(list(nodes), lambda n: image_identity(n, ref), name=lambda n: n.name)
    return {name: (f[1] if f else None) for name, f in found.items()}


def identity_of(node: Node, image: str) -> str:
    """The content fingerprint of the image ``image`` (an ID or ref) names on ``node``; ``image`` itself when
    the node's docker has no such image (a process-runtime engine identity). The identity gate's value."""
    if not callable(getattr(node, "docker", None)):  # a node kind without a docker daemon
        return image
    try:
        found = image_identity(node, image)
    except NodeError:
        return image
    return found[1] if found else image


def short_id(image_id: str | None) -> str:
    return (image_id or "?").removeprefix("sha256:")[:12]


def ensure_same_engine(cfg: Config, nodes: Sequence[Node]) -> str:
    """The engine every node runs, the same on all: docker — the image ID of ``image.ref``; process — the
    sha256 of ``serve.vllm``'s bytes and ``--version`` output. NodeError naming a node that differs."""
    if cfg.runtime == "docker":
        return ensure_same_image(nodes, cfg.image.ref)
    found = on_all(list(nodes), lambda n: ProcessEngine(n, run_dir=cfg.process.run_dir,
                                                        vllm=cfg.serve.vllm).identity(), name=lambda n: n.name)
    names = list(found)
    want, what = found[names[0]]
    for name in names[1:]:
        got, theirs = found[name]
        if got != want:
            raise NodeError(name, "engine", f"serve.vllm here is {theirs} ({got[7:19]}) but on {names[0]} it is "
                            f"{what} ({want[7:19]}); every node must run the same vLLM")
    return want
