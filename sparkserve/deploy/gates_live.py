"""The gates on the running stack: collect, then judge (sparkserve.observe.gates does the judging).

For every node: the engine container's log since it started, whether it is alive, its image ID, and the
drafter digest at the configured path. On the head: the smoke cell (every request has a deadline — a hang
is a stream error, not a stuck command). The banked pool for this deployment comes from the journal;
``bank=True`` records the observed one. Every full judgement is journalled against the boot it judged
(:func:`boot_id`), which is how `up` knows whether a running stack's gates passed for this boot.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sparkserve.config import Config, resolve_api_key
from sparkserve.config.profiles import NO_DRAFTER, drafter_path
from sparkserve.deploy.stack import boot_id, managed_on_all  # noqa: F401 - boot_id: gates_live.boot_id
from sparkserve.deploy.sync import remote_manifest
from sparkserve.deploy.wait import _stamp
from sparkserve.errors import RemoteFailure, SparkserveError
from sparkserve.image.on_nodes import identity_of
from sparkserve.journal import lookup, record
from sparkserve.journal.history import GATES_SMOKE_CELL
from sparkserve.measure.prompts import builtin_prompts
from sparkserve.measure.records import CELLS, Cell
from sparkserve.measure.run import default_warmup, run_cell
from sparkserve.measure.wedge import wedge_probe
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ContainerState
from sparkserve.nodes.hostfacts import kernel_faults
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.runtime import engine_for
from sparkserve.observe.gate_inputs import Expectations, NodeIdentity, SmokeError, SmokeResult
from sparkserve.observe.gate_report import GateReport
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import ParsedLog, parse_log
from sparkserve.plan.build import Plan, build_plan


def smoke_cell(cfg: Config) -> Cell:
    """The built-in smoke cell, sized by ``gates.smoke``."""
    s = cfg.gates.smoke
    base = CELLS["smoke"]
    return Cell(base.name, prompts=s.prompts, concurrency=s.concurrency, max_tokens=s.max_tokens)


def run_smoke(cfg: Config, plan: Plan, *, progress: bool = False) -> tuple[SmokeResult, dict[str, Any]]:
    """The smoke cell against the head's API: what the smoke gate judges, and the raw bench result.
    ``progress``: bench's live bar on stderr (a terminal)."""
    cell = smoke_cell(cfg)
    wedged = wedge_probe(cfg, plan)  # a wedged engine fails at once, within the supervisor's stall bound
    if wedged is not None:
        return wedged, {}
    warmup = cfg.gates.smoke.warmup
    res = run_cell(plan.api_url, plan.served_name, cell, builtin_prompts(), node=plan.head.node,
                   api_key=resolve_api_key(cfg), deadline_s=cfg.gates.smoke.request_timeout_s,
                   stall_timeout_s=min(60.0, cfg.gates.smoke.request_timeout_s), progress=progress,
                   warmup=default_warmup(cell) if warmup is None else warmup)
    errors = tuple(SmokeError(plan.head.node, f"request {e.request}: {e.kind}: {e.detail}") for e in res.errors)
    warm = res.warmup
    if warm is not None and warm.errors:  # the server failed before the measured requests: the gate sees it too
        kinds = ", ".join(f"{n} {k}" for k, n in warm.error_kinds.items())
        errors += (SmokeError(plan.head.node, f"warm-up: {warm.errors} of {warm.requests} requests failed "
                              f"({kinds})"),)
    incomplete = res.incomplete
    return SmokeResult(requests=cell.prompts, requests_ok=res.requests_ok,
                       stream_errors=res.stream_errors + (warm.errors if warm is not None else 0),
                       incomplete=incomplete, errors=errors, node=plan.head.node), res.model_dump(mode="json")


#: How long before the container's recorded start a line of this boot may be stamped: docker records StartedAt
#: only after it started the process, whose launcher may already have written a line.
BOOT_SLACK_S = 1.0


