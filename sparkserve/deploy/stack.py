"""The running stack: what runs where (`status`), its logs (`logs`), and taking it all down (`down`).

Every function takes the open nodes (the caller opens them with :func:`sparkserve.nodes.open_nodes`) and
finds the stack by its ``io.sparkserve.*`` labels, never by name or by asking the API. `down` and
`status` take the nodes that could be reached (:func:`sparkserve.nodes.factory.open_reachable`) and the
errors of those that could not: they act on every node they can reach (a follower that is down must not
keep the head serving) and name the others; :func:`unreachable_error` is the exit-3 error that follows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy import lock
from sparkserve.deploy.teardown import Reporter, quiet, teardown
from sparkserve.deploy.wait import served_models
from sparkserve.errors import BadInput, RemoteFailure, SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ManagedContainer
from sparkserve.nodes.factory import as_failure
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.runtime import engine_for
from sparkserve.plan.build import Plan, build_plan


def managed_on_all(nodes: dict[str, Node], how: Config | Plan | None = None) -> dict[str, list[ManagedContainer]]:
    """Every node's sparkserve containers (running or not), asked in parallel. ``how``: the config (or plan)
    whose runtime to ask — its processes for ``runtime: process``; None: docker."""
    return on_all(list(nodes.values()), lambda n: engine_for(n, how).list_managed(), name=lambda n: n.name)


def managed_where_reachable(
        nodes: dict[str, Node],
        how: Config | Plan | None = None) -> tuple[dict[str, list[ManagedContainer]], dict[str, SparkserveError]]:
    """Every node's sparkserve containers, asked in parallel, and the error of each node that did not
    answer (its docker daemon is down, its SSH link dropped): one silent node never hides the others."""
    def ask(node: Node) -> list[ManagedContainer] | SparkserveError:
        try:
            return engine_for(node, how).list_managed()
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - any way a node fails to answer is reported, not raised
            return as_failure(node.name, e)

    answers = on_all(list(nodes.values()), ask, name=lambda n: n.name)
    found = {k: v for k, v in answers.items() if not isinstance(v, SparkserveError)}
    return found, {k: v for k, v in answers.items() if isinstance(v, SparkserveError)}


def _reason(e: SparkserveError) -> str:
    """An unreachable node's error without its node name: ``ssh: cannot connect to …``."""
    step = getattr(e, "step", None)
    return f"{step}: {e.what}" if step else e.what


def _silent_nodes(cfg: Config, unreachable: Mapping[str, SparkserveError] | None,
                  silent: Mapping[str, SparkserveError]) -> dict[str, SparkserveError]:
    """Nodes that did not connect or whose docker did not answer, in config order."""
    both = {**silent, **(unreachable or {})}
    return {n.name: both[n.name] for n in cfg.nodes if n.name in both}


def unreachable_error(unreachable: Mapping[str, SparkserveError], consequence: str) -> RemoteFailure:
    """Exit 3 after a command did what it could: the first unreachable node's own error (which names the
    node and the step), what that means for it, and every other unreachable node."""
    (first, e), *others = unreachable.items()
    step = getattr(e, "step", None) or "ssh"
    return RemoteFailure(e.where, e.what, node=first, step=step,
                         details=[f"{first}: {consequence}", *(f"also unreachable: {k}: {_reason(o)}"
                                                               for k, o in others)])


# -- down -------------------------------------------------------------------------------------------------


DOWN_LEFT = "its sparkserve containers (if any) were not stopped; run `sparkserve down` again once it answers"


@dataclass(frozen=True)
class DownResult:
    """What `down` removed (node → container names), where it saved their logs, and the nodes it could
    not reach (node → why), whose containers it could not stop."""

    removed: dict[str, list[str]] = field(default_factory=dict)
    logs: Path | None = None
    unreachable: dict[str, SparkserveError] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"removed": self.removed, "logs": str(self.logs) if self.logs else None,
                "unreachable": {k: _reason(e) for k, e in self.unreachable.items()}}


