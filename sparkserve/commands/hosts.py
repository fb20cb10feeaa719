"""`setup` (the hosts and the fabric, from two bare Sparks) and `weights pull|ship|verify` (the model fetched once
on the head and shipped over the fabric): parse, open the nodes, call one function, print.

The logic lives in :mod:`sparkserve.nodes.hostsetup` (+ :mod:`sparkserve.plan.fabric_setup`) and
:mod:`sparkserve.deploy.weights`.
"""

from __future__ import annotations

import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sparkserve.commands._common import ConfigOpt, JsonOpt, console, emit_json, err_console
from sparkserve.errors import BadInput, RemoteFailure

if TYPE_CHECKING:
    from sparkserve.config import NodeConfig, SSHConfig
    from sparkserve.nodes.base import Node


def _say(line: str, *, err: bool = False) -> None:
    (err_console if err else console).print(line, markup=False, highlight=False, soft_wrap=True)


def _password_for(user_of: dict[str, str]) -> Any:
    if not sys.stdin.isatty():
        return None
    asked: dict[str, str] = {}

    def ask(node: str) -> str:  # asked once per node, kept in memory for this run only
        if node not in asked:
            asked[node] = getpass.getpass(f"[sudo] password for {user_of.get(node, '?')} on {node}: ")
        return asked[node]

    return ask


def _targets(hosts: list[str], config: Path | None, user: str | None, ssh_config: Path | None,
             known_hosts: Path | None, identity_file: Path | None, accept_new: bool
             ) -> tuple[list[NodeConfig], SSHConfig, Path]:
    from sparkserve.config import DEFAULT_CONFIG_NAME, SSHConfig, find_config_path, load_config
    from sparkserve.nodes.hostsetup import setup_targets

    path = config or find_config_path(None) or Path(DEFAULT_CONFIG_NAME)
    if hosts:
        nodes = setup_targets(hosts, user=user)
        kw: dict[str, Any] = {"identity_file": identity_file}
        if ssh_config is not None:
            kw["config_file"] = ssh_config
        if known_hosts is not None:
            kw["known_hosts"] = known_hosts
        ssh = SSHConfig(**kw)
    else:
        if not path.exists():
            raise BadInput("HOST", "name the nodes (`sparkserve setup spark-a.lan spark-b.lan`) or a config with "
                           "-c")
        cfg = load_config(path, require_file=True)
        nodes, ssh = list(cfg.nodes), cfg.ssh.model_copy()
    if accept_new:
        ssh.accept_new_host_keys = True
    return nodes, ssh, path


def _connect(nodes: list[NodeConfig], ssh: SSHConfig) -> dict[str, Node]:
    from sparkserve.nodes.factory import make_node
    from sparkserve.nodes.hostsetup import ssh_fix
    from sparkserve.nodes.parallel import on_all
    from sparkserve.nodes.ssh import SSHNode

    opened = {n.name: make_node(n, ssh) for n in nodes}
    failed: dict[str, str] = {}

    def one(name: str) -> None:
        node = opened[name]
        try:
            if isinstance(node, SSHNode):
                node.connect()
        except RemoteFailure as e:
            failed[name] = str(e)

    on_all(list(opened), one)
    if failed:
        for n in nodes:
            if n.name in failed:
                _say(f"error: {n.name}: ssh: {failed[n.name]}", err=True)
                _say(f"  fix: {ssh_fix(n.host, n.user, n.port, failed[n.name])}", err=True)
        for node in opened.values():
            node.close()
        raise typer.Exit(3)
    return opened


