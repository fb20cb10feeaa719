"""Where a node is and how to log in to it, resolved the way OpenSSH does: ``~/.ssh/config`` first.

A node's ``host`` may be an alias (``spark1``) that only ``~/.ssh/config`` knows. Its ``Host`` block gives
``HostName``, ``User``, ``Port``, ``IdentityFile``, ``IdentitiesOnly``, ``IdentityAgent``, ``ProxyJump``,
``UserKnownHostsFile`` and ``StrictHostKeyChecking`` (only ``accept-new`` is taken from it: host keys are
always verified). What the sparkserve config sets explicitly wins, as OpenSSH's command line does:
``nodes[].user`` / ``nodes[].port`` when written in the file, ``ssh.known_hosts`` when written.

Keys: ``ssh.identity_file`` (when the file exists) and the ``IdentityFile`` entries are offered first (with
neither written, OpenSSH's default keys ``~/.ssh/id_{rsa,ecdsa,ed25519}`` that exist), then
the ssh-agent (``SSH_AUTH_SOCK``) unless ``IdentitiesOnly yes`` or ``IdentityAgent none`` — with
``IdentitiesOnly``, only the agent's keys whose public half is one of those files'.

    r = resolve(node_cfg, cfg.ssh)      # pure apart from reading the ssh config file
    r.hostname, r.port, r.user, r.identities, r.use_agent, r.proxy_jump
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

if TYPE_CHECKING:
    from sparkserve.config import NodeConfig, SSHConfig


#: The key files OpenSSH offers when no IdentityFile is named (ssh_config(5)), those paramiko can load.
OPENSSH_DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519")


@dataclass(frozen=True)
class ResolvedSSH:
    """One node's SSH settings after ``~/.ssh/config`` (see the module docstring)."""

    alias: str  # nodes[].host as written
    hostname: str  # what is connected to (HostName, or the alias itself)
    port: int
    user: str
    identities: tuple[Path, ...]  # key files to offer, in order (only ones that exist)
    missing_identities: tuple[Path, ...]  # configured key files that do not exist (named in auth errors)
    identities_only: bool
    use_agent: bool
    proxy_jump: str | None
    known_hosts: tuple[Path, ...]  # the first is where an accepted new key is written
    accept_new: bool
    ssh_config: Path | None  # the file that was read (None: there is none)
    in_config: bool  # a Host block other than `*` matched the alias
    options: dict[str, str] = field(default_factory=dict, compare=False)  # what the file said, lower-case keys

    @property
    def address(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def load_ssh_config(path: Path | None) -> paramiko.SSHConfig | None:
    """The parsed ssh config file, or None when there is none. Raises OSError/ValueError on a bad file."""
    if path is None or not path.is_file():
        return None
    return paramiko.SSHConfig.from_path(str(path))


def _matched_block(conf: paramiko.SSHConfig, alias: str) -> bool:
    """Whether a ``Host`` pattern other than a bare ``*`` matches ``alias`` (an alias the file knows)."""
    import fnmatch

    for entry in conf._config:  # paramiko keeps the parsed blocks here; no public accessor
        hosts = [h for h in entry.get("host", []) if h != "*"]
        if any(not h.startswith("!") and fnmatch.fnmatch(alias, h) for h in hosts):
            return True
    return False


def resolve(node: NodeConfig, ssh: SSHConfig, *, env: dict[str, str] | None = None) -> ResolvedSSH:
    """Resolve one node's SSH settings (reads ``ssh.config_file`` once; BadInput-free: a broken ssh config
    raises ValueError naming the file, which the connect step turns into its one-line error)."""
    env = os.environ if env is None else env
    path = ssh.resolved_config_file()
    try:
        conf = load_ssh_config(path)
    except (OSError, ValueError, paramiko.SSHException) as e:
        raise ValueError(f"cannot read ssh config {path}: {e}") from None
    o: dict[str, str | list[str]] = dict(conf.lookup(node.host)) if conf else {}
    opts = {k: (" ".join(v) if isinstance(v, list) else str(v)) for k, v in o.items()}
    explicit = node.model_fields_set
    hostname = str(o.get("hostname") or node.host)
    port = node.port if "port" in explicit or "port" not in o else int(str(o["port"]))
    user = node.user if "user" in explicit or "user" not in o else str(o["user"])
    files: list[Path] = []
    own = ssh.resolved_identity()
    if own is not None:
        files.append(own)
    raw = o.get("identityfile", [])
    for f in raw if isinstance(raw, list) else [raw]:
        p = Path(os.path.expanduser(str(f)))
        if p not in files:
            files.append(p)
    present = tuple(p for p in files if p.is_file())
    if not raw and "identity_file" not in ssh.model_fields_set:  # as OpenSSH: its default keys when none is named
        present += tuple(p for p in (Path(os.path.expanduser(f"~/.ssh/{k}")) for k in OPENSSH_DEFAULT_KEYS)
                         if p.is_file() and p not in present)
    missing = tuple(p for p in files if not p.is_file())
    identities_only = str(o.get("identitiesonly", "no")).lower() == "yes"
    # paramiko reaches the agent through $SSH_AUTH_SOCK only; `IdentityAgent none` turns it off
    use_agent = str(o.get("identityagent", "")).strip().lower() != "none" and bool(env.get("SSH_AUTH_SOCK"))
    jump = str(o["proxyjump"]) if str(o.get("proxyjump", "none")).lower() != "none" else None
    if "known_hosts" in ssh.model_fields_set or "userknownhostsfile" not in o:
        kh: tuple[Path, ...] = (ssh.resolved_known_hosts(),)
    else:
        kh = tuple(Path(os.path.expanduser(x)) for x in str(opts["userknownhostsfile"]).split())
    accept_new = ssh.accept_new_host_keys or str(o.get("stricthostkeychecking", "")).lower() == "accept-new"
    return ResolvedSSH(alias=node.host, hostname=hostname, port=port, user=user, identities=present,
                       missing_identities=missing, identities_only=identities_only, use_agent=use_agent,
                       proxy_jump=jump, known_hosts=kh, accept_new=accept_new,
                       ssh_config=path if conf is not None else None,
                       in_config=conf is not None and _matched_block(conf, node.host), options=opts)


def ssh_argv(r: ResolvedSSH, *, connect_timeout: float, keepalive: int, jump: ResolvedSSH | None = None) -> list[str]:
    """The OpenSSH client argv (for rsync's ``-e``) that reaches the node exactly as paramiko does: the same
    config file, and every resolved value given on the command line (which OpenSSH lets win). A ProxyJump
    hop (``jump``) becomes a ProxyCommand running this same argv for the jump host, so that hop too uses
    the resolved known_hosts and keys (OpenSSH's own ProxyJump would not pass them on)."""
    import math
    import shlex

    argv = ["ssh", "-F", str(r.ssh_config) if r.ssh_config else "/dev/null",
            "-p", str(r.port), "-l", r.user, "-o", f"HostName={r.hostname}",
            "-o", f"UserKnownHostsFile={' '.join(str(p) for p in r.known_hosts)}",
            "-o", f"StrictHostKeyChecking={'accept-new' if r.accept_new else 'yes'}",
            "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, math.ceil(connect_timeout))}",
            "-o", "Compression=no"]
    if keepalive:
        argv += ["-o", f"ServerAliveInterval={keepalive}"]
    for p in r.identities:
        argv += ["-i", str(p)]
    argv += ["-o", f"IdentitiesOnly={'yes' if r.identities_only else 'no'}"]
    if not r.use_agent:
        argv += ["-o", "IdentityAgent=none"]
    if jump is not None:
        hop = ssh_argv(jump, connect_timeout=connect_timeout, keepalive=keepalive)
        line = shlex.join([*hop, "-W", "%h:%p", jump.alias]).replace("%", "%%").replace("%%h:%%p", "%h:%p")
        argv += ["-o", f"ProxyCommand={line}"]
    elif r.proxy_jump:
        argv += ["-o", f"ProxyJump={r.proxy_jump}"]
    return argv
