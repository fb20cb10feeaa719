"""`up`, `down`, `status`, `doctor`, `swap-drafter`: parse, open the nodes, call one deploy function, print.

Nodes are opened here, by the commands layer, with :func:`sparkserve.nodes.factory.open_nodes`; every
deploy function takes them open.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from sparkserve.commands._common import AcceptNew, ConfigOpt, JsonOpt, config_from, console, emit_json, err_console
from sparkserve.config import Config
from sparkserve.deploy.stack import DOWN_LEFT, STATUS_LEFT, StackStatus, down, status, unreachable_error
from sparkserve.deploy.swap import swap_drafter
from sparkserve.deploy.up import up
from sparkserve.deploy.wait import NodeView
from sparkserve.errors import GateFailed, RemoteFailure, RollbackFailed
from sparkserve.nodes.factory import open_nodes, open_reachable

BreakLock = Annotated[bool, typer.Option("--break-lock", help="remove a lock left by a run that is gone")]


def _say(json_out: bool):  # noqa: ANN202
    """The progress reporter deploy functions get: dim lines on stderr, nothing with --json."""
    def say(msg: str) -> None:
        if not json_out:
            err_console.print(f"[dim]·[/dim] {msg}", highlight=False)
    return say


class _BootView:
    """A live per-node table (phase, last log line, elapsed) on a terminal; phase changes otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.live: Live | None = None
        self.phases: dict[str, str] = {}

    def __enter__(self) -> _BootView:
        if self.enabled and err_console.is_terminal:
            self.live = Live(console=err_console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def update(self, views: list[NodeView], elapsed: float) -> None:
        if not self.enabled:
            return
        if self.live is not None:
            t = Table(title=f"booting — {elapsed:.0f}s", expand=True)
            for col in ("node", "rank", "phase", "free mem", "last log line"):
                t.add_column(col, overflow="ellipsis", no_wrap=col == "last log line")
            for v in views:
                mem = f"{v.available / 2**30:.1f} GiB" if v.available is not None else "-"
                t.add_row(v.node, str(v.rank), v.phase.value, mem, v.last_line)
            self.live.update(t)
            return
        for v in views:
            if self.phases.get(v.node) != v.phase.value:
                self.phases[v.node] = v.phase.value
                err_console.print(f"[dim]·[/dim] {v.node} (rank {v.rank}): {v.phase.value} after {elapsed:.1f}s",
                                  highlight=False)


def up_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    no_gates: Annotated[bool, typer.Option("--no-gates", help="do not run the gates after boot")] = False,
    accept_new: AcceptNew = False,
    break_lock: BreakLock = False,
) -> None:
    """Preflight, sync the drafter, start every rank (followers, then head), wait, check parity and gates.

    On any failure or Ctrl-C every container this run started is stopped and removed on every node. A
    stack already running this deployment is "already up" only once its gates passed for this boot (run
    now when the journal holds no verdict for it; a failure stops it, exit 1). After the gates, every rank
    is watched for gates.settle_s before "serving" (a rank dying then: exit 3)."""
    cfg = config_from(config, accept_new=accept_new, check=True)
    with open_nodes(cfg) as nodes, _BootView(not json_out) as view:
        result = up(cfg, nodes, run_gates=not no_gates, break_lock=break_lock, say=_say(json_out),
                    on_update=view.update)
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


def down_cmd(config: ConfigOpt = None, json_out: JsonOpt = False, accept_new: AcceptNew = False,
             break_lock: BreakLock = False) -> None:
    """Stop (gracefully) and remove every sparkserve container on every node; logs are saved first.

    A node that cannot be reached is named and the others are still taken down (exit 3)."""
    cfg = config_from(config, accept_new=accept_new)
    with open_reachable(cfg) as (nodes, unreachable):
        result = down(cfg, nodes, unreachable=unreachable, break_lock=break_lock, say=_say(json_out))
    if json_out:
        emit_json(result.to_json())
    elif result.removed:
        print(f"down: removed {sum(len(v) for v in result.removed.values())} container(s); logs in {result.logs}")
    else:
        print("down: nothing was running" + (" on the nodes it could reach" if result.unreachable else ""))
    if result.unreachable:
        raise unreachable_error(result.unreachable, DOWN_LEFT)


def status_cmd(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    """What runs where: every node's sparkserve containers (liveness per node) and the head's API.

    Exit 1 when the stack is not fully up; 3 when a node cannot be reached (the others are still shown)."""
    cfg = config_from(config)
    with open_reachable(cfg) as (nodes, unreachable):
        st = status(cfg, nodes, unreachable=unreachable)
    if json_out:
        emit_json(st.to_json())
    else:
        _print_status(cfg, st)
    if st.unreachable:
        raise unreachable_error(st.unreachable, STATUS_LEFT)
    if not st.ok:
        raise typer.Exit(1)


def _print_status(cfg: Config, st: StackStatus) -> None:
    t = Table(title="sparkserve status")
    for col in ("node", "container", "rank", "role", "status", "deployment", "image"):
        t.add_column(col)
    for n in cfg.nodes:
        if n.name in st.unreachable:
            t.add_row(n.name, "?", "-", "-", "[red]unreachable[/red]", "-", "-")
        cs = st.nodes.get(n.name)
        if cs == []:
            t.add_row(n.name, "-", "-", "-", "[red]none[/red]", "-", "-")
        for c in cs or []:
            color = "green" if c.status == "running" else "red"
            t.add_row(n.name, c.name, str(c.rank), c.role, f"[{color}]{c.status}[/{color}]", c.deployment,
                      c.image_id)
    console.print(t)
    print(f"api {st.api.url}: {'serving' if st.api.serving else 'not serving'}")


def doctor_cmd(config: ConfigOpt = None, json_out: JsonOpt = False, accept_new: AcceptNew = False) -> None:
    """ssh, docker, disk, UMA memory headroom, ports, stale containers, paths, CX-7 fabric — every node.

    Exit 1 when a check fails; 3 when a node (its ssh or its docker) cannot be reached: every node that
    can be is still checked."""
    from sparkserve.deploy.doctor import as_json, check_all, unreachable_checks

    cfg = config_from(config, accept_new=accept_new)
    with open_reachable(cfg) as (nodes, unreachable):
        checks = check_all(cfg, nodes, None, check_ports=True, unreachable=unreachable)
    out = as_json(checks)
    if json_out:
        emit_json(out)
    else:
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
) -> None:
    """Validate PATH, sync it to every node, restart with the new bind mount, run the gates; roll back
    to the drafter that was serving if anything fails.

    Exit 0 swapped · 1 swap failed, rolled back (the previous drafter serves) · 2 bad drafter (nothing
    changed) · 4 ROLLBACK FAILED: nothing runs on any node."""
    cfg = config_from(config)
    with open_nodes(cfg) as nodes:
        result = swap_drafter(cfg, nodes, path, break_lock=break_lock, say=_say(json_out))
    if json_out:
        emit_json(result.to_json())
    else:
        print(result.message)
    if not result.ok and not result.rolled_back:
        raise RollbackFailed("swap-drafter", result.message)
    if not result.ok:
        raise GateFailed("swap-drafter", result.message)


def register(app: typer.Typer) -> None:
    app.command("up")(up_cmd)
    app.command("down")(down_cmd)
    app.command("status")(status_cmd)
    app.command("doctor")(doctor_cmd)
    app.command("swap-drafter")(swap_drafter_cmd)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the sparkserve command")
