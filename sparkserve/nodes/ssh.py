"""SSHNode: a node reached with paramiko — key auth, the configured known_hosts, keepalive, timeouts.

One TCP connection per node carries everything: ``run`` channels, one SFTP channel, and the docker SDK's
``docker system dial-stdio`` channel (see :mod:`sparkserve.nodes.docker_client`). sshd allows 10 sessions per
connection by default (``MaxSessions``), so concurrent ``run`` calls on one node are capped at
:data:`MAX_RUN_CHANNELS` and docker keeps at most two pooled channels.

Host keys: only keys already in ``ssh.known_hosts`` are accepted. An unknown key is refused with a one-line
error unless ``ssh.accept_new_host_keys`` is set, in which case it is appended to that file (like
OpenSSH's ``StrictHostKeyChecking=accept-new``). A *changed* key is always refused.
"""

from __future__ import annotations

import contextlib
import math
import posixpath
import select
import shlex
import socket
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko

from sparkserve.nodes.base import CommandResult, NodeError, RsyncRemote

if TYPE_CHECKING:
    import docker

    from sparkserve.config import NodeConfig, SSHConfig
    from sparkserve.deploy.sync import SyncReport

MAX_RUN_CHANNELS = 6  # + 1 SFTP + ≤2 docker pool channels + 1 spare stays under sshd's MaxSessions=10
SFTP_REQUEST = 255 * 1024  # bytes per SFTP write request (OpenSSH's sftp-server takes up to 256 KiB)
KILL_GRACE_S = 3  # remote `timeout -k`: SIGKILL this long after SIGTERM
SFTP_TIMEOUT_S = 120  # no SFTP reply for this long: the step fails


