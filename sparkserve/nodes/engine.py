"""Containers on one node through the docker SDK: run, list, stop, logs, exec, parity facts.

    eng = Engine(node)                          # node: any sparkserve.nodes.Node
    cid = eng.run(spec)                         # spec: sparkserve.plan.container.ContainerSpec → container id
    for c in eng.list_managed(): ...            # only containers labelled io.sparkserve.managed=1
    eng.stop_and_remove(cid, timeout=30)        # docker stop (SIGTERM, SIGKILL after timeout), then rm
    for line in eng.logs(cid, follow=True): ...
    eng.exec(cid, argv, detach=True, to_container_log=True)   # the ray `vllm serve` step
    eng.parity_facts(cid) == eng2.parity_facts(cid2)          # rank parity (same keys as plan.parity_view)

Images (identity across nodes, shipping) are :mod:`sparkserve.image.ship`.

Ownership rule: every verb that stops, removes or execs in a container first checks that it carries
``io.sparkserve.managed=1``; a container without it is never touched, whatever its name. A container is
only force-removed after a graceful ``docker stop`` was attempted (forced removal of a GPU container has
wedged GB10 hosts).

Every failure is a :class:`~sparkserve.nodes.NodeError` naming the node and the step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.docker_client import LogStream, docker_errors
from sparkserve.plan.build import parity_view
from sparkserve.plan.container import (
    LABEL_FINGERPRINT,
    LABEL_MANAGED,
    LABEL_NODE,
    LABEL_RANK,
    LABEL_ROLE,
    ContainerSpec,
    Mount,
)

#: What to do about an image a node lacks (the image stage says it too).
SHIP_HINT = "run `sparkserve image ship` to copy it from a node that has it"

if TYPE_CHECKING:
    from docker.models.containers import Container

DOCKER_STOP_TIMEOUT_S = 10  # what dockerd uses when a container was created without a stop timeout
EXEC_TO_LOG = 'exec "$@" >/proc/1/fd/1 2>/proc/1/fd/2'  # exec'd output joins the container's log


class NoSuchContainer(NodeError):
    """The container does not exist (any more)."""


class NotManaged(NodeError):
    """The container exists but carries no io.sparkserve.managed=1 label: sparkserve never touches it."""


@dataclass(frozen=True)
class ManagedContainer:
    """A container sparkserve started (it carries the io.sparkserve.* labels)."""

    id: str
    name: str
    node: str
    rank: int | None
    role: str
    fingerprint: str
    status: str  # created | running | exited | dead | ...
    image_id: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass(frozen=True)
class ContainerState:
    status: str
    running: bool
    exit_code: int | None
    oom_killed: bool
    error: str
    started_at: str
    finished_at: str


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when detached
    output: str


def _restart_text(policy: dict[str, Any]) -> str:
    """The API's RestartPolicy back in ``docker run --restart`` syntax."""
    name = str(policy.get("Name") or "no")
    retries = policy.get("MaximumRetryCount")
    return f"{name}:{retries}" if name == "on-failure" and retries else name


def _is_managed(labels: dict[str, str] | None) -> bool:
    return (labels or {}).get(LABEL_MANAGED) == "1"


