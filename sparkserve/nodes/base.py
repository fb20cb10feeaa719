"""The Node protocol: the few verbs everything above needs (after pyinfra's BaseConnector)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sparkserve.errors import RemoteFailure

if TYPE_CHECKING:
    import docker


@dataclass
class CommandResult:
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str

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
        self, node: str, step: str, what: str, *, argv: list[str] | None = None, last_lines: list[str] | None = None
    ) -> None:
        self.node_name = node
        self.step_name = step
        self.argv = argv or []
        self.last_lines = last_lines or []
        super().__init__(f"{node}: {step}", what, node=node, step=step, details=self.last_lines[-10:])


@runtime_checkable
class Node(Protocol):
    """One machine sparkserve drives. Implementations: SSHNode (paramiko), LocalNode."""

    name: str

    def run(self, argv: list[str], *, timeout: float = 60.0, step: str = "run", check: bool = True,
            stdin: bytes | None = None) -> CommandResult:
        """Run an argv (never a shell string) on the node; raise NodeError on timeout or (check) non-zero."""
        ...

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        """Copy a local file to ``remote`` on the node."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the node."""
        ...

    def read_text(self, remote: str) -> str:
        """Read a small text file on the node (e.g. /proc/meminfo, sysfs)."""
        ...

    def docker(self) -> docker.DockerClient:
        """A docker SDK client for this node's daemon (cached; one connection pool)."""
        ...

    def close(self) -> None: ...