def _hostport(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Append an unknown host key to known_hosts (only used when the user opted in)."""

    def __init__(self, known_hosts: Path, port: int) -> None:
        self.known_hosts = known_hosts
        self.port = port

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        entry = hostname if hostname.startswith("[") else _hostport(hostname, self.port)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.known_hosts.open("a") as f:
            f.write(f"{entry} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(entry, key.get_name(), key)


class SSHNode:
    """A node over SSH. Connects lazily (or via :meth:`connect`); reconnects once if the link dropped."""

    def __init__(self, node: NodeConfig, ssh: SSHConfig) -> None:
        self.name = node.name
        self.host = node.host
        self.port = node.port
        self.user = node.user
        self.known_hosts = ssh.resolved_known_hosts()
        self.identity = ssh.resolved_identity()
        self.accept_new = ssh.accept_new_host_keys
        self.connect_timeout = ssh.connect_timeout_s
        self.keepalive = ssh.keepalive_s
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
        return f"{self.user}@{self.host}:{self.port}"

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
        client = paramiko.SSHClient()
        kh = self.known_hosts
        if kh.exists():
            try:
                client.load_host_keys(str(kh))
            except (OSError, paramiko.SSHException) as e:
                raise self._fail(f"cannot read known_hosts {kh}: {e}") from None
        elif not self.accept_new:
            raise self._fail(
                f"known_hosts file {kh} does not exist; add {self.host}'s host key to it "
                f"(ssh-keyscan -p {self.port} {self.host}) or set ssh.accept_new_host_keys"
            )
        if self.accept_new:
            client.set_missing_host_key_policy(_AcceptNewPolicy(kh, self.port))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if self.identity is not None and not self.identity.exists():
            raise self._fail(f"ssh.identity_file {self.identity} does not exist")
        kwargs: dict[str, object] = dict(
            hostname=self.host,
            port=self.port,
            username=self.user,
            timeout=self.connect_timeout,
            banner_timeout=self.connect_timeout,
            auth_timeout=self.connect_timeout,
            channel_timeout=self.connect_timeout,
        )
        if self.identity is not None:
            kwargs.update(key_filename=str(self.identity), look_for_keys=False, allow_agent=False)
        try:
            client.connect(**kwargs)  # type: ignore[arg-type]
        except paramiko.BadHostKeyException as e:
            client.close()
            raise self._fail(
                f"host key for {_hostport(self.host, self.port)} CHANGED (got {e.key.get_name()} "
                f"{e.key.get_fingerprint().hex()}, {kh} has another); refusing to connect — "
                "verify the node and fix known_hosts yourself"
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            how = f"key {self.identity}" if self.identity else "agent/default keys"
            raise self._fail(f"authentication as {self.user} with {how} failed: {e}") from None
        except paramiko.SSHException as e:
            client.close()
            msg = str(e)
            if "not found in known_hosts" in msg:
                raise self._fail(
                    f"host key for {_hostport(self.host, self.port)} is not in {kh}; refusing an unknown key "
                    f"— verify it and add it (ssh-keyscan -p {self.port} {self.host} >> {kh}) "
                    "or pass --accept-new-host-keys"
                ) from None
            raise self._fail(f"cannot connect to {self.address}: {msg}") from None
        except TimeoutError:
            client.close()
            raise self._fail(
                f"cannot connect to {self.address}: timed out after {self.connect_timeout:g}s"
            ) from None
        except OSError as e:
            client.close()
            reason = e.strerror or str(e)
            if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
                reason = "connection refused (is sshd running?)"
            raise self._fail(f"cannot connect to {self.address}: {reason}") from None
        t = client.get_transport()
        if t is not None:
            with contextlib.suppress(OSError, AttributeError):
                # small request/response packets (channel open, exit status, SFTP stat) would otherwise
                # wait on Nagle + delayed ACK: ~40 ms per channel open on loopback
                t.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
            if self.keepalive:
                t.set_keepalive(self.keepalive)
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
                self._client.close()
            self._client = None

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

    def __enter__(self) -> SSHNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ---------------------------------------------------------------------------------------

    def command_line(self, argv: list[str], timeout: float | None) -> str:
        """The exact remote command line: the argv shlex-quoted, under coreutils ``timeout``."""
        if not argv:
            raise ValueError("empty argv")
        line = shlex.join(argv)
        if timeout is not None:
            secs = max(1, math.ceil(timeout))
            line = f"timeout -k {KILL_GRACE_S} {secs} {line}"
        return line

    def start(self, argv: list[str], *, timeout: float = 3600.0, step: str = "run") -> _SSHProcess:
        argv = [str(a) for a in argv]
        line = self.command_line(argv, timeout)
        self._channels.acquire()
        try:
            transport = self.ssh_client().get_transport()
            assert transport is not None
            chan = transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(line)
        except NodeError:
            self._channels.release()
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            self._channels.release()
            raise NodeError(self.name, step, f"cannot start {argv[0]}: {e}", argv=argv) from None
        return _SSHProcess(self, chan, argv, timeout, step)

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
                    # paramiko reads get slower with a larger backlog (see dockerssh.WINDOW)
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

    def put(self, local: Path, remote: str, *, mode: int | None = None, preserve_mtime: bool = False) -> None:
        local = Path(local)
        tmp = _tmp_name(remote)
        try:
            with self._sftp_lock:
                sftp = self.sftp()
                self._sftp_mkdirs(sftp, posixpath.dirname(remote))
                st = local.stat()
                with local.open("rb") as src, sftp.open(tmp, "wb") as dst:
                    dst.MAX_REQUEST_SIZE = SFTP_REQUEST  # type: ignore[misc]
                    dst.set_pipelined(True)
                    while chunk := src.read(4 * 2**20):
                        dst.write(chunk)
                sftp.chmod(tmp, mode if mode is not None else stat.S_IMODE(st.st_mode))
                if preserve_mtime:
                    sftp.utime(tmp, (st.st_atime, st.st_mtime))
                sftp.posix_rename(tmp, remote)
        except NodeError:
            raise
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

    def sync_dir(self, local_dir: Path, remote_dir: str, **kw: Any) -> SyncReport:
        from sparkserve.deploy.sync import sync_dir

        return sync_dir(self, Path(local_dir), remote_dir, **kw)

    def rsync_remote(self) -> RsyncRemote:
        argv = ["ssh", "-F", "/dev/null", "-p", str(self.port),
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={max(1, math.ceil(self.connect_timeout))}",
                "-o", "Compression=no"]
        if self.keepalive:
            argv += ["-o", f"ServerAliveInterval={self.keepalive}"]
        if self.identity is not None:
            argv += ["-i", str(self.identity), "-o", "IdentitiesOnly=yes"]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return RsyncRemote(tuple(argv), f"{self.user}@{host}")

    def docker(self) -> docker.DockerClient:
        with self._lock:
            if self._docker is None:
                from sparkserve.nodes.docker_client import docker_over_ssh

                self._docker = docker_over_ssh(self)
            return self._docker


class _SSHProcess:
    """One exec channel: stdin can be fed while the command runs; ``wait`` collects its output."""

    def __init__(self, node: SSHNode, chan: paramiko.Channel, argv: list[str], timeout: float, step: str) -> None:
        self.node, self.chan, self.argv, self.timeout, self.step = node, chan, argv, timeout, step
        self.t0 = time.monotonic()
        self._stdin_closed = False
        self._released = False

    def write(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise NodeError(self.node.name, self.step, f"{self.argv[0]} stopped reading its input: {e}",
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
            self.node._channels.release()

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
        argv, name, step = self.argv, self.node.name, self.step
        res = CommandResult(argv, code, out.decode(errors="replace"), err.decode(errors="replace"), elapsed)
        if code == -1 and not timed_out and (transport is None or not transport.is_active()):
            raise NodeError(name, step, f"connection to {self.node.address} lost during {argv[0]}",
                            argv=argv, last_lines=res.tail())
        if timed_out or (code in (124, 137) and elapsed >= timeout * 0.98):
            raise NodeError(name, step, f"{shlex.join(argv)[:200]} timed out after {timeout:g}s",
                            argv=argv, last_lines=res.tail())
        if check and not res.ok:
            raise NodeError(name, step, f"{shlex.join(argv)[:200]} exited {code}", argv=argv,
                            last_lines=res.tail())
        return res


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _tmp_name(remote: str) -> str:
    return posixpath.join(posixpath.dirname(remote) or ".", f".{posixpath.basename(remote)}.sparkserve-tmp")
