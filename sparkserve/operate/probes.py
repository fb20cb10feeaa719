"""The API side of a round: one canary generation with a deadline, one ``/metrics`` scrape.

    c = canary(client, api_url, "glm-5.3-flash", max_tokens=4, deadline_s=10)    # CanaryResult
    s = scrape_metrics(client, api_url, "glm-5.3-flash")                        # Scrape | None
    w = AcceptanceWindows(window_s=30); w.add(s, now) → Window when a window closes

``/health`` is never asked: it answers 200 while the scheduler is wedged.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sparkserve.journal import lookup
from sparkserve.measure.metrics import MetricsError, Snapshot, acceptance, counter_delta, parse_metrics
from sparkserve.operate.checks import Band, CanaryResult, MetricsPoint, Window

RUNNING = "vllm:num_requests_running"
CANARY_PROMPT = "Reply with one word: ok"


def canary(client: httpx.Client, api_url: str, model: str, *, max_tokens: int, deadline_s: float,
           api_key: str | None = None) -> CanaryResult:
    """One short completion; ok when it returns at least one token within ``deadline_s``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "prompt": CANARY_PROMPT, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    t0 = time.monotonic()
    try:
        r = client.post(f"{api_url}/v1/completions", json=body, headers=headers,
                        timeout=httpx.Timeout(deadline_s, connect=min(deadline_s, 5.0)))
        dt = time.monotonic() - t0
        if r.status_code != 200:
            return CanaryResult(False, dt, 0, f"HTTP {r.status_code}: {r.text[:200]}")
        data = r.json()
        tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
        if dt > deadline_s:
            return CanaryResult(False, dt, tokens, f"took {dt:.1f}s")
        return CanaryResult(tokens > 0, dt, tokens, None if tokens > 0 else "no tokens came back")
    except httpx.TimeoutException:
        return CanaryResult(False, time.monotonic() - t0, 0, "no answer before the deadline")
    except (httpx.HTTPError, ValueError) as e:
        return CanaryResult(False, time.monotonic() - t0, 0, f"{type(e).__name__}: {e}"[:300])


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` scrape: its text, the bench's counters, and the running gauge."""

    at: float
    text: str
    snapshot: Snapshot
    running: float | None

    def point(self) -> MetricsPoint:
        return MetricsPoint(self.at, self.running, self.snapshot.generation_tokens, self.snapshot.boot_id)


def running_requests(text: str, model: str | None) -> float | None:
    total: float | None = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == RUNNING and (model is None or s.labels.get("model_name", model) == model):
                total = (total or 0.0) + s.value
    return total


def scrape_metrics(client: httpx.Client, api_url: str, model: str | None, *, timeout: float = 10.0,
                   now: float | None = None) -> Scrape | None:
    """The head's ``/metrics`` now, or None when it does not answer as vLLM does."""
    try:
        r = client.get(f"{api_url}/metrics", timeout=timeout)
        if r.status_code != 200:
            return None
        snap = parse_metrics(r.text, model_name=model)
        return Scrape(now if now is not None else time.time(), r.text, snap, running_requests(r.text, model))
    except (httpx.HTTPError, MetricsError, ValueError):
        return None


class AcceptanceWindows:
    """Acceptance from ``/metrics`` deltas, one figure per window of ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.start: Scrape | None = None
        self.last: Window | None = None

    def add(self, s: Scrape | None) -> Window | None:
        """The window that closed with this scrape (None while it is open)."""
        if s is None or not s.snapshot.has_spec_decode:
            return None
        if self.start is None:
            self.start = s
            return None
        if s.at - self.start.at < self.window_s:
            return None
        try:
            fig = acceptance(counter_delta(self.start.snapshot, s.snapshot))
        except MetricsError:  # the server restarted: a new window starts here
            self.start = s
            return None
        self.start = s
        self.last = Window(fig.drafts or 0, fig.acceptance_length, tuple(fig.per_position))
        return self.last

def incident_metrics(fresh: Scrape | None, last: Scrape | None) -> tuple[str | None, str]:
    """``/metrics`` for an incident and a note on its age: scraped now, else the last good scrape, else none."""
    if fresh is not None:
        return fresh.text, "scraped when the incident opened"
    if last is not None:
        return last.text, f"/metrics did not answer; this is the last good scrape, {time.time() - last.at:.0f}s old"
    return None, "/metrics never answered"


#: The gates' own smoke run, journalled as a bench cell: a few short requests, too few drafts to bank a band.
SMOKE_CELLS = ("smoke@gates",)


def banked_band(fp: str) -> Band | None:
    """The band banked for deployment ``fp``: a bench result (not the gates' smoke), else the first window after
    boot that a supervisor banked; None when neither is journalled."""

    def read(j: Any) -> Band | None:
        for bid, cell, raw in j.bench_results_for(fp):
            if cell in SMOKE_CELLS:
                continue
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            if d.get("acceptance_length"):
                return Band(float(d["acceptance_length"]), tuple(d.get("per_position_acceptance") or ()),
                            f"bench #{bid}")
        for _id, _t, _k, raw in j.supervise_events(fp, "band", limit=1):
            d = json.loads(raw)
            return Band(float(d["acceptance_length"]), tuple(d["per_position"]), d["source"])
        return None

    return lookup(read, None)
