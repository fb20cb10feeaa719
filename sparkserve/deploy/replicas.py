"""`replicas: N`: N copies of the stack behind vLLM's router — `up`, `down` and `status` of the fleet.

    with open_nodes(cfg) as nodes:
        fleet = up_replicas(cfg, nodes)   # same engine everywhere → every replica's `up` at once → router → gate

Each replica is brought up by :func:`sparkserve.deploy.up.up` exactly as a single stack is (its own preflight,
followers then head, gates, settle, journal rows, head lock), all replicas at once. The router (``vllm-router``,
nodes/router.py) then starts on this machine with exactly the replicas whose gates passed, and the router gate
sends requests through it that must reach every one of them (counted on each replica's own /metrics). A replica
that failed was torn down by its own `up` and is named; the endpoint serves when at least one passed, and the
exit code is then that replica's failure's (1 gate, 3 remote; docs/reference/exit-codes). A failure of the router
or its gate, or Ctrl-C, stops the router and every replica this run started: nothing is left half-done.
`down` stops the router first, then every replica.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from typing import Any

from sparkserve import interrupts
from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy.stack import DownResult, down, status
from sparkserve.deploy.teardown import Reporter, interrupted_what, quiet
from sparkserve.deploy.up import UpResult, up
from sparkserve.deploy.wait import NodeView
from sparkserve.errors import GateFailed, RemoteFailure, SparkserveError
from sparkserve.image.on_nodes import ensure_same_engine
from sparkserve.measure.router_reach import RouterGate, router_gate
from sparkserve.nodes.base import Node
from sparkserve.nodes.router import (
    ROUTER_VERSION,
    RouterAPI,
    RouterProcess,
    router_executable,
    running,
    start_router,
    stop_router,
)
from sparkserve.plan.replicas import Replica, replicas_of, router_argv, router_url


@dataclass
class ReplicaOutcome:
    """One replica's `up`: its result, or the error that stopped it (its own `up` tore it down)."""

    index: int
    nodes: list[str]
    api_url: str
    result: UpResult | None = None
    error: SparkserveError | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and self.error is None

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"replica": self.index, "nodes": self.nodes, "api_url": self.api_url, "ok": self.ok,
                "status": r.status if r else "failed",
                "gates": ("passed" if r.gates is not None else "not run") if r else "failed",
                "fingerprint": r.fingerprint if r else None,
                "error": self.error.line() if self.error else None,
                "exit_code": self.error.exit_code if self.error else 0}


@dataclass
class FleetUp:
    """What `up` left serving: every replica's outcome, the router (url, policy, argv, pid) and its gate."""

    replicas: list[ReplicaOutcome]
    router: dict[str, Any] = field(default_factory=dict)
    gate: RouterGate | None = None

    @property
    def serving(self) -> list[int]:
        return [o.index for o in self.replicas if o.ok]

    @property
    def exit_code(self) -> int:
        """0 when every replica serves; else the first failed replica's own code (the endpoint serves)."""
        return next((o.error.exit_code for o in self.replicas if o.error is not None), 0)

    def to_json(self) -> dict[str, Any]:
        return {"replicas": [o.to_json() for o in self.replicas], "router": self.router,
                "router_gate": self.gate.to_json() if self.gate else None,
                "serving": len(self.serving), "of": len(self.replicas), "exit_code": self.exit_code}


def _sub(nodes: dict[str, Node], r: Replica) -> dict[str, Node]:
    return {n: nodes[n] for n in r.nodes if n in nodes}


def _prefixed(say: Reporter, r: Replica) -> Reporter:
    return lambda line: say(f"{r.name}: {line}")


def _stop_check(views: list[NodeView], elapsed: float) -> None:
    """The boot watcher of every replica's wait: an interrupt the main thread received ends the wait (the
    replica's own `up` then tears down what it started)."""
    if interrupts.stopping():
        raise interrupts.Interrupted(signal.SIGINT)


def up_replicas(cfg: Config, nodes: dict[str, Node], *, run_gates: bool = True, break_lock: bool = False,
                say: Reporter = quiet) -> FleetUp:
    """Every replica up at once, then the router with those that passed, then the router gate (module docstring).
    Raises the first replica's error (every replica's in its details) when none passed; GateFailed / RemoteFailure
    when the router or its gate fails (everything this run started was stopped)."""
    exe = router_executable(cfg.router.executable)  # BadInput (exit 2) before any node is touched
    reps = replicas_of(cfg)
    with interrupts.watching():
        try:
            # one image everywhere: replicas with different images would serve different answers behind one URL
            ensure_same_engine(cfg, [nodes[n.name] for n in cfg.nodes])
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) or interrupts.stopping():
                raise RemoteFailure("up", f"{interrupted_what()} before any replica was started; nothing to clean up",
                                    step="interrupted") from None
            raise
        outcomes = _boot_all(reps, nodes, run_gates=run_gates, break_lock=break_lock, say=say)
        fleet = FleetUp(outcomes)
        passed = [r for r, o in zip(reps, outcomes, strict=True) if o.ok]
        for o in outcomes:
            if o.error is not None:
                say(f"replica {o.index} ({', '.join(o.nodes)}) is left out: {o.error.line()}")
        if not passed:
            first = next(o.error for o in outcomes if o.error is not None)
            assert first is not None
            raise type(first)(first.where, f"no replica serves: {first.what}",
                              details=[o.error.line() for o in outcomes if o.error is not None][1:] + first.details)
        try:
            rebooted = [r for r, o in zip(reps, outcomes, strict=True) if o.result and o.result.status != "unchanged"]
            fleet.router = _router_up(cfg, exe, passed, say, rebooted=rebooted)
            if run_gates:
                fleet.gate = _router_gate(cfg, passed, say)
        except BaseException as e:
            _stop_everything(cfg, nodes, passed, say, why="the router failed" if not interrupts.stopping()
                             else interrupted_what())
            if isinstance(e, KeyboardInterrupt) or interrupts.stopping():
                raise RemoteFailure("up", f"{interrupted_what()}; the router and every replica this run started were "
                                    "stopped", step="interrupted") from None
            raise
    say(f"serving {len(passed)} of {len(reps)} replicas through {fleet.router['url']}")
    return fleet


