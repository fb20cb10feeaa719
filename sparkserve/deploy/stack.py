"""The running stack: what runs where (`status`), its logs (`logs`), and taking it all down (`down`).

Every function takes the open nodes (the caller opens them with :func:`sparkserve.nodes.open_nodes`) and
finds the stack by its ``io.sparkserve.*`` labels, never by name or by asking the API.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkserve.config import Config
from sparkserve.deploy import lock
from sparkserve.deploy.teardown import Reporter, quiet, teardown
from sparkserve.deploy.wait import served_models
from sparkserve.errors import BadInput
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import Engine, ManagedContainer
from sparkserve.nodes.parallel import on_all
from sparkserve.plan.build import build_plan


def managed_on_all(nodes: dict[str, Node]) -> dict[str, list[ManagedContainer]]:
    """Every node's sparkserve containers (running or not), asked in parallel."""
    return on_all(list(nodes.values()), lambda n: Engine(n).list_managed(), name=lambda n: n.name)


# -- down -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DownResult:
    """What `down` removed (node → container names) and where it saved their logs."""

    removed: dict[str, list[str]] = field(default_factory=dict)
    logs: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {"removed": self.removed, "logs": str(self.logs) if self.logs else None}


def down(cfg: Config, nodes: dict[str, Node], *, break_lock: bool = False, say: Reporter = quiet) -> DownResult:
    """Stop (gracefully) and remove every sparkserve container on every node, logs saved first."""
    with lock.held(nodes[cfg.head.name], what="down", break_lock=break_lock):
        existing = managed_on_all(nodes)
        ids = {k: [c.id for c in v] for k, v in existing.items() if v}
        if not ids:
            say("nothing to stop: no sparkserve container on any node")
            return DownResult()
        saved = teardown(cfg, nodes, ids, tag="down", say=say)
        removed = {k: [c.name for c in v] for k, v in existing.items() if v}
        for k, v in removed.items():
            say(f"{k}: removed {', '.join(v)}")
        return DownResult(removed, saved)


# -- status -----------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class StackStatus:
    """What runs where; ``ok`` only when every node runs a container, of one deployment, and the API serves."""

    nodes: dict[str, list[ContainerStatus]]
    api: ApiStatus
    ok: bool
    deployments: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"nodes": {k: [asdict(c) for c in v] for k, v in self.nodes.items()}, "api": asdict(self.api),
                "ok": self.ok, "deployments": self.deployments}


def status(cfg: Config, nodes: dict[str, Node]) -> StackStatus:
    """What runs where. Liveness is read per node, never inferred from /health."""
    existing = managed_on_all(nodes)
    per_node = {n.name: [ContainerStatus.of(c) for c in existing.get(n.name, [])] for n in cfg.nodes}
    every_node_runs = all(any(c.running for c in existing.get(n.name, [])) for n in cfg.nodes)
    plan = build_plan(cfg)
    models = served_models(plan.api_url)
    api = ApiStatus(plan.api_url, models is not None and plan.served_name in models, models)
    fps = {c.fingerprint for cs in existing.values() for c in cs}
    ok = every_node_runs and api.serving and len(fps) <= 1
    return StackStatus(per_node, api, ok, sorted(f[:12] for f in fps))


# -- logs -------------------------------------------------------------------------------------------------


def stream_logs(cfg: Config, nodes: dict[str, Node], *, node: str | None = None, follow: bool = False,
                since: str | None = None, out: Callable[[str], None] = print) -> None:
    """Every node's sparkserve container logs (or one node's), each line prefixed with its node;
    ``follow`` streams every node at once until interrupted."""
    names = [n.name for n in cfg.nodes if node is None or n.name == node]
    if node is not None and not names:
        raise BadInput("--node", f"no node named {node!r} (nodes: {', '.join(n.name for n in cfg.nodes)})")
    since_v = parse_since(since) if since else None
    width = max(len(n) for n in names)
    lock_out = threading.Lock()

    def stream(name: str) -> None:
        eng = Engine(nodes[name])
        for c in eng.list_managed():
            for line in eng.logs(c.id, follow=follow, since=since_v):
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


def parse_since(since: str) -> float:
    """``10m`` / ``2h`` / ``30s`` ago, or a unix timestamp → unix seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if since[-1] in units:
            return time.time() - float(since[:-1]) * units[since[-1]]
        return float(since)
    except (ValueError, IndexError):
        raise BadInput("--since", f"{since!r} is not a duration like 10m or a unix time") from None
