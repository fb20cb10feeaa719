"""The Node protocol: the few verbs everything above needs (after pyinfra's BaseConnector).

A ``Node`` is one machine sparkserve drives. Orchestration code holds ``Node`` objects and never imports
paramiko or asks which kind it has::

    from sparkserve.nodes import connect_nodes
    nodes = connect_nodes(cfg)                      # {name: Node}, connected in parallel
    res = nodes["spark-b"].run(["df", "-B1", "--output=avail", "/srv"], timeout=10, step="disk")
    client = nodes["spark-b"].docker()              # docker SDK over the node's own SSH connection

Implementations: :class:`sparkserve.nodes.ssh.SSHNode` (paramiko) and
:class:`sparkserve.nodes.local.LocalNode` (this machine, no SSH).

Rules every implementation keeps:

* ``run`` takes an **argv list**; it is quoted with ``shlex`` for the remote shell, so a value such as
  ``/m/x; touch /tmp/pwned`` is one argument, never a command.
* every remote step has a timeout; a timeout, a lost connection or (``check=True``) a non-zero exit
  raises :class:`NodeError` naming the node, the step, the command and its last output lines.
* file verbs (``put``/``get``/``read_text``/``write_bytes``) never go through a shell at all.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sparkserve.errors import RemoteFailure

if TYPE_CHECKING:
    from collections.abc import Callable

    import docker


@dataclass
class CommandResult:
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, n: int = 20) -> list[str]:
        lines = (self.stdout + "\n" + self.stderr).strip().splitlines()
        return lines[-n:]


@dataclass
class NodeError(RemoteFailure):
    """A remote step failed: which node, which step, which command, and the last lines it printed."""

    node_name: str = ""
    step_name: str = ""
    argv: list[str] = field(default_factory=list)
    last_lines: list[str] = field(default_factory=list)

    def __init__(
        self,
        node: str,
        step: str,
        what: str,
        *,
        argv: list[str] | None = None,
        last_lines: list[str] | None = None,
    ) -> None:
        self.node_name = node
        self.step_name = step
        self.argv = argv or []
        self.last_lines = last_lines or []
        super().__init__(f"{node}: {step}", what, node=node, step=step, details=self.last_lines[-10:])

    def __hash__(self) -> int:  # exceptions must stay hashable (traceback machinery, sets of errors)
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


@dataclass(frozen=True)
class RsyncRemote:
    """How ``rsync`` reaches a node over OpenSSH with the same key and known_hosts as paramiko.

    ``ssh_argv`` is the ``-e`` program (an argv; join it with :func:`shlex.join`), ``target`` the
    ``user@host`` prefix for remote paths.
    """

    ssh_argv: tuple[str, ...]
    target: str

    @property
    def rsh(self) -> str:
        return shlex.join(self.ssh_argv)


class RemoteProcess(Protocol):
    """A command started with :meth:`Node.start`: feed its stdin while it runs, then wait for it."""

    argv: list[str]

    def write(self, data: bytes) -> None:
        """Send bytes to its stdin."""
        ...

    def close_stdin(self) -> None:
        """EOF on its stdin (idempotent)."""
        ...

    def wait(self, *, check: bool = True) -> CommandResult:
        """Wait until it exits (or its timeout kills it); NodeError on timeout or (check) non-zero."""
        ...


@runtime_checkable
class Node(Protocol):
    """One machine sparkserve drives. Implementations: SSHNode (paramiko), LocalNode."""

    name: str

    @property
    def address(self) -> str:
        """Where the node is, for messages (``root@127.0.0.3:2222`` or ``local``)."""
        ...

    def run(
        self,
        argv: list[str],
        *,
        timeout: float = 60.0,
        step: str = "run",
        check: bool = True,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """Run an argv (never a shell string) on the node; raise NodeError on timeout or (check) non-zero.

        On timeout the remote process is killed (it runs under coreutils ``timeout``).
        """
        ...

    def start(self, argv: list[str], *, timeout: float = 3600.0, step: str = "run") -> RemoteProcess:
        """Start an argv whose stdin stays open for :meth:`RemoteProcess.write` (same quoting and timeout
        rules as ``run``)."""
        ...

    def put(self, local: Path, remote: str, *, mode: int | None = None, preserve_mtime: bool = False,
            on_bytes: Callable[[int], None] | None = None) -> None:
        """Copy a local file to ``remote`` atomically (temp name + rename); parent dirs are created.
        ``on_bytes(n)``: n bytes of this file are written so far. An interrupt (sparkserve.interrupts) stops it
        within about a second, leaving no temp file."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the node."""
        ...

    def read_text(self, remote: str) -> str:
        """Read a small text file on the node (e.g. /proc/meminfo)."""
        ...

    def write_bytes(self, remote: str, data: bytes, *, mode: int | None = None) -> None:
        """Write a small file on the node atomically; parent dirs are created."""
        ...

    def makedirs(self, remote: str) -> None:
        """``mkdir -p`` without a shell (SFTP on SSH nodes: milliseconds, no process on the node)."""
        ...

    def rsync_remote(self) -> RsyncRemote | None:
        """How rsync reaches this node over SSH, or None when the node is this machine."""
        ...

    def docker(self) -> docker.DockerClient:
        """A docker SDK client for this node's daemon (cached; one connection pool)."""
        ...

    def close(self) -> None: ...
