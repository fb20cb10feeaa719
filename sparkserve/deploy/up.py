"""`up`: from a config to a running, gated stack on every node.

    with open_nodes(cfg) as nodes:
        result = up(cfg, nodes)   # validate + preflight → image → drafter → start → wait → parity → gates

:func:`planned_steps` says what those steps will do for a config (`sparkserve plan` prints it); :func:`up` takes
them, the read-only ones first (:mod:`sparkserve.deploy.preflight`). A stack that already runs this exact
deployment (same fingerprint, healthy, ranks in parity, gates passed for this very boot — judged now when the
journal has no verdict for it) is left alone; one that runs anything else is replaced. After the gates pass, every
rank is watched for ``gates.settle_s`` before `up` says it serves: a rank that dies then fails `up`. With no gates
(``run_gates=False``) there is no settle window either: the readiness wait's last look at every rank follows the
head's answer. On any failure or Ctrl-C, every container this run started is stopped (gracefully) and removed on
every node, each node's log is saved first, and the error names the node, the step and the lines that explain it
(deploy.teardown).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any

from sparkserve import interrupts
from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy import lock
from sparkserve.deploy.doctor import check_ports
from sparkserve.deploy.drafter import drafter_words, local_drafter, sync_words
from sparkserve.deploy.parity import check_parity
from sparkserve.deploy.preflight import (
    Found,
    check_requires,
    learn_dialect,
    make_cache_dirs,
    memory_before_start,
    preflight,
)
from sparkserve.deploy.teardown import Reporter, explain_failure, interrupted, interrupted_what, quiet, teardown
from sparkserve.deploy.timings import span
from sparkserve.deploy.wait import NodeView, daemons_answer, served_models, wait_ready, wait_running, watch_alive
from sparkserve.deploy.watchdog import watchdog_floors
from sparkserve.errors import GateFailed, RemoteFailure, SparkserveError
from sparkserve.journal import record
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ManagedContainer
from sparkserve.nodes.factory import docker_opening
from sparkserve.nodes.hostfacts import HostFacts
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.processes import rank_id
from sparkserve.nodes.runtime import LABEL_ENGINE_ID, engine_for
from sparkserve.observe.gate_report import GateReport, Verdict
from sparkserve.plan.build import Plan, build_plan
from sparkserve.plan.dialects import dialect_for
from sparkserve.plan.fabric import fabric_envs
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
    fresh: bool = False,
    say: Reporter = quiet,
    on_update: BootWatcher | None = None,
) -> UpResult:
    """Bring the configured stack up on every node (see the module docstring) and run the gates.

    ``validate``: run :func:`validate_inputs` (drafter and target metadata, vLLM's option list) alongside
    the read-only preflight questions; a BadInput from it is reported first, before anything starts. Pass
    False only when the caller validated these inputs already. ``run_gates=False`` skips the gates.
    ``fresh``: boot the engine again even when this exact deployment already serves (an A/B slot is a boot of
    its own: two slots of one arm in a row, ABBA's middle, must not share one engine).
    Raises GateFailed (the stack was stopped) when a gate fails, RemoteFailure/BootFailure otherwise."""
    with interrupts.watching():
        try:
            return _up(cfg, nodes, run_gates=run_gates, validate=validate, break_lock=break_lock, fresh=fresh,
                       say=say, on_update=on_update)
        except BaseException as e:  # before any container started (after, _boot cleans up and says so itself)
            if isinstance(e, RemoteFailure) and e.step == "interrupted":
                raise
            if interrupted(e):
                raise RemoteFailure("up", f"{interrupted_what()} before any container was started; nothing to "
                                    "clean up", step="interrupted") from None
            raise


def _up(cfg: Config, nodes: dict[str, Node], *, run_gates: bool, validate: bool, break_lock: bool, fresh: bool,
        say: Reporter, on_update: BootWatcher | None) -> UpResult:
    t0 = time.monotonic()
    copy_drafter = local_drafter(cfg) is not None
    docker_nodes = nodes if cfg.runtime == "docker" else {}
    # each node's docker connection opens (read-only) while the lock is taken
    with docker_opening(docker_nodes), lock.held(nodes[cfg.head.name], what="up", break_lock=break_lock):
        with span("preflight"):
            found = preflight(cfg, nodes, validate=validate, copy_drafter=copy_drafter, say=say)
        fp = deploy_fingerprint(cfg, found.image_id, found.drafter.digest)
        # the image ID keys the caches and picks the image's own dialect facts; a setting that dialect
        # cannot express is refused here, before any container starts (exit 2)
        image_id = found.image_id if cfg.runtime == "docker" else None
        if image_id is not None:
            learn_dialect(cfg, nodes, image_id, say)
        dialect = dialect_for(cfg, image_id=image_id)
        refuse_inexpressible(cfg, dialect)
        plan = build_plan(cfg, fabric_env=fabric_envs(found.fabric), fingerprint=fp, api_key=resolve_api_key(cfg),
                          image_id=image_id, dialect=dialect)
        with span("already up?"):
            running = None if fresh else _healthy_existing(cfg, plan, found.existing)
        if running is not None:
            with span("keep (parity, gate verdict)"):
                gates = _keep(cfg, nodes, plan, running, say, run_gates=run_gates)
            return UpResult("unchanged", plan.api_url, plan.served_name, fp, found.image_id, found.drafter.digest,
                            time.monotonic() - t0, containers=running, sync=found.drafter.summary, gates=gates)
        with span("preflight: engine requires"):  # before any rank: a missing dependency dies after the load
            check_requires(cfg, nodes, found.image_id, say)
        make_cache_dirs(cfg, nodes, plan)
        with span("clear the way"):
            status = _clear_the_way(cfg, nodes, found, say)
        with span("memory before start"):
            found.hosts = memory_before_start(cfg, nodes, say)
        with span("boot (start, wait, parity, gates, settle)"):
            return _boot(cfg, nodes, plan, found, status=status, t0=t0, run_gates=run_gates, say=say,
                         on_update=on_update)


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
        with span("settle"):
            watch_alive(plan, nodes, containers, seconds=cfg.gates.settle_s)


def _clear_the_way(cfg: Config, nodes: dict[str, Node], found: Found, say: Reporter) -> str:
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


def _boot(cfg: Config, nodes: dict[str, Node], plan: Plan, found: Found, *, status: str, t0: float,
          run_gates: bool, say: Reporter, on_update: BootWatcher | None) -> UpResult:
    """Start every rank, wait until the head serves, check parity, run the gates, journal the outcome;
    on any failure (Ctrl-C included) tear down everything this run started and explain why."""
    fp, image_id, digest = plan.fingerprint, found.image_id, found.drafter.digest
    started: dict[str, list[str]] = {}
    try:
        with span("boot: start"):
            containers = _start(plan, nodes, started, say, image_id)
        floors = watchdog_floors(cfg, found.hosts) if cfg.watchdog.enabled else None
        say("waiting for the head to serve")
        with span("boot: wait for the head"):
            boot_s = wait_ready(plan, nodes, containers, timeout_s=cfg.serve.ready_timeout_s, floors=floors,
                                on_update=on_update)
        with span("boot: parity"):
            check_parity(cfg, nodes, containers)
        say(f"the head answers at {plan.api_url} after {boot_s:.1f}s" + (
            "; the gates decide whether it serves" if run_gates else ""))
        result = UpResult(status, plan.api_url, plan.served_name, fp, image_id, digest, time.monotonic() - t0,
                          boot_s, containers, found.drafter.summary)
        if run_gates:
            with span("gates"):
                result.gates = _gate(cfg, nodes, plan, containers, say)
            _settle(cfg, nodes, plan, containers, say)
        elif cfg.gates.settle_s > 0:
            # the settle window watches the ranks after the gates' traffic; with no gates there is none to settle
            # from (the readiness wait looked at every rank once more after the head answered)
            say(f"no gates: no settle window either (gates.settle_s {cfg.gates.settle_s:g}s follows the gates)")
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
