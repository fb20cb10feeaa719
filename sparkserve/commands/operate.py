"""`supervise`, `dashboard grafana`, `service install|uninstall|status`: day 2 — parse, call sparkserve.operate,
print. The operate modules are imported inside each command (`sparkserve --help` stays fast)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from sparkserve.commands._common import AcceptNew, ConfigOpt, JsonOpt, config_from, emit_json
from sparkserve.config import find_config_path
from sparkserve.errors import BadInput, GateFailed

if TYPE_CHECKING:
    from sparkserve.config import Config
    from sparkserve.nodes.base import Node

ScopeOpt = Annotated[str, typer.Option("--scope", help="user (~/.config/systemd/user) or system (/etc/systemd)")]
UnitDirOpt = Annotated[Path | None, typer.Option("--unit-dir", help="write the unit here instead (no systemctl)")]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def supervise_cmd(
    config: ConfigOpt = None,
    once: Annotated[bool, typer.Option("--once", help="one round of checks, print the verdicts, exit 0 (all pass) "
                                                      "or 1")] = False,
    up_first: Annotated[bool, typer.Option("--up", help="bring the stack up first (`up`, idempotent: a stack "
                                                        "already serving this deployment is left alone)")] = False,
    json_out: JsonOpt = False,
    accept_new: AcceptNew = False,
) -> None:
    """Keep the stack serving: canary generations, /metrics progress, ranks, logs, kernel, memory, acceptance.

    Runs in the foreground. On a fault it writes an incident directory (py-spy dump of every rank, last log
    lines, /metrics, memory, the verdict), alerts, and restarts through the normal `up` path with
    exponential backoff — at most supervise.max_restarts in supervise.budget_window_s, then it stops every
    rank, alerts loudly and exits 1. SIGTERM or Ctrl-C stops watching and leaves the stack as it is (exit 0).
    The exporter and status page listen on supervise.listen."""
    from sparkserve.deploy.active_drafter import kept_drafter
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config, accept_new=accept_new, check=True, replicas=True)
    run_cfg, _ = kept_drafter(cfg)
    with open_nodes(run_cfg) as nodes:
        from sparkserve.nodes.hf_models import resolve_target
        from sparkserve.operate.exporter import serve

        run_cfg = resolve_target(run_cfg, nodes)
        path = find_config_path(config)
        assert path is not None  # config_from refused a run without a config file
        sup = _supervisor(run_cfg, nodes, path.resolve(), up_first=up_first)
        if once:
            _once(sup, json_out)
            return
        server = serve(sup.state, run_cfg.supervise.listen, refresh_s=run_cfg.supervise.interval_s) \
            if run_cfg.supervise.listen else None
        if server is not None:
            host, port = server.server_address[:2]
            _say(f"supervise: status page and /metrics at http://{host}:{port}/")
        try:
            code = sup.run()
        finally:
            if server is not None:
                server.shutdown()
        if code == 0:  # stopped by a signal: leave now, without waiting for a round's work still in flight (a
            sys.stdout.flush()  # canary at its deadline, a node program) — systemd's stop is prompt; the stack
            sys.stderr.flush()  # is left exactly as it is
            os._exit(0)
    if code:
        raise GateFailed("supervise", "gave up after the restart budget: every rank was stopped; read the "
                         "incidents, fix the cause, then `sparkserve up`")


def _supervisor(cfg: Config, nodes: dict[str, Node], path: Path, *, up_first: bool) -> Any:
    """The single-stack supervisor, or with ``replicas`` > 1 the fleet's (operate/fleet.py); `up` first when
    asked (idempotent: what already serves this deployment is left alone)."""
    if cfg.replicas > 1:
        from sparkserve.operate.fleet import FleetSupervisor

        if up_first:
            from sparkserve.deploy.replicas import up_replicas

            fleet = up_replicas(cfg, nodes, run_gates=True, say=_say)
            _say(f"supervise: serving {len(fleet.serving)} of {len(fleet.replicas)} replicas at {fleet.router['url']}")
        return FleetSupervisor(cfg, nodes, config_path=path, say=_say)
    from sparkserve.operate.loop import Supervisor

    if up_first:
        from sparkserve.deploy.up import up

        r = up(cfg, nodes, run_gates=True, say=_say)
        _say(f"supervise: {r.status}: {r.served_name} at {r.api_url}")
    return Supervisor(cfg, nodes, config_path=path, say=_say)


def _once(sup: Any, json_out: bool) -> None:
    """`supervise --once`: one round, every verdict printed (per replica, and the router's, for a fleet)."""
    from sparkserve.operate.checks import failing

    if hasattr(sup, "subs"):
        got, router = sup.round()
        groups = [(f"{s.label}: ", got.get(s.replica.index, [])) for s in sup.subs] + [("", [router])]
        doc = {"replicas": [{"replica": s.replica.index, "label": s.label, "ok": not failing(got.get(
            s.replica.index, [])), "verdicts": [v.to_json() for v in got.get(s.replica.index, [])]}
            for s in sup.subs], "router": router.to_json()}
    else:
        groups = [("", sup.round())]
        doc = {"verdicts": [v.to_json() for v in groups[0][1]]}
    bad = [(who, v) for who, vs in groups for v in failing(vs)]
    if json_out:
        emit_json({"ok": not bad, **doc})
    else:
        for who, vs in groups:
            for v in vs:
                mark = "PASS" if v.ok else "FAIL" if v.ok is False else "----"
                print(f"{mark}  {v.check:<10}  {who}{v.summary}")
    if bad:
        raise GateFailed("supervise", f"{len(bad)} check(s) failed: " + "; ".join(f"{w}{v.summary}" for w, v in bad))


def dashboard_grafana_cmd(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write here instead of stdout")] = None,
) -> None:
    """The Grafana dashboard JSON for supervise's series and vLLM's own (import it; pick your Prometheus)."""
    from sparkserve.operate.dashboard import dashboard_json

    text = dashboard_json()
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"dashboard written to {out}")


