"""Opening one paramiko connection to a node: OpenSSH's resolution, host-key policy, keys, one-line errors.

Where and as whom: :mod:`sparkserve.nodes.ssh_resolve` (``~/.ssh/config`` aliases, ``HostName``, ``User``,
``Port``, ``IdentityFile``, ``IdentitiesOnly``, ``ProxyJump``; the ssh-agent unless the config says no).

Host keys: only keys already in the known_hosts file(s) are accepted (plain or hashed ``|1|`` entries, as
``ssh-keyscan -H`` writes them). An unknown key is refused with a one-line error unless
``--accept-new-host-keys`` / ``ssh.accept_new_host_keys`` (or ``StrictHostKeyChecking accept-new`` in the ssh
config) is set, in which case it is appended to the first known_hosts file as a hashed entry (OpenSSH's
``accept-new``). A *changed* key is always refused.

    target = SSHTarget.from_config(node_cfg, cfg.ssh)
    client = open_client(target)          # NodeError (step ``ssh``) saying what to run, on any failure
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

from sparkserve.nodes.base import NodeError
from sparkserve.nodes.ssh_resolve import ResolvedSSH, resolve

if TYPE_CHECKING:
    from sparkserve.config import NodeConfig, SSHConfig


def hostport(host: str, port: int) -> str:
    """How known_hosts names a host (``[host]:port`` unless the port is 22)."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass(frozen=True)
class SSHTarget:
    """Where a node is and how sparkserve may log in to it (``nodes[]``, ``ssh:`` and ``~/.ssh/config``)."""

    name: str
    r: ResolvedSSH
    connect_timeout: float
    keepalive: int
    jump: SSHTarget | None = None  # ProxyJump's first hop, itself resolved through the ssh config

    @classmethod
    def from_config(cls, node: NodeConfig, ssh: SSHConfig) -> SSHTarget:
        try:
            r = resolve(node, ssh)
        except ValueError as e:
            raise NodeError(node.name, "ssh", str(e)) from None
        jump = None
        if r.proxy_jump:
            jump = _jump_target(node, ssh, r.proxy_jump)
        return cls(name=node.name, r=r, connect_timeout=ssh.connect_timeout_s, keepalive=ssh.keepalive_s,
                   jump=jump)

    @property
    def host(self) -> str:
        return self.r.hostname

    @property
    def port(self) -> int:
        return self.r.port

    @property
    def user(self) -> str:
        return self.r.user

    @property
    def known_hosts(self) -> Path:
        return self.r.known_hosts[0]

    @property
    def identity(self) -> Path | None:
        return self.r.identities[0] if self.r.identities else None

    @property
    def accept_new(self) -> bool:
        return self.r.accept_new

    @property
    def address(self) -> str:
        return self.r.address

    def fail(self, what: str) -> NodeError:
        return NodeError(self.name, "ssh", what)


