"""Reading an OpenAI chat-completions event stream (SSE): body bytes in, what the stream said out. No I/O.

Example::

    stream = ChatStream(t0=time.perf_counter(), on_chunk=None)
    for raw in body_blocks:                  # bytes as they arrive, split anywhere
        if not stream.feed(raw):
            kind, detail = stream.error      # BAD_CHUNK or ERROR_EVENT
    stream.close()                           # a last line without its newline
    stream.end_error(min_tokens=512)         # None, or why a stream that ended cleanly is still a failure
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sparkserve.measure.records import BAD_CHUNK, ERROR_EVENT, INCOMPLETE, NO_DONE, NO_TOKENS, NO_USAGE


def _has_output(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(
        delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
        or delta.get("tool_calls")
        # a token may decode to "" (special token): a content key without a role still counts
        or ("content" in delta and delta.get("role") is None)
    )


class ChatStream:
    """One chat-completions event stream as it arrives: ``data:`` lines in, tokens seen, usage, errors.

    ``t0`` is the request's start (``time.perf_counter``) for the time to first token; ``on_chunk`` is
    called for each chunk that carries output (the live progress count).
    """

    __slots__ = (
        "t0", "on_chunk", "done", "got_tokens", "usage_tokens", "ttft_s", "finish_reason", "error", "_buf",
        "chunks", "last_s", "itl",
    )

    def __init__(self, t0: float, on_chunk: Callable[[], None] | None = None) -> None:
        self.t0 = t0
        self.on_chunk = on_chunk
        self.done = self.got_tokens = False
        self.usage_tokens: int | None = None
        self.ttft_s: float | None = None
        self.finish_reason: str | None = None
        self.error: tuple[str, str] | None = None  # (kind, detail) once the stream is known broken
        self._buf = b""
        self.chunks = 0  # chunks that carried output: one per engine step, unless the server merged steps
        self.last_s: float | None = None  # when the last output chunk came, from t0 (vLLM's E2E)
        self.itl: list[float] = []  # gaps between successive output chunks (vLLM's ITL)

    def feed(self, raw: bytes) -> bool:
        """Body bytes as they arrive; False once the stream is known to be broken (see ``error``)."""
        self._buf += raw
        if b"\n" not in raw:  # no line completed: skip the split (most SSE blocks end a line anyway)
            return True
        *lines, self._buf = self._buf.split(b"\n")
        feed_line = self.feed_line
        # a plain loop: all(genexpr) costs ~2 % of the parse on the hot path (bench/bench_client_vs_vllm.py)
        for line in lines:  # noqa: SIM110
            if not feed_line(line):
                return False
        return True

    def close(self) -> bool:
        """The body ended: read a last line left without its newline. False if it breaks the stream."""
        buf, self._buf = self._buf, b""
        return not buf or self.feed_line(buf)

    def feed_line(self, line: bytes) -> bool:
        """One line of the stream; False once the stream is known to be broken."""
        if not line.startswith(b"data:"):
            return True  # blank separators, comments, event names
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = (BAD_CHUNK, f"unparseable SSE data: {payload[:200]!r}")
            return False
        if not isinstance(obj, dict):
            return True
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.error = (ERROR_EVENT, f"error event in stream: {msg}")
            return False
        choices = obj.get("choices")
        if choices:
            c0 = choices[0]
            if _has_output(c0):
                self.chunks += 1
                now = time.perf_counter() - self.t0
                if not self.got_tokens:
                    self.got_tokens = True
                    self.ttft_s = now
                else:
                    self.itl.append(now - self.last_s)  # type: ignore[operator]
                self.last_s = now
                if self.on_chunk is not None:
                    self.on_chunk()
            if c0.get("finish_reason"):
                self.finish_reason = c0["finish_reason"]
        usage = obj.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        return True

    def end_error(self, min_tokens: int | None) -> tuple[str, str] | None:
        """Why a stream whose body ended without a transport fault still failed, or None if it did not:
        no ``[DONE]``, no tokens, no usage chunk, or fewer than a forced length of ``min_tokens``."""
        tokens = self.usage_tokens
        if not self.done:
            return NO_DONE, "stream ended without [DONE]"
        if not self.got_tokens:
            return NO_TOKENS, "stream carried no tokens"
        if tokens is None:
            return NO_USAGE, "stream carried no usage chunk (stream_options.include_usage)"
        if tokens == 0:
            return NO_TOKENS, "usage reports completion_tokens = 0"
        if min_tokens and tokens < min_tokens:
            return INCOMPLETE, f"forced length {min_tokens} but {tokens} tokens came back"
        return None
