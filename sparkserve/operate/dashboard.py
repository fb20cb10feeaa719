"""The Grafana dashboard for a supervised stack: the supervisor's verdict series and vLLM's own, in one JSON
document (Grafana's dashboard model, schemaVersion 39) — `sparkserve dashboard grafana > supervise.json`,
then Dashboards → Import. Its Prometheus data source is a variable (``DS_PROMETHEUS``), chosen on import.

Panels: gate verdicts, canary latency, live acceptance length against the banked band, acceptance per
position (live and band), MemFree per node against its floor, incidents and restarts, and vLLM's generation
throughput, running/waiting requests, KV-cache usage and TTFT.
"""

from __future__ import annotations

import json
from typing import Any

UID = "sparkserve-supervise"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

#: Every expression's series, so a test can check that the exporter (or vLLM) emits each one.
PANELS: list[tuple[str, str, list[tuple[str, str]], dict[str, Any]]] = [
    ("Gates (1 pass · 0 fail · -1 not judged)", "stat", [("sparkserve_gate_ok", "{{gate}}")],
     {"min": -1, "max": 1}),
    ("Canary latency", "timeseries", [("sparkserve_canary_latency_seconds", "canary")], {"unit": "s"}),
    ("Acceptance length: live vs band", "timeseries",
     [("sparkserve_acceptance_length", "live"), ("sparkserve_acceptance_band_length", "band")], {}),
    ("Acceptance per position", "barchart",
     [("sparkserve_acceptance_per_position", "live {{position}}"),
      ("sparkserve_acceptance_band_per_position", "band {{position}}")], {"min": 0, "max": 1}),
    ("MemFree per node vs floor", "timeseries",
     [("sparkserve_node_memfree_bytes", "{{node}}"), ("sparkserve_node_memfree_floor_bytes", "floor {{node}}")],
     {"unit": "bytes"}),
    ("Incidents and restarts", "timeseries",
     [("sparkserve_incidents_total", "incidents"), ("sparkserve_restarts_total", "restarts"),
      ("sparkserve_gave_up", "gave up")], {}),
    ("vLLM generation throughput", "timeseries",
     [("rate(vllm:generation_tokens_total[1m])", "tokens/s")], {"unit": "short"}),
    ("vLLM requests running / waiting", "timeseries",
     [("vllm:num_requests_running", "running"), ("vllm:num_requests_waiting", "waiting")], {}),
    ("vLLM KV-cache usage", "timeseries", [("vllm:kv_cache_usage_perc", "usage")], {"unit": "percentunit"}),
    ("vLLM time to first token (p50)", "timeseries",
     [("histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))", "p50")],
     {"unit": "s"}),
]


def dashboard() -> dict[str, Any]:
    panels = []
    for i, (title, kind, targets, field) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "title": title, "type": kind, "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
            "fieldConfig": {"defaults": dict(field), "overrides": []},
            "targets": [{"refId": chr(65 + j), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for j, (expr, legend) in enumerate(targets)],
        })
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus"}],
        "uid": UID, "title": "sparkserve — supervised stack", "schemaVersion": 39, "version": 1,
        "editable": True, "refresh": "10s", "time": {"from": "now-3h", "to": "now"},
        "tags": ["sparkserve", "vllm", "speculative-decoding"],
        "templating": {"list": [{"name": "DS_PROMETHEUS", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"
