"""``runtime: process``: each rank is ``<serve.vllm> serve …`` as a host process on its node, with the same
verbs as the docker :class:`~sparkserve.nodes.engine.Engine` (see :mod:`sparkserve.nodes.runtime`).

    eng = ProcessEngine(node, run_dir="~/.local/state/sparkserve/run", vllm="vllm")
    rid = eng.run(spec, argv=plan.process_argv(spec))    # → "<fingerprint[:16]>-r<rank>"
    eng.state(rid).running                               # pid alive AND the same start time (pid reuse)
    eng.stop_and_remove(rid, timeout=30)                 # SIGINT → SIGTERM → SIGKILL, then files removed

Where things are on the node: ``<run_dir>/<fingerprint[:16]>/rank<R>.{json,log,exit}`` — the manifest (the
process equivalent of the container labels), the log (one per boot), the exit status its supervisor wrote.
Everything on the node is done by one program (:mod:`sparkserve.nodes.process_remote`), one round trip per
verb. Only processes a manifest names (its pid, its verified group leader, the processes carrying its
marker) are ever signalled.

Log lines are stamped as docker stamps them: the rank's supervisor notes when each chunk of output arrived
(``rank<R>.stamps``); a line takes the time of the chunk that ended it. One log per boot.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.engine import ContainerState, ExecResult, ManagedContainer, NoSuchContainer
from sparkserve.nodes.process_remote import MARKER_ENV, run_remote
from sparkserve.plan.build import NODE_SPECIFIC_ENV, parity_view
from sparkserve.plan.container import LABEL_FINGERPRINT, ContainerSpec

LABEL_ENGINE_ID = "io.sparkserve.engine-id"  # runtime process: the engine identity the preflight found
FOLLOW_POLL_S = 0.5
FRESH_S = 0.15  # a look this recent answers logs() without another round trip


def rank_id(fingerprint: str, rank: int) -> str:
    """The handle of one rank's process (what a container id is to docker): ``<fingerprint[:16]>-r<rank>``."""
    return f"{fingerprint[:16]}-r{rank}"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


@dataclass(frozen=True)
class Waited:
    """A process of a stopped rank that `stop` waited for until it was gone (``seconds`` after the signals)."""

    pid: int
    name: str
    seconds: float

    def words(self) -> str:
        return f"pid {self.pid} ({self.name}) {self.seconds:.1f}s"


@dataclass
class _Seen:
    """What this engine has read of one rank's log: bytes consumed, whole lines and when each was first seen."""

    offset: int = 0
    stamp_offset: int = 0
    lines: list[str] = field(default_factory=list)
    stamps: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    pending: bytes = b""
    chunks: list[tuple[int, float]] = field(default_factory=list)  # (log bytes so far, arrival) not yet used
    stamp_pending: bytes = b""
    looked: float = 0.0
    reply: dict[str, Any] = field(default_factory=dict)


