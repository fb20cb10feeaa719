"""Shipping the engine image node to node: only the layers each target lacks.

    plan = plan_ship(src, dsts, ref)            # the survey: done already / tagged / what each target lacks
    reports = ship_layers(src, dsts, ref, source_ip=…)   # only the layers each target lacks, node to node
                                                # (--via registry: sparkserve.image.registry.ship_via_registry)
    report = ship_image(src, dst, ref)          # docker save | docker load through this machine (all layers)

Which node has the image, and whether it is the same everywhere, is :mod:`sparkserve.image.on_nodes`.
Every failure is a
:class:`~sparkserve.nodes.NodeError` naming the node and the step.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import docker.errors

from sparkserve import interrupts
from sparkserve.errors import RemoteFailure
from sparkserve.image.identity import chain_ids, fingerprint
from sparkserve.image.on_nodes import image_id, image_identity, normalize_ref, short_id
from sparkserve.image.ship_node import last_json, read_progress, recv_program, send_program
from sparkserve.nodes.base import CommandResult, Node, NodeError, RemoteProcess
from sparkserve.nodes.docker_client import docker_errors
from sparkserve.nodes.parallel import on_all

SHIP_CHUNK = 8 * 2**20


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
        raise NodeError(dst.name, "ship", f"after loading, {ref} is {short_id(got)} here, not {short_id(img.id)}")
    return ShipReport(ref=ref, image_id=str(img.id), bytes=sent, seconds=seconds)


# -- layer-aware ship: only what each target lacks, source node → target nodes directly ------------------


@dataclass(frozen=True)
class LayerShip:
    """One target of :func:`ship_layers`: bytes that crossed the wire, layer bytes left out, wall time."""

    node: str
    ref: str
    fingerprint: str
    bytes: int
    skipped_bytes: int
    seconds: float
    how: str  # "stream" | "registry" | "already there" | "tagged"
    push_seconds: float = 0.0  # --via registry: the push into the source's temporary registry

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0


Progress = Callable[[str, int, int, float], None]  # (node, bytes sent so far, layer bytes it lacks, seconds)


def held_chains(node: Node) -> set[str]:
    """Every layer ChainID the node's docker holds (the union over all its images)."""
    with docker_errors(node, "ship", "image inventory"):
        images = node.docker().api.images(all=True)
        out: set[str] = set()
        for summary in images:
            attrs = node.docker().api.inspect_image(summary["Id"])
            out.update(chain_ids((attrs.get("RootFS") or {}).get("Layers") or []))
        return out