def _boot_all(reps: list[Replica], nodes: dict[str, Node], *, run_gates: bool, break_lock: bool,
              say: Reporter) -> list[ReplicaOutcome]:
    """Every replica's `up` in its own thread. Ctrl-C in the main thread ends every boot's wait (each replica's
    `up` tears down what it started); a replica that came up meanwhile is taken down here."""
    outcomes = [ReplicaOutcome(r.index, r.nodes, r.api_url) for r in reps]

    def one(i: int) -> None:
        r = reps[i]
        try:
            outcomes[i].result = up(r.cfg, _sub(nodes, r), run_gates=run_gates, break_lock=break_lock,
                                    say=_prefixed(say, r), on_update=_stop_check)
        except SparkserveError as e:
            outcomes[i].error = e
        except BaseException as e:  # noqa: BLE001 — reported as this replica's failure, never lost
            outcomes[i].error = RemoteFailure(r.name, f"{type(e).__name__}: {e}", step="up")

    say(f"starting {len(reps)} replicas at once: " + "; ".join(f"{r.name} on {', '.join(r.nodes)}" for r in reps))
    pool = ThreadPoolExecutor(max_workers=len(reps), thread_name_prefix="replica")
    futures: list[Future[None]] = [pool.submit(one, i) for i in range(len(reps))]
    try:
        wait_all(futures)
    except KeyboardInterrupt:
        with interrupts.deferred():
            say(f"{interrupted_what()}: stopping every replica's boot")
            wait_all(futures)
            _stop_everything(reps[0].cfg, nodes, [r for r, o in zip(reps, outcomes, strict=True) if o.ok], say,
                             why=interrupted_what(), router=False)
        raise RemoteFailure("up", f"{interrupted_what()}; every container this run started was stopped and removed",
                            step="interrupted") from None
    finally:
        pool.shutdown(wait=True)
    return outcomes


def _router_up(cfg: Config, exe: str, passed: list[Replica], say: Reporter, *,
               rebooted: list[Replica]) -> dict[str, Any]:
    """The router with exactly ``passed`` as its workers: one already running with this very argv is kept (an
    `up` run again changes nothing), and each replica this run booted again is removed from it and added back
    (a fresh worker: no open breaker, no failed health checks left from its dead predecessor); any other router
    recorded on this port is stopped first. Returns once the router holds every replica as healthy."""
    argv = router_argv(cfg, [r.api_url for r in passed], exe=exe)
    url = router_url(cfg)
    have = running(cfg.router.port)
    if have is not None and have.argv == argv and _workers_are(url, [r.api_url for r in passed]):
        say(f"router: already running at {url} (pid {have.pid}) with these replicas; kept")
        proc: RouterProcess = have
        api = RouterAPI(url)
        for r in rebooted:
            api.remove_worker(r.api_url)
            api.add_worker(r.api_url)
            say(f"router: {r.name} booted again: re-added as a fresh worker")
    else:
        if stop_router(cfg.router.port) is not None:
            say("router: stopped the one running with other settings or replicas")
        say(f"router: starting vllm-router {ROUTER_VERSION} ({cfg.router.policy}) at {url} with "
            + ", ".join(f"{r.name} {r.api_url}" for r in passed))
        proc = start_router(argv, port=cfg.router.port, url=url)
    _until_healthy(url, [r.api_url for r in passed], timeout_s=cfg.router.health.interval_s * 3 + 10.0)
    return {"url": url, "policy": cfg.router.policy, "pid": proc.pid, "argv": argv, "log": proc.log,
            "workers": [r.api_url for r in passed]}


def restart_router(cfg: Config, serving: list[Replica], say: Reporter = quiet) -> dict[str, Any]:
    """The router started again with ``serving`` as its workers, through `up`'s own start (supervise restarts a
    dead or silent router this way)."""
    return _router_up(cfg, router_executable(cfg.router.executable), serving, say, rebooted=[])