class ProcessEngine:
    """The process runtime on one node. Cheap to create; it remembers what it read of each log."""

    noun = "process"  # what a rank is here, for messages

    def __init__(self, node: Node, *, run_dir: str, vllm: str = "vllm", marker: str = MARKER_ENV) -> None:
        self.node = node
        self.run_dir = run_dir
        self.vllm = vllm
        self.marker = marker
        self._seen: dict[str, _Seen] = {}
        self.waited: dict[str, list[Waited]] = {}  # rank id -> what its last stop waited for, after the signals

    @property
    def name(self) -> str:
        return self.node.name

    def _ask(self, question: dict[str, Any], step: str, timeout: float = 60.0) -> dict[str, Any]:
        return run_remote(self.node, {"root": self.run_dir, "marker": self.marker, **question}, step=step,
                          timeout=timeout)

    @staticmethod
    def _key(ref: str | ManagedContainer) -> str:
        return ref.id if isinstance(ref, ManagedContainer) else ref

    # -- start ------------------------------------------------------------------------------------------

    def run(self, spec: ContainerSpec, *, make_dirs: bool = True, argv: list[str] | None = None) -> str:
        """Start ``spec``'s rank as a host process in its own session; return its rank id.

        ``argv`` is what runs (default: the spec's serve argv with ``serve.vllm`` for ``vllm``); env is the
        node's login environment plus the spec's env and secrets (sent on stdin, never in an argv)."""
        del make_dirs  # no mounts: a host process sees the host paths
        cmd = list(argv if argv is not None else spec.serve_argv())
        if cmd[:1] == ["vllm"]:
            cmd[0] = self.vllm
        rid = rank_id(spec.labels.get(LABEL_FINGERPRINT, ""), spec.rank)
        q = {"verb": "start", "id": rid, "exe": cmd[0], "argv": cmd[1:], "env": spec.run_env(),
             "fingerprint": spec.labels.get(LABEL_FINGERPRINT, ""), "rank": spec.rank, "role": spec.role,
             "node": spec.node, "name": spec.name, "labels": dict(spec.labels)}
        reply = self._ask(q, "run")
        if reply.get("error") == "clash":
            raise NodeError(self.name, "run", f"{spec.name} already runs on this node (pid {reply.get('pid')}); "
                            "run `sparkserve down` first")
        if "error" in reply:
            raise NodeError(self.name, "run", f"{spec.name} did not start: {reply['error']}")
        self._seen.pop(rid, None)
        return rid

    # -- what runs ----------------------------------------------------------------------------------------

    def _managed(self, r: dict[str, Any]) -> ManagedContainer:
        m = r["manifest"]
        labels = dict(m.get("labels") or {})
        return ManagedContainer(id=str(r["id"]), name=str(m.get("name", r["id"])), node=str(m.get("node", self.name)),
                                rank=int(m["rank"]), role=str(m.get("role", "")),
                                fingerprint=str(m.get("fingerprint", "")),
                                status="running" if r.get("running") else "exited",
                                image_id=labels.get(LABEL_ENGINE_ID, ""), labels=labels)

    def list_managed(self, *, include_stopped: bool = True) -> list[ManagedContainer]:
        """Every rank a manifest names on this node, ordered by rank."""
        out = [self._managed(r) for r in self._ask({"verb": "list"}, "list")["ranks"]]
        out = [c for c in out if include_stopped or c.running]
        return sorted(out, key=lambda m: (m.rank is None, m.rank or 0, m.name))

    def _look(self, ref: str | ManagedContainer, step: str) -> dict[str, Any]:
        """One look at a rank: its manifest, liveness, exit status and the log bytes not read yet."""
        key = self._key(ref)
        seen = self._seen.setdefault(key, _Seen())
        consumed = seen.offset + len(seen.pending)
        offsets = [consumed, seen.stamp_offset + len(seen.stamp_pending)]
        reply = self._ask({"verb": "look", "ids": [key], "offsets": {key: offsets}}, step)
        r = reply["ranks"][0]
        if r.get("manifest") is None:
            raise NoSuchContainer(self.name, step, f"no process {key}")
        self._take(seen, base64.b64decode(r.pop("log", "") or ""), base64.b64decode(r.pop("stamps", "") or ""),
                   float(reply["now"]))
        seen.looked, seen.reply = time.monotonic(), r
        return r

    @staticmethod
    def _take(seen: _Seen, log: bytes, stamps: bytes, now: float) -> None:
        """New log and stamps bytes → whole lines, each stamped with the arrival of the chunk that ended it
        (``now`` when its stamp is not written yet)."""
        *entries, seen.stamp_pending = (seen.stamp_pending + stamps).split(b"\n")
        seen.stamp_offset += sum(len(e) + 1 for e in entries)
        for e in entries:
            end, _, at = e.decode(errors="replace").partition(" ")
            with contextlib.suppress(ValueError):
                seen.chunks.append((int(end), float(at)))
        *whole, seen.pending = (seen.pending + log).split(b"\n")
        for line in whole:
            end = seen.offset + len(line) + 1
            while seen.chunks and seen.chunks[0][0] < end:  # chunks that ended before this line did
                seen.chunks.pop(0)
            at = seen.chunks[0][1] if seen.chunks else now
            seen.lines.append(line.decode(errors="replace").rstrip("\r"))
            seen.stamps.append(_iso(at))
            seen.times.append(at)
            seen.offset = end

    def managed(self, ref: str) -> ManagedContainer | None:
        try:
            return self._managed(self._look(ref, "inspect"))
        except NoSuchContainer:
            return None

    def state(self, ref: str | ManagedContainer) -> ContainerState:
        r = self._look(ref, "inspect")
        m, ex = r["manifest"], r.get("exit") or {}
        running = bool(r.get("running"))
        code = ex.get("exit_code") if not running else None
        return ContainerState(status="running" if running else "exited", running=running,
                              exit_code=code if isinstance(code, int) else None, oom_killed=False,
                              error="", started_at=str(m.get("started_at", "")),
                              finished_at=_iso(float(ex["at"])) if ex.get("at") and not running else "")

    def daemon_answers(self, *, watch_s: float = 0.0, every_s: float = 0.25) -> bool:
        """There is no daemon: a process runtime node answers when its SSH does."""
        del watch_s, every_s
        return True

    def restarted_since(self, ref: str | ManagedContainer, started_at: str) -> bool:
        """There is no daemon to restart under a host process."""
        del ref, started_at
        return False

    # -- logs -------------------------------------------------------------------------------------------

    def logs(self, ref: str | ManagedContainer, *, since: datetime | float | int | None = None,
             follow: bool = False, tail: int | None = None, timestamps: bool = False) -> Iterator[str]:
        """The rank's log of this boot as lines without newline (one log per boot; ``since``: the lines that
        arrived from then on); ``timestamps`` prefixes each with its arrival (RFC 3339, as docker's);
        ``follow`` streams until the rank ends."""
        key = self._key(ref)
        seen = self._seen.get(key)
        if seen is None or time.monotonic() - seen.looked > FRESH_S:
            self._look(key, "logs")
        seen = self._seen[key]
        start = 0
        if since is not None:
            t = since.timestamp() if isinstance(since, datetime) else float(since)
            start = next((i for i, x in enumerate(seen.times) if x >= t), len(seen.times))
        if not follow:
            return iter(self._render(seen, start, tail, timestamps, partial=True))
        return self._follow(key, start, tail, timestamps)

    @staticmethod
    def _render(seen: _Seen, start: int, tail: int | None, timestamps: bool, *, partial: bool) -> list[str]:
        lines, stamps = seen.lines[start:], seen.stamps[start:]
        if partial and seen.pending:
            lines = [*lines, seen.pending.decode(errors="replace").rstrip("\r")]
            stamps = [*stamps, stamps[-1] if stamps else _iso(time.time())]
        if tail:
            lines, stamps = lines[-tail:], stamps[-tail:]
        return [f"{s} {x}" for s, x in zip(stamps, lines, strict=True)] if timestamps else lines

    def _follow(self, key: str, start: int, tail: int | None, timestamps: bool) -> Iterator[str]:
        seen = self._seen[key]
        yield from self._render(seen, start, tail, timestamps, partial=False)
        done = len(seen.lines)
        while True:
            time.sleep(FOLLOW_POLL_S)
            r = self._look(key, "logs")
            yield from self._render(seen, done, None, timestamps, partial=False)
            done = len(seen.lines)
            if not r.get("running"):
                yield from ([seen.pending.decode(errors="replace")] if seen.pending else [])
                return

    def log_tail(self, ref: str | ManagedContainer, n: int = 40) -> list[str]:
        return list(self.logs(ref, tail=n))

    # -- stop -------------------------------------------------------------------------------------------

    def stop_graceful(self, ref: str | ManagedContainer, timeout: int) -> list[str]:
        """SIGINT, then SIGTERM, then SIGKILL (each after ``timeout`` s) to the rank's processes; return the
        signals sent. NodeError when a process of the rank survived SIGKILL."""
        key = self._key(ref)
        reply = self._ask({"verb": "stop", "id": key, "timeout_s": timeout}, "stop", timeout=3.0 * timeout + 30)
        if key in self._seen:  # what it said while stopping is new: the next logs() looks again
            self._seen[key].looked = float("-inf")
        self.waited[key] = [Waited(int(w["pid"]), str(w["name"]), float(w["seconds"]))
                            for w in reply.get("waited", [])]
        if reply.get("left"):
            raise NodeError(self.name, "stop", f"{key}: pids {reply['left']} survived SIGKILL or were still "
                            f"exiting after {timeout}s")
        return list(reply.get("signals", []))

    def remove(self, ref: str | ManagedContainer) -> None:
        """Delete a stopped rank's manifest, exit status and log. A running rank is refused."""
        key = self._key(ref)
        reply = self._ask({"verb": "remove", "id": key}, "remove")
        if reply.get("error"):
            raise NodeError(self.name, "remove", f"{key} is still running; stop it gracefully first")
        self._seen.pop(key, None)

    def stop_and_remove(self, ref: str | ManagedContainer, *, timeout: int) -> None:
        """Stop (escalating), then remove. Idempotent: a rank that is already gone is fine."""
        self.stop_graceful(ref, timeout)
        self.remove(ref)

    def exec(self, ref: str | ManagedContainer, argv: list[str], *, detach: bool = False,
             to_container_log: bool = False, env: dict[str, str] | None = None) -> ExecResult:
        """Not a thing a host process has (the ray executor needs runtime: docker; the config refuses it)."""
        raise NodeError(self.name, "exec", "runtime: process cannot exec into a rank (ray needs runtime: docker)")

    # -- parity -----------------------------------------------------------------------------------------

    def inspect_spec(self, ref: str | ManagedContainer) -> tuple[ContainerSpec, str]:
        """The running rank as a ContainerSpec (argv from its manifest, no mounts, env values unknown: empty)
        and its engine identity."""
        r = self._look(ref, "inspect")
        m = r["manifest"]
        labels = dict(m.get("labels") or {})
        spec = ContainerSpec(node=str(m.get("node", self.name)), host=self.node.address, rank=int(m["rank"]),
                             role="head" if m.get("role") == "head" else "follower", name=str(m.get("name", "")),
                             image="", command=list(m.get("argv") or []), env={}, mounts=[], labels=labels,
                             shm_size=0, gpus=False, cap_add=[])
        return spec, labels.get(LABEL_ENGINE_ID, "")

    def parity_facts(self, ref: str | ManagedContainer) -> dict[str, object]:
        """``plan.parity_view`` of what runs: argv from ``/proc/<pid>/cmdline``, env as a sha256 per value
        from ``/proc/<pid>/environ`` (per-node names left out; values never leave the node), and the
        engine identity as ``image_id``."""
        spec, engine_id = self.inspect_spec(ref)
        reply = self._ask({"verb": "parity", "id": self._key(ref), "skip": list(NODE_SPECIFIC_ENV)}, "parity")
        if reply.get("error"):
            raise NodeError(self.name, "rank parity", f"{self._key(ref)} is not running")
        live = spec.model_copy(update={"command": list(reply["argv"]), "env": dict(reply["env"])})
        return parity_view(live) | {"image_id": engine_id}

    def identity(self, *, timeout: float = 180.0) -> tuple[str, str]:
        """(engine id, what it is) of ``serve.vllm`` on this node: sha256 of the executable's bytes and its
        ``--version`` output. NodeError when the node has no such executable."""
        reply = self._ask({"verb": "identity", "exe": self.vllm, "timeout_s": timeout}, "engine",
                          timeout=timeout + 30)
        if reply.get("error"):
            raise NodeError(self.name, "engine", f"serve.vllm: {reply['error']}")
        return str(reply["id"]), f"{reply['path']} {reply.get('version') or '(no --version)'}"
