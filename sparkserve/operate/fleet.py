"""`supervise` with ``replicas: N``: every replica watched as the single-stack supervisor watches one stack, the
router watched too, and each recovery made behind the router so the endpoint keeps serving.

    fleet = FleetSupervisor(cfg, nodes, config_path=path, say=print)
    rounds, router = fleet.round()      # `supervise --once`: each replica's verdicts, the router's
    code = fleet.run()                  # foreground until SIGTERM (0) or every replica gave up (1)

A round runs every replica's own round side by side (its canary and ``/metrics`` on its own head, never through
the router: the router forwards ``/metrics`` to one worker, docs/replicas-facts.md §1.3), and one look at the
router (its recorded process alive, ``GET /workers`` answering). Then, in this order:

1. a dead or silent router is started again first (it is cheap), through `up`'s own start
   (:func:`sparkserve.deploy.replicas.restart_router`), holding the replicas that pass their checks;
2. a replica this supervisor took out whose checks pass again is put back (``POST /add_worker``, which blocks
   until its ``/health`` answers);
3. at most one failing replica is recovered: taken out of the router (``POST /remove_worker``: new requests stop
   at once, those in flight on it finish), its incident written, its restart made within its own budget (its
   `down`, then its `up` with the gates, in a thread of its own), and only then put back. The rounds go on
   meanwhile (the router and the other replicas stay watched; a dead router is started again at once); never two
   restarts at once, and never the last replica in the router while another one is down and may come back: that
   replica stays in, and its incident says why.

A replica that spends its restart budget is stopped and left out (alert); the fleet gives up (router stopped,
exit 1) only when every replica has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from sparkserve import interrupts
from sparkserve.config import Config
from sparkserve.errors import GateFailed, RemoteFailure, SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.router import RouterAPI, running, stop_router
from sparkserve.operate import alerts, sdnotify
from sparkserve.operate.checks import CHECKS, Verdict, failing
from sparkserve.operate.loop import GAVE_UP_EXIT, Supervisor
from sparkserve.operate.recovery import LockBusy, busy, stop_everything
from sparkserve.operate.sdnotify import Heartbeat
from sparkserve.operate.state import SuperviseState
from sparkserve.plan.replicas import Replica, replicas_of, router_url


def label_of(r: Replica) -> str:
    """How incidents, alerts and phase lines name a replica: ``replica 2 (spark-c, spark-d)``."""
    return f"{r.name} ({', '.join(r.nodes)})"


class ReplicaSupervisor(Supervisor):
    """One replica's watcher: the single-stack supervisor on the replica's own config and nodes; its restart is
    that replica's `down` and `up` (gates included) in this process, the rest of the fleet untouched."""

    def __init__(self, r: Replica, nodes: dict[str, Node], *, config_path: Path, say: Callable[[str], None],
                 heartbeat: Heartbeat) -> None:
        super().__init__(r.cfg, {n: nodes[n] for n in r.nodes if n in nodes}, config_path=config_path, say=say,
                         label=label_of(r), heartbeat=heartbeat)
        self.replica = r
        self.owns_service = False  # the fleet says STOPPING=1, once every replica gave up

    def _restart(self) -> tuple[float, float]:
        from sparkserve.deploy.up import up

        t0 = time.monotonic()
        say: Callable[[str], None] = lambda m: self.say(f"  {self.replica.name}: {m}")  # noqa: E731
        try:
            stop_everything(self.cfg, self.nodes, say)
            t1 = time.monotonic()
            up(self.cfg, self.nodes, run_gates=True, say=say)
        except SparkserveError as e:
            if busy(e.what):
                raise LockBusy(e.where, e.what) from None
            raise
        return t1 - t0, time.monotonic() - t1


