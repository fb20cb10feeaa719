"""Node-side pre-flight (`sparkserve doctor`, and the first step of `up`): every node in parallel.

Each check returns a :class:`Check` (ok / warn / fail with one sentence). `up` stops at the first
failing node check; `doctor` shows them all. What the node is asked, in one round trip, is
:mod:`sparkserve.deploy.probe`; the fabric facts it returns are resolved by :mod:`sparkserve.plan.fabric`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from sparkserve.config import Config, NodeConfig
from sparkserve.config.profiles import drafter_path
from sparkserve.deploy.drafter import local_drafter
from sparkserve.deploy.probe import probe_node
from sparkserve.deploy.sync import RemoteState, manifest_args, state_from
from sparkserve.errors import BadInput, SparkserveError
from sparkserve.journal import lookup
from sparkserve.models.target_manifest import TargetManifest
from sparkserve.nodes.base import Node
from sparkserve.nodes.hostfacts import HostFacts, host_question, host_verdicts, memory_verdict, storage_parity
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.runtime import engine_for
from sparkserve.plan.build import Plan
from sparkserve.plan.fabric import FabricError, FabricFacts, compare_nodes, resolve
from sparkserve.plan.fabric_sysfs import parse_sysfs
from sparkserve.plan.mounts import cache_dir
from sparkserve.units import human_bytes

Status = Literal["ok", "warn", "fail"]


@dataclass
class Check:
    """One node check's verdict, as `doctor --json` prints it."""

    node: str
    name: str
    status: Status
    detail: str

    @property
    def ok(self) -> bool:
        return self.status != "fail"


def head_ports(cfg: Config) -> list[tuple[str, int]]:
    """The API port and the rendezvous port: both live on the head."""
    return [(cfg.serve.host or "0.0.0.0", cfg.serve.port), (cfg.head.fabric_ip, cfg.fabric.master_port)]


