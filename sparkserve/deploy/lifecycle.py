"""`up` / `down` / `status` / `logs`: from a config to a running stack on every node, and back to nothing.

    with open_nodes(cfg) as nodes:
        result = up(cfg, nodes)          # preflight → identity → drafter sync → start → wait → parity → gates

On any failure or Ctrl-C during `up`, every container it started is stopped (gracefully) and removed on
every node, each node's log is saved first, and the error names the node, the step and the lines that
explain it. Only containers labelled ``io.sparkserve.managed=1`` are ever stopped or removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platformdirs import user_state_dir

from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy import lock
from sparkserve.deploy.doctor import check_all, check_ports
from sparkserve.deploy.sync import remote_manifest, sync_all
from sparkserve.deploy.wait import BootFailure, NodeView, explain, served_models, wait_ready
from sparkserve.deploy.watchdog import Floors
from sparkserve.errors import BadInput, GateFailed, RemoteFailure, SparkserveError
from sparkserve.models.manifest import Manifest, manifest
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import Engine, ManagedContainer, ensure_same_image
from sparkserve.nodes.parallel import on_all
from sparkserve.plan.build import Plan, build_plan
from sparkserve.plan.fabric import FabricFacts, fabric_envs

Reporter = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


@dataclass
class UpResult:
    status: str  # "started" | "unchanged" | "replaced"
    api_url: str
    served_name: str
    fingerprint: str
    image_id: str
    drafter_digest: str
    seconds: float
    boot_seconds: float | None = None
    containers: dict[str, str] = field(default_factory=dict)
    sync: dict[str, str] = field(default_factory=dict)
    gates: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def logs_dir() -> Path:
    d = Path(user_state_dir("sparkserve")) / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def deploy_fingerprint(cfg: Config, image_id: str, drafter_digest: str) -> str:
    """sha256 of the normalized config + image ID + drafter manifest: what booted, exactly."""
    blob = json.dumps({"config": cfg.normalized(), "image_id": image_id, "drafter": drafter_digest},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# -- drafter ----------------------------------------------------------------------------------------------


def local_drafter(cfg: Config) -> Path | None:
    """The controller's copy of the drafter (the sync source), if there is one."""
    if cfg.drafter.source is not None:
        src = cfg.drafter.source.expanduser()
        if not src.is_dir():
            raise BadInput("drafter.source", f"{src} is not a directory")
        return src
    p = Path(cfg.drafter.path)
    return p if p.is_dir() else None


def fetch_target_config(node: Node, target: str, into: Path) -> Path:
    """Copy the target's small metadata files from a node (the weights stay there)."""
    into.mkdir(parents=True, exist_ok=True)
    try:
        node.get(f"{target.rstrip('/')}/config.json", into / "config.json")
    except SparkserveError as e:
        raise BadInput("model.target", f"{target}/config.json is not readable on {node.name}: {e.what}") from None
    return into


def sync_drafter(cfg: Config, nodes: dict[str, Node], say: Reporter) -> tuple[str, dict[str, str]]:
    """Make the drafter identical on every node; return its manifest digest and per-node summaries.

    With a local source, only differing files are copied and then verified. Without one, the head's
    copy is the reference and any node that differs is an error (nothing to copy from)."""
    ordered = [nodes[n.name] for n in cfg.nodes]
    src = local_drafter(cfg)
    path = str(cfg.drafter.path)
    if src is not None:
        local: Manifest = manifest(src)
        reports = sync_all(ordered, src, path, local_manifest=local)
        for r in reports.values():
            say(f"drafter: {r.summary()}")
        return local.digest, {k: r.summary() for k, r in reports.items()}
    states = on_all(ordered, lambda n: remote_manifest(n, path), name=lambda n: n.name)
    digests = {k: s.manifest.digest for k, s in states.items()}
    ref = digests[cfg.head.name]
    for name, d in digests.items():
        if d != ref:
            raise RemoteFailure(
                f"{name}: drafter", f"drafter bytes at {path} differ from {cfg.head.name}'s "
                f"({d[:12]} vs {ref[:12]}); set drafter.source to a local copy to sync it", node=name,
                step="drafter")
    say(f"drafter: identical on every node ({ref[:12]})")
    return ref, {k: f"{k}: identical ({d[:12]})" for k, d in digests.items()}


