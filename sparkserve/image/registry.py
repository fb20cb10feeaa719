"""`image ship --via registry`: a temporary registry on the source node, pulled from by every target.

    reports = ship_via_registry(src, dsts, ref, source_ip=…)   # {node: LayerShip(how="registry")}

The source pushes the image into a registry of its own (``docker-registry``: Debian/Ubuntu's package of
distribution 2.x, or ``registry`` on PATH) bound to its loopback; each target pulls it through a token relay
on the source's fabric IP (:mod:`sparkserve.image.registry_node`), so docker fetches only the layers it does
not hold, by the standard distribution protocol (any image store, any docker version). The registry, its
storage and every temporary tag are removed afterwards, after a failure and after Ctrl-C/SIGTERM/SIGHUP
alike (the node programs clean up when their SSH channel ends or a signal arrives).

docker's pull knows a layer it holds by the registry (compressed) digest it was pulled or pushed under: a
layer a target got by ``docker load`` (the stream ship, a rig's fixture) is fetched once more on its first
registry ship; from then on only changed layers move (docker's gzip is deterministic, so the same layer
has the same digest in every temporary registry).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Sequence

from sparkserve import interrupts
from sparkserve.errors import RemoteFailure
from sparkserve.image.on_nodes import image_identity
from sparkserve.image.registry_node import pull_program, serve_program
from sparkserve.image.ship import LayerShip, Progress, ShipPlan, free_bytes, plan_ship
from sparkserve.image.ship_node import last_json, read_progress
from sparkserve.nodes.base import CommandResult, Node, NodeError, RemoteProcess

TEMP_REPO = "sparkserve-ship/image"
REGISTRY_PROGRAMS = ("docker-registry", "registry")
REGISTRY_HINT = ("--via registry needs a registry program on the source node: `docker-registry` (apt install "
                 "docker-registry) or distribution's `registry` on PATH; or ship without --via registry")


def registry_program(node: Node) -> str:
    """The registry binary on ``node`` (its path); NodeError saying how to get one."""
    for name in REGISTRY_PROGRAMS:
        res = node.run(["sh", "-c", 'command -v "$1"', "sh", name], timeout=20, check=False, step="ship")
        if res.ok and res.stdout.strip():
            return res.stdout.strip().splitlines()[0]
    raise NodeError(node.name, "ship", REGISTRY_HINT)


def ship_via_registry(src: Node, dsts: Sequence[Node], ref: str, *, source_ip: str,
                      progress: Progress | None = None, timeout: float = 3600.0,
                      workdir: str = "/tmp") -> dict[str, LayerShip]:
    """Copy ``ref`` from ``src`` to ``dsts`` through a temporary registry on ``src`` (module docstring).

    Targets that already have it (or only lack the tag) are done without a registry (:func:`plan_ship`);
    disk is checked first (each target's docker root for what it lacks, ``src``'s ``workdir`` for the
    registry's compressed copy of every layer); every target is checked by fingerprint afterwards."""
    plan = plan_ship(src, dsts, ref)
    out = dict(plan.done)
    if not plan.pending:
        return out
    program = registry_program(src)
    total = sum(plan.sizes)
    if free_bytes(src, workdir) < total * 1.1:
        raise NodeError(src.name, "ship", f"{workdir} lacks room for the temporary registry's copy of {ref} "
                        f"({total / 1e9:.1f} GB of layers, +10%); nothing was written")
    out.update(_ship(src, plan, program, source_ip=source_ip, progress=progress, timeout=timeout,
                     workdir=workdir))
    return out


class _Waiter:
    """One thread waiting for a started program (a RemoteProcess may be waited for only once)."""

    def __init__(self, proc: RemoteProcess) -> None:
        self.proc = proc
        self.result: CommandResult | None = None
        self.error: NodeError | None = None
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        try:
            self.result = self.proc.wait(check=False)
        except NodeError as e:  # a connection closed under it (an interrupt's cleanup): said by the caller
            self.error = e

    def done(self) -> bool:
        return not self.thread.is_alive()

    def close(self) -> None:
        with contextlib.suppress(NodeError, OSError):
            self.proc.close_stdin()

    def join(self, timeout: float | None = None) -> CommandResult | None:
        self.thread.join(timeout)
        return self.result


def _ship(src: Node, plan: ShipPlan, program: str, *, source_ip: str, progress: Progress | None,
          timeout: float, workdir: str) -> dict[str, LayerShip]:
    job = f"{workdir.rstrip('/')}/sparkserve-registry-{secrets.token_hex(6)}"
    tag = secrets.token_hex(8)
    tokens = {dst.name: secrets.token_hex(16) for dst, _ in plan.pending}
    server = _Waiter(src.start(serve_program({
        "registry": program, "workdir": job, "bind": source_ip, "docker": "docker", "ref": plan.ref,
        "repo": TEMP_REPO, "tag": tag, "targets": [{"name": n, "token": t} for n, t in tokens.items()]}),
        timeout=timeout, step="ship"))
    pullers: dict[str, _Waiter] = {}
    t0 = time.monotonic()
    try:
        ready = _wait_ready(src, job, server)
        t_pull = time.monotonic()  # progress: bytes/s of the pulls (the push was local to the source)
        for dst, _ in plan.pending:
            pullers[dst.name] = _Waiter(dst.start(pull_program({
                "host": source_ip, "port": ready["port"], "token": tokens[dst.name], "docker": "docker",
                "repo": TEMP_REPO, "tag": tag, "ref": plan.ref}), timeout=timeout, step="ship"))
        while not all(w.done() for w in pullers.values()):
            next(iter(pullers.values())).join(0.5)
            if progress is not None:
                sent = read_progress(src, job)
                for name in pullers:
                    progress(name, sent.get(name, 0), plan.need[name], time.monotonic() - t_pull)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: every program ends on EOF and cleans up
        interrupts.note(e)
        with interrupts.deferred():
            _close_all(server, pullers)
        raise RemoteFailure("image ship", f"interrupted ({interrupts.signal_name()}) while shipping {plan.ref} "
                            "through the temporary registry; it was removed, pulls stopped, no temporary tag "
                            "is left", node=src.name, step="interrupted") from None
    finally:
        with interrupts.deferred():
            served = _close_all(server, pullers)
    seconds = time.monotonic() - t0
    summary = (last_json(served.stdout) if served else None) or {}
    push_seconds = float(summary.get("push_seconds") or 0.0)
    out: dict[str, LayerShip] = {}
    for dst, _ in plan.pending:
        waiter = pullers[dst.name]
        res = waiter.result
        if res is None:
            raise waiter.error or NodeError(dst.name, "ship", "the pull program did not finish")
        got = last_json(res.stdout)
        if not res.ok or got is None or not got.get("ok"):
            lines = (got or {}).get("pull_out") or res.tail()
            raise NodeError(dst.name, "ship", f"docker pull of {plan.ref} from {src.name}'s temporary registry "
                            "failed", last_lines=list(lines))
        found = image_identity(dst, plan.ref)
        if found is None or found[1] != plan.fingerprint:
            raise NodeError(dst.name, "ship", f"after pulling, {plan.ref} is "
                            f"{(found[1] if found else '?')[:19]} here, not {plan.fingerprint[:19]} "
                            "(content fingerprint)")
        out[dst.name] = LayerShip(dst.name, plan.ref, plan.fingerprint, int(got.get("bytes") or 0), 0, seconds,
                                  "registry", push_seconds=push_seconds)
    return out


def _wait_ready(src: Node, job: str, server: _Waiter, limit: float = 3600.0) -> dict:
    """``job/ready`` once the image is in the registry; NodeError with the server's reason if it ended."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with contextlib.suppress(NodeError, OSError, ValueError):
            return dict(json.loads(src.read_text(f"{job}/ready")))
        if server.done():
            break
        server.join(0.2)
    server.close()
    res = server.join(30)
    summary = last_json(res.stdout) if res else None
    lines = (summary or {}).get("error") or (res.tail() if res else [])
    what = lines[0] if lines else "the temporary registry did not become ready"
    raise NodeError(src.name, "ship", what, last_lines=list(lines[1:]))


def _close_all(server: _Waiter, pullers: dict[str, _Waiter]) -> CommandResult | None:
    """EOF to every program (a puller still pulling stops; the server cleans up), then wait for them all."""
    for w in pullers.values():
        w.close()
    server.close()
    for w in pullers.values():
        w.join(120)
    return server.join(120)
