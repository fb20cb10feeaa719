"""The supervisor's port: Prometheus text a real parser reads, the status page, the Grafana dashboard whose every
series exists, and the canary/acceptance probes against a real HTTP server."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkserve.errors import BadInput
from sparkserve.measure.metrics import Snapshot
from sparkserve.operate.checks import Band, Verdict, Window
from sparkserve.operate.dashboard import PANELS, dashboard
from sparkserve.operate.exporter import parse_listen, serve
from sparkserve.operate.probes import AcceptanceWindows, Scrape, canary
from sparkserve.operate.state import SuperviseState
from sparkserve.operate.statuspage import render


def state() -> SuperviseState:
    s = SuperviseState()
    s.stack = {"served_name": "glm", "api_url": "http://x:8000", "nodes": ["a", "b"], "runtime": "docker",
               "fingerprint": "f" * 64}
    s.rounds, s.last_round_at = 3, time.time()
    s.verdicts = {"progress": Verdict("progress", True, "canary: 4 token(s) in 0.10s"),
                  "memory": Verdict("memory", False, "b: MemFree 1.00 GiB is below the floor", ["b: MemFree 1.00 GiB"],
                                    node="b")}
    s.canary_s, s.canary_ok = 0.1, True
    s.window = Window(500, 3.4, (0.74, 0.55, 0.40))
    s.band = Band(3.5, (0.75, 0.56, 0.41), "bench #2")
    s.memfree, s.memfree_floor = {"a": 80 << 30, "b": 1 << 30}, 4 << 30
    s.restarts = 1
    return s


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def test_the_exporter_serves_every_series_a_prometheus_parser_reads() -> None:
    srv = serve(state(), "127.0.0.1:0")
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        fams = {f.name: f for f in text_string_to_metric_families(get(base + "/metrics"))}
        gates = {s.labels["gate"]: s.value for s in fams["sparkserve_gate_ok"].samples}
        assert gates["progress"] == 1 and gates["memory"] == 0 and gates["wedge"] == -1 and len(gates) == 7
        assert fams["sparkserve_acceptance_length"].samples[0].value == 3.4
        pp = {s.labels["position"]: s.value for s in fams["sparkserve_acceptance_per_position"].samples}
        assert pp == {"0": 0.74, "1": 0.55, "2": 0.4}
        assert fams["sparkserve_restarts"].samples[0].value == 1
        mem = {s.labels["node"]: s.value for s in fams["sparkserve_node_memfree_bytes"].samples}
        assert mem == {"a": float(80 << 30), "b": float(1 << 30)}
        page = get(base + "/")
        assert "<tr class='gate fail' id='gate-memory'>" in page and "<tr class='gate ok' id='gate-progress'>" in page
        assert json.loads(get(base + "/status.json"))["band"]["source"] == "bench #2"
    finally:
        srv.shutdown()


def test_a_port_in_use_or_a_bad_listen_is_named() -> None:
    srv = serve(SuperviseState(), "127.0.0.1:0")
    try:
        with pytest.raises(BadInput, match="supervise.listen"):
            serve(SuperviseState(), f"127.0.0.1:{srv.server_address[1]}")
    finally:
        srv.shutdown()
    with pytest.raises(BadInput, match="host:port"):
        parse_listen("9321")


def test_the_page_escapes_evidence_and_charts_live_against_band() -> None:
    s = state()
    s.verdicts["faults"] = Verdict("faults", False, "a logged <script>alert(1)</script>", ["<b>x</b>"])
    page = render(s.snapshot())
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page
    assert page.count("<rect class=\"live\"") == 3 and 'id="acceptance-chart"' in page
    assert 'http-equiv="refresh"' in page


def test_every_dashboard_series_is_one_the_exporter_or_vllm_emits() -> None:
    d = dashboard()
    json.dumps(d)
    assert d["uid"] == "sparkserve-supervise" and len(d["panels"]) == len(PANELS)
    srv = serve(state(), "127.0.0.1:0")
    try:
        exported = get(f"http://127.0.0.1:{srv.server_address[1]}/metrics")
    finally:
        srv.shutdown()
    vllm = {"vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket"}  # the emulator serves each
    for p in d["panels"]:
        for t in p["targets"]:
            for name in re.findall(r"(sparkserve_[a-z_]+|vllm:[a-z_]+)", t["expr"]):
                assert name in vllm or re.search(rf"^{name}[{{ ]", exported, re.M), (p["title"], name)


class Slow(BaseHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - a wedged engine: the request is taken, nothing comes back
        time.sleep(3)


def test_the_canary_fails_at_its_deadline_when_nothing_comes_back() -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with httpx.Client(trust_env=False) as c:
            t0 = time.monotonic()
            r = canary(c, f"http://127.0.0.1:{srv.server_address[1]}", "m", max_tokens=4, deadline_s=0.5)
        assert not r.ok and r.error == "no answer before the deadline" and time.monotonic() - t0 < 2.0
    finally:
        srv.shutdown()


def snap(drafts: float, accepted: float, per_pos: dict[int, float], boot: float = 1.0) -> Snapshot:
    return Snapshot(boot, drafts, drafts * 3, accepted, per_pos, 100.0, 1.0, 0.0)


def test_acceptance_windows_close_every_window_s_and_restart_on_a_new_boot() -> None:
    w = AcceptanceWindows(window_s=10)
    assert w.add(Scrape(0, "", snap(100, 150, {0: 80, 1: 50, 2: 20}), 0)) is None
    assert w.add(Scrape(5, "", snap(150, 200, {0: 100, 1: 70, 2: 30}), 0)) is None
    win = w.add(Scrape(10, "", snap(300, 450, {0: 230, 1: 150, 2: 70}), 0))
    assert win is not None and win.drafts == 200 and win.acceptance_length == pytest.approx(1 + 300 / 200)
    assert win.per_position == pytest.approx((0.75, 0.5, 0.25))
    assert w.add(Scrape(21, "", snap(10, 5, {0: 5}, boot=2.0), 0)) is None  # restarted: counters start over


def test_sparkserve_dashboard_grafana_prints_the_dashboard(tmp_path) -> None:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "sparkserve", "dashboard", "grafana"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout) == dashboard()
    out = tmp_path / "d.json"
    p = subprocess.run([sys.executable, "-m", "sparkserve", "dashboard", "grafana", "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and json.loads(out.read_text())["uid"] == "sparkserve-supervise"
