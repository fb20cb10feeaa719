"""The supervisor's one port (``supervise.listen``): Prometheus series at ``/metrics``, the status page at
``/``, the state as JSON at ``/status.json``.

    server = serve(state, "127.0.0.1:9321")      # a daemon thread; server.shutdown() stops it
    # curl -s 127.0.0.1:9321/metrics | grep sparkserve_gate_ok

Series (all gauges unless ``_total``):

* ``sparkserve_gate_ok{gate}`` — 1 pass, 0 fail, -1 not judged this round;
* ``sparkserve_supervise_up``, ``sparkserve_supervise_rounds_total``,
  ``sparkserve_supervise_last_round_timestamp_seconds``;
* ``sparkserve_canary_ok``, ``sparkserve_canary_latency_seconds``;
* ``sparkserve_acceptance_length``, ``sparkserve_acceptance_per_position{position}``,
  ``sparkserve_acceptance_band_length``, ``sparkserve_acceptance_band_per_position{position}``;
* ``sparkserve_incidents_total``, ``sparkserve_restarts_total``, ``sparkserve_gave_up``;
* ``sparkserve_node_memfree_bytes{node}``, ``sparkserve_node_memfree_floor_bytes{node}``.

With ``replicas: N`` (operate/fleet.py) the per-stack series carry a ``replica`` label ("1", "2", …) instead:
``sparkserve_gate_ok{gate,replica}``, ``sparkserve_canary_ok{replica}``, ``sparkserve_canary_latency_seconds{replica}``,
``sparkserve_acceptance_length{replica}``, ``sparkserve_acceptance_band_length{replica}``,
``sparkserve_replica_restarts_total{replica}``; and ``sparkserve_replica_serving{replica}`` (in the router, every
gate passing), ``sparkserve_replica_in_router{replica}``, ``sparkserve_router_ok``,
``sparkserve_router_restarts_total``. The fleet-wide counters (rounds, incidents, restarts, gave_up) and the
per-node memory keep their names.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sparkserve.errors import BadInput
from sparkserve.operate.state import SuperviseState
from sparkserve.operate.statuspage import render


class StateCollector(Collector):
    def __init__(self, state: SuperviseState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state.snapshot()
        if s.get("replicas"):
            yield from _fleet_series(s)
            yield from _common_series(s)
            return
        g = GaugeMetricFamily("sparkserve_gate_ok", "Verdict of each supervise gate: 1 pass, 0 fail, -1 not judged",
                              labels=["gate"])
        for name, v in s["gates"].items():
            g.add_metric([name], 1.0 if v["ok"] is True else 0.0 if v["ok"] is False else -1.0)
        yield g
        yield GaugeMetricFamily("sparkserve_supervise_up", "The supervisor runs", value=1.0)
        yield CounterMetricFamily("sparkserve_supervise_rounds", "Rounds of checks", value=s["rounds"])
        if s["last_round_at"] is not None:
            yield GaugeMetricFamily("sparkserve_supervise_last_round_timestamp_seconds", "End of the last round",
                                    value=s["last_round_at"])
        if s["canary_ok"] is not None:
            yield GaugeMetricFamily("sparkserve_canary_ok", "The last canary generation finished in time",
                                    value=1.0 if s["canary_ok"] else 0.0)
        if s["canary_s"] is not None:
            yield GaugeMetricFamily("sparkserve_canary_latency_seconds", "Seconds the last canary took",
                                    value=s["canary_s"])
        w, b = s["window"], s["band"]
        if w and w.get("acceptance_length") is not None:
            yield GaugeMetricFamily("sparkserve_acceptance_length", "Live acceptance length (last window)",
                                    value=w["acceptance_length"])
            pp = GaugeMetricFamily("sparkserve_acceptance_per_position", "Live per-position acceptance rate",
                                   labels=["position"])
            for i, x in enumerate(w["per_position"]):
                pp.add_metric([str(i)], x)
            yield pp
        if b:
            yield GaugeMetricFamily("sparkserve_acceptance_band_length", "Banked acceptance length of this drafter",
                                    value=b["acceptance_length"])
            bp = GaugeMetricFamily("sparkserve_acceptance_band_per_position", "Banked per-position rate",
                                   labels=["position"])
            for i, x in enumerate(b["per_position"]):
                bp.add_metric([str(i)], x)
            yield bp
        yield from _common_series(s)


def _common_series(s: dict[str, Any]) -> Iterator[Metric]:
    yield CounterMetricFamily("sparkserve_incidents", "Incidents opened", value=len(s["incidents"]))
    yield CounterMetricFamily("sparkserve_restarts", "Restarts made by supervise", value=s["restarts"])
    yield GaugeMetricFamily("sparkserve_gave_up", "1 once the give-up budget was spent",
                            value=1.0 if s["gave_up"] else 0.0)
    mf = GaugeMetricFamily("sparkserve_node_memfree_bytes", "Each node's MemFree", labels=["node"])
    fl = GaugeMetricFamily("sparkserve_node_memfree_floor_bytes", "Each node's MemFree floor", labels=["node"])
    for node, v in s["memfree"].items():
        if v is not None:
            mf.add_metric([node], float(v))
        fl.add_metric([node], float(s["memfree_floor"]))
    yield mf
    yield fl


def _fleet_series(s: dict[str, Any]) -> Iterator[Metric]:
    """The per-replica series of a fleet's supervisor (module docstring)."""
    reps = s["replicas"]
    gate = GaugeMetricFamily("sparkserve_gate_ok", "Verdict of each supervise gate per replica: 1 pass, 0 fail, "
                             "-1 not judged", labels=["gate", "replica"])
    fams = {k: GaugeMetricFamily(f"sparkserve_{k}", h, labels=["replica"]) for k, h in (
        ("canary_ok", "The replica's last canary generation finished in time"),
        ("canary_latency_seconds", "Seconds the replica's last canary took"),
        ("acceptance_length", "The replica's live acceptance length (last window)"),
        ("acceptance_band_length", "Banked acceptance length of the replica's drafter"),
        ("replica_serving", "1 when the replica is in the router and every gate passes"),
        ("replica_in_router", "1 when the router holds the replica as a worker"))}
    restarts = CounterMetricFamily("sparkserve_replica_restarts", "Restarts of the replica made by supervise",
                                   labels=["replica"])
    for r in reps:
        i = str(r["replica"])
        for name, v in r["gates"].items():
            gate.add_metric([name, i], 1.0 if v["ok"] is True else 0.0 if v["ok"] is False else -1.0)
        w, b = r.get("window"), r.get("band")
        for k, v in (("canary_ok", None if r["canary_ok"] is None else float(r["canary_ok"])),
                     ("canary_latency_seconds", r["canary_s"]),
                     ("acceptance_length", w.get("acceptance_length") if w else None),
                     ("acceptance_band_length", b["acceptance_length"] if b else None),
                     ("replica_serving", float(bool(r["ok"]))), ("replica_in_router", float(bool(r["in_router"])))):
            if v is not None:
                fams[k].add_metric([i], float(v))
        restarts.add_metric([i], float(r["restarts"]))
    yield gate
    yield from fams.values()
    yield restarts
    router = s.get("router") or {}
    yield GaugeMetricFamily("sparkserve_router_ok", "The router runs and answers /workers",
                            value=1.0 if router.get("ok") else 0.0)
    yield CounterMetricFamily("sparkserve_router_restarts", "Router restarts made by supervise",
                              value=float(router.get("restarts") or 0))
    yield GaugeMetricFamily("sparkserve_supervise_up", "The supervisor runs", value=1.0)
    yield CounterMetricFamily("sparkserve_supervise_rounds", "Rounds of checks", value=s["rounds"])
    if s["last_round_at"] is not None:
        yield GaugeMetricFamily("sparkserve_supervise_last_round_timestamp_seconds", "End of the last round",
                                value=s["last_round_at"])


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadInput("supervise.listen", f"{listen!r} is not host:port")
    return host.strip("[]"), int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    state: SuperviseState
    registry: CollectorRegistry
    refresh_s: float


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: no access log on stderr
        pass

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.server.registry), "text/plain; version=0.0.4; charset=utf-8")
        elif path in ("/", "/index.html"):
            page = render(self.server.state.snapshot(), refresh_s=self.server.refresh_s)
            self._send(200, page.encode(), "text/html; charset=utf-8")
        elif path == "/status.json":
            self._send(200, json.dumps(self.server.state.snapshot(), default=str).encode(), "application/json")
        else:
            self._send(404, b"not found\n", "text/plain")


def serve(state: SuperviseState, listen: str, *, refresh_s: float = 5.0) -> _Server:
    """Start the exporter + status page on ``listen`` in a daemon thread; BadInput when it cannot bind."""
    host, port = parse_listen(listen)
    try:
        srv = _Server((host, port), _Handler)
    except OSError as e:
        raise BadInput("supervise.listen", f"cannot listen on {listen}: {e.strerror or e}") from None
    srv.state = state
    srv.registry = CollectorRegistry(auto_describe=False)
    srv.registry.register(StateCollector(state))
    srv.refresh_s = refresh_s
    threading.Thread(target=srv.serve_forever, name="supervise-exporter", daemon=True).start()
    return srv
