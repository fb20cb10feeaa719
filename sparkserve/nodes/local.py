"""LocalNode: the machine sparkserve runs on (``local: true`` in the config, e.g. sparkserve on the head).

Same verbs as :class:`~sparkserve.nodes.ssh.SSHNode` without SSH: argv through ``subprocess`` (no shell),
files through the filesystem, docker through ``DOCKER_HOST`` or the default socket.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sparkserve.nodes.base import CommandResult, NodeError

if TYPE_CHECKING:
    import docker


class LocalNode:
    """This machine as a Node: argv through subprocess, files through the filesystem."""

    def __init__(self, name: str, *, docker_host: str | None = None) -> None:
        self.name = name
        self.docker_host = docker_host
        self._docker: docker.DockerClient | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return "local"

    def __repr__(self) -> str:
        return f"LocalNode({self.name!r})"

    def connect(self) -> LocalNode:
        return self

    def run(
        self,
        argv: list[str],
        *,
        timeout: float = 60.0,
        step: str = "run",
        check: bool = True,
        stdin: bytes | None = None,
    ) -> CommandResult:
        argv = [str(a) for a in argv]
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # so a timeout kills the whole process group
            )
        except FileNotFoundError:
            res = CommandResult(argv, 127, "", f"{argv[0]}: command not found", 0.0)
            if check:
                raise NodeError(self.name, step, f"{argv[0]}: command not found", argv=argv) from None
            return res
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            res = CommandResult(argv, -1, out.decode(errors="replace"), err.decode(errors="replace"),
                                time.monotonic() - t0)
            raise NodeError(self.name, step, f"{shlex.join(argv)[:200]} timed out after {timeout:g}s",
                            argv=argv, last_lines=res.tail()) from None
        res = CommandResult(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                            time.monotonic() - t0)
        if check and not res.ok:
            raise NodeError(self.name, step, f"{shlex.join(argv)[:200]} exited {res.exit_code}", argv=argv,
                            last_lines=res.tail())
        return res

    def start(self, argv: list[str], *, timeout: float = 3600.0, step: str = "run") -> _LocalProcess:
        argv = [str(a) for a in argv]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except FileNotFoundError:
            raise NodeError(self.name, step, f"{argv[0]}: command not found", argv=argv) from None
        return _LocalProcess(self.name, proc, argv, timeout, step)

    def _tmp(self, remote: str) -> Path:
        p = Path(remote)
        return p.with_name(f".{p.name}.sparkserve-tmp")

    def put(self, local: Path, remote: str, *, mode: int | None = None, preserve_mtime: bool = False,
            on_bytes: Callable[[int], None] | None = None) -> None:
        dst = Path(remote)
        tmp = self._tmp(remote)
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, tmp)
            if on_bytes is not None:
                on_bytes(Path(local).stat().st_size)
            st = Path(local).stat()
            os.chmod(tmp, mode if mode is not None else st.st_mode & 0o7777)
            if preserve_mtime:
                os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, dst)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise NodeError(self.name, "put", f"cannot copy {local} to {remote}: {e.strerror or e}") from None

    def makedirs(self, remote: str) -> None:
        try:
            Path(remote).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NodeError(self.name, "mkdir", f"cannot create {remote}: {e.strerror or e}") from None

    def write_bytes(self, remote: str, data: bytes, *, mode: int | None = None) -> None:
        dst = Path(remote)
        tmp = self._tmp(remote)
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, dst)
        except OSError as e:
            raise NodeError(self.name, "write", f"cannot write {remote}: {e.strerror or e}") from None

    def get(self, remote: str, local: Path) -> None:
        try:
            shutil.copyfile(remote, local)
        except OSError as e:
            raise NodeError(self.name, "get", f"cannot copy {remote}: {e.strerror or e}") from None

    def read_text(self, remote: str) -> str:
        try:
            return Path(remote).read_bytes().decode(errors="replace")
        except OSError as e:
            raise NodeError(self.name, "read", f"cannot read {remote}: {e.strerror or e}") from None

    def rsync_remote(self) -> None:
        return None

    def docker(self) -> docker.DockerClient:
        from sparkserve.nodes.docker_client import docker_local  # docker's SDK only once it is used

        with self._lock:
            if self._docker is None:
                self._docker = docker_local(self.name, self.docker_host)
            return self._docker

    def close(self) -> None:
        with self._lock:
            if self._docker is not None:
                with contextlib.suppress(Exception):
                    self._docker.close()
                self._docker = None


class _LocalProcess:
    def __init__(self, node: str, proc: subprocess.Popen[bytes], argv: list[str], timeout: float, step: str) -> None:
        self.node, self.proc, self.argv, self.timeout, self.step = node, proc, argv, timeout, step
        self.t0 = time.monotonic()

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError as e:
            raise NodeError(self.node, self.step, f"{self.argv[0]} stopped reading its input: {e}",
                            argv=self.argv) from None

    def close_stdin(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            self.proc.stdin = None  # communicate() would flush a closed pipe

    def wait(self, *, check: bool = True) -> CommandResult:
        self.close_stdin()
        left = max(0.0, self.t0 + self.timeout - time.monotonic())
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            out, err = self.proc.communicate()
            raise NodeError(self.node, self.step, f"{shlex.join(self.argv)[:200]} timed out after {self.timeout:g}s",
                            argv=self.argv) from None
        res = CommandResult(self.argv, self.proc.returncode, out.decode(errors="replace"),
                            err.decode(errors="replace"), time.monotonic() - self.t0)
        if check and not res.ok:
            raise NodeError(self.node, self.step, f"{shlex.join(self.argv)[:200]} exited {res.exit_code}",
                            argv=self.argv, last_lines=res.tail())
        return res
