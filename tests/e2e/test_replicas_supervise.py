"""`supervise` of `replicas: 2` on four rig nodes behind the real vllm-router 0.1.17: kill -9 of replica 2's head
engine while streamed and non-streamed requests flow through the router — the supervisor takes replica 2 out of
the router, restarts it alone (replica 1 untouched) and puts it back after its gates; kill -9 of the router — the
supervisor starts it again. Failed requests are counted at the client, each kind apart, before and after the
replica left the router; the figures are printed (the issue's report quotes them).

Same four-node rig as test_replicas.py (its own SSRIG_DIR, 127.0.0.40-43, port 2225, node root /srv/spark-e4).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import SPARKSERVE, free_port
from replicas_support import Load, fleet_config

pytestmark = pytest.mark.rig



class TimedLoad(Load):
    """Load, each failure with the time its request started (to split before/after the replica left)."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(url, model)
        self.failures: list[tuple[str, float, str]] = []  # kind, start (monotonic), why

    def _one(self, kind: str, i: int) -> str | None:
        t0 = time.monotonic()
        why = super()._one(kind, i)
        if why:
            with self.lock:
                self.failures.append((kind, t0, why))
        return why


def _status(url: str) -> dict[str, Any] | None:
    try:
        return httpx.get(url + "/status.json", timeout=2, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return None


def _wait(url: str, pred: Any, timeout: float, sup: subprocess.Popen, log: Path, poll: float = 0.2) -> tuple[
        dict[str, Any], float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert sup.poll() is None, f"supervise exited {sup.returncode}:\n{log.read_text()[-3000:]}"
        st = _status(url)
        if st is not None and pred(st):
            return st, time.monotonic()
        time.sleep(poll)
    pytest.fail(f"not within {timeout:g}s:\n{log.read_text()[-3000:]}")


def _rep(st: dict[str, Any], i: int) -> dict[str, Any]:
    return next(r for r in st["replicas"] if r["replica"] == i)


def test_supervise_takes_a_dead_replica_out_restarts_it_alone_and_restarts_a_dead_router(e4, tmp_path) -> None:
    port = free_port("127.0.0.1")
    sup_url = f"http://127.0.0.1:{port}"
    cfg = fleet_config(e4, 2, supervise={"listen": f"127.0.0.1:{port}", "interval_s": 1, "canary_deadline_s": 3,
                                         "stall_s": 5, "backoff_s": 0, "memfree_floor_bytes": "256MiB",
                                         "incidents_dir": str(tmp_path / "incidents")})
    p = e4.cli("up", cfg=cfg, timeout=600)
    assert p.returncode == 0, p.stderr
    model = e4.load(cfg).model.served_name
    router_url = e4.json("status", cfg=cfg)["router"]["url"]
    ids1 = {k: v for k, v in e4.running_ids().items() if k in ("node-a", "node-b")}

    log = tmp_path / "supervise.log"
    with log.open("w") as out:
        sup = subprocess.Popen([str(SPARKSERVE), "supervise", "-c", str(cfg)], stdout=out, stderr=subprocess.STDOUT,
                               text=True, env=e4.env())
    try:
        _wait(sup_url, lambda s: s.get("replicas") and all(r["ok"] for r in s["replicas"]), 120, sup, log)

        # kill -9 of replica 2's head engine under load through the router
        with TimedLoad(router_url, model) as load:
            time.sleep(4)
            before = dict(load.done)
            t_kill = time.monotonic()
            e4.kill_rank("node-c")
            st, t_out = _wait(sup_url, lambda s: not _rep(s, 2)["in_router"], 60, sup, log)
            _, t_back = _wait(sup_url, lambda s: _rep(s, 2)["ok"] and _rep(s, 2)["recoveries"] >= 1, 300, sup, log)
            time.sleep(5)  # requests go to replica 2 again
        # the breaker sparkserve renders (3 failures, 10 s) opened on the dead replica only: replica 1 kept serving
        url1 = e4.json("status", cfg=cfg)["replicas"][0]["api_url"]
        rm = httpx.get(f"http://127.0.0.1:{e4.load(cfg).router.metrics_port}/metrics", timeout=5).text
        cb = [ln for ln in rm.splitlines() if ln.startswith("vllm_router_cb_")]
        print("\nrouter breaker series: " + "; ".join(cb))
        assert not [ln for ln in cb if url1 in ln and 'to="open"' in ln and not ln.rstrip().endswith(" 0")], cb
        fail = {k: [f for f in load.failures if f[0] == k] for k in ("plain", "stream")}
        after_out = [f for f in load.failures if f[1] >= t_out]
        print(f"\nkill -9 of replica 2's head under load, supervised: {json.dumps(load.done)} requests "
              f"({before} before the kill); failed non-streaming {len(fail['plain'])}, streaming (cut) "
              f"{len(fail['stream'])} {[f[2] for f in fail['stream']][:3]}; out of the router "
              f"{t_out - t_kill:.1f}s after the kill, serving again {t_back - t_kill:.1f}s after it; failed among "
              f"requests started after it left the router: {len(after_out)}")
        assert fail["plain"] == [], fail
        assert after_out == [], after_out
        cut = ("cut: no [DONE]", "RemoteProtocolError")
        assert all(f[2].startswith(cut) for f in fail["stream"]) and len(fail["stream"]) <= 3, fail
        assert {k: v for k, v in e4.running_ids().items() if k in ("node-a", "node-b")} == ids1  # replica 1 untouched
        text = log.read_text()
        assert "replica 2 (node-c, node-d): out of the router (replica 1 keeps serving)" in text, text[-3000:]
        assert text.index("out of the router") < text.index("replica 2 (node-c, node-d): back in the router")
        inc = json.loads(Path(st["incidents"][-1]["dir"], "incident.json").read_text()) if st["incidents"] else \
            json.loads(sorted((tmp_path / "incidents").glob("*/incident.json"))[-1].read_text())
        assert inc["replica"] == "replica 2 (node-c, node-d)" and "ranks" in {v["check"] for v in inc["verdict"]}

        # `status --json`: per-replica verdicts from the supervisor
        doc = e4.json("status", cfg=cfg)
        view = doc["supervisor"]
        assert view["running"] is True and [r["replica"] for r in view["replicas"]] == [1, 2]
        assert all(r["in_router"] and r["failing"] == [] for r in view["replicas"]), view
        assert [r["restarts"] for r in view["replicas"]] == [0, 1]
        series = httpx.get(sup_url + "/metrics", timeout=5, trust_env=False).text
        assert 'sparkserve_gate_ok{gate="ranks",replica="2"} 1.0' in series, series
        assert 'sparkserve_replica_restarts_total{replica="2"} 1.0' in series, series

        # kill -9 of the router: started again by the supervisor, through `up`'s own start
        pid = doc["router"]["pid"]
        t0 = time.monotonic()
        subprocess.run(["kill", "-9", str(pid)], check=True)
        served = None
        while time.monotonic() - t0 < 120:
            try:
                r = httpx.post(router_url + "/v1/chat/completions", timeout=30, trust_env=False, json={
                    "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
                if r.status_code == 200:
                    served = time.monotonic() - t0
                    break
            except httpx.HTTPError:
                served = None  # no router on the port yet: ask again
            time.sleep(0.2)
        print(f"kill -9 of the router: serving again {served}s after it")
        assert served is not None, log.read_text()[-3000:]
        st, _ = _wait(sup_url, lambda s: s["router"]["restarts"] >= 1 and s["router"]["ok"] and
                      all(r["in_router"] for r in s["replicas"]), 60, sup, log)
        assert st["router"]["pid"] != pid
        assert "router: vllm-router is not running" in log.read_text()
    finally:
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(30)
        except subprocess.TimeoutExpired:
            sup.kill()
    assert sup.returncode == 0, log.read_text()[-3000:]
    p = e4.cli("down", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert e4.leftovers() == {}
