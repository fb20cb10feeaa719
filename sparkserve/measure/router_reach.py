"""The router gate: requests sent through the router reach every replica, counted from each replica's own
``/metrics`` (``vllm:request_success_total``), never through the router's port (it forwards ``/metrics`` to one
worker: docs/replicas-facts.md §1.3).

Example::

    g = router_gate(router_url, {1: "http://10.0.0.1:8000", 2: "http://10.0.0.3:8000"}, model="glm", api_key=None)
    g.ok, g.reached, g.failed

Each request is a streamed chat completion judged at the client: HTTP 200 and ``data: [DONE]`` (a stream cut on a
dying replica also arrives as HTTP 200, §3.9).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from sparkserve.measure.metrics import parse_metrics

PER_REPLICA = 4  # requests per replica: round_robin alternates, cache_aware splits unique prompts


@dataclass
class RouterGate:
    """Requests sent, failed (with why), and how many each replica served meanwhile (None: its /metrics did not
    answer). ``ok``: none failed and every replica served at least one."""

    sent: int
    failed: list[str] = field(default_factory=list)
    reached: dict[int, int | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed and all(v for v in self.reached.values())

    def missed(self) -> list[int]:
        return [i for i, v in self.reached.items() if not v]

    def reason(self) -> str:
        per = ", ".join(f"replica {i}: {v if v is not None else '?'}" for i, v in self.reached.items())
        fail = f"; {len(self.failed)} failed ({self.failed[0]})" if self.failed else ""
        return f"{self.sent} requests through the router reached {per}{fail}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "reason": self.reason()}


def served(api_url: str, model: str) -> float | None:
    """``vllm:request_success_total`` (summed over finished reasons) on one replica's own /metrics."""
    try:
        r = httpx.get(api_url + "/metrics", timeout=10.0, trust_env=False)
        if r.status_code != 200:
            return None
        return parse_metrics(r.text, model_name=model).request_success
    except (httpx.HTTPError, ValueError):
        return None


def one_request(url: str, model: str, api_key: str | None, tag: str, *, max_tokens: int = 8,
                timeout: float = 120.0) -> str | None:
    """One streamed chat completion through ``url``: None when it completed, else why it failed."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"sparkserve router gate {tag}: say ok"}]}
    try:
        with httpx.Client(trust_env=False, timeout=timeout) as c, \
                c.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            text = "".join(r.iter_text())
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e or 'no answer'}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {text[:120]}"
    if "data: [DONE]" not in text:
        return "the stream ended without data: [DONE]"
    return None


def router_gate(router_url: str, replicas: dict[int, str], *, model: str, api_key: str | None,
                per_replica: int = PER_REPLICA) -> RouterGate:
    """``per_replica`` x N requests through the router at once; each replica's served count before and after."""
    before = {i: served(u, model) for i, u in replicas.items()}
    n = per_replica * len(replicas)
    with ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
        results = list(pool.map(lambda k: one_request(router_url, model, api_key, f"#{k}"), range(n)))
    after = {i: served(u, model) for i, u in replicas.items()}
    reached: dict[int, int | None] = {}
    for i in replicas:
        b, a = before[i], after[i]
        reached[i] = None if a is None or b is None else int(a - b)
    return RouterGate(n, [x for x in results if x is not None], reached)