def _table(found: dict[str, Any], plan: Any, changes: dict[str, Any]) -> None:
    from rich.table import Table

    peer_of = {(a, b): f"{c} {d}" for a, b, c, d in plan.links}
    t = Table(title="ConnectX-7 ports", title_justify="left")
    for col in ("node", "port", "link", "speed", "MTU", "IPv4", "RDMA", "peer (cabled to)"):
        t.add_column(col)
    for name, f in found.items():
        for p in f.ports.values():
            t.add_row(name, p.name, "up" if p.link else "down", f"{p.speed_mbps // 1000} Gb/s" if p.speed_mbps else "-",
                      str(p.mtu or "-"), ", ".join(p.ipv4) or "-", p.rdma or "-", peer_of.get((name, p.name), "-"))
    console.print(t)
    h = Table(title="hosts", title_justify="left")
    for col in ("node", "docker", "NVIDIA runtime", "groups", "swappiness", "free at model path", "HF cache"):
        h.add_column(col)
    for name, f in found.items():
        r = f.raw
        d = r["docker"]
        hf = r["hf_cache"]
        h.add_row(name, d["server"] or (d["error"] or "no docker CLI"),
                  "yes" if "nvidia" in d["runtimes"] else "missing", ",".join(r["groups"]), r["swappiness"],
                  f"{r['disk']['free_bytes'] / 1e9:.0f} GB ({r['disk']['path']})",
                  f"{hf['path']} ({len(hf['repos'])} models)" if hf["exists"] else f"{hf['path']} (none yet)")
    console.print(h)
    for _, _, hint in plan.unlinked:
        _say(f"· {hint}")
    for name, ch in changes.items():
        for line in ch.lines():
            _say(f"would change on {name}: {line}")


def _facts_json(found: dict[str, Any], plan: Any, changes: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "nodes": [{"name": n, "host": f.host, "ports": [asdict(p) for p in f.ports.values()],
                   "docker": f.raw["docker"], "groups": f.raw["groups"], "swappiness": f.raw["swappiness"],
                   "disk": f.raw["disk"], "hf_cache": f.raw["hf_cache"], "netplan": f.raw["netplan"],
                   "sparkserve_state": f.raw["state"]} for n, f in found.items()],
        "links": [{"node": a, "port": b, "peer": c, "peer_port": d} for a, b, c, d in plan.links],
        "unlinked": [{"node": a, "port": b, "hint": c} for a, b, c in plan.unlinked],
        "changes": {n: ch.lines() for n, ch in changes.items()},
        "conflicts": plan.conflicts, "errors": plan.errors,
        "config": {"interface": plan.interface, "hca": plan.hca, "fabric_ip": plan.fabric_ip},
    }