def validate_inputs(cfg: Config, nodes: dict[str, Node]) -> None:
    """The pure pre-flight rules, on the drafter and target wherever they are (metadata only)."""
    from sparkserve.deploy.remotemeta import fetch_meta
    from sparkserve.plan.validate import validate

    head = nodes[cfg.head.name]
    with tmpdir() as tmp, ThreadPoolExecutor(max_workers=2) as pool:  # both fetches at once
        drafter_dir: Path | None = local_drafter(cfg)
        f_drafter = None
        if drafter_dir is None:
            f_drafter = pool.submit(fetch_meta, head, str(cfg.drafter.path), Path(tmp) / "drafter",
                                    field="drafter.path")
        target_dir = Path(cfg.model.target)
        f_target = None
        if not (target_dir / "config.json").is_file():
            f_target = pool.submit(fetch_meta, head, str(cfg.model.target), Path(tmp) / "target",
                                   field="model.target")
        if f_drafter is not None:  # the drafter's problem first, as before
            drafter_dir = f_drafter.result()
        if f_target is not None:
            target_dir = f_target.result()
        report = validate(cfg, drafter_dir=drafter_dir, target_dir=target_dir, parser="list")
        for w in report.warnings:
            print(f"warning: {w.where}: {w.what}", file=sys.stderr)
        report.raise_first()


# -- the running stack ------------------------------------------------------------------------------------


def managed_on_all(nodes: dict[str, Node]) -> dict[str, list[ManagedContainer]]:
    return on_all(list(nodes.values()), lambda n: Engine(n).list_managed(), name=lambda n: n.name)


def save_logs(nodes: dict[str, Node], containers: dict[str, list[str]], tag: str) -> Path | None:
    """Save every listed container's full log under the state dir; never raises."""
    if not any(containers.values()):
        return None
    d = logs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-{tag}"
    d.mkdir(parents=True, exist_ok=True)
    for name, ids in containers.items():
        for cid in ids:
            with contextlib.suppress(Exception):
                text = "\n".join(Engine(nodes[name]).logs(cid)) + "\n"
                (d / f"{name}-{cid[:12]}.log").write_text(text)
    return d


def teardown(cfg: Config, nodes: dict[str, Node], containers: dict[str, list[str]], *, tag: str,
             say: Reporter) -> Path | None:
    """Save logs, then stop (gracefully) and remove the given managed containers: head first."""
    saved = save_logs(nodes, containers, tag)
    order = [n.name for n in cfg.nodes if n.name in containers and containers[n.name]]

    def stop(name: str) -> None:
        eng = Engine(nodes[name])
        for cid in containers[name]:
            eng.stop_and_remove(cid, timeout=cfg.container.stop_timeout_s)

    if order:
        with contextlib.suppress(SparkserveError):
            stop(order[0])
        rest = [n for n in order[1:]]
        with contextlib.suppress(SparkserveError):
            on_all(rest, stop)
    if saved:
        say(f"logs saved to {saved}")
    return saved


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Cleanup must finish: a second Ctrl-C while tearing down is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


# Set when Ctrl-C arrived during `up`: a KeyboardInterrupt can surface wrapped in another exception (a
# library that calls back into Python, e.g. pydantic's serializer, reports it as its own error).
_ctrl_c = threading.Event()