class FleetSupervisor:
    def __init__(self, cfg: Config, nodes: dict[str, Node], *, config_path: Path,
                 say: Callable[[str], None] = print) -> None:
        self.cfg, self.s, self.say = cfg, cfg.supervise, say
        self.model = cfg.model.served_name
        self.url = router_url(cfg)
        self.api = RouterAPI(self.url)
        self.heartbeat = Heartbeat()
        self.subs = [ReplicaSupervisor(r, nodes, config_path=config_path, say=say, heartbeat=self.heartbeat)
                     for r in replicas_of(cfg)]
        self.state = SuperviseState()
        self.state.stack = {"served_name": self.model, "api_url": self.url, "runtime": cfg.runtime,
                            "nodes": [n.name for n in cfg.nodes], "fingerprint": None, "replicas": len(self.subs)}
        self.state.memfree_floor = self.s.memfree_floor_bytes
        self.members: dict[str, bool] = {}  # worker URL -> healthy, as the router said at the last look
        self.taken_out: set[int] = set()  # replicas this supervisor took out of the router (it puts them back)
        self.router = Verdict("router", None, "not looked at yet")
        self.router_restarts = 0
        self.last: dict[int, list[Verdict]] = {}
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="fleet-restart")  # one restart at a time
        self.pending: tuple[ReplicaSupervisor, Future[int | None], int, bool] | None = None  # sub, its recovery,
        # its recoveries before, restarted alone (in place)

    # -- one round ------------------------------------------------------------------------------------------

    def _router_look(self) -> Verdict:
        proc = running(self.cfg.router.port)
        if proc is None:
            return Verdict("router", False, f"vllm-router is not running on this machine (port {self.cfg.router.port})")
        try:
            workers = self.api.workers()
        except RemoteFailure as e:
            return Verdict("router", False, f"vllm-router (pid {proc.pid}) does not answer: {e.what}")
        self.members = {str(w.get("url")): bool(w.get("is_healthy")) for w in workers}
        names = [s.replica.name for s in self.subs if s.replica.api_url in self.members]
        return Verdict("router", True, f"vllm-router pid {proc.pid} at {self.url}: "
                       f"{', '.join(names) or 'no replica'} in it")

    def round(self) -> tuple[dict[int, list[Verdict]], Verdict]:
        """Every live replica's round and the router's look, side by side."""
        live = [s for s in self.subs if not s.state.gave_up and not self._restarting(s)]
        ex = ThreadPoolExecutor(len(live) + 1, thread_name_prefix="fleet")
        try:
            f_router = ex.submit(self._router_look)
            futures = {s.replica.index: ex.submit(s.round) for s in live}
            got = {i: f.result() for i, f in futures.items()}
            self.router = f_router.result()
        finally:  # a SIGTERM mid-round must not wait for a canary at its deadline
            ex.shutdown(wait=False, cancel_futures=True)
        self.last.update(got)
        self._publish()
        return got, self.router

    def _restarting(self, sub: ReplicaSupervisor) -> bool:
        return self.pending is not None and self.pending[0] is sub

    def _bad(self, sub: ReplicaSupervisor) -> list[Verdict]:
        return failing(self.last.get(sub.replica.index, []))

    def _in(self, sub: ReplicaSupervisor) -> bool:
        return sub.replica.api_url in self.members

    # -- the loop -------------------------------------------------------------------------------------------

    def _phase(self, phase: str, text: str) -> None:
        with self.state.lock:
            self.state.phase = phase
            self.state.event(phase, text)
        self.say(f"supervise: {text}")
        sdnotify.notify(f"STATUS={text[:200]}")

    def _alert(self, title: str, body: str, level: alerts.Level) -> None:
        alerts.send(self.s.alert_urls, f"sparkserve {self.model}: {title}", body, level=level)

    def run(self) -> int:
        """Watch until SIGTERM/Ctrl-C (returns 0, everything left as it is) or every replica gave up (1)."""
        self._phase("watching", f"watching {self.model}: {len(self.subs)} replicas behind {self.url} every "
                    f"{self.s.interval_s:g}s")
        first = True
        try:
            while True:
                t0 = time.monotonic()
                self.heartbeat.expect(self.s.interval_s + self.s.canary_deadline_s + 60.0)
                self.round()
                if first:
                    if not any(any(s.ranks.values()) for s in self.subs):
                        self._phase("stopped", "nothing to supervise: no sparkserve rank runs on any node")
                        raise GateFailed("supervise", "no sparkserve rank runs on any node: `sparkserve up` first, "
                                         "or `sparkserve supervise --up`")
                    sdnotify.notify("READY=1")
                    first = False
                code = self._act()
                self._publish()
                if code is not None:
                    return code
                self.subs[0]._sleep(max(0.0, self.s.interval_s - (time.monotonic() - t0)))
        except KeyboardInterrupt:
            if self.pending is not None:  # its `up` sees the interrupt too and removes what it started
                with interrupts.deferred():
                    self.say(f"supervise: waiting for {self.pending[0].label}'s restart to stop")
                    wait([self.pending[1]])
            self._phase("stopped", "stopped watching (signal); the router and every replica are left as they are")
            sdnotify.notify("STOPPING=1")
            return 0
        finally:
            self.pool.shutdown(wait=True)
            self.heartbeat.stop()

    def _act(self) -> int | None:
        """This round's actions, in the module docstring's order. An int: the fleet gave up."""
        if self.router.ok is False and self.s.recover:
            self._restart_router()
        elif self.router.ok is False and self.state.phase != "incident":
            self._phase("incident", f"router: {self.router.summary} (supervise.recover is off: not started again)")
            self._alert("router down", self.router.summary, "failure")
        if self.pending is not None and self.pending[1].done():
            code = self._restarted()
            if code is not None:
                return code
        for sub in self.subs:
            if self._restarting(sub):
                continue
            bad = self._bad(sub)
            sub.fault_rounds = sub.fault_rounds + 1 if bad else 0
            if not bad:
                sub.open_failure, sub.awaiting_lock = None, False
                if sub.state.phase != "watching":
                    sub._set_phase("watching", "all gates pass")
                if sub.replica.index in self.taken_out and self.router.ok:
                    self._put_back(sub)
        due = [s for s in self.subs if not s.state.gave_up and not self._restarting(s) and self._bad(s) and
               s.fault_rounds >= self.s.confirm_rounds]
        if not due:
            if self.state.phase != "watching" and self.pending is None and self.router.ok and \
                    all(self._in(s) for s in self.subs):
                self._phase("watching", "every replica serves in the router; all gates pass")
            return None
        if not self.s.recover:
            for sub in due:
                checks = frozenset(v.check for v in self._bad(sub))
                if checks != sub.open_failure:
                    sub._incident(self.last[sub.replica.index])
                    sub.open_failure = checks
            return None
        due.sort(key=self._in)  # one already out of the router first: its restart costs no capacity
        free = []
        for sub in due:
            held = self._held(sub)
            if held is None:
                free.append(sub)
            elif frozenset(v.check for v in self._bad(sub)) != sub.open_failure:
                sub._incident(self.last[sub.replica.index], note=held)
                sub.open_failure = frozenset(v.check for v in self._bad(sub))
        if free and self.pending is not None:  # never two restarts at once: it waits, said once per failure
            for sub in free:
                checks = frozenset(v.check for v in self._bad(sub))
                if checks != sub.open_failure:
                    sub._incident(self.last[sub.replica.index],
                                  note=f"not restarted yet: {self.pending[0].replica.name} is restarting")
                    sub.open_failure = checks
            return None
        return self._recover(free[0]) if free else None

    def _held(self, sub: ReplicaSupervisor) -> str | None:
        """Why ``sub`` must stay in the router now (it is the last one there while another replica is down and may
        come back), or None."""
        if not self._in(sub) or any(self._in(o) for o in self.subs if o is not sub):
            return None
        down = [o.replica.name for o in self.subs if o is not sub and not o.state.gave_up]
        if not down:
            return None
        return (f"not taken out of the router: {sub.replica.name} is the last serving replica while "
                f"{', '.join(down)} {'is' if len(down) == 1 else 'are'} down")

    def _recover(self, sub: ReplicaSupervisor) -> int | None:
        """Out of the router, the replica's own recovery (incident, budget, backoff, restart), back in once its
        gates passed. Alone in the router (every other replica gave up), it is restarted where it is."""
        others = [o.replica.name for o in self.subs if o is not sub and self._in(o)]
        alone = self._in(sub) and not others
        if self._in(sub) and others:
            try:
                self.api.remove_worker(sub.replica.api_url)
                self.taken_out.add(sub.replica.index)
                self.members.pop(sub.replica.api_url, None)
                verb = "keeps" if len(others) == 1 else "keep"
                sub._set_phase("incident", f"out of the router ({', '.join(others)} {verb} serving)")
            except RemoteFailure as e:
                sub._set_phase("incident", f"could not be taken out of the router: {e.what}")
        elif not self._in(sub):
            self.taken_out.add(sub.replica.index)
        self._phase("recovering", f"recovering {sub.label}")
        before = sub.state.recoveries  # read before the thread starts: it may finish at once
        self.pending = (sub, self.pool.submit(sub._recover, self.last[sub.replica.index]), before, alone)
        self._publish()  # the page and `status` see it out while it restarts
        return None

    def _restarted(self) -> int | None:
        """The restart in flight finished: put back once its gates passed, or left out (its budget spent)."""
        assert self.pending is not None
        sub, future, before, alone = self.pending
        self.pending = None
        code = future.result()
        if code is not None:  # its budget is spent: it was stopped; it stays out
            self.taken_out.discard(sub.replica.index)
            if alone:
                self._forget(sub)
            if all(s.state.gave_up for s in self.subs):
                return self._give_up()
            return None
        if sub.state.recoveries > before:
            self.last[sub.replica.index] = []  # judged afresh next round
            if alone:
                self._forget(sub)
            self._put_back(sub)
        return None

    def _forget(self, sub: ReplicaSupervisor) -> None:
        """A replica restarted in place leaves the router's registry (its breaker and failed checks with it)."""
        try:
            self.api.remove_worker(sub.replica.api_url)
            self.taken_out.add(sub.replica.index)
        except RemoteFailure as e:
            self.say(f"supervise: {sub.label}: could not be removed from the router: {e.what}")

    def _put_back(self, sub: ReplicaSupervisor) -> None:
        """``POST /add_worker`` (blocks until its /health answers); said, and alerted when it fails."""
        self.heartbeat.expect(150.0)
        try:
            self.api.add_worker(sub.replica.api_url)
        except RemoteFailure as e:
            sub._set_phase("incident", f"not put back in the router: {e.what}; trying again next round")
            return
        self.taken_out.discard(sub.replica.index)
        self.members[sub.replica.api_url] = True
        sub._set_phase("watching", "back in the router")

    def _restart_router(self) -> None:
        """The router again, holding the replicas that pass (the others are put back once they pass)."""
        from sparkserve.deploy.replicas import restart_router

        why = self.router.summary
        serving = [s for s in self.subs if not s.state.gave_up and not self._bad(s) and
                   s.replica.index not in self.taken_out]
        self._phase("recovering", f"router: {why}; starting it again with "
                    f"{', '.join(s.replica.name for s in serving) or 'no replica'}")
        self.heartbeat.expect(self.cfg.router.health.interval_s * 3 + 200.0)
        try:
            restart_router(self.cfg, [s.replica for s in serving], say=lambda m: self.say(f"  {m}"))
        except SparkserveError as e:
            self._phase("incident", f"router: could not be started again: {e.line()}; trying again next round")
            self._alert("router restart failed", e.line(), "failure")
            return
        self.router_restarts += 1
        self.taken_out |= {s.replica.index for s in self.subs if s not in serving and not s.state.gave_up}
        self.router = self._router_look()
        self._phase("watching", f"router: serving again ({self.router.summary})")
        self._alert("router restarted", f"{why}; started again with {len(serving)} replica(s)", "warning")

    def _give_up(self) -> int:
        stop_router(self.cfg.router.port)
        with self.state.lock:
            self.state.gave_up = True
        text = (f"GAVE UP on {self.model}: every replica spent its restart budget and was stopped; the router was "
                "stopped too. Read the incidents, fix the cause, then `sparkserve up`.")
        self._phase("gave_up", text)
        self._alert("GAVE UP — every replica stopped", text, "failure")
        sdnotify.notify("STOPPING=1")
        return GAVE_UP_EXIT

    # -- what the exporter, the page and `status` read ------------------------------------------------------

    def replica_doc(self, sub: ReplicaSupervisor) -> dict[str, Any]:
        snap = sub.state.snapshot()
        r = sub.replica
        bad = [g for g in snap["gates"].values() if g["ok"] is False]
        return {"replica": r.index, "name": r.name, "label": sub.label, "nodes": r.nodes, "api_url": r.api_url,
                "phase": snap["phase"], "in_router": self._in(sub), "healthy_in_router": self.members.get(r.api_url),
                "taken_out": r.index in self.taken_out, "gave_up": snap["gave_up"],
                "ok": not bad and self._in(sub) and not snap["gave_up"], "gates": snap["gates"],
                "canary_s": snap["canary_s"], "canary_ok": snap["canary_ok"], "window": snap["window"],
                "band": snap["band"], "fingerprint": snap["stack"].get("fingerprint"), "restarts": snap["restarts"],
                "recoveries": snap["recoveries"], "incidents": len(snap["incidents"]),
                "last_round_at": snap["last_round_at"]}

    def _publish(self) -> None:
        docs = [self.replica_doc(s) for s in self.subs]
        snaps = [s.state.snapshot() for s in self.subs]
        worst: dict[str, Verdict] = {}
        for d in docs:
            for c in CHECKS:
                g = d["gates"][c]
                if c not in worst or (g["ok"] is False and worst[c].ok is not False) or \
                        (g["ok"] is True and worst[c].ok is None):
                    worst[c] = Verdict(c, g["ok"], f"{d['name']}: {g['summary']}", list(g["evidence"]), g["node"])
        incidents = sorted((i for s in snaps for i in s["incidents"]), key=lambda i: str(i.get("time")))
        proc = running(self.cfg.router.port)
        with self.state.lock:
            st = self.state
            st.rounds = max(s["rounds"] for s in snaps)
            st.last_round_at = max((s["last_round_at"] or 0.0) for s in snaps) or None
            st.verdicts = worst
            st.canary_ok = all(s["canary_ok"] for s in snaps if s["canary_ok"] is not None) \
                if any(s["canary_ok"] is not None for s in snaps) else None
            st.canary_s = max((s["canary_s"] for s in snaps if s["canary_s"] is not None), default=None)
            st.memfree = {k: v for s in snaps for k, v in s["memfree"].items()}
            st.incidents = incidents
            st.restarts = sum(s["restarts"] for s in snaps) + self.router_restarts
            st.recoveries = sum(s["recoveries"] for s in snaps)
            st.replicas = docs
            st.router = {"url": self.url, "ok": self.router.ok, "summary": self.router.summary,
                         "pid": proc.pid if proc else None, "restarts": self.router_restarts,
                         "workers": dict(self.members)}
            fps = sorted({d["fingerprint"] for d in docs if d["fingerprint"]})
            st.stack["fingerprint"] = fps[0] if fps else None
            bad = [d for d in docs if not d["ok"]]
            if st.last_round_at and (not st.history or st.history[-1]["time"] != st.last_round_at):
                st.history.append({"time": st.last_round_at, "ok": not bad and bool(self.router.ok),
                                   "summary": "; ".join(f"{d['name']}: {d['phase']}" for d in bad) or
                                   "every replica serves"})
