"""ChatStream: an OpenAI chat-completions SSE body, split anywhere, read into what the stream said."""

from __future__ import annotations

import json

from sparkserve.measure.records import BAD_CHUNK, ERROR_EVENT, INCOMPLETE, NO_DONE, NO_TOKENS, NO_USAGE
from sparkserve.measure.stream import ChatStream


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(content: str, finish: str | None = None) -> bytes:
    return _event({"choices": [{"delta": {"content": content}, "finish_reason": finish}]})


USAGE = _event({"choices": [], "usage": {"completion_tokens": 3}})
BODY = _chunk("a") + _chunk("b") + _chunk("c", "length") + USAGE + b"data: [DONE]\n\n"


def test_a_body_split_anywhere_reads_the_same_as_whole() -> None:
    chunks: list[int] = []
    whole = ChatStream(0.0)
    assert whole.feed(BODY) and whole.close()
    split = ChatStream(0.0, on_chunk=lambda: chunks.append(1))
    for i in range(0, len(BODY), 7):
        assert split.feed(BODY[i : i + 7])
    assert split.close()
    for s in (whole, split):
        assert s.done and s.got_tokens and s.usage_tokens == 3 and s.finish_reason == "length"
        assert s.end_error(min_tokens=3) is None
    assert len(chunks) == 3


def test_a_last_line_without_its_newline_is_read_on_close() -> None:
    s = ChatStream(0.0)
    assert s.feed(BODY[: -len(b"\n\n")])
    assert not s.done
    assert s.close() and s.done


def test_unparseable_data_and_error_events_break_the_stream() -> None:
    bad = ChatStream(0.0)
    assert not bad.feed(b"data: {nope\n")
    assert bad.error is not None and bad.error[0] == BAD_CHUNK
    err = ChatStream(0.0)
    assert not err.feed(_event({"error": {"message": "out of KV cache"}}))
    assert err.error == (ERROR_EVENT, "error event in stream: out of KV cache")


def test_a_stream_that_ended_cleanly_can_still_have_failed() -> None:
    def verdict(body: bytes, min_tokens: int | None = None) -> str | None:
        s = ChatStream(0.0)
        s.feed(body)
        s.close()
        e = s.end_error(min_tokens)
        return e[0] if e else None

    assert verdict(_chunk("a") + USAGE) == NO_DONE
    assert verdict(USAGE + b"data: [DONE]\n") == NO_TOKENS
    assert verdict(_chunk("a") + b"data: [DONE]\n") == NO_USAGE
    assert verdict(BODY, min_tokens=8) == INCOMPLETE
    assert verdict(BODY) is None