@contextlib.contextmanager
def _watch_ctrl_c() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as usual, and is remembered (see _interrupted)."""
    _ctrl_c.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        _ctrl_c.set()
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _interrupted(e: BaseException) -> bool:
    """Ctrl-C, however it surfaced: whatever failed after it was pressed failed because of it."""
    return isinstance(e, KeyboardInterrupt) or _ctrl_c.is_set()


def check_parity(cfg: Config, nodes: dict[str, Node], containers: dict[str, str]) -> None:
    """Every rank's container must match the head's: image ID, argv minus rank flags, env minus
    per-node fabric values, mounts. A drifted worker is the classic two-node bug."""
    facts = on_all([n.name for n in cfg.nodes], lambda name: Engine(nodes[name]).parity_facts(containers[name]))
    head = cfg.head.name
    ref = facts[head]
    for name, f in facts.items():
        if name == head:
            continue
        for key in ("image_id", "argv", "env", "mounts"):
            if key == "argv" and cfg.serve.executor == "ray":
                continue  # ray workers run `ray start`; the serve argv runs on the head only
            if f.get(key) != ref.get(key):
                what = f"{key} differs from {head}: {_diff(ref.get(key), f.get(key))}"
                raise RemoteFailure(f"{name}: rank parity", what, node=name, step="rank parity")


def _diff(a: Any, b: Any) -> str:
    if isinstance(a, list) and isinstance(b, list):
        if len(a) == len(b) and all(isinstance(x, str) for x in a + b):  # argv: name the flag that changed
            at = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
            return "; ".join(f"head has {_flag_and_value(a, i)!r}, this rank has {_flag_and_value(b, i)!r}"
                             for i in at[:3])
        only_a = [x for x in a if x not in b]
        only_b = [x for x in b if x not in a]
        return f"head has {only_a or '[]'}, this rank has {only_b or '[]'}"
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys[:5])
    return f"{str(a)[:60]} vs {str(b)[:60]}"


def _flag_and_value(argv: list[str], i: int) -> str:
    """``--flag value`` around position ``i`` of an argv (just the item when it is not a flag's value)."""
    if i > 0 and argv[i - 1].startswith("-") and not argv[i].startswith("-"):
        return f"{argv[i - 1]} {argv[i]}"
    return argv[i]


def _healthy_existing(cfg: Config, plan: Plan, nodes: dict[str, Node],
                      existing: dict[str, list[ManagedContainer]]) -> dict[str, str] | None:
    """The running containers when the stack already runs this exact deployment, else None."""
    found: dict[str, str] = {}
    for n in cfg.nodes:
        mine = [c for c in existing.get(n.name, []) if c.fingerprint == plan.fingerprint and c.running]
        if len(mine) != 1 or len(existing.get(n.name, [])) != 1:
            return None
        found[n.name] = mine[0].id
    models = served_models(plan.api_url)
    if not models or plan.served_name not in models:
        return None
    return found


# -- up ---------------------------------------------------------------------------------------------------


def up(
    cfg: Config,
    nodes: dict[str, Node],
    *,
    run_gates: bool = True,
    break_lock: bool = False,
    say: Reporter = _quiet,
    on_update: Callable[[list[NodeView], float], None] | None = None,
    gate_runner: Callable[..., dict[str, Any]] | None = None,
    validate: bool = False,
) -> UpResult:
    """Bring the configured stack up on every node (see module docstring).

    ``validate``: run :func:`validate_inputs` (drafter and target metadata, vLLM's parser) alongside the
    read-only preflight questions; a BadInput from it is reported first, before anything starts.
    Otherwise the caller validated already."""
    with _watch_ctrl_c():
        try:
            return _up(cfg, nodes, run_gates=run_gates, break_lock=break_lock, say=say, on_update=on_update,
                       gate_runner=gate_runner, validate=validate)
        except BaseException as e:  # before any container started (after, _up cleans up and says so itself)
            if isinstance(e, RemoteFailure) and e.step == "interrupted":
                raise
            if _interrupted(e):
                raise RemoteFailure("up", "interrupted before any container was started; nothing to clean up",
                                    step="interrupted") from None
            raise


def _up(cfg: Config, nodes: dict[str, Node], *, run_gates: bool, break_lock: bool, say: Reporter,
        on_update: Callable[[list[NodeView], float], None] | None,
        gate_runner: Callable[..., dict[str, Any]] | None, validate: bool) -> UpResult:
    t0 = time.monotonic()
    head = nodes[cfg.head.name]
    src = local_drafter(cfg)
    with lock.held(head, what="up", break_lock=break_lock):
        say("preflight: checking every node")
        # Every question at once, each node in parallel: node checks (one round trip: paths, disk, ports,
        # memory, fabric facts, and the containers' writable mount dirs made), image identity, the running
        # containers, the drafter's digest (when there is nothing to copy). Failures are then reported in
        # that order.
        facts: dict[str, FabricFacts] = {}
        drafter_msgs: list[str] = []
        rw = {s.node: [m.source for m in s.mounts if not m.read_only] for s in build_plan(cfg).specs}
        with ThreadPoolExecutor(max_workers=5) as pool:
            f_valid = pool.submit(validate_inputs, cfg, nodes) if validate else None
            f_checks = pool.submit(check_all, cfg, nodes, None, check_ports=True, mkdirs=rw, fabric_out=facts)
            f_image = pool.submit(ensure_same_image, [nodes[n.name] for n in cfg.nodes], cfg.image.ref)
            f_existing = pool.submit(managed_on_all, nodes)
            f_drafter = pool.submit(sync_drafter, cfg, nodes, drafter_msgs.append) if src is None else None
            if f_valid is not None:
                f_valid.result()  # BadInput (exit 2): nothing was started
            checks = f_checks.result()
            bad = [c for c in checks if c.status == "fail" and not c.name.startswith("port ")]
            if bad:
                c = bad[0]
                raise RemoteFailure(f"{c.node}: preflight {c.name}", c.detail, node=c.node,
                                    step=f"preflight {c.name}",
                                    details=[f"{x.node}: {x.name}: {x.detail}" for x in bad[1:]])
            image_id = f_image.result()
            say(f"image: {cfg.image.ref} is {image_id[:19]} on every node")
            existing = f_existing.result()
            if f_drafter is not None:
                digest, sync_summary = f_drafter.result()
                for m in drafter_msgs:
                    say(m)
        if f_drafter is None:
            digest, sync_summary = sync_drafter(cfg, nodes, say)
        fp = deploy_fingerprint(cfg, image_id, digest)
        plan = build_plan(cfg, fabric_env=fabric_envs(facts), fingerprint=fp, api_key=resolve_api_key(cfg))
        running = _healthy_existing(cfg, plan, nodes, existing)
        if running is not None:
            try:
                check_parity(cfg, nodes, running)
            except RemoteFailure as e:  # a drifted rank serves wrong results: the stack must not stay up
                with _sigint_deferred():
                    say("rank parity failed on the running stack: stopping and removing it")
                    saved = teardown(cfg, nodes, {k: [running[k]] for k in running}, tag="parity", say=say)
                raise _explain(e, saved) from None
            say(f"already up: {plan.api_url} serves {plan.served_name} (deployment {fp[:12]}); nothing to do")
            return UpResult("unchanged", plan.api_url, plan.served_name, fp, image_id, digest,
                            time.monotonic() - t0, containers=running, sync=sync_summary)
        status = "started"
        busy = [c for c in checks if c.name.startswith("port ") and c.status == "fail"]
        old = {k: [c.id for c in v] for k, v in existing.items() if v}
        if old:
            status = "replaced"
            say("replacing the running stack (its config, image or drafter changed, or it was unhealthy)")
            with _sigint_deferred():
                teardown(cfg, nodes, old, tag="replaced", say=say)
            if busy:  # the old stack may have held them: ask again
                busy = [c for c in check_ports(cfg, head) if c.status == "fail"]
        if busy:
            c = busy[0]
            raise RemoteFailure(f"{c.node}: preflight ports", c.detail, node=c.node, step="preflight ports")
        started: dict[str, list[str]] = {}
        try:
            containers = _start(cfg, plan, nodes, started, say)
            floors = Floors(cfg.watchdog.memory_floor_bytes) if cfg.watchdog.enabled else None
            say("waiting for the head to serve")
            boot_s = wait_ready(plan, nodes, containers, timeout_s=cfg.serve.ready_timeout_s, floors=floors,
                                on_update=on_update)
            check_parity(cfg, nodes, containers)
            say(f"serving {plan.served_name} at {plan.api_url} after {boot_s:.1f}s")
            result = UpResult(status, plan.api_url, plan.served_name, fp, image_id, digest,
                              time.monotonic() - t0, boot_s, containers, sync_summary)
            if run_gates and gate_runner is not None:
                result.gates = gate_runner(cfg, nodes, plan, containers)
                if not result.gates.get("ok"):
                    failed = [_gate_where(g) for g in result.gates.get("gates", []) if not g.get("ok")]
                    raise GateFailed("gates", f"{', '.join(failed)} failed after boot; the stack was stopped",
                                     details=_gate_lines(result.gates))
            _journal(cfg, fp, image_id, digest, "up" if result.gates is None else "up+gates")
            return result
        except BaseException as e:
            _journal(cfg, fp, image_id, digest, f"failed: {type(e).__name__}")
            with _sigint_deferred():
                say("failure: stopping and removing every container this run started")
                saved = teardown(cfg, nodes, started, tag="failed-up", say=say)
            raise _explain(e, saved) from None


def _journal(cfg: Config, fp: str, image_id: str, digest: str, outcome: str) -> None:
    """What ran, with sha256 pins; a journal problem never breaks a deploy."""
    from sparkserve.journal import Journal

    with contextlib.suppress(Exception), Journal.open() as j:
        j.record_deployment(fp, cfg.normalized(), {n.name: image_id for n in cfg.nodes}, digest, outcome)


def _gate_where(g: dict[str, Any]) -> str:
    """``faults (node-b)``: a failed gate and the nodes its evidence points at."""
    where = list(dict.fromkeys(str(ev.get("node")) for ev in g.get("evidence") or [] if ev.get("node")))
    return f"{g['name']} ({', '.join(where)})" if where else str(g["name"])


def _gate_lines(gates: dict[str, Any]) -> list[str]:
    out = []
    for g in gates.get("gates", []):
        if g.get("ok"):
            continue
        out.append(f"{g['name']}: {g.get('reason', '')}")
        for ev in (g.get("evidence") or [])[:3]:
            out.append(f"  {ev.get('node')}:{ev.get('line')}: {str(ev.get('text', ''))[:160]}")
    return out


def _explain(e: BaseException, saved: Path | None) -> SparkserveError:
    tail = [f"full logs: {saved}"] if saved else []
    if _interrupted(e):
        return RemoteFailure("up", "interrupted; every container this run started was stopped and removed",
                             step="interrupted", details=tail)
    if isinstance(e, SparkserveError):
        e.details = list(e.details) + tail
        return e
    return RemoteFailure("up", f"{type(e).__name__}: {e}", details=tail)


def _start(cfg: Config, plan: Plan, nodes: dict[str, Node], started: dict[str, list[str]],
           say: Reporter) -> dict[str, str]:
    """Followers first (confirmed running), then the head; for ray, then `vllm serve` on the head."""
    containers: dict[str, str] = {}

    def run(spec_node: str) -> str:
        spec = plan.spec_for(spec_node)
        cid = Engine(nodes[spec_node]).run(spec, create_rw_mount_dirs=False)  # the preflight probe made them
        started.setdefault(spec_node, []).append(cid)
        containers[spec_node] = cid
        return cid

    if plan.executor == "ray":
        run(plan.head.node)
        _confirm_running(cfg, nodes, {plan.head.node: containers[plan.head.node]}, marker=None)
        on_all([s.node for s in plan.followers], run)
        _confirm_running(cfg, nodes, {s.node: containers[s.node] for s in plan.followers}, marker=None)
        say("ray: workers joined; starting vllm serve on the head")
        assert plan.head.exec_after_join is not None
        Engine(nodes[plan.head.node]).exec(containers[plan.head.node], plan.head.exec_after_join, detach=True,
                                           to_container_log=True)
        return containers
    say(f"starting {len(plan.followers)} follower(s): {', '.join(s.node for s in plan.followers)}")
    on_all([s.node for s in plan.followers], run)
    _confirm_running(cfg, nodes, {s.node: containers[s.node] for s in plan.followers},
                     marker="headless multiproc executor")
    say(f"starting the head on {plan.head.node}")
    run(plan.head.node)
    return containers


def _confirm_running(cfg: Config, nodes: dict[str, Node], containers: dict[str, str], *, marker: str | None,
                     timeout_s: float = 60.0) -> None:
    """No fixed sleeps: each container must be running and (if given) have logged ``marker``."""
    def confirm(name: str) -> None:
        eng = Engine(nodes[name])
        t0 = time.monotonic()
        while True:
            st = eng.state(containers[name])
            lines = eng.log_tail(containers[name], 200)
            if not st.running:
                raise BootFailure(name, "start", f"container {containers[name][:12]} stopped "
                                  f"(exit code {st.exit_code})", explain(lines))
            if marker is None or any(marker in line for line in lines):
                return
            if time.monotonic() - t0 > timeout_s:
                return  # running but quiet: the head's rendezvous wait covers the rest
            time.sleep(0.1)

    on_all(list(containers), confirm)


# -- down / status / logs ---------------------------------------------------------------------------------


def down(cfg: Config, nodes: dict[str, Node], *, break_lock: bool = False, say: Reporter = _quiet) -> dict[str, Any]:
    head = nodes[cfg.head.name]
    with lock.held(head, what="down", break_lock=break_lock):
        existing = managed_on_all(nodes)
        ids = {k: [c.id for c in v] for k, v in existing.items() if v}
        if not ids:
            say("nothing to stop: no sparkserve container on any node")
            return {"removed": {}, "logs": None}
        with _sigint_deferred():
            saved = teardown(cfg, nodes, ids, tag="down", say=say)
        removed = {k: [c.name for c in v] for k, v in existing.items() if v}
        for k, v in removed.items():
            say(f"{k}: removed {', '.join(v)}")
        return {"removed": removed, "logs": str(saved) if saved else None}


def status(cfg: Config, nodes: dict[str, Node]) -> dict[str, Any]:
    """What runs where. Liveness is read per node, never inferred from /health."""
    existing = managed_on_all(nodes)
    out: dict[str, Any] = {"nodes": {}, "api": None, "ok": True}
    for n in cfg.nodes:
        cs = existing.get(n.name, [])
        out["nodes"][n.name] = [
            {"name": c.name, "id": c.id[:12], "rank": c.rank, "role": c.role, "status": c.status,
             "deployment": c.fingerprint[:12], "image_id": c.image_id[:19]} for c in cs
        ]
        if not any(c.running for c in cs):
            out["ok"] = False
    plan = build_plan(cfg)
    models = served_models(plan.api_url)
    out["api"] = {"url": plan.api_url, "serving": models is not None and plan.served_name in (models or []),
                  "models": models}
    if not out["api"]["serving"]:
        out["ok"] = False
    fps = {c.fingerprint for cs in existing.values() for c in cs}
    out["deployments"] = sorted(f[:12] for f in fps)
    if len(fps) > 1:
        out["ok"] = False
    return out


def show_logs(cfg: Config, node: str | None = None, follow: bool = False, since: str | None = None,
              *, out: Callable[[str], None] = print) -> None:
    """Every node's sparkserve container logs, each line prefixed with its node; ``follow`` streams."""
    from sparkserve.nodes.factory import open_nodes

    with open_nodes(cfg) as nodes:
        stream_logs(cfg, nodes, node=node, follow=follow, since=since, out=out)


def stream_logs(cfg: Config, nodes: dict[str, Node], *, node: str | None = None, follow: bool = False,
                since: str | None = None, out: Callable[[str], None] = print) -> None:
    names = [n.name for n in cfg.nodes if node is None or n.name == node]
    if node is not None and not names:
        raise BadInput("--node", f"no node named {node!r} (nodes: {', '.join(n.name for n in cfg.nodes)})")
    since_v = _parse_since(since) if since else None
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
            while t.is_alive():
                t.join(0.5)
    else:
        for n in names:
            stream(n)


def _parse_since(since: str) -> float:
    """``10m`` / ``2h`` / ``30s`` ago, or a unix timestamp."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if since[-1] in units:
            return time.time() - float(since[:-1]) * units[since[-1]]
        return float(since)
    except (ValueError, IndexError):
        raise BadInput("--since", f"{since!r} is not a duration like 10m or a unix time") from None


def tmpdir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="sparkserve-")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the sparkserve command")
