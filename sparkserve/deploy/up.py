"""`up`: from a config to a running, gated stack on every node.

    with open_nodes(cfg) as nodes:
        result = up(cfg, nodes)   # validate + preflight → image → drafter → start → wait → parity → gates

:func:`planned_steps` says what those steps will do for a config (`sparkserve plan` prints it); :func:`up`
takes them. A stack that already runs this exact deployment (same fingerprint, healthy, ranks in parity,
gates passed for this very boot — judged now when the journal has no verdict for it) is left alone; one
that runs anything else is replaced. After the gates pass, every rank is watched for ``gates.settle_s``
before `up` says it serves: a rank that dies then fails `up`. On any failure or Ctrl-C, every container this
run started is stopped (gracefully) and removed on every node, each node's log is saved first, and the
error names the node, the step and the lines that explain it (deploy.teardown).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any

from sparkserve import interrupts
from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy import lock
from sparkserve.deploy.doctor import Check, check_all, check_ports
from sparkserve.deploy.drafter import DrafterSync, all_cached, drafter_words, local_drafter, sync_drafter, sync_words
from sparkserve.deploy.inputs import validate_inputs
from sparkserve.deploy.parity import check_parity
from sparkserve.deploy.probe import probe_node
from sparkserve.deploy.stack import managed_on_all
from sparkserve.deploy.sync import RemoteState
from sparkserve.deploy.teardown import Reporter, explain_failure, interrupted, interrupted_what, quiet, teardown
from sparkserve.deploy.timings import span, timed
from sparkserve.deploy.wait import NodeView, daemons_answer, served_models, wait_ready, wait_running, watch_alive
from sparkserve.deploy.watchdog import watchdog_floors
from sparkserve.errors import BadInput, CheckRefused, GateFailed, RemoteFailure, SparkserveError
from sparkserve.image.on_nodes import ensure_same_engine
from sparkserve.journal import record
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ManagedContainer
from sparkserve.nodes.factory import docker_opening
from sparkserve.nodes.hostfacts import HostFacts, host_question, memory_verdict, sudoers_fix
from sparkserve.nodes.parallel import after, on_all
from sparkserve.nodes.processes import rank_id
from sparkserve.nodes.runtime import LABEL_ENGINE_ID, engine_for
from sparkserve.observe.gate_report import GateReport, Verdict
from sparkserve.plan.build import Plan, build_plan, cache_dirs
from sparkserve.plan.dialects import dialect_for, shipped_for_image, stored_facts
from sparkserve.plan.fabric import FabricFacts, fabric_envs
from sparkserve.plan.mounts import CACHE_MOUNT
from sparkserve.plan.validate import refuse_inexpressible

BootWatcher = Callable[[list[NodeView], float], None]


@dataclass
class UpResult:
    """What `up` left running: the API, exactly what booted (fingerprint, image, drafter), how long it
    took, each node's container, the drafter sync, and the gate report (None: gates not run)."""

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
    gates: GateReport | None = None

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["gates"] = self.gates.to_json() if self.gates is not None else None
        return out


