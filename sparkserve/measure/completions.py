"""One request of the model card's protocol: a rendered prompt to ``/v1/completions``, not streamed, EOS ends it.

Example::

    body = card_body("glm-5.3-flash", rendered, 1024)   # {model, prompt, max_tokens, temperature, top_p}
    outcome = await complete_request(conn, body, 0, deadline_s=1200, where="spark-a (http://…)")
    outcome.completion_tokens, outcome.finish_reason, outcome.error

The body is the card's holdout client's, key for key: no ``ignore_eos``, no ``min_tokens``, no
``stream``, no ``chat_template_kwargs`` (thinking is already in the rendered prompt). The output is the
response's ``usage.completion_tokens``; a reply without it is a failed request, as it is for the card's
client. The card's client bounds a request with a 1200 s total timeout (:data:`CARD_DEADLINE_S`); the
reply comes in one piece, so there is no stall bound short of the deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from sparkserve.measure.httpstream import StreamConnection, StreamError
from sparkserve.measure.records import HTTP, HUNG, NO_USAGE, TRANSPORT, RequestOutcome

COMPLETIONS_PATH = "/v1/completions"
CARD_DEADLINE_S = 1200.0  # the card client's aiohttp ClientTimeout(total=1200)
MAX_BODY = 32 << 20  # a 1024-token reply is a few KiB; anything near this is not a completion


def card_body(model: str, prompt: str, max_tokens: int, *, temperature: float = 1.0,
              top_p: float = 0.95) -> dict[str, Any]:
    """The card's request body: the served name, the rendered prompt, max_tokens, T and top_p — nothing else."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}


async def _read_all(conn: StreamConnection, deadline_s: float) -> bytes:
    out = bytearray()
    while data := await conn.read(stall_s=deadline_s):
        out += data
        if len(out) > MAX_BODY:
            raise StreamError(f"reply over {MAX_BODY:,} bytes: not a completion")
    return bytes(out)


def _usage_tokens(obj: Any) -> int | None:
    usage = obj.get("usage") if isinstance(obj, dict) else None
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _finish(obj: Any) -> str | None:
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        r = choices[0].get("finish_reason")
        return r if isinstance(r, str) else None
    return None


async def complete_request(
    conn: StreamConnection,
    body: dict[str, Any],
    index: int,
    *,
    deadline_s: float,
    where: str,
    headers: dict[str, str] | None = None,
) -> RequestOutcome:
    """POST one completion on ``conn`` and read the whole reply. Never raises for the server's faults:
    an HTTP error, a broken connection, a reply without usage and the deadline are the outcome's ``error``."""
    out = RequestOutcome(index=index)
    t0 = time.perf_counter()
    payload = json.dumps(body).encode()
    try:
        async with asyncio.timeout(deadline_s):
            status, _ = await conn.post(COMPLETIONS_PATH, payload, headers)
            raw = await _read_all(conn, deadline_s)
    except TimeoutError:
        out.error = HUNG
        out.detail = f"{where}: request {index} hung: not finished within the {deadline_s:g} s deadline"
        return out
    except (StreamError, OSError) as e:
        out.error, out.detail = TRANSPORT, f"{where}: {e}"
        return out
    finally:
        if not conn.idle:
            conn.abort()
        out.latency_s = time.perf_counter() - t0
    text = raw.decode("utf-8", "replace")
    if status != 200:
        out.error, out.detail = HTTP, f"{where}: request {index}: HTTP {status}: {text[:300].strip()}"
        return out
    try:
        obj = json.loads(text)
    except ValueError:
        out.error, out.detail = NO_USAGE, f"{where}: request {index}: reply is not JSON: {text[:200]!r}"
        return out
    out.finish_reason = _finish(obj)
    n = _usage_tokens(obj)
    if n is None:
        out.error, out.detail = NO_USAGE, f"{where}: request {index}: reply has no usage.completion_tokens"
        return out
    out.completion_tokens = n
    return out
