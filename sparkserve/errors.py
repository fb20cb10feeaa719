"""Typed failures. Each carries the exit code DESIGN.md assigns and prints as one line.

0 ok · 1 a gate or check failed · 2 bad input (config, drafter, usage) · 3 a node unreachable, a remote
step failed, or the run was interrupted (Ctrl-C, SIGTERM, SIGHUP — after cleaning up what it started) ·
4 a swap failed and so did its rollback: nothing runs.
"""

from __future__ import annotations


class SparkserveError(Exception):
    """An expected failure: printed as ``error: <where>: <what>`` without a traceback."""

    exit_code = 1

    def __init__(self, where: str, what: str, *, details: list[str] | None = None) -> None:
        self.where = where
        self.what = what
        self.details = details or []
        super().__init__(f"{where}: {what}")

    def line(self) -> str:
        return f"error: {self.where}: {self.what}"


class BadInput(SparkserveError):
    """Config, drafter, target or usage is wrong. Raised before any node is touched."""

    exit_code = 2


class GateFailed(SparkserveError):
    """A gate or check failed."""

    exit_code = 1


class RemoteFailure(SparkserveError):
    """A node was unreachable or a remote step failed (node, step, command, last lines)."""

    exit_code = 3

    def __init__(
        self,
        where: str,
        what: str,
        *,
        node: str | None = None,
        step: str | None = None,
        details: list[str] | None = None,
    ) -> None:
        self.node = node
        self.step = step
        super().__init__(where, what, details=details)


class CheckRefused(RemoteFailure):
    """A node answered, and one of its checks refuses the run (too little free accelerator memory, a known-bad
    kernel, a target copy that differs): a failed check, exit 1, nothing was started."""

    exit_code = 1


class RollbackFailed(SparkserveError):
    """The swap failed and so did the rollback: nothing runs on any node. Louder than a clean rollback
    (exit 1): the operator must act now."""

    exit_code = 4