def layer_sizes(node: Node, ref: str) -> list[int]:
    """Uncompressed size of each layer of ``ref`` in RootFS order, from ``docker history`` (the non-empty
    history entries, oldest first, are the layers)."""
    with docker_errors(node, "ship", f"history {ref}"):
        hist = node.docker().api.history(ref)
        attrs = node.docker().api.inspect_image(ref)
    layers = (attrs.get("RootFS") or {}).get("Layers") or []
    sizes = [int(h.get("Size") or 0) for h in reversed(hist)]
    nonempty = [s for s in sizes if s > 0]
    if len(nonempty) == len(layers):
        return nonempty
    # empty-size layers (a WORKDIR, an empty COPY) break the pairing: spread what is known, conservatively
    total = sum(sizes)
    return [total // max(len(layers), 1)] * len(layers)


def free_bytes(node: Node, path: str, step: str = "ship") -> int:
    res = node.run(["df", "-B1", "--output=avail", path], timeout=20, step=step)
    return int(res.stdout.strip().splitlines()[-1])


@dataclass
class ShipPlan:
    """What a layer-aware ship of ``ref`` has to do, from the survey of every target (nothing written yet):
    the targets already done (same fingerprint, or only the tag missing: tagged), and the rest with the
    layer ChainIDs each already holds and how many layer bytes it lacks."""

    ref: str
    image_id: str
    fingerprint: str
    layers: list[str]
    sizes: list[int]
    done: dict[str, LayerShip]
    pending: list[tuple[Node, set[str]]]
    need: dict[str, int]


def plan_ship(src: Node, dsts: Sequence[Node], ref: str) -> ShipPlan:
    """Survey ``dsts`` for ``ref`` as ``src`` holds it; tag it where only the tag is missing; check each
    target's docker disk has room for what it lacks (NodeError naming the node, nothing written)."""
    named = normalize_ref(ref)
    with docker_errors(src, "ship", ref):
        try:
            img = src.docker().images.get(ref)
        except docker.errors.ImageNotFound:
            raise NodeError(src.name, "ship", f"image {ref} is not on this node either; nothing to ship") from None
    want_fp = fingerprint(img.attrs)
    layers = list((img.attrs.get("RootFS") or {}).get("Layers") or [])
    chains = chain_ids(layers)

    def survey(dst: Node) -> tuple[str, set[str], str | None]:
        found = image_identity(dst, ref)
        if found and found[1] == want_fp:
            return "already there", set(), None
        with docker_errors(dst, "ship", "image inventory"):
            try:
                by_id = fingerprint(dst.docker().images.get(str(img.id)).attrs) == want_fp
            except docker.errors.ImageNotFound:
                by_id = False
            root = str(dst.docker().info().get("DockerRootDir") or "/var/lib/docker")
        return ("tag" if by_id else "stream"), held_chains(dst), root

    surveyed = on_all(list(dsts), survey, name=lambda n: n.name)
    sizes = layer_sizes(src, ref)
    plan = ShipPlan(ref, str(img.id), want_fp, layers, sizes, {}, [], {})
    for dst in dsts:
        how, have, root = surveyed[dst.name]
        if how == "already there":
            plan.done[dst.name] = LayerShip(dst.name, ref, want_fp, 0, 0, 0.0, "already there")
            continue
        if how == "tag":
            repo, _, tag = named.rpartition(":")
            with docker_errors(dst, "ship", f"tag {ref}"):
                dst.docker().api.tag(str(img.id), repo, tag)
            plan.done[dst.name] = LayerShip(dst.name, ref, want_fp, 0, 0, 0.0, "tagged")
            continue
        need = sum(s for s, c in zip(sizes, chains, strict=True) if c not in have)
        assert root is not None
        avail = free_bytes(dst, root)
        if avail < need * 1.1:
            raise NodeError(dst.name, "ship", f"{root} has {avail / 1e9:.1f} GB free but {ref} needs "
                            f"{need / 1e9:.1f} GB of layers here (+10%); nothing was written")
        plan.pending.append((dst, have))
        plan.need[dst.name] = need
    return plan


def ship_layers(src: Node, dsts: Sequence[Node], ref: str, *, source_ip: str, progress: Progress | None = None,
                timeout: float = 3600.0, workdir: str = "/tmp") -> dict[str, LayerShip]:
    """Copy ``ref`` from ``src`` to every node of ``dsts``, sending each only the layers it lacks.

    A target whose copy already has the source's fingerprint gets 0 bytes; one that has the image under
    another tag only gets the tag (:func:`plan_ship`). The rest are streamed in parallel straight from
    ``src`` (listening on ``source_ip``, its fabric address) to each target's ``docker load`` — the bytes
    never pass through this machine — after checking each target's docker disk has room for what it lacks
    (and ``src``'s ``workdir`` for the largest layer it spools). Every target is checked by fingerprint
    afterwards."""
    plan = plan_ship(src, dsts, ref)
    out = dict(plan.done)
    if not plan.pending:
        return out
    largest = max(plan.sizes, default=0)
    if free_bytes(src, workdir) < largest * 1.1:
        raise NodeError(src.name, "ship", f"{workdir} lacks room to spool the largest layer "
                        f"({largest / 1e9:.1f} GB); nothing was written")
    out.update(_stream(src, plan, source_ip=source_ip, progress=progress, timeout=timeout, workdir=workdir))
    return out


def _stream(src: Node, plan: ShipPlan, *, source_ip: str, progress: Progress | None, timeout: float,
            workdir: str) -> dict[str, LayerShip]:
    ref, layers, want_fp, streams = plan.ref, plan.layers, plan.fingerprint, plan.pending
    job = f"{workdir.rstrip('/')}/sparkserve-ship-{secrets.token_hex(6)}"
    tokens = {dst.name: secrets.token_hex(16) for dst, _ in streams}
    args = {"ref": ref, "layers": layers, "workdir": job, "bind": source_ip, "docker": "docker",
            "targets": [{"name": dst.name, "token": tokens[dst.name], "have_chains": sorted(have)}
                        for dst, have in streams]}
    t0 = time.monotonic()
    sender = src.start(send_program(args), timeout=timeout, step="ship")
    receivers: dict[str, RemoteProcess] = {}
    try:
        port = _wait_port(src, job, sender)
        for dst, _ in streams:
            receivers[dst.name] = dst.start(recv_program({"host": source_ip, "port": port,
                                                          "token": tokens[dst.name], "docker": "docker"}),
                                            timeout=timeout, step="ship")
            receivers[dst.name].close_stdin()
        sender.close_stdin()
        results: dict[str, CommandResult] = {}
        lost: dict[str, NodeError] = {}

        def wait_all() -> None:  # in a thread, so that the main thread stays interruptible and shows progress
            for name, proc in receivers.items():
                try:
                    results[name] = proc.wait(check=False)
                except NodeError as e:  # a connection closed under it (an interrupt's cleanup): said below
                    lost[name] = e

        waiter = threading.Thread(target=wait_all, daemon=True)
        waiter.start()
        while waiter.is_alive():
            waiter.join(0.5)
            if progress is not None:
                sent = read_progress(src, job)
                for name in receivers:
                    progress(name, sent.get(name, 0), plan.need[name], time.monotonic() - t0)
        send_res = sender.wait(check=False)
        if lost:
            raise next(iter(lost.values()))
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: docker discards a load whose stream ends early
        interrupts.note(e)
        with contextlib.suppress(NodeError, OSError, ValueError):  # stop the sender: every stream ends early
            src.run(["kill", "--", str(int(src.read_text(f"{job}/pid").strip()))], timeout=20, step="ship",
                    check=False)
        raise RemoteFailure("image ship", f"interrupted ({interrupts.signal_name()}) while shipping {ref}; "
                            "partial loads were discarded, the targets are as they were",
                            node=src.name, step="interrupted") from None
    finally:
        with contextlib.suppress(NodeError):
            src.run(["rm", "-rf", "--", job], timeout=30, step="ship", check=False)
    seconds = time.monotonic() - t0
    summary = last_json(send_res.stdout)
    if not send_res.ok or summary is None:
        raise NodeError(src.name, "ship", f"docker save of {ref} failed", last_lines=send_res.tail())
    out: dict[str, LayerShip] = {}
    for dst, _ in streams:
        res = results[dst.name]
        got = last_json(res.stdout)
        if not res.ok or got is None or got.get("load_rc") != 0:
            lines = (got or {}).get("load_out") or res.tail()
            raise NodeError(dst.name, "ship", f"docker load of {ref} failed", last_lines=list(lines))
        found = image_identity(dst, ref)
        if found is None or found[1] != want_fp:
            raise NodeError(dst.name, "ship", f"after loading, {ref} is {short_id(found[1] if found else None)} "
                            f"here, not {short_id(want_fp)} (content fingerprint)")
        out[dst.name] = LayerShip(dst.name, ref, want_fp, int(summary["sent"].get(dst.name, 0)),
                                  int(summary["skipped"].get(dst.name, 0)), seconds, "stream")
    return out


def _wait_port(src: Node, job: str, sender: RemoteProcess, limit: float = 60.0) -> int:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            return int(src.read_text(f"{job}/port").strip())
        except (NodeError, OSError, ValueError):
            time.sleep(0.1)
    sender.close_stdin()
    res = sender.wait(check=False)
    raise NodeError(src.name, "ship", "the sending program did not start listening", last_lines=res.tail())
