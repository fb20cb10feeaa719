"""The troubleshooting page's first-contact entries: the errors a first run meets before any rank starts.

Each entry's message is made by calling the code that prints it (the placeholder refusal, the SSH connect's
one-line errors, the identity-file check, the image comparison, the sudoers fix) on a fixed example, so the page
says exactly what the CLI says; where the text is built inline in a larger function (the port check of `doctor`)
the entry names its source and a test holds the two together. Nothing here touches a node or the network.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: The example's paths and names: fixed, so the page is the same wherever it is generated.
HOME = Path("/home/you")
HOST, USER = "spark1", "ubuntu"
IMAGE = "ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e"
#: deploy/doctor.py's port line (built inline there; tests/unit/test_troubleshooting.py holds them together)
PORT_IN_USE = "port {hp} is already in use on {name}"


@dataclass(frozen=True)
class Entry:
    anchor: str
    title: str
    message: Callable[[], str]  # the exact line(s) the CLI prints
    meaning: str
    fix: str


@contextlib.contextmanager
def _no_agent() -> Iterator[None]:
    """The messages that depend on $SSH_AUTH_SOCK, as on a machine without an agent."""
    old = os.environ.pop("SSH_AUTH_SOCK", None)
    try:
        yield
    finally:
        if old is not None:
            os.environ["SSH_AUTH_SOCK"] = old


def _cfg(**ssh: object):  # type: ignore[no-untyped-def]
    from sparkserve.config import load_config

    return load_config(overrides={
        "nodes": [{"name": "spark-a", "host": HOST, "fabric_ip": "192.168.200.1", "user": USER},
                  {"name": "spark-b", "host": "spark2", "fabric_ip": "192.168.200.2", "user": USER}],
        "ssh": {"config_file": None, "known_hosts": str(HOME / ".ssh" / "known_hosts"), **ssh}})


def _target(**ssh: object):  # type: ignore[no-untyped-def]
    from sparkserve.nodes.ssh_connect import SSHTarget

    cfg = _cfg(**ssh)
    with _no_agent():
        return SSHTarget.from_config(cfg.nodes[0], cfg.ssh)


def _line(make: Callable[[], object]) -> str:
    """The `error:` line (and its indented details) of the SparkserveError ``make`` raises or returns."""
    from sparkserve.errors import SparkserveError

    with _no_agent():
        try:
            e = make()
        except SparkserveError as raised:
            e = raised
    assert isinstance(e, SparkserveError), e
    return "\n".join([e.line(), *(f"  {d}" for d in e.details)])


def _placeholder() -> str:
    from sparkserve.config import load_config, refuse_placeholders

    return _line(lambda: refuse_placeholders(load_config()))


def _no_known_hosts() -> str:
    from sparkserve.nodes.ssh_connect import _client_with_host_keys

    return _line(lambda: _client_with_host_keys(_target(known_hosts="/nonexistent/.ssh/known_hosts"))).replace(
        "/nonexistent/.ssh/known_hosts", str(HOME / ".ssh" / "known_hosts"))


def _unknown_key() -> str:
    import paramiko

    from sparkserve.nodes.ssh_connect import _connect_error

    return _line(lambda: _connect_error(_target(), paramiko.SSHException(f"Server '{HOST}' not found in known_hosts")))


def _changed_key() -> str:
    from sparkserve.nodes.ssh_connect import _connect_error

    class _Key:  # what paramiko's BadHostKeyException carries, without generating a key
        def get_name(self) -> str:
            return "ssh-ed25519"

        def get_fingerprint(self) -> bytes:
            return bytes.fromhex("3f9c2a6b0d41e8577a1c9e20b4d6f813")

    import paramiko

    e = paramiko.BadHostKeyException.__new__(paramiko.BadHostKeyException)
    e.hostname, e.key, e.expected_key = HOST, _Key(), _Key()
    return _line(lambda: _connect_error(_target(), e))


def _identity_missing() -> str:
    from sparkserve.nodes.factory import check_identity_file

    return _line(lambda: check_identity_file(_cfg(identity_file=str(HOME / ".ssh" / "id_ed25519"))))


def _no_key() -> str:
    from sparkserve.nodes.ssh_connect import _auth_kwargs

    return _line(lambda: _auth_kwargs(_target(identity_file=None)))


def _auth_failed() -> str:
    import paramiko

    from sparkserve.nodes.ssh_connect import _connect_error

    return _line(lambda: _connect_error(_target(identity_file=None), paramiko.AuthenticationException(
        "Authentication failed.")))


def _unresolvable() -> str:
    from sparkserve.nodes.ssh_connect import _connect_error

    return _line(lambda: _connect_error(_target(), socket.gaierror(-2, "Name or service not known")))


def _refused() -> str:
    from paramiko.ssh_exception import NoValidConnectionsError

    from sparkserve.nodes.ssh_connect import _connect_error

    err = NoValidConnectionsError({("192.168.1.10", 22): ConnectionRefusedError(111, "Connection refused")})
    return _line(lambda: _connect_error(_target(), err))


def _image_missing() -> str:
    from sparkserve.image.on_nodes import same_image_problem

    return _line(lambda: same_image_problem({"spark-a": "sha256:8e3f" + "0" * 60, "spark-b": None}, IMAGE))


def _port_in_use() -> str:
    return "doctor, check `port 0.0.0.0:8000`: " + PORT_IN_USE.format(hp="0.0.0.0:8000", name="spark-a")


def _sudoers() -> str:
    from sparkserve.nodes.hostfacts import sudoers_fix

    return (f"doctor, check `page cache drop`: sudo -n cannot drop the page cache (sudo's reason) — {sudoers_fix(USER)}"
            f"\nup: warning: spark-a: the page cache was not dropped before the boot (sudo's reason) — "
            f"{sudoers_fix(USER)}")


ENTRIES: tuple[Entry, ...] = (
    Entry("placeholder-host", "A placeholder host", _placeholder,
          "`nodes[].host` still holds the name `sparkserve init` wrote: nothing answers there, so every command "
          "that would connect stops first (exit 2).",
          "Put each Spark's SSH address, or its `~/.ssh/config` alias, in `nodes[].host` (and its ConnectX-7 "
          "address in `nodes[].fabric_ip`), then `sparkserve validate`."),
    Entry("no-known-hosts", "No known_hosts file", _no_known_hosts,
          "sparkserve verifies every host key and has no file to verify against (exit 3).",
          "After checking you reach the right machines, record their keys: the `ssh-keyscan -H` line the message "
          "gives (one per node), or `sparkserve --accept-new-host-keys doctor` once."),
    Entry("unknown-host-key", "An unknown host key", _unknown_key,
          "The node's key is not in known_hosts; sparkserve refuses it rather than trust it silently (exit 3).",
          "Verify the node, then run the `ssh-keyscan -H` line from the message, or pass `--accept-new-host-keys` "
          "once (it adds the key, hashed)."),
    Entry("changed-host-key", "A changed host key", _changed_key,
          "The node answers with another key than known_hosts holds: a reinstalled node, or another machine at "
          "that address. sparkserve refuses to connect (exit 3).",
          "If the node was reinstalled: the `ssh-keygen -R` line from the message, then `ssh-keyscan -H`. If not, "
          "find out who answers at that address first."),
    Entry("missing-ssh-identity", "A missing ssh identity file", _identity_missing,
          "`ssh.identity_file` names a key file that is not there (exit 2, before any node is touched). "
          "`sparkserve init` writes no identity file: this line is one you set.",
          "Fix the path, or delete the line: then sparkserve offers what `ssh` itself would — `~/.ssh/config`'s "
          "`IdentityFile`, the ssh-agent's keys, OpenSSH's default key files."),
    Entry("no-key-to-offer", "No key to offer", _no_key,
          "No key file and no ssh-agent: there is nothing to log in with (exit 3).",
          "Load your key into an agent (`eval $(ssh-agent) && ssh-add`), or name it: an `IdentityFile` in "
          "`~/.ssh/config`, or `ssh.identity_file`. If `ssh spark1` works, sparkserve works."),
    Entry("authentication-failed", "Authentication failed", _auth_failed,
          "The node refused every key offered (exit 3).",
          "Add your public key on the node: the `ssh-copy-id` line from the message."),
    Entry("unresolvable-host", "A host name that does not resolve", _unresolvable,
          "`nodes[].host` is neither a name your resolver knows nor a `Host` alias in `~/.ssh/config` (exit 3).",
          "Add a `Host` block for it to `~/.ssh/config` (`HostName` the address, `User` the login), or put the "
          "address in `nodes[].host`."),
    Entry("connection-refused", "Connection refused", _refused,
          "The address answers, but nothing listens on the SSH port (exit 3).",
          "Start sshd on the node (`sudo systemctl enable --now ssh`), or fix `nodes[].port` / the `Port` in "
          "`~/.ssh/config`."),
    Entry("image-not-on-a-node", "The image is not on a node", _image_missing,
          "`up` (and `image verify`) require the same image, by content fingerprint, on every node; this node does "
          "not have it at all (exit 3, before any rank starts).",
          "`sparkserve image ship` copies it from the node that has it (only the missing layers), or `docker "
          "pull` it on that node. See [the image](how-to/image.md)."),
    Entry("port-in-use", "A port in use", _port_in_use,
          "`doctor` (and `up`'s pre-flight) found the API port (`serve.port`) or the rendezvous port "
          "(`fabric.master_port`) taken on the head: a stack started by hand, another server, an old container.",
          "`sudo ss -ltnp 'sport = :8000'` on the head names the process; stop it (`docker ps` for a container "
          "left from a manual launch), or choose another `serve.port`. A port held by this config's own running "
          "stack is fine: `doctor` says so."),
    Entry("sudo-for-the-page-cache-drop", "sudo for the page-cache drop", _sudoers,
          "Before the ranks start, sparkserve drops the page cache and compacts memory on every node "
          "(`watchdog.drop_caches`: on GB10 the GPU allocates from MemFree, which page cache eats). That needs "
          "`sudo -n` for exactly one program on exactly two files; without it the boot goes on, warned, and may "
          "be refused for memory.",
          "Add the sudoers line from the message on each node, with `sudo visudo -f /etc/sudoers.d/sparkserve` "
          "(it allows `tee` on the two `/proc/sys/vm` files and nothing else). `sparkserve doctor` checks it."),
)


def first_contact_section() -> list[str]:
    out = ["## First contact { #first-contact }\n",
           "The errors a first run meets before any rank starts, each with the exact line sparkserve prints "
           "(generated by calling the code that prints it, on the example nodes `spark-a` / `spark-b`, SSH host "
           f"`{HOST}`, user `{USER}`), what it means and what to do.\n"]
    for e in ENTRIES:
        out.append(f"### {e.title} {{ #{e.anchor} }}\n")
        out.append("```text\n" + e.message() + "\n```\n")
        out.append(f"**What it means.** {e.meaning}\n")
        out.append(f"**What to do.** {e.fix}\n")
    return out
