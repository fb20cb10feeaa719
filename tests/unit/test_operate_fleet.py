"""`supervise` with ``replicas: 2``: which replica is taken out of the router, restarted and put back, in what
order; the last replica in the router is never taken out while another is down (the incident says so); a dead
router is started again first; per-replica verdicts in the state, the exporter (``replica`` label) and `status`'s
view. The replicas' rounds, restarts and incidents are scripted; the router is a recording fake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _fixtures import config_file
from prometheus_client.parser import text_string_to_metric_families

from sparkserve.config import load_config
from sparkserve.errors import RemoteFailure
from sparkserve.operate import fleet as fleet_mod
from sparkserve.operate.checks import CHECKS, Verdict
from sparkserve.operate.exporter import StateCollector
from sparkserve.operate.fleet import FleetSupervisor
from sparkserve.operate.supervisor_view import _fleet, view_lines

URL1, URL2 = "http://10.0.0.1:8000", "http://10.0.0.3:8000"


class FakeRouter:
    def __init__(self, urls: list[str]) -> None:
        self.urls_in = list(urls)
        self.calls: list[tuple[str, str]] = []

    def workers(self) -> list[dict[str, Any]]:
        return [{"url": u, "is_healthy": True} for u in self.urls_in]

    def remove_worker(self, url: str) -> None:
        self.calls.append(("remove", url))
        self.urls_in = [u for u in self.urls_in if u != url]

    def add_worker(self, url: str, *, timeout: float = 120.0) -> None:
        self.calls.append(("add", url))
        self.urls_in.append(url)


class Proc:
    pid = 4242


def ok_round() -> list[Verdict]:
    return [Verdict(c, True, f"{c} fine") for c in CHECKS]


def bad_round() -> list[Verdict]:
    return [Verdict("ranks", False, "node-c: rank 0 exited (137)", node="spark-3"),
            *(Verdict(c, True, "fine") for c in CHECKS if c != "ranks")]


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the journal rows of recoveries
    nodes = [{"name": f"spark-{i}", "host": f"10.0.0.{i}", "fabric_ip": f"192.168.200.{i}"} for i in range(1, 5)]
    cfg = load_config(config_file(tmp_path / "c.yaml", {"nodes": nodes, "replicas": 2,
                                                        "supervise": {"backoff_s": 0, "listen": ""}}))
    f = FleetSupervisor(cfg, {n["name"]: object() for n in nodes}, config_path=tmp_path / "c.yaml",  # type: ignore
                        say=lambda _m: None)
    f.api = FakeRouter([URL1, URL2])
    f.router_alive = True
    monkeypatch.setattr(fleet_mod, "running", lambda _port: Proc() if f.router_alive else None)
    f.script = {1: [], 2: []}  # each replica's next rounds' verdicts (then all pass)
    f.events = []  # (what, replica index, detail) in the order they happened

    for sub in f.subs:
        i = sub.replica.index

        def round_(i: int = i, sub: Any = sub) -> list[Verdict]:
            vs = f.script[i].pop(0) if f.script[i] else ok_round()
            with sub.state.lock:
                sub.state.verdicts = {v.check: v for v in vs}
                sub.state.rounds += 1
            return vs

        def restart(i: int = i) -> tuple[float, float]:
            f.events.append(("restart", i, [c for c in f.api.calls]))
            if f.fail_restart.get(i):
                raise RemoteFailure("up", f"replica {i} did not come back")
            return 0.1, 0.2

        def incident(verdicts: list[Verdict], note: str = "", i: int = i, sub: Any = sub) -> None:
            f.events.append(("incident", i, {"label": sub.label, "note": note}))

        sub.round, sub._restart, sub._incident, sub._sleep = round_, restart, incident, lambda _s: None
    f.fail_restart = {}
    return f


def step(f: Any) -> int | None:
    """One round and its actions; a restart started in it (it runs in a thread of its own) is let finish and
    collected, as the next round would."""
    f.round()
    code = f._act()
    if f.pending is not None:
        f.pending[1].result(timeout=30)
        code = f._restarted()
    f._publish()
    return code


def test_a_failing_replica_leaves_the_router_before_its_restart_and_returns_after_it(fleet: Any) -> None:
    fleet.script[2] = [bad_round()]
    assert step(fleet) is None
    (inc, restart) = fleet.events
    assert inc == ("incident", 2, {"label": "replica 2 (spark-3, spark-4)", "note": ""})
    assert restart == ("restart", 2, [("remove", URL2)])  # out of the router before the restart began
    assert fleet.api.calls == [("remove", URL2), ("add", URL2)]  # and back only after it (gates passed in `up`)
    assert fleet.subs[1].state.recoveries == 1 and fleet.subs[0].state.restarts == 0
    assert step(fleet) is None and fleet.api.calls == [("remove", URL2), ("add", URL2)]  # nothing more to do
    docs = fleet.state.snapshot()["replicas"]
    assert [(d["replica"], d["ok"], d["in_router"], d["restarts"]) for d in docs] == [(1, True, True, 0),
                                                                                      (2, True, True, 1)]


def test_the_last_replica_in_the_router_stays_in_while_another_is_down_and_the_incident_says_so(fleet: Any) -> None:
    fleet.fail_restart[1] = True  # replica 1 does not come back: it stays out
    fleet.script[1] = [bad_round(), bad_round(), bad_round()]
    fleet.script[2] = [ok_round(), bad_round(), bad_round()]
    step(fleet)
    assert fleet.api.calls == [("remove", URL1)] and fleet.api.urls_in == [URL2]
    fleet.events.clear()
    step(fleet)  # both fail now: replica 2 is the last in the router, replica 1 is down → replica 1 again, not 2
    assert [(e[0], e[1]) for e in fleet.events] == [("incident", 2), ("incident", 1), ("restart", 1)]
    note = fleet.events[0][2]["note"]
    assert note == "not taken out of the router: replica 2 is the last serving replica while replica 1 is down"
    assert ("remove", URL2) not in fleet.api.calls and fleet.api.urls_in == [URL2]
    assert fleet.subs[1].state.restarts == 0
    view = _fleet(fleet.state.snapshot())
    assert view["failing_now"] is True
    assert [(r["replica"], r["in_router"], [x["check"] for x in r["failing"]]) for r in view["replicas"]] == [
        (1, False, ["ranks"]), (2, True, ["ranks"])]


def test_a_dead_router_is_started_again_first_with_the_replicas_that_pass(fleet: Any, monkeypatch) -> None:
    import sparkserve.deploy.replicas as deploy_replicas

    started: list[list[int]] = []

    def restart_router(cfg: Any, serving: list[Any], say: Any = None) -> dict[str, Any]:
        started.append([r.index for r in serving])
        fleet.router_alive = True
        fleet.api.urls_in = [r.api_url for r in serving]
        fleet.events.append(("router", 0, None))
        return {}

    monkeypatch.setattr(deploy_replicas, "restart_router", restart_router)
    fleet.router_alive = False
    fleet.script[2] = [bad_round()]
    step(fleet)
    assert started == [[1]]  # replica 2 fails: not in the new router
    assert [(e[0], e[1]) for e in fleet.events] == [("router", 0), ("incident", 2), ("restart", 2)]
    assert fleet.api.calls == [("add", URL2)] and sorted(fleet.api.urls_in) == [URL1, URL2]
    assert fleet.state.snapshot()["router"]["restarts"] == 1


def test_every_replica_spent_its_budget_the_fleet_gives_up_and_stops_the_router(fleet: Any, monkeypatch) -> None:
    stopped: list[int] = []
    monkeypatch.setattr(fleet_mod, "stop_router", lambda port: stopped.append(port))
    monkeypatch.setattr(fleet_mod.ReplicaSupervisor, "_give_up", lambda self, why: self.state.__setattr__(
        "gave_up", True) or 1)
    for sub in fleet.subs:
        sub.budget.max_restarts = 0
    fleet.script[1] = [bad_round()] * 3
    fleet.script[2] = [bad_round()] * 3
    assert step(fleet) is None  # replica 1 gave up; replica 2 still serves
    assert fleet.subs[0].state.gave_up and not stopped
    assert step(fleet) == 1 and stopped == [fleet.cfg.router.port]
    assert fleet.state.snapshot()["gave_up"] is True


def test_per_replica_series_and_status_lines(fleet: Any) -> None:
    fleet.script[2] = [bad_round()]
    fleet.fail_restart[2] = True
    step(fleet)
    fams = {f.name: f for f in text_string_to_metric_families(
        "".join(_text(m) for m in StateCollector(fleet.state).collect()))}
    gate = {(s.labels["gate"], s.labels["replica"]): s.value for s in fams["sparkserve_gate_ok"].samples}
    assert gate[("ranks", "2")] == 0.0 and gate[("ranks", "1")] == 1.0
    serving = {s.labels["replica"]: s.value for s in fams["sparkserve_replica_serving"].samples}
    assert serving == {"1": 1.0, "2": 0.0}
    assert {s.labels["replica"]: s.value for s in fams["sparkserve_replica_restarts"].samples
            if s.name.endswith("_total")} == {"1": 0.0, "2": 1.0}
    lines = view_lines({"running": True, "phase": "incident", "rounds": 1, "last_round_age_s": 1.0, "url": "u",
                        "failing": [], **_fleet(fleet.state.snapshot())})
    assert "  replica 2 (spark-3, spark-4): incident, NOT in the router; FAILING ranks: node-c: rank 0 exited " \
           "(137)" in lines


def _text(m: Any) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    class One:
        def collect(self) -> Any:
            yield m

    reg = CollectorRegistry(auto_describe=False)
    reg.register(One())  # type: ignore[arg-type]
    return generate_latest(reg).decode()


def test_one_replica_giving_up_does_not_tell_systemd_the_service_stops(fleet: Any, monkeypatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(fleet_mod.sdnotify, "notify", said.append)
    monkeypatch.setattr(fleet_mod, "stop_router", lambda port: None)
    from sparkserve.operate import loop as loop_mod
    monkeypatch.setattr(loop_mod.sdnotify, "notify", said.append)
    monkeypatch.setattr(loop_mod, "stop_everything", lambda cfg, nodes, say: {})
    for sub in fleet.subs:
        sub.budget.max_restarts = 0
    fleet.script[1] = [bad_round()] * 3
    assert step(fleet) is None and fleet.subs[0].state.gave_up  # replica 1 gave up; replica 2 still serves
    assert "STOPPING=1" not in said
    fleet.script[2] = [bad_round()] * 3
    assert step(fleet) == 1 and said.count("STOPPING=1") == 1  # the fleet gave up: said once


def test_while_a_replica_restarts_the_router_and_the_others_stay_watched(fleet: Any, monkeypatch) -> None:
    import threading

    release = threading.Event()
    sub2 = fleet.subs[1]
    real_restart = sub2._restart

    def slow_restart() -> tuple[float, float]:
        assert release.wait(30)
        return real_restart()

    sub2._restart = slow_restart
    started: list[list[int]] = []
    monkeypatch.setattr("sparkserve.deploy.replicas.restart_router",
                        lambda cfg, reps, say: started.append([r.index for r in reps]) or fleet.__setattr__(
                            "router_alive", True))
    fleet.script[2] = [bad_round()]
    fleet.round()
    assert fleet._act() is None and fleet.pending is not None  # replica 2 restarts in its thread
    assert fleet.api.calls == [("remove", URL2)]
    fleet.router_alive = False  # the router dies while replica 2 is still booting
    fleet.round()
    assert fleet._act() is None
    assert started == [[1]]  # started again at once, with replica 1 alone (replica 2 is out, restarting)
    fleet.script[1] = [bad_round(), bad_round()]
    fleet.round()
    assert fleet._act() is None
    fleet.round()
    assert fleet._act() is None  # replica 1 fails too: no second restart while replica 2's runs
    assert [e for e in fleet.events if e[0] == "incident" and e[1] == 1] == [
        ("incident", 1, {"label": "replica 1 (spark-1, spark-2)", "note": "not taken out of the router: replica 1 "
                         "is the last serving replica while replica 2 is down"})]
    assert not [e for e in fleet.events if e[0] == "restart"]
    release.set()
    fleet.pending[1].result(timeout=30)
    fleet.round()
    assert fleet._act() is None  # collected: replica 2 back in the router
    assert ("add", URL2) in fleet.api.calls and [e[1] for e in fleet.events if e[0] == "restart"] == [2]
