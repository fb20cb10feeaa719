"""The rolling swap's choreography against the real vllm-router 0.1.17 and two vLLM stand-ins that really go away
while "swapped" (their HTTP server is shut down and started again): streamed requests flow through the router the
whole time and none fails; a replica is swapped only once it is out of the router and runs no request; the next
leaves only after the previous is back; a failure stops the rollout, named; zero serving is refused.

The per-replica swap itself (sync, restart, gates, rollback) is deploy/swap.py's, proven on the rig
(tests/e2e/test_swap.py; the fleet's in tests/e2e/test_replicas.py); here it is replaced by a restart of the
stand-in so the router's side is tested on its own, in seconds."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fake_vllm import FakeState, FakeVllm
from _fixtures import config_file

from sparkserve.config import Config, load_config
from sparkserve.deploy import rolling
from sparkserve.deploy.swap import SwapResult
from sparkserve.errors import RemoteFailure
from sparkserve.measure.router_reach import one_request
from sparkserve.nodes.router import RouterAPI, router_executable, start_router, stop_router
from sparkserve.plan.replicas import replicas_of, router_argv, router_url

HEADS = ("127.0.0.2", "127.0.0.3")


def _free(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Fleet:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("SSROUTER_STATE", str(tmp_path / "router"))
        self.port = _free(HEADS[0])
        self.states = {h: FakeState(model="m", chunk_delay_s=0.02) for h in HEADS}
        self.servers = {h: FakeVllm(self.states[h], host=h, port=self.port).__enter__() for h in HEADS}
        nodes = []
        for i, h in enumerate(HEADS):
            nodes += [{"name": f"h{i}", "host": h, "fabric_ip": f"192.168.1.{i}"},
                      {"name": f"f{i}", "host": f"127.0.0.{20 + i}", "fabric_ip": f"192.168.1.{10 + i}"}]
        self.cfg: Config = load_config(config_file(tmp_path / "c.yaml", {
            "nodes": nodes, "replicas": 2, "model": {"served_name": "m"}, "serve": {"port": self.port},
            "router": {"port": _free(), "metrics_port": _free()}}))
        self.url = router_url(self.cfg)
        self.api = RouterAPI(self.url)
        self.events: list[str] = []

    def start(self) -> None:
        urls = [r.api_url for r in replicas_of(self.cfg)]
        start_router(router_argv(self.cfg, urls, exe=router_executable("vllm-router")), port=self.cfg.router.port,
                     url=self.url)

    def swap(self, fail_on: str | None = None) -> Any:
        def fake(cfg: Config, nodes: dict, path: Path, *, break_lock: bool = False, say: Any = None) -> SwapResult:
            host = cfg.head.host
            url = f"http://{host}:{self.port}"
            # what the rollout promised before the swap: out of the router, nothing running on it
            self.events.append(f"swap {host} in_router={url in self.api.urls()} running={self.states[host].running}")
            self.servers[host].__exit__()  # the stack goes away…
            time.sleep(0.5)
            self.servers[host] = FakeVllm(self.states[host], host=host, port=self.port).__enter__()  # …and comes back
            if host == fail_on:
                return SwapResult(False, True, f"swap failed: gates; rolled back ({url} serving again)", error="gates")
            return SwapResult(True, False, "swapped", drafter_path="/d-new", drafter_digest="ab" * 32)
        return fake

    def close(self) -> None:
        stop_router(self.cfg.router.port)
        for s in self.servers.values():
            s.__exit__()


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    f = Fleet(tmp_path, monkeypatch)
    try:
        f.start()
        yield f
    finally:
        f.close()


class Load:
    def __init__(self, url: str) -> None:
        self.url, self.stop, self.failed, self.done = url, threading.Event(), [], 0
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(3)]

    def run(self) -> None:
        while not self.stop.is_set():
            why = one_request(self.url, "m", None, "load", max_tokens=24)
            if why:
                self.failed.append(why)
            self.done += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_rolling_swap_one_at_a_time_drops_no_request(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rolling, "swap_drafter", fleet.swap())
    said: list[str] = []
    with Load(fleet.url) as load:
        time.sleep(0.5)
        res = rolling.rolling_swap(fleet.cfg, {}, Path("/tmp/new"), say=said.append)
        time.sleep(0.5)
    assert res.ok and "swapped on all 2 replicas" in res.message
    assert load.failed == [] and load.done > 20
    assert fleet.events == [f"swap {h} in_router=False running=0" for h in HEADS]
    assert said.index("replica 1: back in the router") < said.index(
        "replica 2: out of the router (replica 1 keep serving)")
    assert sorted(fleet.api.urls()) == sorted(r.api_url for r in replicas_of(fleet.cfg))


def test_a_failed_replica_stops_the_rollout_and_is_back_in_the_router(fleet: Fleet,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rolling, "swap_drafter", fleet.swap(fail_on=HEADS[0]))
    with Load(fleet.url) as load:
        res = rolling.rolling_swap(fleet.cfg, {}, Path("/tmp/new"))
    assert not res.ok and res.rolled_back
    assert res.message.startswith("rolling swap stopped at replica 1: swap failed: gates") and "none" in res.message
    assert len(fleet.events) == 1  # replica 2 never touched
    assert load.failed == []
    assert len(fleet.api.urls()) == 2  # the rolled-back replica serves again, in the router


def test_never_zero_serving(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rolling, "swap_drafter", fleet.swap())
    second = replicas_of(fleet.cfg)[1].api_url
    fleet.api.remove_worker(second)  # replica 2 is out already (say, the supervisor took it out)
    res = rolling.rolling_swap(fleet.cfg, {}, Path("/tmp/new"))
    assert not res.ok and "zero serving" in res.message and fleet.events == []
    assert fleet.api.urls() == [replicas_of(fleet.cfg)[0].api_url]  # replica 1 was never taken out


def test_no_router_no_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fleet(tmp_path, monkeypatch)
    try:
        with pytest.raises(RemoteFailure) as e:
            rolling.rolling_swap(f.cfg, {}, Path("/tmp/new"))
        assert e.value.step == "router" and "`sparkserve up` starts it" in e.value.what
    finally:
        f.close()