def setup_cmd(
    hosts: Annotated[list[str] | None, typer.Argument(
        help="the nodes' SSH addresses, head first: host, user@host or user@host:port (none: the config's "
             "nodes)")] = None,
    config: ConfigOpt = None,
    apply: Annotated[bool, typer.Option("--apply", help="make the changes (asks first unless --yes)")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="with --apply: do not ask")] = False,
    force: Annotated[bool, typer.Option("--force", help="with --apply: replace fabric addresses set differently")
                     ] = False,
    undo: Annotated[bool, typer.Option("--undo", help="remove every file setup wrote, ports back as they were")
                    ] = False,
    fabric_range: Annotated[str, typer.Option(
        "--fabric-range", help="where the fabric's /24s come from (one per twin port)")] = "192.168.100.0/22",
    sysfs_root: Annotated[str, typer.Option("--sysfs-root", help="where the RDMA devices are read")] = "/sys",
    model_path: Annotated[str, typer.Option("--model-path", help="where the weights go (free disk is read there)")
                          ] = "~/.cache/huggingface",
    user: Annotated[str | None, typer.Option("--user", help="SSH user for hosts without user@")] = None,
    ssh_config: Annotated[Path | None, typer.Option("--ssh-config", help="OpenSSH client config to resolve hosts")
                          ] = None,
    known_hosts: Annotated[Path | None, typer.Option("--known-hosts", help="known_hosts file")] = None,
    identity_file: Annotated[Path | None, typer.Option("--identity-file", help="private key to offer first")] = None,
    accept_new: Annotated[bool, typer.Option("--accept-new-host-keys", help="add unknown host keys")] = False,
    rollback_s: Annotated[float, typer.Option("--rollback-s", help="seconds a node waits to be reached again after "
                                              "--apply before it undoes it by itself")] = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Discover the nodes (read-only), then, with --apply, set up their hosts and fabric and write the config.

    Without --apply nothing changes: every node's ConnectX-7 ports (link, speed, MTU, IPv4, RDMA device, GIDs),
    which port is cabled to which peer, docker and the NVIDIA runtime, groups, swappiness, free disk, the HF
    cache, and what it would change.

    --apply changes, on each node (root through sudo; a password prompt is the user's, never stored): the
    cabled ports' IPv4 (one /24 per twin) and MTU 9000, live through `ip`; /etc/netplan/60-sparkserve-fabric.yaml;
    /etc/sysctl.d/60-sparkserve.conf (vm.swappiness = 1, when it is above 10); the user in the docker group;
    /etc/sparkserve/setup.json (the record of all this). A node not reached again within --rollback-s undoes the
    apply by itself. Then it writes or updates the config (nodes, hosts, fabric IPs, interface, HCA).
    --undo removes those files and puts the ports back."""
    from sparkserve.nodes import hostsetup
    from sparkserve.plan.fabric_setup import plan_fabric

    nodes, ssh, path = _targets(hosts or [], config, user, ssh_config, known_hosts, identity_file, accept_new)
    users = {n.name: n.user for n in nodes}
    doc: dict[str, Any] = {}

    def say(line: str) -> None:  # with --json, stdout holds the one document: the narration goes to stderr
        _say(line, err=as_json)

    def done(code: int = 0) -> None:
        if as_json:
            emit_json({**doc, "ok": code == 0})
        if code:
            raise typer.Exit(code)

    opened = _connect(nodes, ssh)
    try:
        if undo:
            undone = hostsetup.undo(opened, password_for=_password_for(users))
            doc["undo"] = undone
            for name, r in undone.items():
                what = ", ".join(r["removed"]) or "nothing of sparkserve's"
                say(f"{name}: removed {what}" + (f"; problems: {'; '.join(r['problems'])}" if r["problems"] else ""))
            return done(3 if any(r["problems"] for r in undone.values()) else 0)
        found = hostsetup.discover(opened, {n.name: n.host for n in nodes}, sysfs_root=sysfs_root,
                                   model_path=model_path)
        plan = plan_fabric(list(found.values()), address_range=fabric_range)
        changes = hostsetup.node_changes(plan, found)
        doc.update(_facts_json(found, plan, changes))
        if not as_json:
            _table(found, plan, changes)
            say(f"ssh: every node answered from this machine ({', '.join(f'{n.user}@{n.host}' for n in nodes)})")
        for e in plan.errors:
            _say(f"error: fabric: {e}", err=True)
        if plan.conflicts:
            _say("addresses already set differently (- now, + setup's):", err=True)
            for line in plan.conflicts:
                _say(f"  {line}", err=True)
        if not apply:
            say("nothing changed (read-only); `sparkserve setup --apply` makes these changes")
            return done(2 if plan.errors else 0)
        if plan.errors:
            return done(2)
        if plan.conflicts and not force:
            _say("error: fabric: refused: ports hold other addresses (shown above); --force replaces them", err=True)
            return done(2)
        if not yes and not typer.confirm("apply these changes?", default=False, err=True):
            _say("nothing changed", err=True)
            return done(1)
        by_name = {n.name: n for n in nodes}

        def reconnect(name: str) -> Node:
            from sparkserve.nodes.factory import make_node
            from sparkserve.nodes.ssh import SSHNode

            fresh = make_node(by_name[name], ssh)
            if isinstance(fresh, SSHNode):
                fresh.connect()
            return fresh

        applied = hostsetup.apply(opened, changes, reconnect=reconnect, password_for=_password_for(users),
                                  rollback_s=rollback_s)
        doc["applied"] = {n: {"written": a.written, "confirmed": a.confirmed, "error": a.error}
                          for n, a in applied.items()}
        bad = False
        for name, a in applied.items():
            if a.confirmed:
                say(f"{name}: applied; wrote {', '.join(a.written)}")
            else:
                bad = True
                _say(f"error: {name}: {a.error}", err=True)
        if bad:
            return done(3)
        names = hostsetup.node_names(nodes, found)
        verb = hostsetup.write_config(path, nodes, plan, ssh_config=ssh.config_file if hosts else None,
                                      known_hosts=ssh.known_hosts if hosts else None,
                                      identity_file=ssh.identity_file if hosts else "keep", names=names,
                                      sysfs_root=sysfs_root)
        doc["config_file"] = str(path)
        say(f"{verb} {path}: nodes {', '.join(f'{names[n]} ({ip})' for n, ip in plan.fabric_ip.items())}, "
            f"fabric interface {plan.interface}, hca {plan.hca}; next: `sparkserve weights pull`")
        return done(0)
    finally:
        for node in opened.values():
            node.close()


CARD_TARGET = "canada-quant/GLM-5.3-Flash-W4A16-MTP"  # the card's target (~178 GiB, the README's size)
CARD_DRAFTER = "canada-quant/GLM-5.3-Flash-DFlash2-G"  # the card's Spark drafter of record (~6.2 GB)

weights_app = typer.Typer(help="The model fetched once on the head (`pull`) and shipped over the fabric (`ship`), "
                               "checked by content on every node (`verify`).", no_args_is_help=True)


class _Rate:
    """One progress line a second at most: bytes done of all, GB/s, ETA (stderr)."""

    def __init__(self, verb: str) -> None:
        import time

        self.verb, self.t0, self.last, self._time = verb, time.monotonic(), 0.0, time.monotonic

    def __call__(self, what: str, done: int, total: int) -> None:
        now = self._time()
        if now - self.last < 0.95 and done < total:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-6)
        eta = f"ETA {(total - done) / rate:.0f} s" if rate > 0 and done < total else ("done" if done >= total else "")
        _say(f"{self.verb} {what}: {done / 1e9:.2f} / {total / 1e9:.2f} GB, {rate / 1e9:.2f} GB/s, {eta}", err=True)


def _split_rev(ref: str) -> tuple[str, str | None]:
    from sparkserve.models.hf_cache import parse_repo_id

    try:
        r = parse_repo_id(ref)
    except BadInput:
        raise BadInput(ref, "not a Hugging Face repo id (org/name or org/name@revision)") from None
    return f"{r.org}/{r.name}", r.revision


def pull_cmd(
    config: ConfigOpt = None,
    target: Annotated[str, typer.Option("--target", help="the target, org/name[@revision]")] = CARD_TARGET,
    drafter: Annotated[str | None, typer.Option("--drafter", help="the drafter, org/name[@revision] (empty: none)")
                       ] = CARD_DRAFTER,
    python: Annotated[str, typer.Option("--python", help="the head's python that has huggingface_hub")] = "python3",
    hub_cache: Annotated[str | None, typer.Option("--hub-cache", help="the head's HF hub cache (default: its "
                                                  "HF_HUB_CACHE, else ~/.cache/huggingface/hub)")] = None,
    write: Annotated[bool, typer.Option("--write/--no-write", help="set model.target and drafter.path in the config "
                                        "to the pulled snapshots")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Download the target and the drafter once, on the head, into its Hugging Face cache.

    Through huggingface_hub on the head: its cache, its token (or HF_TOKEN from here, sent on stdin), HF_ENDPOINT
    (from here when set), at the commit the revision resolves to (pinned: the snapshot path names it). A pull
    that stopped resumes. Changes: the head's HF cache; the config's model.target and drafter.path (unless
    --no-write). Progress once a second with GB/s and ETA."""
    import os

    from sparkserve.commands._common import config_from
    from sparkserve.deploy.weights import pull, write_model_paths
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config)
    refs = [("target", *_split_rev(target))] + ([("drafter", *_split_rev(drafter))] if drafter else [])
    out: dict[str, Any] = {}
    with open_nodes(cfg, names=[cfg.head.name]) as nodes:
        head = nodes[cfg.head.name]
        for role, repo, rev in refs:
            got = pull(head, repo, rev, python=python, token=os.environ.get("HF_TOKEN") or None,
                       endpoint=os.environ.get("HF_ENDPOINT") or None, hub_cache=hub_cache, progress=_Rate("pull"))
            out[role] = got
            if not as_json:
                _say(f"{role}: {repo}@{got.revision} ({got.bytes / 1e9:.2f} GB, {got.seconds:.0f} s) at "
                     f"{cfg.head.name}:{got.path}")
    if write:
        from sparkserve.config import find_config_path

        path = find_config_path(config)
        if path is not None:
            write_model_paths(path, out["target"].path, out["drafter"].path if "drafter" in out else None)
            if not as_json:
                _say(f"updated {path}: model.target" + (" and drafter.path" if "drafter" in out else "")
                     + "; next: `sparkserve weights ship`")
    if as_json:
        from dataclasses import asdict

        emit_json({role: asdict(p) for role, p in out.items()})


