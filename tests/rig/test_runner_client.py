"""The rig's test client (runner.stream_completion) ends every stream cleanly: it reads the response to its
chunked terminator before closing, so the server never sees a reset (issue 15 item 11).

No rig needed: a raw-socket server answers one streamed request and reports how the client left. Bytes
after ``data: [DONE]`` (blank lines here; the chunked terminator on the emulator and vLLM) are in the
client's receive buffer when it closes; closing over unread bytes makes the kernel send a reset instead
of a FIN, which a keep-alive server loop reads as ConnectionResetError.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import runner  # noqa: E402

TAIL = b"\n" * 65536  # after [DONE]: more than the client's read buffer, so some is unread at [DONE]


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


def _serve_one(events: list[bytes]) -> tuple[str, threading.Thread, list[str]]:
    """A server for one request: it streams ``events`` then the terminator, and records how the client
    went away: "eof" (a clean close) or "reset"."""
    srv = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def run() -> None:
        conn, _ = srv.accept()
        with srv, conn:
            conn.settimeout(10)
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            head, _, body = buf.partition(b"\r\n\r\n")
            m = re.search(rb"content-length: *(\d+)", head, re.I)
            while m and len(body) < int(m.group(1)):
                body += conn.recv(65536)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n" + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
                seen.append("eof" if conn.recv(1) == b"" else "data")
            except (ConnectionResetError, BrokenPipeError):
                seen.append("reset")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    host, port = srv.getsockname()
    return f"http://{host}:{port}", t, seen


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@pytest.mark.timeout(30)
def test_stream_completion_drains_to_the_terminator_after_done() -> None:
    url, t, seen = _serve_one([
        _event({"choices": [{"text": "hi"}]}),
        _event({"choices": [], "usage": {"completion_tokens": 1}}),
        b"data: [DONE]\n\n" + TAIL,
    ])
    text, usage, _ = runner.stream_completion(url, "m", "p", max_tokens=1)
    t.join(10)
    assert (text, usage, seen) == ("hi", {"completion_tokens": 1}, ["eof"])


@pytest.mark.timeout(30)
def test_stream_completion_drains_after_an_error_event_too() -> None:
    url, t, seen = _serve_one([
        _event({"choices": [{"text": "h"}]}),
        _event({"error": {"message": "boom", "type": "InternalServerError"}}),
        b"data: [DONE]\n\n" + TAIL,
    ])
    with pytest.raises(runner.RunnerError, match="InternalServerError"):
        runner.stream_completion(url, "m", "p", max_tokens=4)
    t.join(10)
    assert seen == ["eof"]