def boot_since(state: ContainerState) -> float | None:
    """Where the log of the container's current boot starts (docker's ``logs --since``, unix seconds): its last
    start less :data:`BOOT_SLACK_S`, never before the previous run ended. None: the whole log."""
    started = _stamp(state.started_at)
    if started is None:
        return None
    since = started - BOOT_SLACK_S
    ended = _stamp(state.finished_at)
    if ended is not None and ended < started:  # a restarted container: its previous run ended here
        since = max(since, ended)
    return since


def _quiet(_: str) -> None:
    pass


def _wants_bar(say: Callable[[str], None]) -> bool:
    """Whether ``say`` belongs to a reporter drawing on a terminal (commands.progress.Progress: ``enabled``
    and ``tty``): then the smoke cell draws bench's live bar; else its start and end are lines."""
    owner = getattr(say, "__self__", None)
    return bool(getattr(owner, "enabled", False) and getattr(owner, "tty", False))


def _smoke_line(raw: dict[str, Any] | None, took: float) -> str:
    if not raw:
        return f"gates: smoke cell ended after {took:.1f}s"
    al = raw.get("acceptance_length")
    al_s = f", acceptance length {al:.2f}" if isinstance(al, int | float) else ""
    return (f"gates: smoke {raw.get('requests_ok', '?')}/{raw.get('prompts', '?')} requests ok, "
            f"{raw.get('output_tok_s', 0):,.1f} tok/s{al_s} in {took:.1f}s")


def collect_and_judge(cfg: Config, nodes: dict[str, Node], plan: Plan, containers: dict[str, str], *,
                      smoke: bool = True, bank: bool = False, skip: tuple[str, ...] = (),
                      say: Callable[[str], None] = _quiet) -> GateReport:
    """Every gate on the stack in ``containers`` (node → container id): collect on every node, judge,
    and record the run (and, with ``bank``, the observed pool) in the journal. `up`'s last step.
    ``say`` narrates the steps (the smoke cell as bench's bar on a terminal, else a line at each end)."""
    dpath = drafter_path(cfg)  # None: mtp, the target's own head

    def per_node(name: str) -> tuple[ParsedLog, bool, str | None, str | None, list[str] | None]:
        eng = engine_for(nodes[name], plan)
        cid = containers.get(name)
        if cid is None:
            return parse_log("", file=f"{name}.log", node=name), False, None, None, []
        since = boot_since(eng.state(cid))
        text = "\n".join(eng.logs(cid, since=since)) + "\n"
        log = parse_log(text, file=f"{name}.log", node=name)  # here: one node's parse overlaps the others' reads
        alive = eng.state(cid).running
        image = eng.managed(cid)
        digest = remote_manifest(nodes[name], dpath).manifest.digest if dpath else NO_DRAFTER
        ident = image.image_id if image else None
        if ident is not None and plan.runtime == "docker":  # the content fingerprint: store-independent
            ident = identity_of(nodes[name], ident)
        knl = kernel_faults(nodes[name], cfg, since=since or 0.0)  # NVRM/Xid lines never reach the rank's log
        return log, alive, ident, digest, (None if knl.error else knl.lines)

    names = [n.name for n in cfg.nodes]
    boot = boot_id(nodes, containers, plan) if smoke and not skip else None  # only a full judgement vouches for a boot
    smoke_result = None
    raw_smoke = None
    if smoke:  # first: a fault the smoke provokes (a dead follower, a hung collective) must be judged too
        alive = on_all(names, lambda name: name in containers
                       and engine_for(nodes[name], plan).state(containers[name]).running)
        if all(alive.values()):
            c = smoke_cell(cfg)
            say(f"gates: smoke cell, {c.prompts} requests × {c.max_tokens} tokens at concurrency {c.concurrency} "
                f"against {plan.head.node}")
            t_smoke = time.monotonic()
            smoke_result, raw_smoke = (run_smoke(cfg, plan, progress=True) if _wants_bar(say)
                                       else run_smoke(cfg, plan))
            say(_smoke_line(raw_smoke, time.monotonic() - t_smoke))
    say(f"gates: reading every rank's log, image and drafter ({len(names)} node(s))")
    facts = on_all(names, per_node)
    logs = {name: f[0] for name, f in facts.items()}
    liveness = {name: f[1] for name, f in facts.items()}
    identity = {name: NodeIdentity(image_id=f[2], drafter_digest=f[3]) for name, f in facts.items()}
    mask_file = _drafter_has_mask(nodes[cfg.head.name], dpath) if dpath else False  # mtp: no mask to load
    banked = lookup(lambda j: j.get_banked_pool(plan.fingerprint), None)
    expect = Expectations.from_config(cfg, banked_pool=banked, mask_file=mask_file,
                                      drafter_layers=drafter_layers(nodes[cfg.head.name], dpath) if dpath else None)
    kernel = {name: f[4] for name, f in facts.items()}
    report = judge(logs, expect, smoke=smoke_result, liveness=liveness, identity=identity, skip=skip, kernel=kernel)
    observed = _observed_pool(report) if bank else None
    if observed is not None:
        record("banked_pool", fingerprint=plan.fingerprint, pool_tokens=observed)
    record("gate_run", fingerprint=plan.fingerprint, ok=report.ok, verdicts=report.to_json(), boot_id=boot)
    if raw_smoke is not None:
        record("bench", fingerprint=plan.fingerprint, cell=GATES_SMOKE_CELL,
               result_json=json.dumps(raw_smoke, indent=2) + "\n")
    return report


