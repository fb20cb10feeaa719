"""`sparkserve setup` on the nodes: the read-only discovery, the apply (with its rollback), the undo.

    nodes = setup_targets(["spark-a.lan", "ubuntu@spark-b.lan:22"], ssh)   # NodeConfig per host
    found = discover(opened, sysfs_root="/sys")                             # {name: NodeFacts}
    plan = plan_fabric(list(found.values()))                                # plan/fabric_setup.py
    applied = apply(opened, plan, found, ...)                               # watchdog, then confirm anew

The node-side programs are :mod:`sparkserve.nodes.hostsetup_node` (plus the one sysfs reader,
:func:`sparkserve.plan.fabric_node.node_read_sysfs`, that `up`'s pre-flight and `doctor` use), shipped by
source. A node whose ConnectX-7 ports live in a network namespace names it in its SSH session's
``SPARKSERVE_FABRIC_NETNS`` (the rig's nodes do; a Spark does not): the programs then run inside it.

Root comes through ``sudo`` as the node's SSH session allows: ``sudo -n`` first, and only when that needs a
password is the user asked (``password_for``); the password goes to sudo's stdin, never to argv, a file or a log.
"""

from __future__ import annotations

import inspect
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkserve.config import NodeConfig
from sparkserve.errors import BadInput, SparkserveError
from sparkserve.nodes import hostsetup_node
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.parallel import on_all
from sparkserve.plan import fabric_node
from sparkserve.plan.fabric_setup import (
    FABRIC_MTU,
    FabricPlan,
    NodeFacts,
    PortChange,
    netplan_yaml,
    node_facts,
    sysctl_text,
)

# run the program inside the node's fabric namespace when its session names one (values only as "$@")
NETNS_WRAP = ('if [ -n "${SPARKSERVE_FABRIC_NETNS:-}" ]; then exec ip netns exec "$SPARKSERVE_FABRIC_NETNS" "$@"; '
              'fi; exec "$@"')
ROLLBACK_S = 30.0  # seconds a node waits for the control machine to reach it again after an apply
PasswordFn = Callable[[str], str]  # node name → its sudo password (asked of the user; never stored)


def program_source(fn_name: str) -> str:
    """The node program: the node-side module, the sysfs reader, and a main that prints one JSON answer."""
    main = (f"\nimport json as _j, sys as _s\ntry:\n    _out = {fn_name}(_j.loads(_s.argv[1]))\n"
            "except Exception as _e:\n    print(_j.dumps({'error': f'{type(_e).__name__}: {_e}'}))\n    _s.exit(1)\n"
            "print(_j.dumps(_out))\n")
    return inspect.getsource(hostsetup_node) + "\n\n" + inspect.getsource(fabric_node.node_read_sysfs) + main


