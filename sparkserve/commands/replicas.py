"""`up`, `down`, `status` with ``replicas`` > 1: the fleet behind vllm-router (deploy/replicas.py). No command of
its own: commands/deploy.py hands a multi-replica config here, so each command keeps its one name and options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from sparkserve.commands._common import console, emit_json
from sparkserve.config import Config
from sparkserve.errors import BadInput

if TYPE_CHECKING:
    from sparkserve.commands.progress import Progress
    from sparkserve.nodes.base import Node


def _print(line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def up_fleet(cfg: Config, nodes: dict[str, Node], p: Progress, *, json_out: bool, run_gates: bool,
             break_lock: bool) -> None:
    """Prints the fleet's outcome; exit 0 when every replica serves, else the first failed replica's code while
    the endpoint serves the others (said on stdout: "serving K of N")."""
    from sparkserve.deploy.replicas import up_replicas
    from sparkserve.deploy.serving import usage_example

    fleet = up_replicas(cfg, nodes, run_gates=run_gates, break_lock=break_lock, say=p.say)
    if json_out:
        emit_json(fleet.to_json())
    else:
        for o in fleet.replicas:
            what = (f"{o.result.status}, gates {'passed' if o.result.gates is not None else 'not run'}"
                    if o.result else f"LEFT OUT — {o.error.line() if o.error else '?'}")
            _print(f"replica {o.index} ({', '.join(o.nodes)}) {o.api_url}: {what}")
        gate = f" — router gate: {fleet.gate.reason()}" if fleet.gate else ""
        _print(f"serving {len(fleet.serving)} of {len(fleet.replicas)} replicas at {fleet.router['url']} "
               f"({fleet.router['policy']}){gate}")
        _print(usage_example(cfg, fleet.router["url"]))
    if fleet.exit_code:
        raise typer.Exit(fleet.exit_code)


def down_fleet(cfg: Config, p: Progress, *, json_out: bool, break_lock: bool) -> None:
    from sparkserve.deploy.replicas import down_replicas
    from sparkserve.deploy.stack import DOWN_LEFT, unreachable_error
    from sparkserve.nodes.factory import open_reachable

    with open_reachable(cfg) as (nodes, unreachable):
        result = down_replicas(cfg, nodes, unreachable=unreachable, break_lock=break_lock, say=p.say)
    doc = result.to_json()
    if json_out:
        emit_json(doc)
    else:
        n = sum(len(v) for v in doc["removed"].values())
        router = f"router pid {result.router.pid} stopped" if result.router else "no router was running"
        _print(f"down: {router}; removed {n} rank(s) on {len(doc['removed'])} node(s) of {len(result.replicas)} "
               "replicas")
    if unreachable:
        raise unreachable_error(unreachable, DOWN_LEFT)


def status_fleet(cfg: Config, *, json_out: bool) -> None:
    """Exit 1 unless the router runs with every replica serving in it; 3 when a node cannot be reached."""
    from sparkserve.deploy.replicas import status_replicas
    from sparkserve.deploy.stack import STATUS_LEFT, unreachable_error
    from sparkserve.nodes.factory import open_reachable
    from sparkserve.operate.supervisor_view import supervisor_view, view_lines

    with open_reachable(cfg) as (nodes, unreachable):
        doc: dict[str, Any] = status_replicas(cfg, nodes, unreachable=unreachable)
    doc["supervisor"] = supervisor_view(cfg)  # per-replica verdicts when `supervise` watches this fleet
    if json_out:
        emit_json(doc)
    else:
        r = doc["router"]
        _print(f"router {r['url']} ({r['policy']}): " + (f"running, pid {r['pid']}, {len(r['workers'])} worker(s)"
                                                         if r["running"] else "NOT running"))
        for rep in doc["replicas"]:
            ranks = "; ".join(f"{node}: " + (", ".join(f"rank {c['rank']} {c['status']}" for c in cs) or "none")
                              for node, cs in rep["ranks"].items())
            _print(f"replica {rep['replica']} {rep['api_url']}: {'serving' if rep['serving'] else 'NOT serving'}, "
                   f"gates {rep['gates']}, {'in' if rep['in_router'] else 'NOT in'} the router — {ranks}")
        _print(f"serving {doc['serving']} of {doc['of']} replicas")
        _print("\n".join(view_lines(doc["supervisor"])))
    if unreachable:
        raise unreachable_error(unreachable, STATUS_LEFT)
    if not doc["ok"] or doc["supervisor"].get("failing_now"):
        raise typer.Exit(1)


def refuse(cfg: Config, command: str) -> None:
    """A command that does not know replicas yet: refused, naming the way that works (nothing touched)."""
    if cfg.replicas > 1:
        raise BadInput("replicas", f"`{command}` is not replica-aware yet (replicas: {cfg.replicas}); run it with a "
                       "config that holds one replica's nodes and replicas: 1")
