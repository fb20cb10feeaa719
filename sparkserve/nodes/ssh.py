"""SSHNode: a node reached with paramiko — key auth, the configured known_hosts, keepalive, timeouts.

One TCP connection per node carries everything: ``run`` channels, one SFTP channel, and the docker SDK's
``docker system dial-stdio`` channel (see :mod:`sparkserve.nodes.docker_client`). sshd allows 10 sessions per
connection by default (``MaxSessions``), so concurrent ``run`` calls on one node are capped at
:data:`MAX_RUN_CHANNELS` and docker keeps at most two pooled channels.

How the connection is opened (host-key policy, errors) is :mod:`sparkserve.nodes.ssh_connect`; one running
command is :mod:`sparkserve.nodes.ssh_process`.
"""

from __future__ import annotations

import contextlib
import posixpath
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

from sparkserve import interrupts
from sparkserve.nodes.base import CommandResult, NodeError, RsyncRemote
from sparkserve.nodes.ssh_connect import SSHTarget, close_client, open_client
from sparkserve.nodes.ssh_process import SSHProcess, command_line
from sparkserve.nodes.ssh_resolve import ssh_argv

if TYPE_CHECKING:
    import docker

    from sparkserve.config import NodeConfig, SSHConfig

MAX_RUN_CHANNELS = 6  # + 1 SFTP + ≤2 docker pool channels + 1 spare stays under sshd's MaxSessions=10
SFTP_REQUEST = 255 * 1024  # bytes per SFTP write request (OpenSSH's sftp-server takes up to 256 KiB)
SFTP_TIMEOUT_S = 120  # no SFTP reply for this long: the step fails
PUT_CHUNK = 2**20  # put() looks at the stop flag once per chunk: an interrupt stops a copy within ~1 s


class _Stopped(Exception):
    """put() saw the interrupt flag (sparkserve.interrupts) between two chunks."""


