"""The supervisor: a round of checks every ``supervise.interval_s``; on a fault, forensics, an alert, and a
bounded restart through the normal `up` path; past the budget, everything stopped and a loud alert.

    sup = Supervisor(cfg, nodes, say=print)
    verdicts = sup.round()          # `supervise --once`
    code = sup.run()                # foreground until SIGTERM (0: stopped watching) or a give-up (1)

A round runs its parts side by side: the canary generation (the slowest part when the engine is wedged:
it ends at its deadline), the ranks through the runtime seam plus the lines their logs gained, each node's
memory and kernel lines (one node program each), and one ``/metrics`` scrape. SIGTERM (and Ctrl-C) while
watching ends the loop and leaves the stack exactly as it is. Under systemd, READY=1 follows the first
round and WATCHDOG=1 comes from a heartbeat that only beats while the loop keeps its promise to come back
(a round, a backoff wait, a restart's own deadline) — a hung supervisor is itself restarted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy.stack import managed_where_reachable
from sparkserve.deploy.wait import daemon_fault
from sparkserve.errors import GateFailed, RemoteFailure, SparkserveError
from sparkserve.journal import record
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ManagedContainer, NoSuchContainer
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.runtime import Runtime, engine_for
from sparkserve.operate import alerts, sdnotify
from sparkserve.operate.checks import (
    Band,
    RankFact,
    StallTracker,
    Verdict,
    failing,
    judge_acceptance,
    judge_faults,
    judge_kernel,
    judge_memory,
    judge_progress,
    judge_ranks,
)
from sparkserve.operate.incident import open_incident
from sparkserve.operate.nodefacts import HostFacts, host_facts
from sparkserve.operate.probes import SMOKE_CELLS as SMOKE_CELLS  # the journal test's import
from sparkserve.operate.probes import AcceptanceWindows, Scrape, banked_band, canary, incident_metrics, scrape_metrics
from sparkserve.operate.recovery import Budget, LockBusy, restart, stop_everything
from sparkserve.operate.sdnotify import Heartbeat
from sparkserve.operate.state import SuperviseState
from sparkserve.plan.build import build_plan

GAVE_UP_EXIT = 1
FACTS_EVERY = 3  # rounds between two looks at each node's memory and kernel log
RELIST_ROUNDS = 12  # list every node's ranks again this often (a rank started by hand, a node back)


class Supervisor:
    def __init__(self, cfg: Config, nodes: dict[str, Node], *, config_path: Path,
                 state: SuperviseState | None = None, say: Callable[[str], None] = print, label: str = "",
                 heartbeat: Heartbeat | None = None) -> None:
        self.cfg = cfg
        self.owns_service = True  # this process's systemd service is this stack's (False: a fleet's replica)
        self.label = label  # "replica 2 (spark-c, spark-d)" under a fleet: every phase line, alert and incident
        self.config_path = config_path
        self.nodes = nodes
        self.s = cfg.supervise
        self.say = say
        plan = build_plan(cfg)
        self.api_url, self.model = plan.api_url, plan.served_name
        self.api_key = resolve_api_key(cfg)
        # one client for the whole run (thread-safe; a new one per round costs an SSL context each time)
        self.http = httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))
        self.state = state or SuperviseState()
        self.state.stack = {"served_name": self.model, "api_url": self.api_url, "runtime": cfg.runtime,
                            "nodes": [n.name for n in cfg.nodes], "fingerprint": None}
        self.state.memfree_floor = self.s.memfree_floor_bytes
        self.engines: dict[str, Runtime] = {n: engine_for(node, cfg) for n, node in nodes.items()}
        self.budget = Budget.from_config(cfg)
        self.heartbeat = heartbeat or Heartbeat()
        self.kernel_seen: dict[str, list[str]] = {}
        self._reset_watch()
        self.fingerprint: str | None = None
        self.band: Band | None = None
        self.band_for: str | None = None
        self.ranks: dict[str, list[ManagedContainer]] = {}
        self.unreachable: dict[str, str] = {}
        self.rounds_since_list = 0
        self.last_scrape: Scrape | None = None
        self.cursors: dict[str, int | None] = {}
        self.open_failure: frozenset[str] | None = None  # checks of the incident already opened (no restart)
        self.fault_rounds = 0
        self.awaiting_lock = False  # a restart waits for another sparkserve run's deploy lock

    def _reset_watch(self) -> None:
        """After a (re)start: fresh trackers, logs read from now on."""
        self.stall = StallTracker(self.s.stall_s)
        self.windows = AcceptanceWindows(self.s.acceptance_window_s)
        self.log_marks: dict[str, float] = {}
        self.faults_seen: dict[str, list[str]] = {}
        self.kernel_seen = {}  # kernel lines judged: those since this (re)start (the cursors stay)
        self.last_facts: dict[str, HostFacts] = {}  # memory is read afresh after a (re)start
        self.rounds_since_facts = 0
        self.watch_from = time.time()

    # -- one round ------------------------------------------------------------------------------------

    def _canary(self) -> Any:
        return canary(self.http, self.api_url, self.model, max_tokens=self.s.canary_max_tokens,
                      deadline_s=self.s.canary_deadline_s, api_key=self.api_key)

    def _scrape(self, timeout: float | None = None) -> Scrape | None:
        t = timeout if timeout is not None else min(10.0, self.s.canary_deadline_s)
        return scrape_metrics(self.http, self.api_url, self.model, timeout=t)

    def _ranks_and_logs(self) -> tuple[list[RankFact], dict[str, str], dict[str, list[str]]]:
        """Each rank's liveness and the log lines it gained, one look per rank (the runtime answers both at
        once: a process rank's look carries its new log bytes). The ranks are listed again every
        ``RELIST_ROUNDS`` rounds, after a restart, and when a known rank is gone."""
        if not self.ranks or self.rounds_since_list >= RELIST_ROUNDS:
            found, silent = managed_where_reachable(self.nodes, self.cfg)
            # nodes that share one run dir (several ``local: true`` nodes) each list every rank: keep a node's own
            self.ranks = {node: [c for c in cs if c.node in ("", node)] for node, cs in found.items()}
            self.unreachable = {k: e.what for k, e in silent.items()}
            self.rounds_since_list = 0
        self.rounds_since_list += 1
        facts: list[RankFact] = []
        new_lines: dict[str, list[str]] = {}
        unreachable = dict(self.unreachable)

        def look(node: str) -> list[tuple[ManagedContainer, bool, int | None, list[str]]]:
            eng = self.engines[node]
            out = []
            for c in self.ranks.get(node, []):
                try:
                    st = eng.state(c.id)
                except NoSuchContainer:
                    self.rounds_since_list = RELIST_ROUNDS  # gone: list again next round
                    out.append((c, False, None, []))
                    continue
                if (why := daemon_fault(eng, c.id, st)) is not None:  # the node's docker, not the rank (issue 29)
                    raise RemoteFailure(f"{node}: docker", f"{why} ({c.name})", node=node, step="docker")
                lines: list[str] = []
                if self.s.log_follow:
                    since = self.log_marks.get(c.id, self.watch_from)
                    self.log_marks[c.id] = time.time()
                    lines = list(eng.logs(c.id, since=since))
                out.append((c, st.running, st.exit_code, lines))
            return out

        def safe(node: str) -> list[tuple[ManagedContainer, bool, int | None, list[str]]] | SparkserveError:
            try:
                return look(node)
            except SparkserveError as e:
                return e

        got = on_all(list(self.ranks), safe)
        for node, res in got.items():
            if isinstance(res, SparkserveError):
                unreachable[node] = res.what
                self.rounds_since_list = RELIST_ROUNDS
                continue
            for c, running, code, lines in res:
                facts.append(RankFact(node, c.name, running, code))
                seen = self.faults_seen.setdefault(c.id, [])
                seen += lines
                del seen[:-2000]
                new_lines.setdefault(node, []).extend(lines)
        fps = {c.fingerprint for cs in self.ranks.values() for c in cs if c.fingerprint}
        if fps:
            self.fingerprint = sorted(fps)[0]
            self.state.stack["fingerprint"] = self.fingerprint
        return facts, unreachable, new_lines

    def _hosts(self) -> dict[str, HostFacts]:
        """Every node's memory and new kernel lines — every ``FACTS_EVERY`` rounds (a node program start each
        time; unified memory does not run dry between two of them), the last answer in between."""
        self.rounds_since_facts += 1
        if self.last_facts and self.rounds_since_facts < FACTS_EVERY:
            return self.last_facts
        self.rounds_since_facts = 0

        def ask(node: Node) -> HostFacts:
            f = host_facts(node, meminfo=self.s.meminfo_path, kmsg=self.s.kmsg_path or None,
                           cursor=self.cursors.get(node.name), timeout=max(10.0, self.s.interval_s * 2))
            return f
        got = on_all(list(self.nodes.values()), ask, name=lambda n: n.name)
        for name, f in got.items():
            if f.kernel_lines is not None:
                self.cursors[name] = f.cursor
                if f.kernel_lines:
                    self.kernel_seen.setdefault(name, []).extend(f.kernel_lines)
                    del self.kernel_seen[name][:-500]
        self.last_facts = got
        return got

    def _band(self) -> Band | None:
        """The band banked for this deployment: a bench result, else the first window after boot banked here."""
        if self.fingerprint is None:
            return None
        if self.band_for == self.fingerprint and self.band is not None:
            return self.band
        self.band = banked_band(self.fingerprint)
        self.band_for = self.fingerprint
        return self.band

    def round(self) -> list[Verdict]:
        ex = ThreadPoolExecutor(4, thread_name_prefix="supervise")
        try:
            f_canary = ex.submit(self._canary)
            f_ranks = ex.submit(self._ranks_and_logs)
            f_hosts = ex.submit(self._hosts)
            f_scrape = ex.submit(self._scrape)
            scrape = f_scrape.result()
            ranks, unreachable, _ = f_ranks.result()
            hosts = f_hosts.result()
            c = f_canary.result()
        finally:  # a SIGTERM mid-round must not wait for a canary at its deadline
            ex.shutdown(wait=False, cancel_futures=True)
        meanwhile = None
        if not c.ok and scrape is not None:  # busy or wedged? what the engine generated while the canary waited
            after = self._scrape(timeout=min(3.0, self.s.canary_deadline_s / 2))  # the round is late already
            if after is not None and after.snapshot.boot_id == scrape.snapshot.boot_id and \
                    after.snapshot.generation_tokens is not None and scrape.snapshot.generation_tokens is not None:
                meanwhile = after.snapshot.generation_tokens - scrape.snapshot.generation_tokens
            scrape = after
        if scrape is not None:
            self.last_scrape = scrape
        window = self.windows.add(scrape)
        band = self._band()
        if window is not None and band is None and self.fingerprint and window.acceptance_length and \
                window.drafts >= self.s.acceptance_min_drafts:
            band = Band(window.acceptance_length, window.per_position, "first window after boot")
            record("supervise_event", fingerprint=self.fingerprint, event="band", event_json=json.dumps(band.to_json()))
            self.band = band
            self.band_for = self.fingerprint
        verdicts = [
            judge_progress(c, self.s.canary_deadline_s, tokens_meanwhile=meanwhile),
            self.stall.add(scrape.point() if scrape else None),
            judge_ranks(ranks, [n.name for n in self.cfg.nodes], unreachable),
            judge_faults(self._fault_lines()),
            judge_kernel({n: (self.kernel_seen.get(n, []) if f.kernel_lines is not None or n in self.kernel_seen
                              else None) for n, f in hosts.items()}),
            judge_memory({n: f.mem for n, f in hosts.items()}, self.s.memfree_floor_bytes),
            judge_acceptance(window if window is not None else self.windows.last, band,
                             drop=self.s.acceptance_drop, min_drafts=self.s.acceptance_min_drafts),
        ]
        bad = failing(verdicts)
        with self.state.lock:
            st = self.state
            st.rounds += 1
            st.last_round_at = time.time()
            st.verdicts = {v.check: v for v in verdicts}
            st.canary_s, st.canary_ok = c.seconds, c.ok
            if window is not None:
                st.window = window
            st.band = band
            st.memfree = {n: f.mem.free for n, f in hosts.items()}
            st.history.append({"time": st.last_round_at, "ok": not bad,
                               "summary": "; ".join(v.summary for v in bad) or "all gates pass"})
        return verdicts

    def _fault_lines(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node, cs in self.ranks.items():
            for c in cs:
                out.setdefault(node, []).extend(self.faults_seen.get(c.id, []))
        return out

    # -- the loop -------------------------------------------------------------------------------------

    def _set_phase(self, phase: str, text: str | None = None) -> None:
        text = f"{self.label}: {text}" if text and self.label else text
        with self.state.lock:
            self.state.phase = phase
            if text:
                self.state.event(phase, text)
        if text:
            self.say(f"supervise: {text}")
            sdnotify.notify(f"STATUS={text[:200]}")

    def _alert(self, title: str, body: str, level: alerts.Level) -> None:
        who = f"{self.label}: " if self.label else ""
        alerts.send(self.s.alert_urls, f"sparkserve {self.model}: {who}{title}", body, level=level)

    def _sleep(self, seconds: float) -> None:
        self.heartbeat.expect(seconds + 30.0)
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))

    def run(self) -> int:
        """Watch until SIGTERM/Ctrl-C (returns 0, the stack left as it is) or a give-up (returns 1)."""
        first = True
        self._set_phase("watching", f"watching {self.model} at {self.api_url} every {self.s.interval_s:g}s")
        try:
            while True:
                t0 = time.monotonic()
                self.heartbeat.expect(self.s.interval_s + self.s.canary_deadline_s + 60.0)
                verdicts = self.round()
                if first:
                    if not any(self.ranks.values()):
                        self._set_phase("stopped", "nothing to supervise: no sparkserve rank runs on any node")
                        raise GateFailed("supervise", "no sparkserve rank runs on any node: `sparkserve up` first, "
                                         "or `sparkserve supervise --up`")
                    sdnotify.notify("READY=1")
                    first = False
                bad = failing(verdicts)
                self.fault_rounds = self.fault_rounds + 1 if bad else 0
                if not bad:
                    self.open_failure = None
                    self.awaiting_lock = False
                    if self.state.phase != "watching":
                        self._set_phase("watching", "all gates pass")
                elif self.fault_rounds >= self.s.confirm_rounds:
                    if self.s.recover:
                        code = self._recover(verdicts)
                        if code is not None:
                            return code
                        continue
                    if frozenset(v.check for v in bad) != self.open_failure:
                        self._incident(verdicts)
                        self.open_failure = frozenset(v.check for v in bad)
                self._sleep(max(0.0, self.s.interval_s - (time.monotonic() - t0)))
        except KeyboardInterrupt:
            self._set_phase("stopped", "stopped watching (signal); the stack is left as it is")
            sdnotify.notify("STOPPING=1")
            return 0
        finally:
            self.heartbeat.stop()

    def _incident(self, verdicts: list[Verdict], note: str = "") -> Any:
        bad = failing(verdicts)
        self._set_phase("incident", "; ".join(v.summary for v in bad) + (f" — {note}" if note else ""))
        about = {k: v for k, v in (("replica", self.label), ("note", note)) if v}
        self.heartbeat.expect(300.0)
        box: dict[str, Any] = {}

        def write() -> None:
            try:
                box["inc"] = open_incident(self.cfg, self.nodes, verdicts, ranks=self.ranks,
                                           metrics_text=self._metrics_now(), metrics_note=self._metrics_note,
                                           kernel_seen=self.kernel_seen, fingerprint=self.fingerprint, about=about)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread below
                box["error"] = e

        # in a thread the main one waits for in short joins: a SIGTERM meanwhile is seen at once (py-spy dumps of
        # every rank on every node may take a while), and the supervisor leaves without waiting for them
        t = threading.Thread(target=write, name="supervise-incident", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.5)
        if "error" in box:
            raise box["error"]
        inc = box["inc"]
        with self.state.lock:
            self.state.incidents.append(inc.summary)
        self.say(f"supervise: incident recorded in {inc.path}")
        self._alert("incident", "\n".join([*(v.summary for v in bad), *([note] if note else []),
                                           f"forensics: {inc.path}"]), "warning")
        return inc

    _metrics_note = ""

    def _metrics_now(self) -> str | None:
        text, self._metrics_note = incident_metrics(self._scrape(timeout=5.0), self.last_scrape)
        return text

    def _recover(self, verdicts: list[Verdict]) -> int | None:
        """Forensics, then a restart within the budget — or the give-up. None: go on watching."""
        if not self.awaiting_lock:  # the incident of a restart that waits for someone else's run is written
            self._incident(verdicts)
        decision = self.budget.decide(time.monotonic())
        if decision.action == "give_up":
            return self._give_up(decision.why)
        self._set_phase("recovering", f"{decision.why}")
        self._sleep(decision.wait_s)
        self.heartbeat.expect(self.cfg.serve.ready_timeout_s + 600.0)
        try:
            stop_s, up_s = self._restart()
        except LockBusy as e:  # someone else's run holds the stack: no restart was made, none is counted
            self.awaiting_lock = True
            self._set_phase("incident", f"not restarted: {e.what}; looking again next round")
            self.fault_rounds = self.s.confirm_rounds
            self.ranks = {}
            return None
        except SparkserveError as e:
            self.awaiting_lock = False
            self.budget.note_restart(time.monotonic())
            with self.state.lock:
                self.state.restarts += 1
            self._set_phase("incident", f"restart failed: {e.line()}")
            record("supervise_event", fingerprint=self.fingerprint, event="restart_failed",
                   event_json=json.dumps({"error": e.line()}))
            self._alert("restart failed", e.line(), "failure")
            self.fault_rounds = self.s.confirm_rounds  # the next round's failure acts at once
            self._reset_watch()
            return None
        self.awaiting_lock = False
        self.budget.note_restart(time.monotonic())
        with self.state.lock:
            self.state.restarts += 1
        took = stop_s + up_s
        self._reset_watch()
        self.ranks = {}
        self.fault_rounds = 0
        with self.state.lock:
            self.state.recoveries += 1
        self._set_phase("watching", f"recovered: serving again after a restart of {took:.1f}s (stop {stop_s:.1f}s, "
                                    f"up {up_s:.1f}s)")
        record("supervise_event", fingerprint=self.fingerprint, event="recovered",
               event_json=json.dumps({"restart_s": took, "stop_s": stop_s, "up_s": up_s,
                                      "restarts_in_window": len(self.budget.restarts)}))
        self._alert("recovered", f"serving again after a restart of {took:.1f}s", "success")
        return None

    def _restart(self) -> tuple[float, float]:
        """The restart itself (stop, up seconds): graceful `down`, then `sparkserve up` as a child process."""
        return restart(self.cfg, self.nodes, say=lambda m: self.say(f"  {m}"), config_path=self.config_path)

    def _give_up(self, why: str) -> int:
        self._set_phase("gave_up", f"giving up: {why}; stopping every rank on every node")
        self.heartbeat.expect(600.0)
        try:
            removed = stop_everything(self.cfg, self.nodes, say=lambda m: self.say(f"  {m}"))
        except SparkserveError as e:
            removed = {}
            self.say(f"supervise: stopping failed: {e.line()}")
        with self.state.lock:
            self.state.gave_up = True
        text = (f"GAVE UP on {self.model}: {why}. Every rank was stopped "
                f"({sum(len(v) for v in removed.values())} removed); the stack is DOWN. "
                "Read the incidents, fix the cause, then `sparkserve up`.")
        record("supervise_event", fingerprint=self.fingerprint, event="gave_up",
               event_json=json.dumps({"why": why, "removed": removed}))
        self._alert("GAVE UP — stack stopped", text, "failure")
        self.say(f"supervise: {text}")
        if self.owns_service:  # under a fleet, one replica giving up does not stop the service
            sdnotify.notify("STOPPING=1")
        return GAVE_UP_EXIT
