"""One streamed chat completion, bounded in time: the request the protocol sends and how it ended.

Example::

    conn = StreamConnection("http://127.0.0.1:8000")
    body = request_body("glm-5.3-flash", prompt, 512, Sampling())
    outcome = await stream_request(conn, body, 0, deadline_s=222, stall_s=60, where="spark-a (http://…)")
    outcome.error, outcome.completion_tokens, outcome.ttft_s

Every request has a deadline and a stall timeout: a hung server is a stream error naming the node and
URL, never a stuck command. :func:`stream_request` never raises for the server's faults.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from sparkserve.measure.httpstream import StreamConnection, StreamError
from sparkserve.measure.prompts import Prompt
from sparkserve.measure.records import HTTP, HUNG, STALLED, TRANSPORT, RequestOutcome, Sampling
from sparkserve.measure.stream import ChatStream

CHAT_PATH = "/v1/chat/completions"


def request_body(model: str, prompt: Prompt, max_tokens: int, sampling: Sampling) -> dict[str, Any]:
    """The chat-completions request of the seed protocol (all fields are real vLLM request params)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": prompt.messages,
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": sampling.enable_thinking},
    }
    if sampling.forced_length:
        body["min_tokens"] = max_tokens
        body["ignore_eos"] = True
    return body


class _Stalled(Exception):
    """A stream went silent longer than the stall timeout."""


async def _exchange(
    conn: StreamConnection, payload: bytes, headers: dict[str, str] | None, stream: ChatStream, stall_s: float
) -> tuple[str, str] | None:
    """POST and feed the body to ``stream``; the (kind, detail) of an HTTP error or a broken stream.
    Raises TimeoutError when the server is silent for ``stall_s`` (before the head or within the body)."""
    async with asyncio.timeout(stall_s):
        status, _ = await conn.post(CHAT_PATH, payload, headers)
    if status != 200:
        text = (await conn.read_text(300, stall_s=stall_s)).strip()
        return HTTP, f"HTTP {status}: {text}"
    while raw := await conn.read(stall_s=stall_s):
        if not stream.feed(raw):
            return stream.error
    if not stream.close():
        return stream.error
    return None


async def stream_request(
    conn: StreamConnection,
    body: dict[str, Any],
    index: int,
    *,
    deadline_s: float,
    stall_s: float,
    where: str,
    headers: dict[str, str] | None = None,
    on_chunk: Callable[[], None] | None = None,
) -> RequestOutcome:
    """POST one streamed chat completion on ``conn`` and classify how it ended. Never raises for the
    server's faults: ``deadline_s`` bounds the whole request, ``stall_s`` any silence within it."""
    out = RequestOutcome(index=index)
    t0 = time.perf_counter()
    stream = ChatStream(t0, on_chunk)
    payload = json.dumps(body).encode()
    try:
        async with asyncio.timeout(deadline_s):
            try:
                failure = await _exchange(conn, payload, headers, stream, stall_s)
            except TimeoutError:  # the stall bound; the deadline's own expiry surfaces outside
                raise _Stalled() from None
    except _Stalled:
        out.error = STALLED
        out.detail = f"{where}: request {index} stalled: nothing received for {stall_s:g} s (hung?)"
        return out
    except TimeoutError:
        out.error = HUNG
        out.detail = f"{where}: request {index} hung: not finished within the {deadline_s:g} s deadline"
        return out
    except (StreamError, OSError) as e:
        out.error, out.detail = TRANSPORT, f"{where}: {e}"
        return out
    finally:
        if not conn.idle:
            conn.abort()  # a response left part-way must not be mistaken for the next one
        out.latency_s = time.perf_counter() - t0
        out.ttft_s, out.finish_reason, out.chunks = stream.ttft_s, stream.finish_reason, stream.chunks
        out.e2e_s, out.itl_s = stream.last_s, stream.itl
    if failure is not None:
        out.error, out.detail = failure
        return out
    if stream.usage_tokens is not None:
        out.completion_tokens = stream.usage_tokens
    verdict = stream.end_error(body.get("min_tokens"))
    if verdict is not None:
        out.error, out.detail = verdict
    return out
