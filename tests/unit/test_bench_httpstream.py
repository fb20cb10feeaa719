"""The bench's lean HTTP/1.1 streaming client: chunked framing, keep-alive, retries, stalls, breaks."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from sparkserve.measure.httpstream import ChunkedDecoder, StreamConnection, StreamError

BODY = b"data: one\n\ndata: two\n\n"
CHUNKED = b"9\r\ndata: one\r\n2\r\n\n\n\r\n" + b"b;ext=1\r\ndata: two\n\n\r\n" + b"0\r\nX-Trailer: y\r\n\r\n"


def test_chunked_decoder_whole_and_byte_by_byte() -> None:
    d = ChunkedDecoder()
    assert d.feed(CHUNKED) == BODY and d.done
    d = ChunkedDecoder()
    out = b"".join(d.feed(CHUNKED[i : i + 1]) for i in range(len(CHUNKED)))
    assert out == BODY and d.done


@pytest.mark.parametrize("bad", [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"1" * 5000])
def test_chunked_decoder_rejects_bad_framing(bad: bytes) -> None:
    with pytest.raises(StreamError, match="bad chunked framing"):
        ChunkedDecoder().feed(bad)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length"))
    return head + await r.readexactly(length)


async def serve(handler: Handler, client: Callable[[str], Awaitable[None]]) -> int:
    """Run ``client(url)`` against an asyncio server on 127.0.0.1 whose ``handler`` gets each connection;
    returns how many connections the client opened."""
    conns = 0

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal conns
        conns += 1
        try:
            await handler(r, w, conns)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        await client(f"http://127.0.0.1:{port}")
    finally:
        srv.close()
        await srv.wait_closed()
    return conns


async def _drain(conn: StreamConnection, stall: float | None = 5.0) -> bytes:
    out = b""
    while data := await conn.read(stall_s=stall):
        out += data
    return out


def test_keep_alive_carries_two_chunked_responses_on_one_connection() -> None:
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        for _ in range(2):
            seen.append(await _read_request(r))
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(CHUNKED), 7):  # split across writes
                w.write(CHUNKED[i : i + 7])
                await w.drain()

    async def client(url: str) -> None:
        conn = StreamConnection(url + "/prefix")
        for _ in range(2):
            status, headers = await conn.post("/v1/x", b'{"a": 1}', {"Authorization": "Bearer k"})
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            assert await _drain(conn) == BODY
            assert conn.idle
        await conn.close()

    assert asyncio.run(serve(handler, client)) == 1
    assert seen[0].startswith(b"POST /prefix/v1/x HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"a": 1}')
    assert b"Host: 127.0.0.1:" in seen[0] and b"Content-Length: 8\r\n" in seen[0]


def test_content_length_and_close_delimited_bodies() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        await _read_request(r)
        if n == 1:
            w.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nboom!")
            await w.drain()
            await _read_request(r)  # kept alive: the next request arrives here
            w.write(b"HTTP/1.0 200 OK\r\n\r\n" + BODY)
            await w.drain()
            w.close()

    async def client(url: str) -> None:
        conn = StreamConnection(url)
        status, _ = await conn.post("/a", b"{}")
        assert status == 500 and await conn.read_text() == "boom!"
        status, _ = await conn.post("/b", b"{}")
        assert status == 200 and await _drain(conn) == BODY
        assert conn.idle

    assert asyncio.run(serve(handler, client)) == 1


def test_keep_alive_connection_closed_by_the_server_is_retried_once() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        # then close the idle keep-alive connection, as servers do after their idle timeout

    async def client(url: str) -> None:
        conn = StreamConnection(url)
        for _ in range(3):
            status, _ = await conn.post("/a", b"{}")
            assert status == 200 and await _drain(conn) == b"ok"
            await asyncio.sleep(0.05)
        await conn.close()

    assert asyncio.run(serve(handler, client)) == 3


def test_silence_raises_timeout_and_a_break_raises_stream_error() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        await _read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await w.drain()
        if n == 1:
            await asyncio.sleep(5)  # hang
        # n == 2: close mid-body

    async def client(url: str) -> None:
        conn = StreamConnection(url)
        await conn.post("/a", b"{}")
        assert await conn.read(stall_s=0.3) == b"hello"
        with pytest.raises(TimeoutError):
            await conn.read(stall_s=0.3)
        await conn.post("/a", b"{}")
        assert await conn.read(stall_s=2) == b"hello"
        with pytest.raises(StreamError, match="closed mid-response"):
            await conn.read(stall_s=2)

    asyncio.run(serve(handler, client))


def test_refused_connection_is_a_stream_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def go() -> None:
        with pytest.raises(StreamError, match=f"cannot connect to 127.0.0.1:{port}"):
            await StreamConnection(f"http://127.0.0.1:{port}").post("/a", b"{}")

    asyncio.run(go())


def test_not_an_http_url() -> None:
    with pytest.raises(ValueError, match="not an http"):
        StreamConnection("ftp://x")