def _ship_roots(cfg: Any) -> list[str]:
    from sparkserve.models.hf_cache import snapshot_of

    roots = []
    for p in (str(cfg.model.target), str(cfg.drafter.path)):
        snap = snapshot_of(p)
        r = snap.repo_dir if snap else p
        if r not in roots:
            roots.append(r)
    return roots


def ship_cmd(
    config: ConfigOpt = None,
    streams: Annotated[int, typer.Option("--streams", min=1, max=32, help="parallel TCP streams per node")] = 4,
    bwlimit: Annotated[float, typer.Option("--bwlimit", min=0, help="MB/s in all (0: no limit)")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Copy the target and the drafter from the head to every other node over the fabric IPs, then verify.

    Bytes go head → node directly over each node's fabric_ip (never through this machine, never the management
    network); only what a node lacks is sent, and a file a stopped ship left partial is sent from where it
    stopped. Then each node hashes its own copy (sha256, where the bytes are) and the hashes are compared with
    the head's; a file that differs is sent again once. Changes: the model directories on the other nodes.
    Progress once a second with GB/s and ETA."""
    from sparkserve.commands._common import config_from
    from sparkserve.deploy.weights import ship
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config)
    roots = _ship_roots(cfg)
    bad = False
    result: dict[str, Any] = {}
    with open_nodes(cfg) as nodes:
        head = nodes[cfg.head.name]
        targets = {n.name: (nodes[n.name], n.fabric_ip) for n in cfg.nodes[1:]}
        for root in roots:
            reps = ship(head, targets, root, streams=streams, bwlimit=bwlimit * 1e6, progress=_Rate("ship"))
            result[root] = reps
            for name, r in reps.items():
                bad = bad or not r.verified
                if not as_json:
                    line = (f"{name}: {root}: sent {r.sent_bytes / 1e9:.2f} GB in {r.seconds:.1f} s "
                            f"({r.gb_per_s:.2f} GB/s) over {targets[name][1]}, {r.skipped_bytes / 1e9:.2f} GB there "
                            "already; content " + ("verified" if r.verified else "DIFFERS: " + ", ".join(r.mismatched)))
                    if r.repaired:
                        line += f" (sent again: {', '.join(r.repaired)})"
                    _say(line)
    if as_json:
        from dataclasses import asdict

        emit_json({"ship": {root: {n: asdict(r) for n, r in reps.items()} for root, reps in result.items()}})
    if bad:
        raise typer.Exit(1)


def verify_cmd(config: ConfigOpt = None, rehash: Annotated[bool, typer.Option(
        "--rehash", help="hash every file again (not trusting each node's cache of unchanged files)")] = False,
               as_json: JsonOpt = False) -> None:
    """Compare the model's content on every node with the head's: sha256 of every file, computed on each node.

    Changes nothing (a per-directory hash cache in ~/.cache/sparkserve on each node). Exit 1 when any differs."""
    from sparkserve.commands._common import config_from
    from sparkserve.deploy.weights import verify
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config)
    out: dict[str, dict[str, list[str]]] = {}
    with open_nodes(cfg) as nodes:
        head = nodes[cfg.head.name]
        for root in _ship_roots(cfg):
            out[root] = verify(head, {n.name: nodes[n.name] for n in cfg.nodes[1:]}, root, rehash=rehash)
    if as_json:
        emit_json({"verify": out})
    else:
        for root, per in out.items():
            for name, files in per.items():
                _say(f"{name}: {root}: " + ("same content as the head" if not files else
                                            "differs from the head: " + ", ".join(files)))
    if any(f for per in out.values() for f in per.values()):
        raise typer.Exit(1)


weights_app.command("pull")(pull_cmd)
weights_app.command("ship")(ship_cmd)
weights_app.command("verify")(verify_cmd)


def register(app: typer.Typer) -> None:
    app.command("setup")(setup_cmd)
    app.add_typer(weights_app, name="weights")
