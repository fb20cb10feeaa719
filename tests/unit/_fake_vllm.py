"""A small in-test stand-in for vLLM's OpenAI server: streamed chat completions, /metrics, /v1/models.

Runs in a thread on 127.0.0.1 with a free port. Each request can be told to misbehave (``modes``), so
the bench's stream-error and guard logic is tested deterministically; the full engine emulator lives
in tests/rig/emulator. Spec-decode counters follow vLLM's rules: one draft per decode step, prefix
acceptance drawn from a per-position profile, the bonus token, per-position counts.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OK, HTTP500, ERROR_EVENT, NO_DONE, NO_USAGE, SHORT, HANG, EMPTY, DRIBBLE = (
    "ok", "http500", "error_event", "no_done", "no_usage", "short", "hang", "empty", "dribble",
)


@dataclass
class FakeState:
    model: str = "fake-model"
    api_key: str | None = None  # like --api-key: /v1 needs "Authorization: Bearer <key>"
    k: int = 7
    profile: tuple[float, ...] = (0.744, 0.545, 0.405, 0.306, 0.237, 0.185, 0.147)
    seed: int = 0
    boot_id: float = 1795970132.07
    chunk_delay_s: float = 0.0
    modes: Callable[[int], str] = lambda i: OK
    # counters
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=lambda: [0] * 7)
    generation_tokens: int = 0
    request_success: int = 0
    requests_seen: int = 0
    running: int = 0  # requests in flight now (vllm:num_requests_running)
    foreign_requests_per_scrape: int = 0  # someone else's traffic, added at each scrape
    restart_at_scrape: int | None = None  # after this many scrapes, pretend the server restarted
    scrapes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # set to free hung requests

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.per_pos = [0] * self.k

    def steps(self, n_tokens: int) -> list[int]:
        """Tokens emitted per engine step for one request of n_tokens, updating the counters."""
        out = [1]  # prefill produces the first token, no draft
        left = n_tokens - 1
        while left > 0:
            a = 0
            prev = 1.0
            while a < self.k:
                cond = self.profile[a] / prev if prev > 0 else 0.0
                if self.rng.random() >= cond:
                    break
                prev = self.profile[a]
                a += 1
            with self.lock:
                self.drafts += 1
                self.draft_tokens += self.k
                self.accepted += a
                for p in range(a):
                    self.per_pos[p] += 1
            emit = min(a + 1, left)
            out.append(emit)
            left -= emit
        return out

    def metrics_text(self) -> str:
        with self.lock:
            self.scrapes += 1
            if self.foreign_requests_per_scrape and self.scrapes > 1:
                self.request_success += self.foreign_requests_per_scrape
                self.generation_tokens += 100 * self.foreign_requests_per_scrape
            if self.restart_at_scrape is not None and self.scrapes > self.restart_at_scrape:
                self.boot_id += 1000.0
            lab = f'engine="0",model_name="{self.model}"'
            lines = [
                "# TYPE process_start_time_seconds gauge",
                f"process_start_time_seconds {self.boot_id}",
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(self.drafts)}",
                "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(self.draft_tokens)}",
                "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(self.accepted)}",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
                *(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} {float(v)}'
                    for p, v in enumerate(self.per_pos)
                ),
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{lab}}} {float(self.generation_tokens)}",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{{lab},finished_reason="length"}} {float(self.request_success)}',
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{lab}}} {float(self.running)}",
            ]
        return "\n".join(lines) + "\n"


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: FakeState

    def log_message(self, *a: Any) -> None:
        return None

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, self.state.metrics_text().encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": self.state.model}]}).encode())
        elif self.path == "/health":
            self._send(200, b"")
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        st = self.state
        if st.api_key and self.headers.get("Authorization") != f"Bearer {st.api_key}":
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._send(401, b'{"error": "Unauthorized"}')
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if body.get("model") != st.model:
            msg = f"The model `{body.get('model')}` does not exist."
            err = {"error": {"message": msg, "type": "NotFoundError", "code": 404}}
            self._send(404, json.dumps(err).encode())
            return
        with st.lock:
            idx = st.requests_seen
            st.requests_seen += 1
            st.running += 1
        try:
            self._answer(st, body, idx)
        finally:
            with st.lock:
                st.running -= 1

    def _answer(self, st: FakeState, body: dict[str, Any], idx: int) -> None:
        mode = st.modes(idx)
        if mode == HTTP500:
            self._send(500, b'{"error":{"message":"boom","type":"InternalServerError","code":500}}')
            return
        n = int(body.get("max_tokens") or body["max_completion_tokens"])
        if mode == SHORT:
            n = n // 2
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        w = self.wfile
        if mode == DRIBBLE:  # every byte its own write: lines split across reads, \r\n endings
            w = _Dribble(self.wfile)
        rid = f"chatcmpl-{idx}"
        base = {"id": rid, "object": "chat.completion.chunk", "created": 0, "model": st.model}
        w.write(_chunk({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        if mode == HANG:
            w.flush()
            st.release.wait(30)
            return
        if mode == ERROR_EVENT:
            w.write(_chunk({"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}}))
            w.write(b"data: [DONE]\n\n")
            return
        if mode == EMPTY:
            n = 0
        steps = st.steps(n) if n else []
        for i, t in enumerate(steps):
            delta = {"reasoning": "tok " * t} if i < len(steps) // 2 else {"content": "tok " * t}
            w.write(_chunk({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
            if st.chunk_delay_s:
                w.flush()
                time.sleep(st.chunk_delay_s)
        w.write(_chunk({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
        with st.lock:
            st.generation_tokens += n
            st.request_success += 1
        if mode != NO_USAGE:
            usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": n + 10}
            w.write(_chunk({**base, "choices": [], "usage": usage}))
        if mode != NO_DONE:
            w.write(b"data: [DONE]\n\n")
        w.flush()


class _Dribble:
    def __init__(self, w: Any) -> None:
        self.w = w

    def write(self, data: bytes) -> None:
        for i in range(len(data)):
            b = data[i : i + 1]
            self.w.write(b"\r\n" if b == b"\n" else b)
            self.w.flush()

    def flush(self) -> None:
        self.w.flush()


class FakeVllm:
    """``with FakeVllm(FakeState(...)) as srv: srv.url``"""

    def __init__(self, state: FakeState | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state or FakeState()
        handler = type("H", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeVllm:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
