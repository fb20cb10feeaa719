"""Opening one paramiko connection to a node: host-key policy, key auth, timeouts, one-line errors.

Host keys: only keys already in ``ssh.known_hosts`` are accepted. An unknown key is refused with a one-line
error unless ``ssh.accept_new_host_keys`` is set, in which case it is appended to that file (like
OpenSSH's ``StrictHostKeyChecking=accept-new``). A *changed* key is always refused.

    target = SSHTarget.from_config(node_cfg, cfg.ssh)
    client = open_client(target)          # NodeError (step ``ssh``) saying what to do, on any failure
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

from sparkserve.nodes.base import NodeError

if TYPE_CHECKING:
    from sparkserve.config import NodeConfig, SSHConfig


def hostport(host: str, port: int) -> str:
    """How known_hosts names a host (``[host]:port`` unless the port is 22)."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass(frozen=True)
class SSHTarget:
    """Where a node is and how sparkserve may log in to it (from ``nodes[]`` and ``ssh:``)."""

    name: str
    host: str
    port: int
    user: str
    known_hosts: Path
    identity: Path | None
    accept_new: bool
    connect_timeout: float
    keepalive: int

    @classmethod
    def from_config(cls, node: NodeConfig, ssh: SSHConfig) -> SSHTarget:
        return cls(name=node.name, host=node.host, port=node.port, user=node.user,
                   known_hosts=ssh.resolved_known_hosts(), identity=ssh.resolved_identity(),
                   accept_new=ssh.accept_new_host_keys, connect_timeout=ssh.connect_timeout_s,
                   keepalive=ssh.keepalive_s)

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def fail(self, what: str) -> NodeError:
        return NodeError(self.name, "ssh", what)


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Append an unknown host key to known_hosts (only used when the user opted in)."""

    def __init__(self, known_hosts: Path, port: int) -> None:
        self.known_hosts = known_hosts
        self.port = port

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        entry = hostname if hostname.startswith("[") else hostport(hostname, self.port)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.known_hosts.open("a") as f:
            f.write(f"{entry} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(entry, key.get_name(), key)


def _client_with_host_keys(t: SSHTarget) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    kh = t.known_hosts
    if kh.exists():
        try:
            client.load_host_keys(str(kh))
        except (OSError, paramiko.SSHException) as e:
            raise t.fail(f"cannot read known_hosts {kh}: {e}") from None
    elif not t.accept_new:
        raise t.fail(f"known_hosts file {kh} does not exist; add {t.host}'s host key to it "
                     f"(ssh-keyscan -p {t.port} {t.host}) or set ssh.accept_new_host_keys")
    if t.accept_new:
        client.set_missing_host_key_policy(_AcceptNewPolicy(kh, t.port))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def _connect_error(t: SSHTarget, e: BaseException) -> NodeError:
    """The one line a person needs for a failed connect (what happened, and what to do)."""
    kh = t.known_hosts
    if isinstance(e, paramiko.BadHostKeyException):
        return t.fail(f"host key for {hostport(t.host, t.port)} CHANGED (got {e.key.get_name()} "
                      f"{e.key.get_fingerprint().hex()}, {kh} has another); refusing to connect — "
                      "verify the node and fix known_hosts yourself")
    if isinstance(e, paramiko.AuthenticationException):
        how = f"key {t.identity}" if t.identity else "agent/default keys"
        return t.fail(f"authentication as {t.user} with {how} failed: {e}")
    if isinstance(e, paramiko.SSHException):
        msg = str(e)
        if "not found in known_hosts" in msg:
            return t.fail(f"host key for {hostport(t.host, t.port)} is not in {kh}; refusing an unknown key "
                          f"— verify it and add it (ssh-keyscan -p {t.port} {t.host} >> {kh}) "
                          "or pass --accept-new-host-keys")
        return t.fail(f"cannot connect to {t.address}: {msg}")
    if isinstance(e, TimeoutError):
        return t.fail(f"cannot connect to {t.address}: timed out after {t.connect_timeout:g}s")
    assert isinstance(e, OSError)
    reason = e.strerror or str(e)
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        reason = "connection refused (is sshd running?)"
    return t.fail(f"cannot connect to {t.address}: {reason}")


def open_client(t: SSHTarget) -> paramiko.SSHClient:
    """A connected paramiko client for ``t``; NodeError with a one-line reason otherwise."""
    client = _client_with_host_keys(t)
    if t.identity is not None and not t.identity.exists():
        raise t.fail(f"ssh.identity_file {t.identity} does not exist")
    kwargs: dict[str, object] = dict(
        hostname=t.host,
        port=t.port,
        username=t.user,
        timeout=t.connect_timeout,
        banner_timeout=t.connect_timeout,
        auth_timeout=t.connect_timeout,
        channel_timeout=t.connect_timeout,
    )
    if t.identity is not None:
        kwargs.update(key_filename=str(t.identity), look_for_keys=False, allow_agent=False)
    try:
        client.connect(**kwargs)  # type: ignore[arg-type]
    except (paramiko.SSHException, OSError) as e:  # BadHostKey/Authentication are SSHExceptions
        client.close()
        raise _connect_error(t, e) from None
    transport = client.get_transport()
    if transport is not None:
        with contextlib.suppress(OSError, AttributeError):
            # small request/response packets (channel open, exit status, SFTP stat) would otherwise
            # wait on Nagle + delayed ACK: ~40 ms per channel open on loopback
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
        if t.keepalive:
            transport.set_keepalive(t.keepalive)
    return client