def _jump_target(node: NodeConfig, ssh: SSHConfig, spec: str) -> SSHTarget:
    """The first hop of ``ProxyJump [user@]host[:port][,more]`` (one hop is supported; more is an error)."""
    from sparkserve.config import NodeConfig as NC

    if "," in spec:
        raise NodeError(node.name, "ssh", f"ProxyJump {spec}: only one jump host is supported; use a "
                        "ProxyJump on the jump host's own Host block instead")
    user, _, rest = spec.rpartition("@")
    host, _, port = rest.partition(":")
    fields: dict[str, object] = {"name": f"{node.name}-jump", "host": host, "fabric_ip": "127.0.0.1"}
    if user:
        fields["user"] = user
    if port:
        fields["port"] = int(port)
    jump_node = NC(**fields)  # type: ignore[arg-type]
    r = resolve(jump_node, ssh)
    if r.proxy_jump:
        raise NodeError(node.name, "ssh", f"ProxyJump {spec} itself has a ProxyJump; only one hop is supported")
    return SSHTarget(name=node.name, r=r, connect_timeout=ssh.connect_timeout_s, keepalive=ssh.keepalive_s)


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Append an unknown host key to known_hosts, hashed (only used when the user opted in)."""

    def __init__(self, known_hosts: Path, port: int) -> None:
        self.known_hosts = known_hosts
        self.port = port

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        entry = hostname if hostname.startswith("[") else hostport(hostname, self.port)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.known_hosts.open("a") as f:
            f.write(f"{paramiko.HostKeys.hash_host(entry)} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(entry, key.get_name(), key)


def _keyscan(t: SSHTarget) -> str:
    port = f"-p {t.port} " if t.port != 22 else ""
    return f"ssh-keyscan -H {port}{t.host} >> {t.known_hosts}"


def _client_with_host_keys(t: SSHTarget) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    existing = [kh for kh in t.r.known_hosts if kh.exists()]
    for kh in existing:
        try:
            client.load_host_keys(str(kh))
        except (OSError, paramiko.SSHException) as e:
            raise t.fail(f"cannot read known_hosts {kh}: {e}") from None
    if not existing and not t.accept_new:
        raise t.fail(f"known_hosts file {t.known_hosts} does not exist; after verifying the node, run "
                     f"`{_keyscan(t)}` or pass --accept-new-host-keys")
    if t.accept_new:
        client.set_missing_host_key_policy(_AcceptNewPolicy(t.known_hosts, t.port))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def _no_key_error(t: SSHTarget, agent_keys: int | None) -> NodeError:
    """Nothing at all to offer (no key file; the agent off, unreachable or empty): what to run."""
    missing = ", ".join(str(p) for p in t.r.missing_identities)
    files = f"no key file ({missing} does not exist)" if missing else "no key file configured"
    if t.r.use_agent and agent_keys == 0:
        return t.fail(f"no key to offer: {files} and the ssh-agent holds no keys; run `ssh-add` "
                      "(or `ssh-add ~/.ssh/id_ed25519`)")
    if t.r.use_agent:
        return t.fail(f"no key to offer: {files} and the ssh-agent at $SSH_AUTH_SOCK does not answer; start "
                      "one (`eval $(ssh-agent) && ssh-add`)")
    if not os.environ.get("SSH_AUTH_SOCK"):
        return t.fail(f"no key to offer: {files} and no ssh-agent (SSH_AUTH_SOCK is not set); run "
                      "`eval $(ssh-agent) && ssh-add`, or set ssh.identity_file / IdentityFile in ~/.ssh/config")
    return t.fail(f"no key to offer: {files} and the ssh config turns the agent off (IdentityAgent none, or "
                  "IdentitiesOnly yes without a matching key); set ssh.identity_file or IdentityFile")


def _connect_error(t: SSHTarget, e: BaseException) -> NodeError:
    """The one line a person needs for a failed connect (what happened, and what to run)."""
    kh = t.known_hosts
    if isinstance(e, paramiko.BadHostKeyException):
        return t.fail(f"host key for {hostport(t.host, t.port)} CHANGED (got {e.key.get_name()} "
                      f"{e.key.get_fingerprint().hex()}, {kh} has another); refusing to connect — verify the "
                      f"node, then `ssh-keygen -R '{hostport(t.host, t.port)}' -f {kh}` and `{_keyscan(t)}`")
    if isinstance(e, paramiko.AuthenticationException):
        offered = [str(p) for p in t.r.identities] + (["the ssh-agent's keys"] if t.r.use_agent else [])
        how = ", ".join(offered) or "no key"
        return t.fail(f"authentication as {t.user} failed (offered {how}): {e}; add the public key to "
                      f"~{t.user}/.ssh/authorized_keys on the node (`ssh-copy-id -p {t.port} {t.user}@{t.host}`)")
    if isinstance(e, paramiko.SSHException):
        msg = str(e)
        if "not found in known_hosts" in msg:
            return t.fail(f"host key for {hostport(t.host, t.port)} is not in {kh}; refusing an unknown key — "
                          f"verify it, then run `{_keyscan(t)}` or pass --accept-new-host-keys")
        return t.fail(f"cannot connect to {t.address}: {msg}")
    if isinstance(e, socket.gaierror):
        if t.r.alias == t.r.hostname and not t.r.in_config:
            where = t.r.ssh_config or "~/.ssh/config (there is none)"
            return t.fail(f"cannot resolve {t.r.alias!r}: not a known host name and no `Host {t.r.alias}` block "
                          f"in {where}; add one (Host {t.r.alias} / HostName <address> / User <user>) or use "
                          "the address")
        return t.fail(f"cannot resolve {t.host!r} (HostName of {t.r.alias!r}): {e.strerror or e}")
    if isinstance(e, TimeoutError):
        return t.fail(f"cannot connect to {t.address}: timed out after {t.connect_timeout:g}s")
    assert isinstance(e, OSError)
    reason = e.strerror or str(e)
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        reason = "connection refused (is sshd running?)"
    return t.fail(f"cannot connect to {t.address}: {reason}")


def _agent_keys(t: SSHTarget) -> list[paramiko.AgentKey] | None:
    """The agent's keys (None: the agent is not to be used or cannot be reached)."""
    if not t.r.use_agent:
        return None
    agent = paramiko.Agent()
    try:
        return list(agent.get_keys())
    except paramiko.SSHException:
        return None


