"""A command running on a node over one SSH exec channel (what :meth:`SSHNode.start` returns).

The remote side runs under coreutils ``timeout -k KILL_GRACE_S``: :func:`command_line` builds that line.
"""

from __future__ import annotations

import contextlib
import math
import select
import shlex
import time
from collections.abc import Callable

import paramiko

from sparkserve.nodes.base import CommandResult, NodeError

KILL_GRACE_S = 3  # remote `timeout -k`: SIGKILL this long after SIGTERM


def command_line(argv: list[str], timeout: float | None) -> str:
    """The exact remote command line: the argv shlex-quoted, under coreutils ``timeout``."""
    if not argv:
        raise ValueError("empty argv")
    line = shlex.join(argv)
    if timeout is not None:
        secs = max(1, math.ceil(timeout))
        line = f"timeout -k {KILL_GRACE_S} {secs} {line}"
    return line


class SSHProcess:
    """One exec channel: stdin can be fed while the command runs; ``wait`` collects its output.

    ``release`` is called once when the channel is done (the node's cap on concurrent channels)."""

    def __init__(self, node: str, address: str, chan: paramiko.Channel, argv: list[str], timeout: float,
                 step: str, release: Callable[[], None]) -> None:
        self.node, self.address, self.chan, self.argv = node, address, chan, argv
        self.timeout, self.step, self._release_slot = timeout, step, release
        self.t0 = time.monotonic()
        self._stdin_closed = False
        self._released = False

    def write(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise NodeError(self.node, self.step, f"{self.argv[0]} stopped reading its input: {e}",
                            argv=self.argv) from None

    def close_stdin(self) -> None:
        if not self._stdin_closed:
            self._stdin_closed = True
            with contextlib.suppress(Exception):
                self.chan.shutdown_write()

    def feed_and_close(self, data: bytes) -> None:
        with contextlib.suppress(NodeError):
            self.write(data)
        self.close_stdin()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self.chan.close()
            self._release_slot()

    def wait(self, *, check: bool = True) -> CommandResult:
        chan, timeout = self.chan, self.timeout
        deadline = self.t0 + timeout + KILL_GRACE_S + 2  # the remote `timeout` normally fires first
        out, err = bytearray(), bytearray()
        timed_out = False
        transport = chan.get_transport()
        try:
            while True:
                if chan.recv_ready():
                    out += chan.recv(1 << 20)
                    continue
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 20)
                    continue
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not chan.recv_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                select.select([chan], [], [], min(left, 0.5))
            code = -1 if timed_out or not chan.exit_status_ready() else chan.recv_exit_status()
        finally:
            self._release()
        elapsed = time.monotonic() - self.t0
        argv, name, step = self.argv, self.node, self.step
        res = CommandResult(argv, code, out.decode(errors="replace"), err.decode(errors="replace"), elapsed)
        if code == -1 and not timed_out and (transport is None or not transport.is_active()):
            raise NodeError(name, step, f"connection to {self.address} lost during {argv[0]}",
                            argv=argv, last_lines=res.tail())
        if timed_out or (code in (124, 137) and elapsed >= timeout * 0.98):
            raise NodeError(name, step, f"{shlex.join(argv)[:200]} timed out after {timeout:g}s",
                            argv=argv, last_lines=res.tail())
        if check and not res.ok:
            raise NodeError(name, step, f"{shlex.join(argv)[:200]} exited {code}", argv=argv,
                            last_lines=res.tail())
        return res