def check_node(cfg: Config, node_cfg: NodeConfig, node: Node, rank: int, plan: Plan | None,
               *, check_ports: bool = True, drafter_bytes: int = 0, mkdirs: list[str] | None = None,
               fabric_out: dict[str, FabricFacts] | None = None,
               manifest_out: dict[str, RemoteState | None] | None = None, lean: bool = False,
               host_out: dict[str, HostFacts] | None = None,
               target_out: dict[str, TargetManifest] | None = None,
               storage_out: dict[str, str] | None = None,
               ranks_out: dict[str, int] | None = None) -> list[Check]:
    """Every check for one node (one remote round trip). Raises only when the node cannot be reached at all.

    ``lean``: `up`'s pre-flight — free memory is judged just before the ranks start, after the page-cache drop
    (:func:`sparkserve.deploy.preflight.memory_before_start`), so neither the GPU nor sudo is asked here;
    ``host_out``/``target_out`` receive the node's host facts and target manifest (compared across nodes by
    :func:`check_all`); ``storage_out`` the docker storage driver (`doctor`: one more docker question).

    ``ranks_out`` receives how many sparkserve ranks (of any config) the node holds: with none, nothing `up`
    would stop can be what holds a port or the memory, so `up` refuses those at once.

    ``mkdirs`` are created on the node (`up`: the containers' writable mount dirs); ``fabric_out`` receives
    the node's fabric facts, so `up` does not read sysfs twice; ``manifest_out`` the drafter's manifest from
    the node's cache, asked in the same round trip (None: the node could not answer it)."""
    out: list[Check] = []
    name = node_cfg.name

    def add(check: str, status: Status, detail: str) -> None:
        out.append(Check(name, check, status, detail))

    add("ssh", "ok", f"reachable as {node.address}")
    if cfg.runtime == "docker":  # runtime process: no docker on the node (the engine check is up's preflight)
        try:
            ver = node.docker().version()
            add("docker", "ok", f"docker {ver.get('Version', '?')} (API {ver.get('ApiVersion', '?')})")
            if storage_out is not None:
                storage_out[name] = str(node.docker().info().get("Driver") or "")
            if not lean:  # `doctor`: the image by its identity (`up` asks the engine identity itself)
                add("image", *_image_check(cfg.image.ref, node))
        except SparkserveError as e:
            hint = ""
            if "permission denied" in e.what.lower():  # a non-root SSH user outside the docker group
                who = node.address.split("@")[0] if "@" in node.address else node_cfg.user  # after ~/.ssh/config
                hint = f" — add {who} to the docker group on {name} (`sudo usermod -aG docker {who}`, log in again)"
            add("docker", "fail", e.what + hint)
    ports = head_ports(cfg) if check_ports and rank == 0 else []
    target, drafter = str(cfg.model.target), drafter_path(cfg)  # drafter None: mtp, the target's own head
    sysfs = str(cfg.fabric.sysfs_root)
    cache = cache_dir(cfg, node_cfg).rsplit("/", 1)[0]  # the cache root on this node (~/ = its user's home)
    facts = probe_node(node, paths=[target, drafter or target], disk=[drafter or cache, cache],
                       ports=ports, sysfs=sysfs, mkdirs=mkdirs or [],
                       manifest=None if manifest_out is None or drafter is None else
                       manifest_args(drafter, cached_only=True),
                       host=host_question(cfg, drop=False, sudo_check=not lean),
                       target=target if target_out is not None and target.startswith("/") else None)
    host = HostFacts.from_answer(facts.host or {})
    if host_out is not None:
        host_out[name] = host
    if target_out is not None and facts.target is not None and facts.paths[target]:
        target_out[name] = TargetManifest.from_answer(facts.target)
    if manifest_out is not None and drafter is not None:
        manifest_out[name] = _manifest_state(drafter, facts.manifest)
    add("target", "ok" if facts.paths[target] else "fail",
        f"{target} present" if facts.paths[target] else f"model.target: {target} is missing on {name}")
    if drafter is not None and not facts.paths[drafter] and _no_local_drafter(cfg):
        add("drafter", "fail", f"drafter.path: {drafter} is missing on {name} and there is no copy on this machine "
            "to sync from (set drafter.source to one, or copy it there)")
    free = facts.disk[drafter or cache]
    need = drafter_bytes
    add("disk", "ok" if free >= need else "fail",
        f"{human_bytes(free)} free for the drafter" + (f" (needs {human_bytes(need)})" if need else ""))
    try:
        managed: list[Any] | SparkserveError = engine_for(node, cfg).list_managed()
    except SparkserveError as e:
        managed = e
    def is_mine(c: Any) -> bool:
        return c.fingerprint == plan.fingerprint if plan is not None else own_deployment(cfg, c.fingerprint)

    mine = [] if isinstance(managed, SparkserveError) else [c for c in managed if is_mine(c)]
    if ranks_out is not None and not isinstance(managed, SparkserveError):
        ranks_out[name] = len(managed)
    held_by_me = any(c.running for c in mine)  # this config's own running stack holds the head's ports
    for hp, is_free in facts.ports.items():
        if not is_free and held_by_me:
            add(f"port {hp}", "ok", f"in use by this config's running stack (deployment {mine[0].fingerprint[:12]})")
            continue
        add(f"port {hp}", "ok" if is_free else "fail",
            "free" if is_free else f"port {hp} is already in use on {name}")
    bad_dirs = {d: why for d, why in facts.mkdirs.items() if why}
    if mkdirs:
        add("dirs", "fail" if bad_dirs else "ok",
            "; ".join(f"cannot create {d}: {why}" for d, why in bad_dirs.items()) if bad_dirs
            else f"{len(mkdirs)} writable mount dir(s) ready")
    for check, status, detail in [] if lean else memory_verdict(cfg, node_cfg, host, dropped=False):
        add(check, status, detail)
    if isinstance(managed, SparkserveError):
        add("containers", "fail", managed.what)
    else:
        stale = [c for c in managed if c not in mine]
        if stale:
            add("containers", "warn", f"{len(stale)} sparkserve container(s) from another config: "
                f"{', '.join(c.name for c in stale)}")
        elif mine:
            add("containers", "ok", f"this config's stack: {', '.join(c.name for c in mine)} "
                f"({'running' if held_by_me else mine[0].status}; deployment {mine[0].fingerprint[:12]})")
        else:
            add("containers", "ok", "no stale sparkserve containers")
    if len(cfg.nodes) == 1:  # a one-node stack: no link between nodes, no NCCL/GLOO/UCX fabric to set
        add("fabric", "ok", "one node: no fabric between nodes")
        return out
    try:
        fab = resolve(parse_sysfs(facts.sysfs or {}), cfg.fabric, node_cfg.fabric_ip, node=name, sysfs_root=sysfs)
        rec = fab.fabric_env()
        add("fabric", "ok", f"{rec.rule}: " + ", ".join(f"{k}={v}" for k, v in sorted(rec.env.items())))
        for w in rec.warnings:  # each computed warning is shown, with its fix (issue 26)
            add("fabric", "warn", w)
        if fabric_out is not None:
            fabric_out[name] = fab
    except FabricError as e:
        add("fabric", "fail", str(e))
    return out