def planned_steps(cfg: Config, plan: Plan) -> list[dict[str, Any]]:
    """The steps :func:`up` takes for this config and plan, in order, each with what it does (the list
    `sparkserve plan` prints). A start step names its node, rank and container."""
    tool, kept = ("docker", "containers") if cfg.runtime == "docker" else ("python3", "ranks")
    steps: list[dict[str, Any]] = [
        {"step": "validate", "detail": f"config, drafter {drafter_words(cfg)}, target {cfg.model.target}, "
                                        "every argv through vLLM 0.33's parser"},
        {"step": "preflight", "detail": f"on every node in parallel: ssh, {tool}, disk, ports "
                                         f"{cfg.serve.port}/{cfg.fabric.master_port}, stale {kept}, paths, fabric, "
                                         "host (kernel, iommu, swappiness, earlyoom, /dev/shm), the target's manifest"},
        {"step": "image", "detail": f"{cfg.image.ref}: the same image ID on every node" if cfg.runtime == "docker"
         else f"serve.vllm {cfg.serve.vllm}: the same executable and --version on every node"},
        {"step": "drafter", "detail": sync_words(cfg)},
        {"step": "memory", "detail": "on every node: sync, drop the page cache and compact" + (
            "" if cfg.watchdog.drop_caches else " (off: watchdog.drop_caches)") + f"; free accelerator memory (MemFree "
            f"on unified memory) at least gpu_memory_utilization {cfg.serve.gpu_memory_utilization} x total"},
    ]
    for s in plan.start_order():
        if plan.executor == "ray":
            what = "ray start --head" if s.role == "head" else "ray worker"
        else:
            what = "vllm serve (API server)" if s.role == "head" else "vllm serve --headless"
        where = (f"in {s.name} on {s.host}" if plan.runtime == "docker" else
                 f"as a host process in its own session on {s.host} (log and manifest under {plan.run_dir})")
        steps.append({"step": "start", "node": s.node, "rank": s.rank, "container": s.name,
                      "detail": f"{what} {where}"})
    if plan.executor == "ray":
        steps.append({"step": "serve", "node": plan.head.node, "detail": "vllm serve --distributed-executor-backend "
                                                                          "ray, exec'd in the head container"})
    g = cfg.gates
    mode = "no graphs (eager)" if cfg.serve.enforce_eager else cfg.serve.compilation.cudagraph_mode.value
    steps += [
        {"step": "wait", "detail": f"`Application startup complete.` on the head ({plan.api_url}); every rank's "
                                   "engine alive; free memory above the floor"},
        {"step": "gates", "detail": f"pool {g.pool_tokens or 'as banked'} tokens, graphs {mode} on every rank, mask "
                                    f"{g.mask_token_id or 'if the drafter has one'} on every rank, smoke "
                                    f"{g.smoke.prompts}x{g.smoke.concurrency}x{g.smoke.max_tokens}, no faults"},
    ]
    return steps