def down(cfg: Config, nodes: dict[str, Node], *, unreachable: Mapping[str, SparkserveError] | None = None,
         break_lock: bool = False, say: Reporter = quiet) -> DownResult:
    """Stop (gracefully) and remove every sparkserve container on every node it can reach, logs saved first.

    ``nodes`` are the nodes that connected, ``unreachable`` the errors of those that did not. With the head
    unreachable there is no lock to take (it lives there), and no `up` can be running without the head."""
    head = nodes.get(cfg.head.name)
    held = (lock.held(head, what="down", break_lock=break_lock) if head is not None
            else contextlib.nullcontext())
    with held:
        existing, silent = managed_where_reachable(nodes, cfg)
        missing = _silent_nodes(cfg, unreachable, silent)
        for k in missing:
            say(f"{k}: unreachable — {DOWN_LEFT}")
        ids = {k: [c.id for c in v] for k, v in existing.items() if v}
        if not ids:
            say("nothing to stop: no sparkserve container on any node" + (" it could reach" if missing else ""))
            return DownResult(unreachable=missing)
        saved = teardown(cfg, {k: nodes[k] for k in ids}, ids, tag="down", say=say)
        removed = {k: [c.name for c in v] for k, v in existing.items() if v}
        for k, v in removed.items():
            say(f"{k}: removed {', '.join(v)}")
        _record_down(cfg, existing)
        return DownResult(removed, saved, missing)


def _record_down(cfg: Config, existing: Mapping[str, list[ManagedContainer]]) -> None:
    """`down` in the journal: one row per deployment it took down (`history` shows it as kind "down")."""
    from sparkserve.journal import record
    from sparkserve.journal.history import DOWN_OUTCOME

    by_fp: dict[str, dict[str, str]] = {}
    for node, cs in existing.items():
        for c in cs:
            by_fp.setdefault(c.fingerprint, {})[node] = c.image_id
    for fp, images in by_fp.items():
        record("deployment", fingerprint=fp, config=cfg.normalized(), image_ids=images,
               drafter_manifest_sha256=None, outcome=DOWN_OUTCOME)


def last_saved_logs() -> Path | None:
    """The newest folder of saved logs (`down`, a failed `up`, …), or None."""
    from sparkserve.deploy.teardown import logs_dir

    try:
        folders = [d for d in logs_dir().iterdir() if d.is_dir() and any(d.glob("*.log"))]
    except OSError:
        return None
    return max(folders, key=lambda d: d.name) if folders else None


# -- status -----------------------------------------------------------------------------------------------


def boot_id(nodes: dict[str, Node], containers: dict[str, str], how: Config | Plan | None = None) -> str:
    """Which boot of a stack this is: sha256 over every rank's container (or process: ``how``'s runtime) id
    and start time, so it changes whenever a rank is replaced or restarts (a gate verdict holds for one boot
    only)."""
    started = on_all(sorted(containers),
                     lambda name: engine_for(nodes[name], how).state(containers[name]).started_at)
    blob = json.dumps(sorted((name, containers[name], started[name]) for name in containers))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class ContainerStatus:
    """One managed container as `status` shows it (ids shortened for people)."""

    name: str
    id: str
    rank: int | None
    role: str
    status: str
    deployment: str
    image_id: str

    @classmethod
    def of(cls, c: ManagedContainer) -> ContainerStatus:
        return cls(c.name, c.id[:12], c.rank, c.role, c.status, c.fingerprint[:12], c.image_id[:19])


@dataclass(frozen=True)
class ApiStatus:
    """The head's API: whether ``/v1/models`` lists the served model (None: it did not answer)."""

    url: str
    serving: bool
    models: list[str] | None


STATUS_LEFT = "its containers are unknown: the stack is not known to be up"


@dataclass(frozen=True)
class StackStatus:
    """What runs where; ``ok`` only when every node answers and runs a container, of one deployment, and
    the API serves. ``unreachable``: the nodes that did not answer (node → why), absent from ``nodes``."""

    nodes: dict[str, list[ContainerStatus]]
    api: ApiStatus
    ok: bool
    deployments: list[str]
    unreachable: dict[str, SparkserveError] = field(default_factory=dict)
    gates: bool | None = None  # this boot's gate verdict from the journal (None: not judged, or no one stack)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": {k: [asdict(c) for c in v] for k, v in self.nodes.items()}, "api": asdict(self.api),
                "ok": self.ok, "deployments": self.deployments, "gates_this_boot": _verdict(self.gates),
                "unreachable": {k: _reason(e) for k, e in self.unreachable.items()}}


def _verdict(v: bool | None) -> str:
    return {True: "passed", False: "failed", None: "not judged"}[v]


def boot_verdict(cfg: Config, nodes: dict[str, Node],
                 existing: Mapping[str, list[ManagedContainer]]) -> bool | None:
    """The journal's gate verdict for the boot that runs now (one running rank per node, of one deployment):
    True passed, False failed, None never judged (or no such stack)."""
    running = {k: [c for c in v if c.running] for k, v in existing.items()}
    if not running or any(len(v) != 1 for v in running.values()):
        return None
    fps = {v[0].fingerprint for v in running.values()}
    if len(fps) != 1:
        return None
    try:
        boot = boot_id({k: nodes[k] for k in running}, {k: v[0].id for k, v in running.items()}, cfg)
    except SparkserveError:
        return None
    from sparkserve.journal import lookup

    return lookup(lambda j: j.gate_verdict(fps.pop(), boot), None)


