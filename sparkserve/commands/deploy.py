"""`up`, `down`, `status`, `doctor`, `swap-drafter`: parse, open the nodes, call one deploy function, print.

Nodes are opened here, by the commands layer, with :func:`sparkserve.nodes.factory.open_nodes`; every
deploy function takes them open. Progress (bars, the live boot view, heartbeats when piped) goes to stderr
through :class:`sparkserve.commands.progress.Progress`. The deploy modules are imported inside each command,
so `sparkserve status` pays only for what status uses.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sparkserve.commands._common import AcceptNew, ConfigOpt, JsonOpt, config_from, console, emit_json
from sparkserve.commands.progress import Progress
from sparkserve.config import Config, find_config_path
from sparkserve.errors import GateFailed, RemoteFailure, RollbackFailed

if TYPE_CHECKING:
    from sparkserve.deploy.serving import Serving
    from sparkserve.deploy.stack import StackStatus

BreakLock = Annotated[bool, typer.Option("--break-lock", help="remove a lock left by a run that is gone")]


def up_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    no_gates: Annotated[bool, typer.Option("--no-gates", help="do not run the gates after boot")] = False,
    accept_new: AcceptNew = False,
    break_lock: BreakLock = False,
    config_drafter: Annotated[bool, typer.Option(
        "--config-drafter", help="boot the config file's drafter, not one `swap-drafter --no-write` left active "
                                 "(and forget that one)")] = False,
    timings: Annotated[bool, typer.Option("--timings", help="print where the time went (each pre-flight question, "
                                                             "the boot's steps) on stderr at the end")] = False,
) -> None:
    """Preflight, sync the drafter, start every rank (followers, then head), wait, check parity and gates.

    On any failure or Ctrl-C every container this run started is stopped and removed on every node. A
    stack already running this deployment is "already up" only once its gates passed for this boot (run
    now when the journal holds no verdict for it; a failure stops it, exit 1). After the gates, every rank
    is watched for gates.settle_s before "serving" (a rank dying then: exit 3; --no-gates: no settle window
    either). A drafter that `swap-drafter --no-write` left active for this config is kept, and `up` says so."""
    from sparkserve.deploy import timings as tm

    tm.reset()
    try:
        _up_run(config, json_out, no_gates, accept_new, break_lock, config_drafter)
    finally:
        if timings:
            print(tm.report(), file=sys.stderr)


def _up_run(config: Path | None, json_out: bool, no_gates: bool, accept_new: bool, break_lock: bool,
            config_drafter: bool) -> None:
    from sparkserve.deploy.active_drafter import forget, kept_drafter
    from sparkserve.deploy.timings import span
    from sparkserve.nodes.factory import closing_nodes, connect_nodes

    with span("config"):
        cfg = config_from(config, accept_new=accept_new, check=True, replicas=True)
    with Progress(enabled=not json_out) as p:
        if config_drafter:
            forget(cfg)
            run_cfg = cfg
        else:
            run_cfg, kept = kept_drafter(cfg)
            if kept is not None:
                p.say(f"drafter: keeping {kept.path} ({kept.digest[:12]}), which `swap-drafter --no-write` left "
                      f"active at {kept.time[:19]}; the config names {cfg.drafter.path} (`up --config-drafter` "
                      "boots that one)")
        with span("connect"):
            nodes = connect_nodes(run_cfg, meanwhile=_import_up)
        with closing_nodes(nodes):
            from sparkserve.deploy.sync import progress_to
            from sparkserve.deploy.up import up
            from sparkserve.nodes.hf_models import resolve_target

            with progress_to(p.copy):
                with span("model"):
                    run_cfg = resolve_target(run_cfg, nodes)  # org/name[@rev]: the same snapshot on every node
                if str(run_cfg.model.target) != str(cfg.model.target):
                    p.say(f"model: {cfg.model.target} is {run_cfg.model.target} on every node")
                if run_cfg.replicas > 1:  # N stacks behind vllm-router (commands/replicas.py prints and exits)
                    from sparkserve.commands.replicas import up_fleet

                    return up_fleet(run_cfg, nodes, p, json_out=json_out, run_gates=not no_gates,
                                    break_lock=break_lock)
                result = up(run_cfg, nodes, run_gates=not no_gates, break_lock=break_lock, say=p.say,
                            on_update=p.boot)
    if json_out:
        emit_json(result.to_json())
        return
    if result.status == "unchanged":
        judged = "" if result.gates is None else " — gates passed for this boot"
        print(f"already up: {result.api_url} serves {result.served_name} (deployment {result.fingerprint[:12]})"
              f"{judged}")
    else:
        boot = f" in {result.boot_seconds:.1f}s" if result.boot_seconds is not None else ""
        gates = "" if result.gates is None else " — all gates passed"
        print(f"{result.status}: {result.served_name} serving at {result.api_url}{boot}{gates}")
    from sparkserve.deploy.serving import usage_example

    print(usage_example(run_cfg, result.api_url))


def _import_up() -> None:
    """What `up` runs once its nodes are connected — the deploy stage and docker's SDK, a few tenths of a
    second of imports — imported while they connect (nodes.factory.open_nodes' ``meanwhile``).

    Then every object there is (modules, classes, the config) is frozen out of the cyclic garbage
    collector: they live until the process ends, and each full collection (one at exit) would walk them
    all again — about 0.1 s of the `up` a person waits for."""
    import gc

    import sparkserve.deploy.sync
    import sparkserve.deploy.up
    import sparkserve.nodes.docker_client  # noqa: F401

    gc.freeze()


def down_cmd(config: ConfigOpt = None, json_out: JsonOpt = False, accept_new: AcceptNew = False,
             break_lock: BreakLock = False) -> None:
    """Stop (gracefully) and remove every sparkserve container on every node; logs are saved first.

    A node that cannot be reached is named and the others are still taken down (exit 3)."""
    from sparkserve.deploy.stack import DOWN_LEFT, down, unreachable_error
    from sparkserve.nodes.factory import open_reachable

    cfg = config_from(config, accept_new=accept_new, replicas=True)
    if cfg.replicas > 1:  # the router first, then every replica
        from sparkserve.commands.replicas import down_fleet

        with Progress(enabled=not json_out) as p:
            return down_fleet(cfg, p, json_out=json_out, break_lock=break_lock)
    with Progress(enabled=not json_out) as p, open_reachable(cfg) as (nodes, unreachable):
        result = down(cfg, nodes, unreachable=unreachable, break_lock=break_lock, say=p.say)
    if json_out:
        emit_json(result.to_json())
    elif result.removed:
        what = "container(s)" if cfg.runtime == "docker" else "engine process group(s)"
        print(f"down: removed {sum(len(v) for v in result.removed.values())} {what}; logs in {result.logs}")
    else:
        print("down: nothing was running" + (" on the nodes it could reach" if result.unreachable else ""))
    if result.unreachable:
        raise unreachable_error(result.unreachable, DOWN_LEFT)


def status_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    accept_new: AcceptNew = False,
    watch: Annotated[float | None, typer.Option(
        "--watch", min=1.0, help="redraw every SECONDS until Ctrl-C (which exits 0)", metavar="SECONDS")] = None,
) -> None:
    """What runs where: every node's containers, the drafter serving, the API.

    Shows since when the stack serves, the model, the drafter serving (path, digest, and whether it is the
    config's), the image and the endpoint, and the supervisor's last verdict when one runs for this deployment
    (asked at supervise.listen: phase, last round, failing checks, last incident). Exit 1 when the stack is not
    fully up or the supervisor reports a failure; 3 when a node cannot be reached (the others are still shown)."""
    from sparkserve.deploy.stack import STATUS_LEFT, unreachable_error

    cfg = config_from(config, accept_new=accept_new, replicas=True)
    if cfg.replicas > 1:  # replicas: [...] and router: {url, policy, workers}
        from sparkserve.commands.replicas import refuse, status_fleet

        if watch is not None:
            refuse(cfg, "status --watch")
        return status_fleet(cfg, json_out=json_out)
    if watch is not None:
        _watch(cfg, watch, json_out)
        return
    from sparkserve.operate.supervisor_view import supervisor_view, view_lines

    st, serving = _status_once(cfg)
    sup = supervisor_view(cfg)
    if json_out:
        emit_json({**st.to_json(), "serving": serving.to_json() if serving else None, "supervisor": sup})
    else:
        _print_status(cfg, st, serving)
        print("\n".join(view_lines(sup)))
    if st.unreachable:
        raise unreachable_error(st.unreachable, STATUS_LEFT)
    if not st.ok or sup.get("failing_now"):
        raise typer.Exit(1)


def _status_once(cfg: Config) -> tuple[StackStatus, Serving | None]:
    from sparkserve.deploy.serving import serving
    from sparkserve.deploy.stack import status
    from sparkserve.nodes.factory import open_reachable

    with open_reachable(cfg) as (nodes, unreachable):
        st = status(cfg, nodes, unreachable=unreachable)
        return st, serving(cfg, nodes) if cfg.head.name in nodes else None


def _watch(cfg: Config, every: float, json_out: bool) -> None:
    """``status`` again every ``every`` seconds (a live view on a terminal) until Ctrl-C: exit 0."""
    import json

    from rich.live import Live

    from sparkserve.commands.jsonschema import JSON_SCHEMA

    live = Live(console=console, auto_refresh=False) if console.is_terminal and not json_out else None
    try:
        if live is not None:
            live.start()
        while True:
            st, serving = _status_once(cfg)
            if json_out:  # one compact document per line (JSON Lines), "schema" in each
                doc = {"schema": JSON_SCHEMA, **st.to_json(), "serving": serving.to_json() if serving else None}
                sys.stdout.write(json.dumps(doc, default=str) + "\n")
                sys.stdout.flush()
            elif live is not None:
                live.update(_status_renderable(cfg, st, serving), refresh=True)
            else:
                print(time.strftime("%H:%M:%S"))
                _print_status(cfg, st, serving)
                sys.stdout.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        return
    finally:
        if live is not None:
            live.stop()


def status_lines(cfg: Config, st: StackStatus, serving: Serving | None) -> list[str]:
    """`status` for people, as plain lines: never a table column that cuts a name or an ID (piped, or at
    80 columns, a line wraps instead), one name per ID ("deployment"), the API once, this boot's verdict."""
    from sparkserve.deploy.serving import human_duration, human_time

    rows: list[tuple[str, ...]] = []
    for n in cfg.nodes:
        if n.name in st.unreachable:
            rows.append((n.name, "-", "-", "unreachable", "-"))
        cs = st.nodes.get(n.name)
        if cs == []:
            rows.append((n.name, "-", "-", "none", "-"))
        for c in cs or []:
            rows.append((n.name, f"rank {c.rank}" if c.rank is not None else "rank ?", c.role or "-", c.status,
                         f"{c.name} (id {c.id})"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0] * 4
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    if st.deployments:
        verdict = {True: "gates passed for this boot", False: "gates FAILED for this boot",
                   None: "gates not judged for this boot (`sparkserve gates`)"}[st.gates]
        lines.append(f"deployment {', '.join(st.deployments)} · {verdict}")
    endpoint = serving.endpoint if serving is not None else st.api.url.rstrip("/") + "/v1"
    lines.append(f"api {endpoint}: " + (f"serving {', '.join(st.api.models or [])}" if st.api.serving
                                        else "not serving"))
    if serving is not None:
        digest = serving.drafter_digest[:12] if serving.drafter_digest else "digest not in the journal"
        if serving.differs:
            which = f" — NOT the config's drafter ({serving.config_drafter})"
        elif serving.differs is False:
            which = " (the config's)"
        else:
            which = ""
        lines += [f"up {human_duration(serving.uptime_s)} (since {human_time(serving.started_at)})",
                  f"model {serving.model} ({serving.target})",
                  f"drafter {serving.drafter_path or '?'} ({digest}){which}",
                  f"image {serving.image_ref} ({serving.image_id or '?'})"]
    return lines


def _status_renderable(cfg: Config, st: StackStatus, serving: Serving | None) -> object:
    from rich.console import Group
    from rich.text import Text

    return Group(*(Text(x) for x in status_lines(cfg, st, serving)))


def _print_status(cfg: Config, st: StackStatus, serving: Serving | None) -> None:
    for line in status_lines(cfg, st, serving):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def doctor_cmd(config: ConfigOpt = None, json_out: JsonOpt = False, accept_new: AcceptNew = False,
               drift: Annotated[bool, typer.Option(
                   "--drift", help="also diff every node's host (kernel, driver, CX-7 firmware, iommu, swappiness, "
                                   "earlyoom, /dev/shm, NCCL) against the last boot whose gates passed")] = False,
               ) -> None:
    """ssh, docker, disk, UMA memory headroom, ports, stale containers, paths, CX-7 fabric, forensics — every node.

    Every node it can reach is checked in full; the others are reported. Exit 1 when a check fails; 3 when
    a node (its ssh or its docker) cannot be reached. --json prints one document in every case."""
    from sparkserve.deploy.doctor import as_json, check_all, drift_checks, unreachable_checks
    from sparkserve.nodes.factory import open_reachable
    from sparkserve.nodes.hf_models import is_hf_target, resolve_target
    from sparkserve.plan.replicas import replicas_of

    cfg = config_from(config, accept_new=accept_new, replicas=True)
    with open_reachable(cfg) as (nodes, unreachable):
        if is_hf_target(cfg) and not unreachable:
            cfg = resolve_target(cfg, nodes)
        hosts: dict = {}
        checks = []
        for r in replicas_of(cfg):  # each replica is one stack (its head, its ports, its copies compared)
            checks += check_all(r.cfg, {k: v for k, v in nodes.items() if k in r.nodes}, None, check_ports=True,
                                unreachable={k: v for k, v in unreachable.items() if k in r.nodes}, host_out=hosts,
                                storage=True)
        from sparkserve.operate.pyspy import forensics_checks

        checks += forensics_checks(cfg, nodes)  # will an incident hold Python stacks on each node?
        if drift:
            checks += drift_checks(cfg, hosts)
    out = as_json(checks)
    if json_out:
        emit_json(out)
    else:
        from rich.table import Table

        t = Table(title="sparkserve doctor")
        for col in ("node", "check", "", "detail"):
            t.add_column(col, overflow="fold")
        for c in checks:
            mark = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}[c.status]
            t.add_row(c.node, c.name, mark, c.detail)
        console.print(t)
    cut_off = unreachable_checks(checks)
    if cut_off:
        first, *others = cut_off
        raise RemoteFailure(f"{first.node}: {first.name}", first.detail, node=first.node, step=first.name,
                            details=[f"also unreachable: {c.node}: {c.name}: {c.detail}" for c in others])
    if not out["ok"]:
        raise typer.Exit(1)


def swap_drafter_cmd(
    path: Annotated[Path, typer.Argument(help="the new drafter directory (on this machine)")],
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    break_lock: BreakLock = False,
    accept_new: AcceptNew = False,
    no_write: Annotated[bool, typer.Option(
        "--no-write", help="leave the config file as it is: the journal keeps the new drafter active for it, "
                           "and `up` keeps it")] = False,
) -> None:
    """Validate PATH, sync it to every node, restart with the new bind mount, run the gates; roll back
    to the drafter that was serving if anything fails.

    After a swap the config file names the new drafter (drafter.path on the nodes, drafter.source here),
    comments kept — or, with --no-write or no config file, the journal does and `up` keeps it.
    With replicas: N it rolls: one replica at a time out of the router, drained, swapped, gated, back in; the
    first that fails rolls back and stops the rollout, named.
    Exit 0 swapped · 1 swap failed, rolled back (the previous drafter serves) · 2 bad drafter (nothing
    changed) · 4 ROLLBACK FAILED: nothing runs on any node."""
    from sparkserve.deploy.active_drafter import remember, write_config_drafter
    from sparkserve.deploy.swap import swap_drafter
    from sparkserve.deploy.sync import progress_to
    from sparkserve.nodes.factory import open_nodes
    from sparkserve.nodes.hf_models import resolve_target

    cfg = config_from(config, accept_new=accept_new, replicas=True)
    from sparkserve.deploy.rolling import rolling_swap

    swap = rolling_swap if cfg.replicas > 1 else swap_drafter  # replicas: one at a time behind the router
    with Progress(enabled=not json_out) as p, open_nodes(cfg) as nodes, progress_to(p.copy):
        result = swap(resolve_target(cfg, nodes), nodes, path, break_lock=break_lock, say=p.say)
    kept = None
    if result.ok and result.drafter_path and result.drafter_digest and not result.unchanged:
        source = path.expanduser().resolve()
        file = find_config_path(config)
        if no_write or file is None:
            remember(cfg, result.drafter_path, str(source), result.drafter_digest)
            why = "--no-write" if no_write else "no config file to write (the embedded default)"
            kept = (f"{why}: the journal keeps {result.drafter_path} active for this config; `up` keeps it "
                    "(`up --config-drafter` boots the config's)")
        else:
            write_config_drafter(file, result.drafter_path, source)
            kept = f"{file}: drafter.path is now {result.drafter_path}, drafter.source {source} (comments kept)"
            if any(k.startswith("SPARKSERVE_DRAFTER") for k in _env()):
                kept += "; SPARKSERVE_DRAFTER__* in the environment still overrides the file"
    if json_out:
        emit_json({**result.to_json(), "kept": kept})
    elif result.unchanged:
        print(result.message)
    elif result.ok:
        print(result.message if cfg.replicas > 1 else f"swapped: {cfg.model.served_name} now drafts with "
              f"{result.drafter_path} ({(result.drafter_digest or '')[:12]})")
        print(kept)
    else:
        print(result.message)
    if not result.ok and not result.rolled_back:
        raise RollbackFailed("swap-drafter", result.message)
    if not result.ok:
        raise GateFailed("swap-drafter", result.message)


def _env() -> list[str]:
    import os

    return list(os.environ)


def register(app: typer.Typer) -> None:
    app.command("up")(up_cmd)
    app.command("down")(down_cmd)
    app.command("status")(status_cmd)
    app.command("doctor")(doctor_cmd)
    app.command("swap-drafter")(swap_drafter_cmd)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the sparkserve command")