def _matching_agent_key(keys: list[paramiko.AgentKey], files: tuple[Path, ...]) -> paramiko.AgentKey | None:
    """With IdentitiesOnly: the agent key whose public half is one of ``files``' (``file.pub``)."""
    blobs = set()
    for f in files:
        pub = f.with_name(f.name + ".pub")
        with contextlib.suppress(OSError, IndexError, ValueError):
            blobs.add(pub.read_text().split()[1])
    return next((k for k in keys if k.get_base64() in blobs), None)


def _auth_kwargs(t: SSHTarget) -> dict[str, object]:
    """paramiko's key arguments: the key files, then the agent (only matching keys with IdentitiesOnly)."""
    keys = _agent_keys(t)
    kw: dict[str, object] = {"look_for_keys": False, "allow_agent": False}
    if t.r.identities:
        kw["key_filename"] = [str(p) for p in t.r.identities]
    if t.r.identities_only:
        match = _matching_agent_key(keys or [], t.r.identities)
        if match is not None:
            kw["pkey"] = match  # tried first: an agent key needs no passphrase
        elif not t.r.identities:
            raise _no_key_error(t, len(keys) if keys is not None else None)
        return kw
    if not t.r.identities and not keys:
        raise _no_key_error(t, len(keys) if keys is not None else None)
    kw["allow_agent"] = bool(keys)
    return kw


def _jump_sock(t: SSHTarget) -> tuple[paramiko.SSHClient, paramiko.Channel]:
    """A direct-tcpip channel to ``t`` through its ProxyJump host (the jump client stays open with it)."""
    assert t.jump is not None
    jump = open_client(t.jump)
    transport = jump.get_transport()
    assert transport is not None
    try:
        chan = transport.open_channel("direct-tcpip", (t.host, t.port), ("127.0.0.1", 0),
                                      timeout=t.connect_timeout)
    except (paramiko.SSHException, OSError) as e:
        jump.close()
        raise t.fail(f"cannot reach {t.host}:{t.port} through ProxyJump {t.r.proxy_jump}: {e}") from None
    return jump, chan


def open_client(t: SSHTarget) -> paramiko.SSHClient:
    """A connected paramiko client for ``t``; NodeError with a one-line reason otherwise."""
    client = _client_with_host_keys(t)
    kwargs: dict[str, object] = dict(
        hostname=t.host,
        port=t.port,
        username=t.user,
        timeout=t.connect_timeout,
        banner_timeout=t.connect_timeout,
        auth_timeout=t.connect_timeout,
        channel_timeout=t.connect_timeout,
    )
    kwargs.update(_auth_kwargs(t))
    jump: paramiko.SSHClient | None = None
    if t.jump is not None:
        jump, kwargs["sock"] = _jump_sock(t)
    try:
        client.connect(**kwargs)  # type: ignore[arg-type]
    except (paramiko.SSHException, OSError) as e:  # BadHostKey/Authentication are SSHExceptions
        client.close()
        if jump is not None:
            jump.close()
        raise _connect_error(t, e) from None
    transport = client.get_transport()
    if transport is not None:
        if jump is not None:
            client._sparkserve_jump = jump  # type: ignore[attr-defined]  # closed with it: close_client()
        else:
            with contextlib.suppress(OSError, AttributeError):
                # small request/response packets (channel open, exit status, SFTP stat) would otherwise
                # wait on Nagle + delayed ACK: ~40 ms per channel open on loopback
                transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
        if t.keepalive:
            transport.set_keepalive(t.keepalive)
    return client


def close_client(client: paramiko.SSHClient) -> None:
    """Close ``client`` and the ProxyJump connection under it, if any."""
    client.close()
    jump = getattr(client, "_sparkserve_jump", None)
    if jump is not None:
        jump.close()