def status(cfg: Config, nodes: dict[str, Node], *,
           unreachable: Mapping[str, SparkserveError] | None = None) -> StackStatus:
    """What runs where, on every node that answers. Liveness is read per node, never inferred from /health."""
    existing, silent = managed_where_reachable(nodes, cfg)
    missing = _silent_nodes(cfg, unreachable, silent)
    per_node = {n.name: [ContainerStatus.of(c) for c in existing.get(n.name, [])]
                for n in cfg.nodes if n.name not in missing}
    every_node_runs = not missing and all(any(c.running for c in existing.get(n.name, [])) for n in cfg.nodes)
    plan = build_plan(cfg)
    models = served_models(plan.api_url, api_key=resolve_api_key(cfg))
    api = ApiStatus(plan.api_url, models is not None and plan.served_name in models, models)
    fps = {c.fingerprint for cs in existing.values() for c in cs}
    ok = every_node_runs and api.serving and len(fps) <= 1
    verdict = boot_verdict(cfg, nodes, existing) if every_node_runs else None
    return StackStatus(per_node, api, ok, sorted(f[:12] for f in fps), missing, verdict)


# -- logs -------------------------------------------------------------------------------------------------


def stream_logs(cfg: Config, nodes: dict[str, Node], *, node: str | None = None, follow: bool = False,
                since: str | None = None, out: Callable[[str], None] = print, tail: int | None = None) -> int:
    """Every node's sparkserve container logs (or one node's), each line prefixed with its node;
    ``follow`` streams every node at once until interrupted; ``tail``: only each container's last N lines.
    Returns how many containers (or processes) it found."""
    names = [n.name for n in cfg.nodes if node is None or n.name == node]
    if node is not None and not names:
        raise BadInput("--node", f"no node named {node!r} (nodes: {', '.join(n.name for n in cfg.nodes)})")
    since_v = parse_since(since) if since else None
    width = max(len(n) for n in names)
    lock_out = threading.Lock()

    found = [0]

    def stream(name: str) -> None:
        eng = engine_for(nodes[name], cfg)
        for c in eng.list_managed():
            found[0] += 1
            for line in eng.logs(c.id, follow=follow, since=since_v, tail=tail):
                with lock_out:
                    out(f"{name:<{width}} | {line}")

    if follow:
        threads = [threading.Thread(target=stream, args=(n,), daemon=True) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # short joins: Ctrl-C reaches the main thread
                t.join(0.5)
    else:
        for n in names:
            stream(n)
    return found[0]


def parse_since(since: str) -> float:
    """``10m`` / ``2h`` / ``30s`` ago, or a unix timestamp → unix seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if since[-1] in units:
            return time.time() - float(since[:-1]) * units[since[-1]]
        return float(since)
    except (ValueError, IndexError):
        raise BadInput("--since", f"{since!r} is not a duration like 10m or a unix time") from None



def ranks_alive(cfg: Config, nodes: Mapping[str, Node], unreachable: Mapping[str, SparkserveError],
                say: Reporter = quiet) -> None:
    """Before a bench: every configured node runs a rank of one deployment (the head's). RemoteFailure (exit 3)
    naming the first node whose rank is not running — at once, not after every request of the cell failed
    against a stack with a dead follower (fault case A34). A node that cannot be asked (no SSH from this machine:
    the API may still answer) is said and skipped."""
    found, errors = managed_where_reachable(dict(nodes), cfg)
    for name, e in {**unreachable, **errors}.items():
        say(f"warning: {name}: its rank's liveness not checked ({e.what})")
    head = [c for c in found.get(cfg.head.name, []) if c.running]
    if cfg.head.name in found and not head:
        raise RemoteFailure(f"{cfg.head.name}: bench", f"no rank runs on the head {cfg.head.name}: nothing serves "
                            "(`sparkserve up`)", node=cfg.head.name, step="liveness")
    fp = head[0].fingerprint if head else None
    for n in cfg.followers:
        if n.name not in found:
            continue
        mine = [c for c in found[n.name] if fp is None or c.fingerprint == fp]
        if not any(c.running for c in mine):
            what = (f"rank {mine[0].rank} ({mine[0].name}) is {mine[0].status}" if mine
                    else f"no rank of deployment {(fp or '?')[:12]} is there")
            raise RemoteFailure(f"{n.name}: bench", f"{what} on {n.name}: the stack cannot serve a request — "
                                "`sparkserve logs` says why, `sparkserve up` starts it again", node=n.name,
                                step="liveness")