def passed_for_this_boot(nodes: dict[str, Node], fingerprint: str, containers: dict[str, str],
                         how: Config | Plan | None = None) -> bool:
    """Whether the journal holds a passing gate verdict for this very boot of the deployment."""
    boot = boot_id(nodes, containers, how)
    return lookup(lambda j: j.gate_verdict(fingerprint, boot), None) is True


def _observed_pool(report: GateReport) -> int | None:
    """The one KV pool size every rank reported (what ``--bank`` records), or None when they disagree."""
    pool = next((g for g in report.gates if g.name == "pool"), None)
    observed = pool.observed if pool else None
    if isinstance(observed, list):
        observed = observed[0] if len(set(observed)) == 1 else None
    return observed if isinstance(observed, int) else None


def drafter_layers(node: Node, path: str) -> int | None:
    """The drafter's layer count on ``node`` (config.json ``num_hidden_layers``: the signature gate's
    ``drafter_layers``); None when it cannot be read."""
    try:
        n = json.loads(node.read_text(f"{path.rstrip('/')}/config.json")).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError, SparkserveError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _drafter_has_mask(node: Node, path: str) -> bool:
    """Whether the drafter on ``node`` holds mask_embedding.pt (what the mask gate expects)."""
    res = node.run(["test", "-f", f"{path.rstrip('/')}/mask_embedding.pt"], check=False, step="gates", timeout=20)
    return res.ok


def run_gates(cfg: Config, nodes: dict[str, Node], *, bank: bool = False, skip: tuple[str, ...] = (),
              say: Callable[[str], None] = _quiet) -> GateReport:
    """`sparkserve gates` on the running stack: find its containers by label on every node. A skipped smoke
    gate is not run at all (it is the slow part: a bench cell against the API)."""
    existing = managed_on_all(nodes, cfg)
    containers: dict[str, str] = {}
    fps = set()
    for n in cfg.nodes:
        mine = existing.get(n.name, [])
        if not mine:
            continue
        c = mine[0]
        containers[n.name] = c.id
        fps.add(c.fingerprint)
    if not containers:
        raise RemoteFailure("gates", "no sparkserve stack runs on any node (run `sparkserve up`)")
    if len(fps) > 1:
        raise RemoteFailure("gates", f"nodes run different deployments ({', '.join(f[:12] for f in fps)})")
    plan = build_plan(cfg, fingerprint=fps.pop())
    return collect_and_judge(cfg, nodes, plan, containers, smoke="smoke" not in skip, bank=bank, skip=skip, say=say)