dashboard_app = typer.Typer(help="Dashboards for a supervised stack.", no_args_is_help=True)
dashboard_app.command("grafana")(dashboard_grafana_cmd)

service_app = typer.Typer(help="Run `supervise` as a systemd service (install, uninstall, status).",
                          no_args_is_help=True)


def _scope(s: str) -> Literal["user", "system"]:
    if s not in ("user", "system"):
        raise BadInput("--scope", f"{s!r} is neither user nor system")
    return "user" if s == "user" else "system"


def service_install_cmd(config: ConfigOpt = None, scope: ScopeOpt = "user", unit_dir: UnitDirOpt = None,
                        no_start: Annotated[bool, typer.Option("--no-start", help="enable, do not start")] = False,
                        ) -> None:
    """Write the unit for `supervise --up -c CONFIG`, reload systemd, enable and start it.

    Either scope brings the stack back after a reboot: --scope system (with sudo) runs as the sudo caller,
    after network-online.target and docker.service; --scope user waits for the nodes itself (`service wait`)
    and needs lingering, which it turns on (or says it could not)."""
    from sparkserve.operate.service import install

    path = find_config_path(config)
    if path is None:
        raise BadInput("--config", "the service needs a config file (-c sparkserve.yaml)")
    cfg = config_from(path, check=True, replicas=True)  # supervise knows replicas
    r = install(cfg, path, scope=_scope(scope), start=not no_start, dest=unit_dir, run_systemctl=unit_dir is None)
    print(f"service: wrote {r.path}" + (f"; systemctl {', '.join(r.systemctl)}" if r.systemctl else ""))
    if r.note:
        print(f"note: {r.note}")


def service_uninstall_cmd(scope: ScopeOpt = "user", unit_dir: UnitDirOpt = None) -> None:
    """Stop, disable and remove the unit (the stack itself is left as it is)."""
    from sparkserve.operate.service import uninstall

    r = uninstall(scope=_scope(scope), dest=unit_dir, run_systemctl=unit_dir is None)
    print(f"service: removed {r.path}")


def service_status_cmd(scope: ScopeOpt = "user", unit_dir: UnitDirOpt = None) -> None:
    """Whether the unit is installed, and what systemd says about it (exit 1 when not installed)."""
    from sparkserve.operate.service import status

    installed, text = status(scope=_scope(scope), dest=unit_dir)
    print(text)
    if not installed:
        raise typer.Exit(1)


def service_wait_cmd(config: ConfigOpt = None, timeout: Annotated[float, typer.Option(
        "--timeout", help="give up after this many seconds (exit 3)")] = 600.0) -> None:
    """Wait until every node's SSH port (and a local node's docker API) answers: a user unit's ExecStartPre,
    since a user manager cannot order itself after network-online.target or docker.service."""
    from sparkserve.operate.service import wait_for_nodes

    path = find_config_path(config)
    if path is None:
        raise BadInput("--config", "no config file (-c sparkserve.yaml)")
    waited = wait_for_nodes(config_from(path, check=True, replicas=True), timeout_s=timeout, say=print)
    print(f"service: every node answers (after {waited:.0f}s)")


service_app.command("install")(service_install_cmd)
service_app.command("wait")(service_wait_cmd)
service_app.command("uninstall")(service_uninstall_cmd)
service_app.command("status")(service_status_cmd)


def register(app: typer.Typer) -> None:
    app.command("supervise")(supervise_cmd)
    app.add_typer(dashboard_app, name="dashboard")
    app.add_typer(service_app, name="service")