def _until_healthy(url: str, want: list[str], *, timeout_s: float) -> None:
    """Until the router's own health checks hold every one of ``want`` healthy; RemoteFailure (step "router")
    naming those still unhealthy after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        workers = {str(w.get("url")): bool(w.get("is_healthy")) for w in RouterAPI(url).workers()}
        sick = [u for u in want if not workers.get(u)]
        if not sick:
            return
        if time.monotonic() > deadline:
            raise RemoteFailure("router", f"{', '.join(sick)} not healthy in the router after {timeout_s:g}s",
                                step="router")
        time.sleep(0.5)


def _workers_are(url: str, want: list[str]) -> bool:
    """The router answers and holds exactly ``want`` (a router that does not answer is replaced, not kept)."""
    try:
        return sorted(RouterAPI(url).urls()) == sorted(want)
    except RemoteFailure:
        return False


def _router_gate(cfg: Config, passed: list[Replica], say: Reporter) -> RouterGate:
    g = router_gate(router_url(cfg), {r.index: r.api_url for r in passed}, model=cfg.model.served_name,
                    api_key=resolve_api_key(cfg))
    say(f"gate router: {'ok' if g.ok else 'FAIL'} — {g.reason()}")
    if not g.ok:
        missed = ", ".join(f"replica {i}" for i in g.missed())
        raise GateFailed("gates", f"router: {g.reason()}" + (f"; never reached: {missed}" if missed else "") +
                         "; the router and every replica were stopped", details=g.failed[:5])
    return g


def _stop_everything(cfg: Config, nodes: dict[str, Node], reps: list[Replica], say: Reporter, *, why: str,
                     router: bool = True) -> None:
    """The router (when ``router``), then each of ``reps``, stopped and removed; errors are said, not raised."""
    with interrupts.deferred():
        if router and stop_router(cfg.router.port) is not None:
            say(f"router: stopped ({why})")
        for r in reps:
            try:
                down(r.cfg, _sub(nodes, r), say=_prefixed(say, r))
            except SparkserveError as e:
                say(f"{r.name}: could not be stopped: {e.line()}")


# -- down and status --------------------------------------------------------------------------------------------


@dataclass
class FleetDown:
    router: RouterProcess | None
    replicas: dict[int, DownResult]

    def to_json(self) -> dict[str, Any]:
        return {"router": self.router.to_json() if self.router else None,
                "replicas": [{"replica": i, **d.to_json()} for i, d in self.replicas.items()],
                "removed": {k: v for d in self.replicas.values() for k, v in d.removed.items()},
                "unreachable": {k: v for d in self.replicas.values() for k, v in d.to_json()["unreachable"].items()}}


def down_replicas(cfg: Config, nodes: dict[str, Node], *, unreachable: dict[str, SparkserveError] | None = None,
                  break_lock: bool = False, say: Reporter = quiet) -> FleetDown:
    """The router first (no request goes to a replica being stopped), then every replica (stack.down each)."""
    stopped = stop_router(cfg.router.port)
    say(f"router: stopped (pid {stopped.pid})" if stopped else "router: none running on this machine")
    out: dict[int, DownResult] = {}
    for r in replicas_of(cfg):
        miss = {k: v for k, v in (unreachable or {}).items() if k in r.nodes}
        out[r.index] = down(r.cfg, _sub(nodes, r), unreachable=miss, break_lock=break_lock, say=_prefixed(say, r))
    return FleetDown(stopped, out)


def status_replicas(cfg: Config, nodes: dict[str, Node], *,
                    unreachable: dict[str, SparkserveError] | None = None) -> dict[str, Any]:
    """`status --json` of the fleet: ``replicas`` (ranks, API URL, gate verdict, in the router) and ``router``
    (url, policy, workers as the router reports them). ``ok``: the router runs and every replica serves in it."""
    url = router_url(cfg)
    proc = running(cfg.router.port)
    workers: list[dict[str, Any]] = []
    if proc is not None:
        try:
            workers = RouterAPI(url).workers()
        except RemoteFailure:
            workers = []
    in_router = {str(w.get("url")): bool(w.get("is_healthy")) for w in workers}
    reps = []
    for r in replicas_of(cfg):
        miss = {k: v for k, v in (unreachable or {}).items() if k in r.nodes}
        st = status(r.cfg, _sub(nodes, r), unreachable=miss)
        doc = st.to_json()
        reps.append({"replica": r.index, "nodes": r.nodes, "api_url": r.api_url, "ok": st.ok,
                     "serving": st.api.serving, "gates": doc["gates_this_boot"], "ranks": doc["nodes"],
                     "deployments": st.deployments, "unreachable": doc["unreachable"],
                     "in_router": r.api_url in in_router})
    by_url = {r["api_url"]: r["replica"] for r in reps}
    router = {"url": url, "policy": cfg.router.policy, "running": proc is not None,
              "pid": proc.pid if proc else None, "log": proc.log if proc else None,
              "workers": [{"url": u, "replica": by_url.get(u), "healthy": h} for u, h in in_router.items()]}
    ok = proc is not None and all(r["ok"] and r["in_router"] for r in reps)
    return {"replicas": reps, "router": router, "ok": ok,
            "serving": sum(1 for r in reps if r["serving"] and r["in_router"]), "of": len(reps)}