def run_program(node: Node, fn_name: str, args: dict, *, root: bool = False,  # type: ignore[type-arg]
                password_for: PasswordFn | None = None, timeout: float = 120.0, step: str = "setup") -> dict:  # type: ignore[type-arg]
    """Run one node-side function on ``node`` (in its fabric namespace, as root through sudo when ``root``)."""
    prefix: list[str] = []
    stdin = None
    user = getattr(node, "user", "root")
    if root and user != "root":
        probe = node.run(["sudo", "-n", "true"], timeout=30, check=False, step=f"{step}: sudo")
        if probe.ok:
            prefix = ["sudo", "-n", "--"]
        else:
            if password_for is None:
                raise NodeError(node.name, f"{step}: sudo", f"{user} needs a password for sudo (run it where it can "
                                "ask you, or allow it in sudoers)")
            prefix = ["sudo", "-S", "-p", "", "--"]
            stdin = (password_for(node.name) + "\n").encode()
    argv = ["sh", "-c", NETNS_WRAP, "sparkserve-setup", *prefix, "python3", "-c", program_source(fn_name),
            json.dumps(args)]
    res = node.run(argv, timeout=timeout, check=False, stdin=stdin, step=step)
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {}
    except ValueError:
        out = {}
    if not res.ok or "error" in out:
        why = out.get("error") or (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise NodeError(node.name, step, why, argv=argv[:4] + ["…"], last_lines=res.tail())
    return out


def setup_targets(hosts: list[str], *, user: str | None = None, port: int | None = None) -> list[NodeConfig]:
    """``[user@]host[:port]`` arguments → NodeConfig entries (names: the host, made a valid node name)."""
    out: list[NodeConfig] = []
    for h in hosts:
        u, _, rest = h.rpartition("@")
        host, p = rest, port
        if rest.count(":") == 1:
            host, _, ps = rest.partition(":")
            if not ps.isdigit():
                raise BadInput(h, f"{ps!r} is not a port")
            p = int(ps)
        if not host:
            raise BadInput(h, "no host")
        name = "".join(c if c.isalnum() or c in "_.-" else "-" for c in host).strip("-.") or "node"
        if any(n.name == name for n in out):
            name = f"{name}-{len(out) + 1}"
        kw: dict[str, object] = {"name": name, "host": host, "fabric_ip": "0.0.0.0"}
        if u or user:
            kw["user"] = u or user
        if p is not None:
            kw["port"] = p
        out.append(NodeConfig(**kw))  # type: ignore[arg-type]
    return out


def discover(nodes: dict[str, Node], hosts: dict[str, str], *, sysfs_root: str = "/sys",
             model_path: str = "~") -> dict[str, NodeFacts]:
    """Every node's read-only facts, in parallel (in ``nodes``' order)."""
    def one(name: str) -> NodeFacts:
        raw = run_program(nodes[name], "node_discover", {"sysfs_root": sysfs_root, "model_path": model_path},
                          step="setup: discovery", timeout=60)
        return node_facts(name, hosts[name], raw)

    found = on_all(list(nodes), one)
    return {name: found[name] for name in nodes}


@dataclass
class NodeChanges:
    """What `setup --apply` does on one node."""

    node: str
    ports: list[PortChange]
    netplan: str
    sysctl: str
    docker_user: str  # "" when nothing to do (root, or already in the group)

    def lines(self) -> list[str]:
        out = []
        for c in self.ports:
            if c.remove:
                out.append(f"{c.port}: {', '.join(c.remove)} → {c.address} (with --force)")
            elif not c.address_present:
                out.append(f"{c.port}: add {c.address}")
            if c.mtu_from != FABRIC_MTU:
                out.append(f"{c.port}: MTU {c.mtu_from} → {FABRIC_MTU}")
        if self.netplan:
            out.append(f"write {hostsetup_node.NETPLAN_FILE}")
        if self.sysctl:
            out.append(f"write {hostsetup_node.SYSCTL_FILE} (vm.swappiness = 1; active at the next boot, or now: "
                       "sudo sysctl --system)")
        if self.docker_user:
            out.append(f"add {self.docker_user} to the docker group (active at the next login)")
        out.append(f"write {hostsetup_node.STATE} (what `setup --undo` removes)")
        return out


def node_changes(plan: FabricPlan, found: dict[str, NodeFacts]) -> dict[str, NodeChanges]:
    out = {}
    for name, facts in found.items():
        ports = plan.for_node(name)
        raw = facts.raw
        in_group = "docker" in raw.get("groups", [])
        out[name] = NodeChanges(name, ports, netplan_yaml(ports) if ports else "", sysctl_text(
            str(raw.get("swappiness", ""))), "" if raw.get("uid") == 0 or in_group else str(raw.get("user", "")))
    return out


@dataclass
class Applied:
    node: str
    written: list[str] = field(default_factory=list)
    confirmed: bool = False
    error: str = ""


def apply(nodes: dict[str, Node], changes: dict[str, NodeChanges], *, reconnect: Callable[[str], Node],
          password_for: PasswordFn | None = None, rollback_s: float = ROLLBACK_S,
          before_confirm: Callable[[str], None] | None = None) -> dict[str, Applied]:
    """Apply on every node in parallel; then reach each node again over a NEW connection (``reconnect``) and
    confirm, or let its watchdog roll it back at ``rollback_s``."""
    def one(name: str) -> Applied:
        ch = changes[name]
        token = secrets.token_hex(16)
        args = {"ports": {c.port: {"address": c.address, "remove": c.remove} for c in ch.ports},
                "mtu": FABRIC_MTU, "netplan": ch.netplan, "sysctl": ch.sysctl, "docker_user": ch.docker_user,
                "token": token, "rollback_s": rollback_s}
        out = run_program(nodes[name], "node_apply", args, root=True, password_for=password_for,
                          step="setup: apply")
        res = Applied(name, out.get("written", []))
        if before_confirm is not None:
            before_confirm(name)
        deadline = time.monotonic() + rollback_s * 0.6
        last = ""
        while time.monotonic() < deadline:
            try:
                fresh = reconnect(name)
                try:
                    ok = run_program(fresh, "node_confirm", {"token": token}, root=True, password_for=password_for,
                                     step="setup: confirm", timeout=20)
                finally:
                    fresh.close()
                res.confirmed = bool(ok.get("confirmed"))
                res.error = "" if res.confirmed else str(ok.get("reason", "not confirmed"))
                return res
            except SparkserveError as e:
                last = str(e)
                time.sleep(1.0)
        res.error = (f"stopped answering after the apply ({last}); it rolls itself back within "
                     f"{rollback_s:.0f} s of the apply")
        return res

    results: dict[str, Applied] = {}

    def guarded(name: str) -> Applied:
        try:
            results[name] = one(name)
        except SparkserveError as e:
            results[name] = Applied(name, error=str(e))
        return results[name]

    on_all(list(changes), guarded)
    return {n: results[n] for n in changes}


def undo(nodes: dict[str, Node], *, password_for: PasswordFn | None = None) -> dict[str, dict]:  # type: ignore[type-arg]
    """Every file setup wrote removed on every node, the ports as they were."""
    return on_all(list(nodes), lambda n: run_program(nodes[n], "node_undo", {}, root=True, password_for=password_for,
                                                      step="setup: undo"))


def rollback_note(node: Node) -> dict:  # type: ignore[type-arg]
    """What a node's watchdog did after an unconfirmed apply ({} when it did nothing)."""
    return run_program(node, "node_rollback_note", {}, root=True, step="setup: rollback note")


def ssh_fix(host: str, user: str, port: int, error: str) -> str:
    """The exact command that makes SSH from this machine to a node work, for the error seen."""
    low = error.lower()
    target = f"{user}@{host}"
    p = f" -p {port}" if port != 22 else ""
    if "host key" in low or "known_hosts" in low or "not in known" in low:
        return f"ssh{p} {target} true   (check the fingerprint it shows, accept it; or pass --accept-new)"
    if "auth" in low or "permission denied" in low or "key" in low:
        return f"ssh-copy-id{p} {target}"
    return f"ssh{p} {target} true   (is the node on and reachable from here?)"


def node_names(nodes: list[NodeConfig], found: dict[str, NodeFacts]) -> dict[str, str]:
    """The name each node gets in the config: its hostname where every node's differs and is a valid node name
    (two Sparks straight from the box may share one), else the host it was reached by."""
    import re

    names = {n.name: str(found[n.name].raw.get("hostname", "")) if n.name in found else "" for n in nodes}
    ok = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    if len(set(names.values())) == len(nodes) and all(ok.match(v) for v in names.values()):
        return names
    return {n.name: n.name for n in nodes}


def write_config(path: Path, nodes: list[NodeConfig], plan: FabricPlan, *, ssh_config: Path | None,
                 known_hosts: Path | None, identity_file: Path | None | str,
                 names: dict[str, str] | None = None, sysfs_root: str = "/sys") -> str:
    """Write or update ``path``: nodes (names, hosts, users, ports, fabric IPs) and fabric (interface, HCA);
    the rest of an existing file stays as it was, comments included. Returns "wrote" or "updated"."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    from sparkserve.config import default_yaml_text

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # one node per line
    verb = "updated" if path.exists() else "wrote"
    data = yaml.load(path.read_text() if path.exists() else default_yaml_text())
    seq = CommentedSeq()
    for n in nodes:
        m = CommentedMap()
        m["name"] = (names or {}).get(n.name, n.name)
        m["host"] = n.host
        m["fabric_ip"] = plan.fabric_ip.get(n.name, n.fabric_ip)
        m["user"] = n.user
        if n.port != 22:
            m["port"] = n.port
        m.fa.set_flow_style()
        seq.append(m)
    data["nodes"] = seq
    fab = data.setdefault("fabric", CommentedMap())
    if plan.interface:
        fab["interface"] = plan.interface
    fab["hca"] = plan.hca
    if sysfs_root != "/sys":  # where the RDMA devices were read: `up` reads them there too
        fab["sysfs_root"] = sysfs_root
    ssh = data.setdefault("ssh", CommentedMap())
    if ssh_config is not None:
        ssh["config_file"] = str(ssh_config)
    if known_hosts is not None:
        ssh["known_hosts"] = str(known_hosts)
    if identity_file != "keep":
        ssh["identity_file"] = None if identity_file is None else str(identity_file)
    import io

    buf = io.StringIO()
    yaml.dump(data, buf)
    tmp = path.with_name(path.name + ".sparkserve-tmp")
    tmp.write_text(buf.getvalue())
    tmp.replace(path)
    return verb
