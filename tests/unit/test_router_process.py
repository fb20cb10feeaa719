"""The real vllm-router 0.1.17 (the wheel's binary) in front of two in-test vLLM stand-ins on 127.0.0.1: start and
stop as sparkserve does it, the router gate counted on each worker's own /metrics, worker removal and re-adding,
and one dead worker under the router settings sparkserve renders (the endpoint keeps answering)."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fake_vllm import FakeState, FakeVllm
from _fixtures import config_file

from sparkserve.config import load_config
from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.measure.router_reach import one_request, router_gate
from sparkserve.nodes.router import RouterAPI, recorded, router_executable, running, start_router, stop_router
from sparkserve.plan.replicas import router_argv, router_url


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SSROUTER_STATE", str(tmp_path / "router"))
    for k in list(os.environ):
        if k.startswith("SPARKSERVE_"):
            monkeypatch.delenv(k)
    return tmp_path / "router"


@pytest.fixture
def workers() -> Iterator[tuple[FakeVllm, FakeVllm]]:
    with FakeVllm(FakeState(model="m")) as a, FakeVllm(FakeState(model="m")) as b:
        yield a, b


def _cfg(tmp_path: Path, **router: object):
    nodes = [{"name": f"n{i}", "host": f"10.0.0.{i}", "fabric_ip": f"192.168.1.{i}"} for i in range(1, 5)]
    return load_config(config_file(tmp_path / "c.yaml", {
        "nodes": nodes, "replicas": 2, "model": {"served_name": "m"},
        "router": {"port": _free(), "metrics_port": _free(), **router}}))


def test_a_missing_or_foreign_launcher_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        router_executable(str(tmp_path / "nope"))
    assert e.value.where == "router.executable" and "vllm-router==0.1.17" in e.value.what
    fake = tmp_path / "vllm-router"
    fake.write_text("#!/bin/sh\necho 'usage: vllm-router --port PORT --static-backends URLS'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(BadInput) as e:
        router_executable(str(fake))
    assert "production-stack" in e.value.what
    assert router_executable("vllm-router").endswith("/vllm-router")


def test_router_gate_reaches_both_workers_and_remove_add_steer_traffic(
        tmp_path: Path, state: Path, workers: tuple[FakeVllm, FakeVllm]) -> None:
    a, b = workers
    cfg = _cfg(tmp_path)
    url = router_url(cfg)
    proc = start_router(router_argv(cfg, [a.url, b.url], exe=router_executable("vllm-router")),
                        port=cfg.router.port, url=url)
    try:
        assert running(cfg.router.port) == proc and proc.alive()
        api = RouterAPI(url)
        assert sorted(api.urls()) == sorted([a.url, b.url])
        g = router_gate(url, {1: a.url, 2: b.url}, model="m", api_key=None)
        assert g.ok and g.sent == 8 and g.reached == {1: 4, 2: 4}, g.reason()  # round_robin: strict alternation

        api.remove_worker(b.url)  # out of the router: nothing new reaches it
        g = router_gate(url, {1: a.url, 2: b.url}, model="m", api_key=None)
        assert not g.ok and g.reached == {1: 8, 2: 0} and g.missed() == [2] and not g.failed
        api.add_worker(b.url)  # back: blocks until its /health answers
        assert router_gate(url, {1: a.url, 2: b.url}, model="m", api_key=None).ok
    finally:
        stopped = stop_router(cfg.router.port)
    assert stopped is not None and not stopped.alive()  # gone, not a zombie
    assert recorded(cfg.router.port) is None and running(cfg.router.port) is None
    with pytest.raises(RemoteFailure):
        RouterAPI(url).workers()


@pytest.mark.parametrize("retries", [3, 1])
def test_one_dead_worker_never_closes_the_endpoint(tmp_path: Path, state: Path, workers: tuple[FakeVllm, FakeVllm],
                                                   retries: int) -> None:
    """A worker that is gone (connection refused) costs a retry on the other, not a failed request: 40 streamed
    requests, 0 failed, with sparkserve's settings (3 attempts, breaker after 3 failures). With one attempt
    (router.retries: 1) the same requests do fail until the dead worker's breaker opens: the count is real."""
    a, b = workers
    cfg = _cfg(tmp_path, retries=retries)
    url = router_url(cfg)
    start_router(router_argv(cfg, [a.url, b.url], exe=router_executable("vllm-router")), port=cfg.router.port,
                 url=url)
    try:
        b.httpd.shutdown()
        b.httpd.server_close()  # connection refused from now on
        fails = [x for x in (one_request(url, "m", None, f"{i}") for i in range(40)) if x is not None]
        if retries == 1:
            assert 1 <= len(fails) <= cfg.router.breaker.failure_threshold, fails  # then its breaker is open
            return
        assert fails == []
        assert a.state.request_success == 40
    finally:
        stop_router(cfg.router.port)


def test_a_router_that_cannot_bind_is_named_and_stopped(tmp_path: Path, state: Path,
                                                        workers: tuple[FakeVllm, FakeVllm]) -> None:
    a, _ = workers
    cfg = _cfg(tmp_path)
    with socket.socket() as s:  # someone else holds the port
        s.bind(("127.0.0.1", cfg.router.port))
        s.listen()
        with pytest.raises(RemoteFailure) as e:
            start_router(router_argv(cfg, [a.url], exe=router_executable("vllm-router")), port=cfg.router.port,
                         url="http://127.0.0.1:1", timeout_s=30)
    assert e.value.step == "router"
    assert recorded(cfg.router.port) is None  # nothing recorded, nothing left running


def test_the_client_s_key_reaches_every_replica_and_none_is_in_the_router_s_argv(tmp_path: Path, state: Path) -> None:
    """With serve.api_key_env set, every replica checks the key itself: the router forwards the client's own
    Authorization header (replicas-facts §1.6); a request without it is refused by the replica, through the
    router; the key is never in the router's argv."""
    with FakeVllm(FakeState(model="m", api_key="s3cret")) as a, FakeVllm(FakeState(model="m", api_key="s3cret")) as b:
        cfg = _cfg(tmp_path)
        url = router_url(cfg)
        argv = router_argv(cfg, [a.url, b.url], exe=router_executable("vllm-router"))
        assert not any("s3cret" in x for x in argv) and "--api-key" not in argv
        start_router(argv, port=cfg.router.port, url=url)
        try:
            assert router_gate(url, {1: a.url, 2: b.url}, model="m", api_key="s3cret").ok
            refused = one_request(url, "m", None, "no key")
            assert refused is not None and refused.startswith("HTTP 401"), refused
        finally:
            stop_router(cfg.router.port)