def _no_local_drafter(cfg: Config) -> bool:
    """No copy of the drafter on this machine to sync from (a bad drafter.source is validate's error, not this)."""
    try:
        return local_drafter(cfg) is None
    except BadInput:
        return False


def _image_check(ref: str, node: Node) -> tuple[Status, str]:
    """image.ref on the node: its ID, and for a base known by digest the digest and its other names; missing is a
    warning (`up` says how to get it) naming the other names that hold its digest."""
    from sparkserve.image.base_names import describe, digest_of, pull_hint
    from sparkserve.image.on_nodes import image_identity

    found = image_identity(node, ref)
    known = f" — {describe(ref)}" if digest_of(ref) else ""
    if found is None:
        return "warn", f"{ref} is not on this node (`sparkserve image ship`, or pull it){pull_hint(ref)}"
    return "ok", f"{ref} is {found[0][:19]}{known}"


def own_deployment(cfg: Config, fingerprint: str) -> bool:
    """Whether the deployment ``fingerprint`` (a container's label) was booted from this config, as the
    journal recorded it: the same config but for the drafter (`swap-drafter` changes only that)."""
    if not fingerprint:
        return False
    rec = lookup(lambda j: j.deployment(fingerprint), None)
    if not rec or not isinstance(rec.get("config"), dict):
        return False
    mine = {k: v for k, v in cfg.normalized().items() if k != "drafter"}
    theirs = {k: v for k, v in rec["config"].items() if k != "drafter"}
    return mine == theirs


def _manifest_state(drafter: str, answer: dict[str, Any] | None) -> RemoteState | None:
    """The probe's manifest answer as a RemoteState; None when the node could not answer it (the drafter
    step then reads the manifest itself and says why)."""
    if answer is None or "error" in answer:
        return None
    try:
        return state_from(drafter, answer)
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def check_all(cfg: Config, nodes: dict[str, Node], plan: Plan | None = None, *,
              check_ports: bool = True, drafter_bytes: int = 0, mkdirs: dict[str, list[str]] | None = None,
              fabric_out: dict[str, FabricFacts] | None = None,
              manifest_out: dict[str, RemoteState | None] | None = None,
              unreachable: Mapping[str, SparkserveError] | None = None, lean: bool = False,
              host_out: dict[str, HostFacts] | None = None, storage: bool = False,
              ranks_out: dict[str, int] | None = None) -> list[Check]:
    """Every node's checks, in config order. A node in ``unreachable`` (it did not connect), or one whose
    checks could not run (its link dropped), gets one failed check naming the step that failed; every
    other node is still checked in full. Then the nodes side by side: host settings and versions, the
    target checkpoint's manifest (the head's copy is the reference), and with ``storage`` docker's storage
    driver. ``lean``: see :func:`check_node`."""
    host_out = {} if host_out is None else host_out
    targets: dict[str, TargetManifest] = {}
    drivers: dict[str, str] | None = {} if storage and cfg.runtime == "docker" else None
    ranks = {n.name: i for i, n in enumerate(cfg.nodes)}
    by_name = {n.name: n for n in cfg.nodes}

    def one(node: Node) -> list[Check]:
        try:
            return check_node(cfg, by_name[node.name], node, ranks[node.name], plan, check_ports=check_ports,
                              drafter_bytes=drafter_bytes, mkdirs=(mkdirs or {}).get(node.name),
                              fabric_out=fabric_out, manifest_out=manifest_out, lean=lean, host_out=host_out,
                              target_out=targets, storage_out=drivers, ranks_out=ranks_out)
        except SparkserveError as e:
            return [_cut_off(node.name, e)]

    fabric_out = {} if fabric_out is None else fabric_out
    reached = [nodes[n.name] for n in cfg.nodes if n.name in nodes]
    results = on_all(reached, one, name=lambda node: node.name)
    results |= {k: [_cut_off(k, e)] for k, e in (unreachable or {}).items()}
    checks = [c for n in cfg.nodes for c in results.get(n.name, [])]
    # the nodes' fabrics side by side: MTU, link rate, the HCA set (one rank on a slower or smaller link caps both)
    order = [n.name for n in cfg.nodes if n.name in fabric_out]
    checks += [Check("all", "fabric parity", "warn", m.message())
               for m in compare_nodes({k: fabric_out[k] for k in order})]
    hosts = {n.name: host_out[n.name] for n in cfg.nodes if n.name in host_out}
    verdicts = host_verdicts(cfg, hosts, multi_node=len(cfg.nodes) > 1) + storage_parity(drivers or {})
    checks += [Check(node, name, status, detail) for node, (name, status, detail) in verdicts]
    checks += _target_parity(cfg, targets)
    return checks