class SSHNode:
    """A node over SSH. Connects lazily (or via :meth:`connect`); reconnects once if the link dropped."""

    def __init__(self, node: NodeConfig, ssh: SSHConfig) -> None:
        self.target = SSHTarget.from_config(node, ssh)
        self.name = node.name
        self.host = self.target.host  # after ~/.ssh/config: HostName, Port, User
        self.port = self.target.port
        self.user = self.target.user
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.RLock()
        self._channels = threading.BoundedSemaphore(MAX_RUN_CHANNELS)
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.Lock()
        self._docker: docker.DockerClient | None = None
        self.connect_seconds: float | None = None

    # -- connection -------------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.target.address

    def __repr__(self) -> str:
        return f"SSHNode({self.name!r}, {self.address})"

    def _fail(self, what: str, step: str = "ssh") -> NodeError:
        return NodeError(self.name, step, what)

    def connect(self) -> SSHNode:
        """Open the SSH connection now (idempotent). Raises NodeError with a one-line reason."""
        self.ssh_client()
        return self

    def ssh_client(self) -> paramiko.SSHClient:
        """The live paramiko client, (re)connecting if needed. Shared with the docker adapter."""
        with self._lock:
            c = self._client
            if c is not None:
                t = c.get_transport()
                if t is not None and t.is_active():
                    return c
                self._drop_connection(keep_docker=True)  # the docker adapter re-pools on the new client
            self._client = self._open()
            return self._client

    def _open(self) -> paramiko.SSHClient:
        t0 = time.monotonic()
        client = open_client(self.target)
        self.connect_seconds = time.monotonic() - t0
        return client

    def _drop_connection(self, *, keep_docker: bool = False) -> None:
        if self._docker is not None and not keep_docker:
            with contextlib.suppress(Exception):
                self._docker.close()
            self._docker = None
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                close_client(self._client)
            self._client = None

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> SSHNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ---------------------------------------------------------------------------------------

    def start(self, argv: list[str], *, timeout: float = 3600.0, step: str = "run") -> SSHProcess:
        argv = [str(a) for a in argv]
        line = command_line(argv, timeout)
        self._channels.acquire()
        try:
            transport = self.ssh_client().get_transport()
            assert transport is not None
            chan = transport.open_session(timeout=self.target.connect_timeout)
            chan.exec_command(line)
        except NodeError:
            self._channels.release()
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            self._channels.release()
            raise NodeError(self.name, step, f"cannot start {argv[0]}: {e}", argv=argv) from None
        return SSHProcess(self.name, self.address, chan, argv, timeout, step, self._channels.release)

    def run(
        self,
        argv: list[str],
        *,
        timeout: float = 60.0,
        step: str = "run",
        check: bool = True,
        stdin: bytes | None = None,
    ) -> CommandResult:
        proc = self.start(argv, timeout=timeout, step=step)
        if stdin is not None:
            writer = threading.Thread(target=proc.feed_and_close, args=(stdin,), daemon=True)
            writer.start()
        else:
            proc.close_stdin()
        return proc.wait(check=check)

    # -- files ------------------------------------------------------------------------------------------

    def sftp(self) -> paramiko.SFTPClient:
        """The node's one SFTP channel, opened on first use (writes use 255 KiB requests, pipelined)."""
        with self._lock:
            client = self.ssh_client()
            if self._sftp is None or self._sftp.get_channel().closed:
                transport = client.get_transport()
                assert transport is not None
                try:
                    # uploads are paced by the node's window; ours only bounds what we receive, and
                    # paramiko reads get slower with a larger backlog (see docker_client.WINDOW)
                    sftp = paramiko.SFTPClient.from_transport(transport)
                except (paramiko.SSHException, OSError, EOFError) as e:
                    raise self._fail(f"cannot open SFTP: {e}", "sftp") from None
                assert sftp is not None
                sftp.get_channel().settimeout(SFTP_TIMEOUT_S)  # a hung node fails the step, not the run
                self._sftp = sftp
            return self._sftp

    def _sftp_mkdirs(self, sftp: paramiko.SFTPClient, path: str) -> None:
        missing: list[str] = []
        p = path
        while p not in ("", "/"):
            try:
                st = sftp.stat(p)
            except FileNotFoundError:
                missing.append(p)
                p = posixpath.dirname(p)
                continue
            if st.st_mode is not None and not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(p)
            break
        for d in reversed(missing):
            with contextlib.suppress(OSError):  # a concurrent creator is fine; stat below decides
                sftp.mkdir(d)
            sftp.stat(d)

    def put(self, local: Path, remote: str, *, mode: int | None = None, preserve_mtime: bool = False,
            on_bytes: Callable[[int], None] | None = None) -> None:
        local = Path(local)
        tmp = _tmp_name(remote)
        try:
            with self._sftp_lock:
                sftp = self.sftp()
                self._sftp_mkdirs(sftp, posixpath.dirname(remote))
                st = local.stat()
                done = 0
                with local.open("rb") as src, sftp.open(tmp, "wb") as dst:
                    dst.MAX_REQUEST_SIZE = SFTP_REQUEST  # type: ignore[misc]
                    dst.set_pipelined(True)
                    while chunk := src.read(PUT_CHUNK):
                        if interrupts.stopping():  # Ctrl-C mid-file: stop within one chunk, drop the temp file
                            raise _Stopped
                        dst.write(chunk)
                        done += len(chunk)
                        if on_bytes is not None:
                            on_bytes(done)
                sftp.chmod(tmp, mode if mode is not None else stat.S_IMODE(st.st_mode))
                if preserve_mtime:
                    sftp.utime(tmp, (st.st_atime, st.st_mtime))
                sftp.posix_rename(tmp, remote)
        except NodeError:
            raise
        except _Stopped:
            with contextlib.suppress(Exception):
                self.sftp().remove(tmp)
            raise self._fail(f"interrupted: the copy of {local} to {remote} was stopped", "put") from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            with contextlib.suppress(Exception):
                self.sftp().remove(tmp)
            raise self._fail(f"cannot copy {local} to {remote}: {_reason(e)}", "put") from None

    def makedirs(self, remote: str) -> None:
        try:
            with self._sftp_lock:
                self._sftp_mkdirs(self.sftp(), remote.rstrip("/") or "/")
        except NodeError:
            raise
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._fail(f"cannot create {remote}: {_reason(e)}", "mkdir") from None

    def write_bytes(self, remote: str, data: bytes, *, mode: int | None = None) -> None:
        tmp = _tmp_name(remote)
        try:
            with self._sftp_lock:
                sftp = self.sftp()
                self._sftp_mkdirs(sftp, posixpath.dirname(remote))
                with sftp.open(tmp, "wb") as f:
                    f.write(data)
                if mode is not None:
                    sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, remote)
        except NodeError:
            raise
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._fail(f"cannot write {remote}: {_reason(e)}", "write") from None

    def get(self, remote: str, local: Path) -> None:
        try:
            with self._sftp_lock:
                self.sftp().get(remote, str(local), prefetch=True)
        except NodeError:
            raise
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._fail(f"cannot copy {remote} from the node: {_reason(e)}", "get") from None

    def read_text(self, remote: str) -> str:
        try:
            with self._sftp_lock, self.sftp().open(remote, "rb") as f:
                return f.read().decode(errors="replace")
        except NodeError:
            raise
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._fail(f"cannot read {remote}: {_reason(e)}", "read") from None

    # -- rsync and docker -------------------------------------------------------------------------------

    def rsync_remote(self) -> RsyncRemote:
        """OpenSSH for rsync, resolved exactly as this node's paramiko connection (same ssh config file,
        every resolved value on the command line; the agent through SSH_AUTH_SOCK)."""
        t = self.target
        argv = ssh_argv(t.r, connect_timeout=t.connect_timeout, keepalive=t.keepalive,
                        jump=t.jump.r if t.jump is not None else None)
        alias = t.r.alias
        host = f"[{alias}]" if ":" in alias else alias
        return RsyncRemote(tuple(argv), f"{self.user}@{host}")

    def docker(self) -> docker.DockerClient:
        # imported here: connecting needs only paramiko, and a command imports docker's SDK (a tenth of a
        # second) while its nodes connect (nodes.parallel.on_all's ``meanwhile``)
        from sparkserve.nodes.docker_client import docker_over_ssh

        with self._lock:
            if self._docker is None:
                self._docker = docker_over_ssh(self)
            return self._docker


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _tmp_name(remote: str) -> str:
    return posixpath.join(posixpath.dirname(remote) or ".", f".{posixpath.basename(remote)}.sparkserve-tmp")