class Engine:
    """Docker verbs on one node. Cheap to create; the node caches the SDK client."""

    noun = "container"  # what a rank is here, for messages

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def client(self) -> docker.DockerClient:
        return self.node.docker()

    def _step(self, step: str, what: str = "") -> contextlib.AbstractContextManager[None]:
        return docker_errors(self.node, step, what)

    # -- containers -----------------------------------------------------------------------------------

    def run(self, spec: ContainerSpec, *, make_dirs: bool = True) -> str:
        """Create and start ``spec``'s container (detached, with its restart policy and stop timeout); return
        its id. ``make_dirs``: create the spec's ``make_dirs`` first (False: the caller made them).

        Never pulls. A name clash is reported, never resolved by removing the other container.
        """
        if make_dirs:  # the plan's, and any writable mount's source a caller's spec adds (docker needs them all)
            for d in dict.fromkeys([*spec.make_dirs, *(m.source for m in spec.mounts if not m.read_only)]):
                self.node.makedirs(d)
        kw = spec.docker_sdk_kwargs()
        with self._step("run", spec.name):
            api = self.client.api  # low-level: docker-py's containers.create has no stop_timeout
            host_config = api.create_host_config(**kw["host_config"])
            try:
                cid = str(api.create_container(**kw["create"], host_config=host_config)["Id"])
            except docker.errors.ImageNotFound:
                what = f"image {spec.image} is not on this node; {SHIP_HINT}"
                raise NodeError(self.name, "run", what) from None
            except docker.errors.APIError as e:
                if e.status_code == 409:
                    raise NodeError(self.name, "run", self._clash(spec.name)) from None
                raise
            try:
                api.start(cid)  # by the id create returned: no inspect round trip in between
            except docker.errors.APIError as e:
                msg = str(e.explanation or e)
                with contextlib.suppress(Exception):  # ours, created, never started: nothing to stop
                    api.remove_container(cid)
                if "error setting rlimit type 8" in msg:  # RLIMIT_MEMLOCK
                    msg = (f"the node refused ulimit memlock={spec.ulimits.get('memlock')} (dockerd's own hard "
                           f"limit is lower and it lacks CAP_SYS_RESOURCE): {msg}")
                raise NodeError(self.name, "run", f"{spec.name} did not start: {msg}") from None
            return cid

    def _clash(self, name: str) -> str:
        try:
            other = self.client.containers.get(name)
        except docker.errors.NotFound:
            return f"a container named {name} appeared while starting; try again"
        if _is_managed(other.labels):
            return (f"a sparkserve container named {name} already exists ({other.status}); "
                    "run `sparkserve down` first")
        return (f"a container named {name} exists that sparkserve did not start; it is left alone — "
                "remove or rename it yourself, or change container.name_prefix")

    def _get(self, ref: str | ManagedContainer, step: str) -> Container:
        key = ref.id if isinstance(ref, ManagedContainer) else ref
        with self._step(step, key):
            try:
                return self.client.containers.get(key)
            except docker.errors.NotFound:
                raise NoSuchContainer(self.name, step, f"no container {key}") from None

    def _get_managed(self, ref: str | ManagedContainer, step: str) -> Container:
        c = self._get(ref, step)
        if not _is_managed(c.labels):
            raise NotManaged(self.name, step, f"refusing to touch {c.name}: it has no {LABEL_MANAGED}=1 label "
                             "(sparkserve did not start it)")
        return c

    @staticmethod
    def _managed(c: Container, node: str) -> ManagedContainer:
        labels = dict(c.labels or {})
        rank = labels.get(LABEL_RANK, "")
        return ManagedContainer(
            id=str(c.id),
            name=str(c.name),
            node=labels.get(LABEL_NODE, node),
            rank=int(rank) if rank.isdigit() else None,
            role=labels.get(LABEL_ROLE, ""),
            fingerprint=labels.get(LABEL_FINGERPRINT, ""),
            status=str(c.status),
            image_id=str(c.attrs.get("Image", "")),
            labels=labels,
        )

    def list_managed(self, *, include_stopped: bool = True) -> list[ManagedContainer]:
        """Containers labelled io.sparkserve.managed=1 on this node, ordered by rank."""
        with self._step("list"):
            found = self.client.containers.list(all=include_stopped, filters={"label": f"{LABEL_MANAGED}=1"})
        out = [self._managed(c, self.name) for c in found if _is_managed(c.labels)]
        return sorted(out, key=lambda m: (m.rank is None, m.rank or 0, m.name))

    def managed(self, ref: str) -> ManagedContainer | None:
        """The managed container with this id or name, or None (absent, or not sparkserve's)."""
        with self._step("inspect", ref):
            try:
                c = self.client.containers.get(ref)
            except docker.errors.NotFound:
                return None
        return self._managed(c, self.name) if _is_managed(c.labels) else None

    def state(self, ref: str | ManagedContainer) -> ContainerState:
        c = self._get(ref, "inspect")
        s = c.attrs.get("State", {})
        return ContainerState(
            status=str(s.get("Status", c.status)),
            running=bool(s.get("Running")),
            exit_code=s.get("ExitCode"),
            oom_killed=bool(s.get("OOMKilled")),
            error=str(s.get("Error", "")),
            started_at=str(s.get("StartedAt", "")),
            finished_at=str(s.get("FinishedAt", "")),
        )

    def daemon_answers(self, *, watch_s: float = 0.0, every_s: float = 0.25) -> bool:
        """Whether the node's docker daemon answers a ping, and keeps answering for ``watch_s`` seconds: a
        daemon that is shutting down still answers for a moment while it stops its containers, and a
        container it stopped that way reads like one that exited on its own."""
        deadline = time.monotonic() + watch_s
        while True:
            try:
                self.client.ping()
            except Exception:  # noqa: BLE001 - any way of not answering is the answer
                return False
            if time.monotonic() >= deadline:
                return True
            time.sleep(every_s)

    def restarted_since(self, ref: str | ManagedContainer, started_at: str) -> bool:
        """Whether the node's docker daemon restarted after the container started at ``started_at`` (its
        ``State.StartedAt``): docker keeps its events in memory only, so a daemon that restarted since has no
        record of that start. A daemon killed and restarted between two looks (systemd's Restart=always) answers
        again by the next one and reports the rank's container exited 137, as if the engine had died: this is how
        the difference is seen. False when the question cannot be asked (no start time, an unreadable stream)."""
        at = _unix(started_at)
        if at is None:
            return False
        ident = ref.id if isinstance(ref, ManagedContainer) else ref
        try:
            with self._step("events", ident[:12]):
                # both bounds on the daemon's own clock (the start event is stamped a few ms after StartedAt): the
                # stream ends by itself, whatever this machine's clock says
                wanted = {"container": [ident], "event": ["start"], "type": ["container"]}
                events = self.client.api.events(since=at - 1.0, until=at + 1.0, decode=True, filters=wanted)
                return not any(True for _ in events)
        except NodeError:
            return False

    def stop_graceful(self, ref: str | ManagedContainer, timeout: int) -> None:
        """``docker stop -t timeout``: SIGTERM, then SIGKILL after ``timeout`` s. Managed containers only."""
        c = self._get_managed(ref, "stop")
        with self._step("stop", c.name):
            c.reload()
            if c.status in ("running", "paused", "restarting"):
                c.stop(timeout=timeout)

    def remove(self, ref: str | ManagedContainer) -> None:
        """Remove a stopped managed container. A running one is refused: call stop_graceful first."""
        c = self._get_managed(ref, "remove")
        with self._step("remove", c.name):
            c.reload()
            if c.status in ("running", "paused", "restarting"):
                what = f"{c.name} is still {c.status}; stop it gracefully first"
                raise NodeError(self.name, "remove", what)
            with contextlib.suppress(docker.errors.NotFound):
                c.remove()

    def stop_and_remove(self, ref: str | ManagedContainer, *, timeout: int) -> None:
        """Graceful stop, then remove; force only if the daemon could not stop it gracefully.

        Idempotent: a container that is already gone is fine. NotManaged if it is not sparkserve's."""
        try:
            self.stop_graceful(ref, timeout)
        except NoSuchContainer:
            return
        except NotManaged:
            raise
        except NodeError:
            try:
                c = self._get_managed(ref, "remove")
            except NoSuchContainer:
                return
            with self._step("remove", c.name), contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)  # a graceful stop was attempted and failed
            return
        with contextlib.suppress(NoSuchContainer):
            self.remove(ref)

    def logs(
        self,
        ref: str | ManagedContainer,
        *,
        since: datetime | float | int | None = None,
        follow: bool = False,
        tail: int | None = None,
        timestamps: bool = False,
    ) -> LogStream:
        """The container's log (stdout and stderr) as lines without newline; ``follow`` streams (another
        thread may ``cancel()`` it). No inspect of ours first; NoSuchContainer when it does not exist."""
        key, name = (ref.id, ref.name) if isinstance(ref, ManagedContainer) else (ref, ref)
        kw: dict[str, Any] = dict(stdout=True, stderr=True, timestamps=timestamps, tail=tail or "all")
        if since is not None:
            kw["since"] = since
        with self._step("logs", name):
            try:
                chunks = self.client.api.logs(key, stream=True, follow=follow, **kw)
            except docker.errors.NotFound:
                raise NoSuchContainer(self.name, "logs", f"no container {key}") from None
        return LogStream(chunks, self._lines(chunks, name))

    def _lines(self, chunks: Iterator[bytes], name: str) -> Iterator[str]:
        buf = b""
        with self._step("logs", name):
            for chunk in chunks:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace").rstrip("\r")
        if buf:
            yield buf.decode(errors="replace").rstrip("\r")

    def log_tail(self, ref: str | ManagedContainer, n: int = 40) -> list[str]:
        return list(self.logs(ref, tail=n))

    def exec(
        self,
        ref: str | ManagedContainer,
        argv: list[str],
        *,
        detach: bool = False,
        to_container_log: bool = False,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``argv`` inside a managed container. ``to_container_log`` sends its output to the
        container's own log (so `logs` and the boot-log gates see it); it needs ``sh`` in the image."""
        c = self._get_managed(ref, "exec")
        cmd = list(argv)
        if to_container_log:
            cmd = ["sh", "-c", EXEC_TO_LOG, "sparkserve-exec", *cmd]
        with self._step("exec", c.name):
            code, out = c.exec_run(cmd, detach=detach, environment=env)
        if detach:
            return ExecResult(None, "")
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out or "")
        return ExecResult(code, text)

    # -- parity ---------------------------------------------------------------------------------------

    def inspect_spec(self, ref: str | ManagedContainer) -> tuple[ContainerSpec, str]:
        """Rebuild the ContainerSpec a running container corresponds to, and its image ID.

        Env vars identical to the image's own defaults (PATH, …) are dropped, so the spec compares with
        the plan's. The ray head's exec'd serve argv is not visible here (only its ``ray start``)."""
        c = self._get_managed(ref, "inspect")
        a = c.attrs
        cfg, host = a.get("Config", {}), a.get("HostConfig", {})
        with self._step("inspect", c.name):
            img_env = set(self.client.images.get(a["Image"]).attrs.get("Config", {}).get("Env") or [])
        env = {}
        for kv in cfg.get("Env") or []:
            if kv in img_env:
                continue
            k, _, v = kv.partition("=")
            env[k] = v
        labels = dict(cfg.get("Labels") or {})
        rank = labels.get(LABEL_RANK, "0")
        spec = ContainerSpec(
            node=labels.get(LABEL_NODE, self.name),
            host=self.node.address,
            rank=int(rank) if rank.isdigit() else 0,
            role="head" if labels.get(LABEL_ROLE) == "head" else "follower",
            name=str(c.name),
            image=str(cfg.get("Image", "")),
            command=[*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])],
            env=env,
            mounts=[Mount(source=m["Source"], target=m["Destination"], read_only=not m.get("RW", True))
                    for m in a.get("Mounts") or [] if m.get("Type") == "bind"],
            labels=labels,
            ulimits={u["Name"]: (u["Soft"], u["Hard"]) for u in host.get("Ulimits") or []},
            restart=_restart_text(host.get("RestartPolicy") or {}),
            stop_timeout=int(cfg.get("StopTimeout") or DOCKER_STOP_TIMEOUT_S),
            network_mode=str(host.get("NetworkMode", "")),
            ipc_mode=str(host.get("IpcMode", "")),
            shm_size=int(host.get("ShmSize") or 0),
            cap_add=list(host.get("CapAdd") or []),
            devices=[d["PathOnHost"] for d in host.get("Devices") or []],
            gpus=bool(host.get("DeviceRequests")),
        )
        return spec, str(a.get("Image", ""))

    def parity_facts(self, ref: str | ManagedContainer) -> dict[str, object]:
        """``plan.parity_view`` of the running container, plus its ``image_id``.

        Compare ranks with each other on the whole dict; compare with the plan on parity_view's keys."""
        spec, image_id = self.inspect_spec(ref)
        return parity_view(spec) | {"image_id": image_id}


def _unix(stamp: str) -> float | None:
    """Docker's RFC 3339 time (``2026-12-02T08:05:58.014025493Z``) → unix seconds; None for docker's zero time."""
    if not stamp or stamp.startswith("0001-"):
        return None
    base, _, frac = stamp.rstrip("Z").partition(".")
    try:
        return datetime.fromisoformat(base + "+00:00").timestamp() + float(f"0.{frac or 0}")
    except ValueError:
        return None