def drift_checks(cfg: Config, hosts: Mapping[str, HostFacts]) -> list[Check]:
    """`doctor --drift`: every node's host fingerprint now against the last boot whose gates passed (the
    journal's): one check per node, failing with each changed fact ``name: then -> now``."""
    ref = lookup(lambda j: j.last_good_host_facts(), None)
    if ref is None:
        return [Check("all", "drift", "warn", "no boot whose gates passed is in the journal: nothing to diff "
                      "against (a passing `up` records one)")]
    out: list[Check] = []
    when = f"the last boot whose gates passed ({ref['time'][:19]}, deployment {ref['fingerprint'][:12]})"
    for n in cfg.nodes:
        then, f = ref["hosts"].get(n.name), hosts.get(n.name)
        if f is None:
            continue
        if then is None:
            out.append(Check(n.name, "drift", "warn", f"{n.name} was not part of {when}"))
            continue
        now = f.fingerprint()
        changed = [f"{k}: {_said(then.get(k))} -> {_said(now.get(k))}" for k in sorted(set(then) | set(now))
                   if then.get(k) != now.get(k)]
        out.append(Check(n.name, "drift", "fail", f"changed since {when}: " + "; ".join(changed)) if changed
                   else Check(n.name, "drift", "ok", f"{n.name}: no drift since {when}"))
    return out


def _said(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()) or "none"
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    return "none" if v in (None, "") else str(v)


def _target_parity(cfg: Config, targets: Mapping[str, TargetManifest]) -> list[Check]:
    """Every node's copy of the target against the head's (the reference, as for the drafter): a copy with
    shards missing, of another size, or with other safetensors headers fails."""
    out: list[Check] = []
    ref_name = next((n.name for n in cfg.nodes if n.name in targets), None)
    if ref_name is None:
        return out
    ref = targets[ref_name]
    for n in cfg.nodes:
        m = targets.get(n.name)
        if m is None:
            continue
        why = m.problems() or (None if n.name == ref_name else m.differs_from(ref))
        where = f"{n.name}'s copy of model.target {cfg.model.target}"
        if why:
            against = "" if m.problems() or n.name == ref_name else f" (against {ref_name}'s copy)"
            out.append(Check(n.name, "target manifest", "fail", f"{where}: {why}{against} — copy the target again "
                             f"(rsync -a --checksum from {ref_name})"))
        else:
            out.append(Check(n.name, "target manifest", "ok", f"{len(m.shards)} shard(s), index and safetensors "
                             "headers" + ("" if n.name == ref_name else f" as on {ref_name}")))
    return out


def _cut_off(node: str, e: SparkserveError) -> Check:
    """The one check of a node that could not be checked: the step that failed (``ssh``) and why."""
    return Check(node, getattr(e, "step", None) or "ssh", "fail", e.what)


REACH_CHECKS = ("ssh", "docker")  # a failure of these means the node could not be asked at all


def unreachable_checks(checks: list[Check]) -> list[Check]:
    """The failed checks that mean a node could not be reached (its ssh, or its docker daemon)."""
    return [c for c in checks if c.status == "fail" and c.name in REACH_CHECKS]


def check_ports(cfg: Config, node: Node) -> list[Check]:
    """Only the head's ports (after `up` stopped a previous stack that held them): one round trip."""
    facts = probe_node(node, ports=head_ports(cfg))
    return [Check(cfg.head.name, f"port {hp}", "ok" if free else "fail",
                  "free" if free else f"port {hp} is already in use on {cfg.head.name}")
            for hp, free in facts.ports.items()]


def as_json(checks: list[Check]) -> dict[str, object]:
    return {"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}