def deploy_fingerprint(cfg: Config, image_id: str, drafter_digest: str) -> str:
    """sha256 of the normalized config + image ID + drafter manifest: what booted, exactly."""
    blob = json.dumps({"config": cfg.normalized(), "image_id": image_id, "drafter": drafter_digest},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def up(
    cfg: Config,
    nodes: dict[str, Node],
    *,
    run_gates: bool = True,
    validate: bool = True,
    break_lock: bool = False,
    say: Reporter = quiet,
    on_update: BootWatcher | None = None,
) -> UpResult:
    """Bring the configured stack up on every node (see the module docstring) and run the gates.

    ``validate``: run :func:`validate_inputs` (drafter and target metadata, vLLM's option list) alongside
    the read-only preflight questions; a BadInput from it is reported first, before anything starts. Pass
    False only when the caller validated these inputs already. ``run_gates=False`` skips the gates.
    Raises GateFailed (the stack was stopped) when a gate fails, RemoteFailure/BootFailure otherwise."""
    with interrupts.watching():
        try:
            return _up(cfg, nodes, run_gates=run_gates, validate=validate, break_lock=break_lock, say=say,
                       on_update=on_update)
        except BaseException as e:  # before any container started (after, _boot cleans up and says so itself)
            if isinstance(e, RemoteFailure) and e.step == "interrupted":
                raise
            if interrupted(e):
                raise RemoteFailure("up", f"{interrupted_what()} before any container was started; nothing to "
                                    "clean up", step="interrupted") from None
            raise


@dataclass
class _Found:
    """What the preflight learned: every node's checks and fabric facts, the one image ID, the managed
    containers already there, and the drafter every node holds."""

    checks: list[Check]
    fabric: dict[str, FabricFacts]
    image_id: str
    existing: dict[str, list[ManagedContainer]]
    drafter: DrafterSync
    hosts: dict[str, HostFacts] = field(default_factory=dict)  # after the page-cache drop, just before the start


def _up(cfg: Config, nodes: dict[str, Node], *, run_gates: bool, validate: bool, break_lock: bool,
        say: Reporter, on_update: BootWatcher | None) -> UpResult:
    t0 = time.monotonic()
    copy_drafter = local_drafter(cfg) is not None
    docker_nodes = nodes if cfg.runtime == "docker" else {}
    # each node's docker connection opens (read-only) while the lock is taken
    with docker_opening(docker_nodes), lock.held(nodes[cfg.head.name], what="up", break_lock=break_lock):
        with span("preflight"):
            found = _preflight(cfg, nodes, validate=validate, copy_drafter=copy_drafter, say=say)
        fp = deploy_fingerprint(cfg, found.image_id, found.drafter.digest)
        # the image ID keys the caches and picks the image's own dialect facts; a setting that dialect
        # cannot express is refused here, before any container starts (exit 2)
        image_id = found.image_id if cfg.runtime == "docker" else None
        if image_id is not None:
            _learn_dialect(cfg, nodes, image_id, say)
        dialect = dialect_for(cfg, image_id=image_id)
        refuse_inexpressible(cfg, dialect)
        plan = build_plan(cfg, fabric_env=fabric_envs(found.fabric), fingerprint=fp, api_key=resolve_api_key(cfg),
                          image_id=image_id, dialect=dialect)
        with span("already up?"):
            running = _healthy_existing(cfg, plan, found.existing)
        if running is not None:
            with span("keep (parity, gate verdict)"):
                gates = _keep(cfg, nodes, plan, running, say, run_gates=run_gates)
            return UpResult("unchanged", plan.api_url, plan.served_name, fp, found.image_id, found.drafter.digest,
                            time.monotonic() - t0, containers=running, sync=found.drafter.summary, gates=gates)
        _make_cache_dirs(cfg, nodes, plan)
        with span("clear the way"):
            status = _clear_the_way(cfg, nodes, found, say)
        with span("memory before start"):
            found.hosts = memory_before_start(cfg, nodes, say)
        with span("boot (start, wait, parity, gates, settle)"):
            return _boot(cfg, nodes, plan, found, status=status, t0=t0, run_gates=run_gates, say=say,
                         on_update=on_update)


def _learn_dialect(cfg: Config, nodes: dict[str, Node], image_id: str, say: Reporter) -> None:
    """An image nothing is known about (no override, no stored facts of this image ID, not in the shipped table):
    read its engine dialect from inside it on the head, once — the same reader `image verify` runs. Best effort:
    when it cannot be read, the shipped table / vLLM 0.33.0 apply, as before."""
    if cfg.serve.vllm_version or shipped_for_image(cfg.image.ref) is not None:
        return
    entry = (stored_facts().get("by_ref") or {}).get(cfg.image.ref)
    if isinstance(entry, dict) and entry.get("image_id") == image_id:
        return
    from sparkserve.image.dialect import verify_dialect

    try:
        d, raw = verify_dialect(nodes[cfg.head.name], cfg.image.ref, image_id)
    except SparkserveError as e:
        say(f"warning: image: its engine dialect could not be read ({e.what}); vLLM 0.33.0's flag names apply")
        return
    say(f"image: engine dialect {d.describe() if d else 'unknown (vLLM 0.33.0 applies)'}, read from "
        f"{cfg.image.ref} ({raw.get('how') or 'nothing'})")


def _make_cache_dirs(cfg: Config, nodes: dict[str, Node], plan: Plan) -> None:
    """The image's cache dirs on every node (docker bind mounts need their sources), under the cache root the
    preflight made. RemoteFailure naming the node that refuses."""
    dirs = cache_dirs(plan)

    def make(name: str) -> None:
        for d in dirs.get(name, []):
            try:
                nodes[name].makedirs(d)
            except OSError as e:
                raise RemoteFailure(f"{name}: cache", f"cannot create {d}: {e.strerror or e} (container.cache_root)",
                                    node=name, step="cache") from None

    if any(dirs.values()):
        on_all([n.name for n in cfg.nodes], make)


def _preflight(cfg: Config, nodes: dict[str, Node], *, validate: bool, copy_drafter: bool,
               say: Reporter) -> _Found:
    """Every read-only question at once, each node in parallel: input validation, node checks (one round
    trip: paths, disk, ports, memory, fabric facts, the drafter's manifest from the node's cache when there
    is nothing to copy, and the containers' writable mount dirs made), image identity, the running
    containers. Failures are then reported in that order; a drafter to copy is copied only once every check
    passed."""
    say("preflight: checking every node")
    fabric: dict[str, FabricFacts] = {}
    # the drafter's manifest from each node's cache reads no weights, so the node probe answers it too
    # (before validation: one python3 start per node for every check); a cache miss is read in full after
    cached: dict[str, RemoteState | None] | None = None if copy_drafter else {}
    # the cache root is made (and so proven writable) here; the image's own dirs under it once its ID is known
    rw = {s.node: [m.source.rsplit("/", 1)[0] for m in s.mounts if m.target == CACHE_MOUNT]
          for s in build_plan(cfg).specs}
    with ThreadPoolExecutor(max_workers=6) as pool:
        f_valid = pool.submit(timed("preflight: validate", validate_inputs), cfg, nodes) if validate else None
        f_checks = pool.submit(timed("preflight: node checks", check_all), cfg, nodes, None, check_ports=True,
                               mkdirs=rw, fabric_out=fabric,
                               manifest_out=cached, lean=True)
        f_image = pool.submit(timed("preflight: engine identity", ensure_same_engine), cfg,
                              [nodes[n.name] for n in cfg.nodes])
        # docker: after the image question, so each node's questions share one connection (each more
        # connection starts another `docker system dial-stdio` on the node)
        f_existing = pool.submit(timed("preflight: running ranks", after), f_image if cfg.runtime == "docker" else None,
                                 managed_on_all, nodes, cfg)
        if f_valid is not None:
            f_valid.result()  # BadInput (exit 2): nothing was started
        checks = f_checks.result()
        _raise_failed_checks(checks)
        for c in checks:  # the host's known GB10 hazards, each with its fix: said, not refused
            if c.status == "warn" and c.name in HOST_WARNINGS:
                say(f"warning: {c.node}: {c.name}: {c.detail}")
        image_id = f_image.result()
        say(f"image: {cfg.image.ref} is {image_id[:19]} on every node" if cfg.runtime == "docker" else
            f"engine: serve.vllm {cfg.serve.vllm} is {image_id[:19]} on every node")
        existing = f_existing.result()
    # Hashing the drafter on a node whose cache missed comes after validation: a wrong drafter must not cost
    # a full read of its weights before its exit 2.
    with span("preflight: drafter"):
        drafter = sync_drafter(cfg, nodes, say, None if cached is None else all_cached(cfg, cached))
    return _Found(checks, fabric, image_id, existing, drafter)


#: Host checks whose warnings `up` says before it boots (nodes.hostfacts.host_verdicts).
HOST_WARNINGS = ("iommu", "swappiness", "earlyoom", "shm", "nccl", "kernel parity", "driver parity",
                 "firmware parity", "nccl parity")
#: Failed checks that refuse the run although every node answered (exit 1, CheckRefused), in the order judged.
REFUSING = ("kernel", "target manifest", "memory")


def _raise_failed_checks(checks: list[Check]) -> None:
    """The first failed node check as the error, the others as its details. Busy ports are judged later:
    the stack being replaced may be what holds them. Free memory is judged by :func:`memory_before_start`, just
    before the ranks start."""
    bad = [c for c in checks if c.status == "fail" and not c.name.startswith("port ")
           and c.name not in REFUSING]
    if bad:
        c = bad[0]
        raise RemoteFailure(f"{c.node}: preflight {c.name}", c.detail, node=c.node, step=f"preflight {c.name}",
                            details=[f"{x.node}: {x.name}: {x.detail}" for x in bad[1:]])
    _raise_refusals(checks, ("kernel", "target manifest"))


def _raise_refusals(checks: list[Check], names: tuple[str, ...]) -> None:
    """The first failed check among ``names`` as a CheckRefused (exit 1), the others as its details."""
    bad = [c for c in checks if c.status == "fail" and c.name in names]
    if bad:
        c = bad[0]
        raise CheckRefused(f"{c.node}: preflight {c.name}", c.detail, node=c.node, step=f"preflight {c.name}",
                           details=[f"{x.node}: {x.name}: {x.detail}" for x in bad[1:]])


def memory_before_start(cfg: Config, nodes: dict[str, Node], say: Reporter) -> dict[str, HostFacts]:
    """Just before the ranks start, on every node at once: sync, drop the page cache and compact (``sudo -n``;
    watchdog.drop_caches), then free accelerator memory against gpu_memory_utilization x total — MemFree on
    unified memory, the driver's free memory on a discrete GPU. CheckRefused (exit 1) naming the node when it
    falls short: vLLM would refuse it minutes later. Returns each node's host facts (the watchdog's and the
    journal's)."""
    drop = cfg.watchdog.drop_caches
    by_name = {n.name: n for n in cfg.nodes}
    facts = on_all([nodes[n.name] for n in cfg.nodes],
                   lambda node: HostFacts.from_answer(probe_node(node, host=host_question(cfg, drop=drop)).host or {}),
                   name=lambda node: node.name)
    checks = [Check(name, check, status, detail) for name, f in facts.items()
              for check, status, detail in memory_verdict(cfg, by_name[name], f, dropped=drop)]
    kv = next((c for c in checks if c.name == "kv_cache" and c.status == "fail"), None)
    if kv is not None:  # an absurd serve.kv_cache_memory_bytes is bad input (exit 2), found before any rank starts
        raise BadInput("serve.kv_cache_memory_bytes", kv.detail.removeprefix("serve.kv_cache_memory_bytes "))
    _raise_refusals(checks, ("memory",))
    for name, f in facts.items():
        mem = f.memory([])
        if f.drop and mem is not None and mem.unified:
            say(f"warning: {name}: the page cache was not dropped before the boot ({f.drop}) — "
                f"{sudoers_fix(by_name[name].user, str(cfg.host.proc_root))}")
    return facts


def _healthy_existing(cfg: Config, plan: Plan,
                      existing: dict[str, list[ManagedContainer]]) -> dict[str, str] | None:
    """The running containers when the stack already runs this exact deployment, else None."""
    found: dict[str, str] = {}
    for n in cfg.nodes:
        mine = [c for c in existing.get(n.name, []) if c.fingerprint == plan.fingerprint and c.running]
        if len(mine) != 1 or len(existing.get(n.name, [])) != 1:
            return None
        found[n.name] = mine[0].id
    models = served_models(plan.api_url, api_key=resolve_api_key(cfg))
    if not models or plan.served_name not in models:
        return None
    return found


def _keep(cfg: Config, nodes: dict[str, Node], plan: Plan, running: dict[str, str], say: Reporter, *,
          run_gates: bool) -> GateReport | None:
    """Leave the running stack up, once its ranks are in parity and (with ``run_gates``) its gates passed
    for this boot: the journal's verdict, else the gates run now (their report is returned). A drifted
    rank or a failed gate means it serves wrong results, so then the stack must not stay up: it is torn
    down as a failed first boot would be."""
    report = None
    try:
        check_parity(cfg, nodes, running)
        if run_gates and not gates_live().passed_for_this_boot(nodes, plan.fingerprint, running, plan):
            say("the running stack has no passing gate verdict for this boot: running the gates")
            report = _gate(cfg, nodes, plan, running, say)
            _settle(cfg, nodes, plan, running, say)
    except SparkserveError as e:
        parity = isinstance(e, RemoteFailure) and e.step == "rank parity"
        saved = teardown(cfg, nodes, {k: [v] for k, v in running.items()}, tag="parity" if parity else "failed-up",
                         say=say, why=f"the running stack failed {'rank parity' if parity else 'its gates'}: "
                         "stopping and removing it")
        raise explain_failure(e, saved) from None
    say(f"already up: {plan.api_url} serves {plan.served_name} (deployment {plan.fingerprint[:12]}); nothing to do")
    return report


def _settle(cfg: Config, nodes: dict[str, Node], plan: Plan, containers: dict[str, str], say: Reporter) -> None:
    """The settle window: every rank watched for ``gates.settle_s`` more (BootFailure at step "settle")."""
    if cfg.gates.settle_s > 0:
        say(f"settle: watching every rank {cfg.gates.settle_s:g}s more before saying it serves")
        watch_alive(plan, nodes, containers, seconds=cfg.gates.settle_s)


def _clear_the_way(cfg: Config, nodes: dict[str, Node], found: _Found, say: Reporter) -> str:
    """Remove whatever other stack runs, then make sure the ports are free; return "started" or "replaced"."""
    busy = [c for c in found.checks if c.name.startswith("port ") and c.status == "fail"]
    old = {k: [c.id for c in v] for k, v in found.existing.items() if v}
    status = "started"
    if old:
        status = "replaced"
        teardown(cfg, nodes, old, tag="replaced", say=say,
                 why="replacing the running stack (its config, image or drafter changed, or it was unhealthy)")
        if busy:  # the old stack may have held them: ask again
            busy = [c for c in check_ports(cfg, nodes[cfg.head.name]) if c.status == "fail"]
    if busy:
        c = busy[0]
        raise RemoteFailure(f"{c.node}: preflight ports", c.detail, node=c.node, step="preflight ports")
    return status


def _boot(cfg: Config, nodes: dict[str, Node], plan: Plan, found: _Found, *, status: str, t0: float,
          run_gates: bool, say: Reporter, on_update: BootWatcher | None) -> UpResult:
    """Start every rank, wait until the head serves, check parity, run the gates, journal the outcome;
    on any failure (Ctrl-C included) tear down everything this run started and explain why."""
    fp, image_id, digest = plan.fingerprint, found.image_id, found.drafter.digest
    started: dict[str, list[str]] = {}
    try:
        containers = _start(plan, nodes, started, say, image_id)
        floors = watchdog_floors(cfg, found.hosts) if cfg.watchdog.enabled else None
        say("waiting for the head to serve")
        boot_s = wait_ready(plan, nodes, containers, timeout_s=cfg.serve.ready_timeout_s, floors=floors,
                            on_update=on_update)
        check_parity(cfg, nodes, containers)
        say(f"the head answers at {plan.api_url} after {boot_s:.1f}s" + (
            "; the gates decide whether it serves" if run_gates else ""))
        result = UpResult(status, plan.api_url, plan.served_name, fp, image_id, digest, time.monotonic() - t0,
                          boot_s, containers, found.drafter.summary)
        if run_gates:
            result.gates = _gate(cfg, nodes, plan, containers, say)
        _settle(cfg, nodes, plan, containers, say)
        _record(cfg, fp, image_id, digest, "up" if result.gates is None else "up+gates")
        _record_hosts(fp, found.hosts, gates_passed=result.gates is not None)
        return result
    except BaseException as e:
        _record(cfg, fp, image_id, digest, f"failed: {type(e).__name__}")
        _record_hosts(fp, found.hosts, gates_passed=False)
        saved = teardown(cfg, nodes, started, tag="failed-up", say=say,
                         why="failure: stopping and removing every container this run started")
        raise explain_failure(e, saved) from None


def _start(plan: Plan, nodes: dict[str, Node], started: dict[str, list[str]], say: Reporter,
           image_id: str = "") -> dict[str, str]:
    """Followers first, then the head the moment their containers run (docker's start returned): each
    follower's own start-up (imports, its rendezvous wait) overlaps the head's, as torch.distributed's TCP
    rendezvous waits for whichever side comes second; a follower that fails meanwhile fails the readiness
    wait, which names it. For ray: the head, its workers once it runs, then `vllm serve` on the head.
    Every id lands in ``started`` the moment its container (or process) exists, so a failure tears it down.
    runtime process: each manifest records ``image_id``, the engine identity the preflight found."""
    containers: dict[str, str] = {}

    def run(node: str) -> str:
        spec = plan.spec_for(node)
        if plan.runtime == "process":
            spec = spec.model_copy(update={"labels": {**spec.labels, LABEL_ENGINE_ID: image_id}})
            # a process rank's id is known before it starts: a start cut short is still torn down
            started.setdefault(node, []).append(rank_id(plan.fingerprint, spec.rank))
        cid = engine_for(nodes[node], plan).run(spec, make_dirs=False)  # the preflight made them
        if cid not in started.get(node, []):
            started.setdefault(node, []).append(cid)
        containers[node] = cid
        return cid

    followers = [s.node for s in plan.followers]
    if plan.executor == "ray":
        head = plan.head.node
        run(head)
        wait_running(plan, nodes, {head: containers[head]})
        on_all(followers, run)
        wait_running(plan, nodes, {n: containers[n] for n in followers})
        say("ray: workers joined; starting vllm serve on the head")
        assert plan.head.exec_after_join is not None
        engine_for(nodes[head], plan).exec(containers[head], plan.head.exec_after_join, detach=True,
                                           to_container_log=True)
        return containers
    say(f"starting {len(followers)} follower(s): {', '.join(followers)}")
    on_all(followers, run)
    say(f"starting the head on {plan.head.node}")
    run(plan.head.node)
    return containers


def _gate(cfg: Config, nodes: dict[str, Node], plan: Plan, containers: dict[str, str],
          say: Reporter = quiet) -> GateReport:
    """Every gate, with the smoke cell, narrated (one line per gate); GateFailed naming the failed gates and
    their evidence. A node whose docker daemon stopped answering meanwhile is the cause, whatever the gates saw
    (its rank's requests failed with it): RemoteFailure at step "docker" (exit 3), naming it (fault case A30)."""
    try:
        report = gates_live().collect_and_judge(cfg, nodes, plan, containers, say=say)
    except SparkserveError:
        daemons_answer(cfg, nodes, plan, containers, "while the gates ran")
        raise
    if not report.ok:
        daemons_answer(cfg, nodes, plan, containers, "while the gates ran")
    for g in report.gates:
        say(f"gate {g.name}: {'skipped' if g.skipped else 'ok' if g.ok else 'FAIL'} — {g.reason}")
    if not report.ok:
        failed = [_gate_where(g) for g in report.failed()]
        raise GateFailed("gates", f"{', '.join(failed)} failed after boot; the stack was stopped",
                         details=_gate_lines(report))
    return report


def gates_live() -> ModuleType:
    """:mod:`sparkserve.deploy.gates_live`, imported when gates are judged (it brings the bench client and
    the log analyzer: a tenth of a second that ``up --no-gates`` does not pay)."""
    from sparkserve.deploy import gates_live as module

    return module


def _gate_where(g: Verdict) -> str:
    """``faults (node-b)``: a failed gate and the nodes its failure is about."""
    return g.headline()


def _gate_lines(report: GateReport) -> list[str]:
    """Each failed gate's reason and its first three evidence lines."""
    out = []
    for g in report.failed():
        out.append(f"{g.name}: {g.reason}")
        for e in g.evidence[:3]:
            out.append(f"  {e.node}:{e.line}: {e.text[:160]}")
    return out


def _record_hosts(fp: str, hosts: dict[str, HostFacts], *, gates_passed: bool) -> None:
    """Every node's host fingerprint at this boot (`doctor --drift` diffs against the last one whose gates passed)."""
    if hosts:
        record("host_facts", fingerprint=fp, gates_passed=gates_passed,
               hosts={name: f.fingerprint() for name, f in hosts.items()})


def _record(cfg: Config, fp: str, image_id: str, digest: str, outcome: str) -> None:
    """What ran, with sha256 pins, in the journal; a journal problem never breaks a deploy (journal.record)."""
    record("deployment", fingerprint=fp, config=cfg.normalized(), image_ids={n.name: image_id for n in cfg.nodes},
           drafter_manifest_sha256=digest, outcome=outcome)
