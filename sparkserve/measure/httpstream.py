"""A lean HTTP/1.1 client for one job: POST a JSON body and stream the response body back.

Example::

    conn = StreamConnection("http://127.0.0.1:8000")
    status, headers = await conn.post("/v1/chat/completions", body_bytes, {"Authorization": "Bearer k"})
    while data := await conn.read(stall_s=60):   # bytes as they arrive (chunked / length / until close)
        ...
    await conn.close()

Why not httpx here: the bench measures output tokens per second, and a client that costs more CPU per
SSE chunk than the server's own pacing shows up in the figure. httpx (h11, pure Python) spent ~3 %
more wall time than vLLM's own ``vllm bench serve`` (aiohttp) at 16 streams on the emulator; this
client reads large blocks and decodes the chunked framing with ``bytes.find``, and agrees with it
(bench/bench_client_vs_vllm.py). Everything else (``/metrics``, ``/v1/models``) uses httpx.

One connection serves one request at a time and is kept alive for the next (HTTP/1.1 keep-alive); a
kept-alive connection the server closed meanwhile is retried once on a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit

READ_SIZE = 1 << 16


class StreamError(Exception):
    """The connection failed or the server broke HTTP framing (not an HTTP error status)."""


class ChunkedDecoder:
    """Incremental ``Transfer-Encoding: chunked`` decoder: ``feed(raw)`` returns the body bytes so far."""

    __slots__ = ("_buf", "_need", "done")

    def __init__(self) -> None:
        self._buf = b""
        self._need = -1  # bytes of chunk data still to take; -1 = expecting a size line; -2 = trailers
        self.done = False

    def feed(self, raw: bytes) -> bytes:
        buf = self._buf + raw if self._buf else raw
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        need = self._need
        while pos < n and not self.done:
            if need > 0:
                take = min(need, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                need -= take
                if need == 0:
                    need = -3  # the CRLF after the chunk data
                continue
            if need == -3:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise StreamError("bad chunked framing: chunk data not followed by CRLF")
                pos += 2
                need = -1
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 4096:
                    raise StreamError("bad chunked framing: overlong chunk-size line")
                break
            line = buf[pos:eol]
            pos = eol + 2
            if need == -2:  # trailer section ends with an empty line
                if not line:
                    self.done = True
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise StreamError(f"bad chunked framing: chunk size {line[:40]!r}") from None
            need = size if size > 0 else -2
        self._need = need
        self._buf = buf[pos:] if pos < n else b""
        return b"".join(out)


class StreamConnection:
    """One keep-alive HTTP/1.1 connection to ``base_url`` (``http://`` or ``https://``, optional path)."""

    def __init__(self, base_url: str, *, connect_timeout_s: float = 10.0) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.prefix = u.path.rstrip("/")
        default_port = (u.scheme == "https" and self.port == 443) or (u.scheme == "http" and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.connect_timeout_s = connect_timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._rest = b""
        self._mode = ""  # chunked | length | close
        self._left = 0
        self._chunks: ChunkedDecoder | None = None
        self._keep = False

    async def _connect(self) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                self._reader, self._writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.ssl, limit=READ_SIZE
                )
        except TimeoutError:
            raise StreamError(f"connect to {self.host}:{self.port} timed out") from None
        except OSError as e:
            raise StreamError(f"cannot connect to {self.host}:{self.port}: {e.strerror or e}") from None

    @property
    def idle(self) -> bool:
        """No response in flight: the connection (if open) can carry the next request."""
        return self._mode in ("", "done")

    def abort(self) -> None:
        """Drop the connection now (no waiting): for cleanup paths, including cancellation."""
        w, self._writer, self._reader = self._writer, None, None
        self._mode = ""
        if w is not None:
            w.close()

    async def close(self) -> None:
        w, self._writer, self._reader = self._writer, None, None
        if w is not None:
            w.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await w.wait_closed()

    async def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str]]:
        """Send the request; returns the status and lower-cased headers. Read the body with :meth:`body`."""
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\nAccept-Encoding: identity\r\n"
            "User-Agent: sparkserve-bench\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
            + f"Content-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        if self._writer is not None and self._mode not in ("", "done"):
            await self.close()  # the previous response was abandoned part-way: its bytes are still coming
        self._rest, self._mode = b"", ""
        reused = self._writer is not None
        for attempt in (0, 1):
            if self._writer is None:
                await self._connect()
            assert self._writer is not None
            try:
                self._writer.write(head + body)
                status_line = await self._read_line()
            except (OSError, StreamError):
                status_line = b""
            if status_line:
                break
            await self.close()
            if not reused or attempt == 1:  # a fresh connection that says nothing: real failure
                raise StreamError("the server closed the connection without a response")
        parts = status_line.split(b" ", 2)
        try:
            status = int(parts[1])
        except (IndexError, ValueError):
            raise StreamError(f"not an HTTP response: {status_line[:80]!r}") from None
        hdrs: dict[str, str] = {}
        while True:
            line = await self._read_line()
            if not line:
                raise StreamError("connection closed inside the response headers")
            if line in (b"\r\n", b"\n"):
                break
            k, _, v = line.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        te = hdrs.get("transfer-encoding", "").lower()
        if "chunked" in te:
            self._mode, self._chunks = "chunked", ChunkedDecoder()
        elif "content-length" in hdrs:
            self._mode, self._left = "length", int(hdrs["content-length"])
        else:
            self._mode = "close"
        http10 = parts[0].upper() == b"HTTP/1.0"
        conn_hdr = hdrs.get("connection", "").lower()
        self._keep = self._mode != "close" and conn_hdr != "close" and not (http10 and conn_hdr != "keep-alive")
        return status, hdrs

    async def _read_line(self) -> bytes:
        while True:
            i = self._rest.find(b"\n")
            if i >= 0:
                line, self._rest = self._rest[: i + 1], self._rest[i + 1 :]
                return line
            assert self._reader is not None
            data = await self._reader.read(READ_SIZE)
            if not data:
                line, self._rest = self._rest, b""
                return line
            self._rest += data

    async def read(self, *, stall_s: float | None = None) -> bytes:
        """The next body bytes as they arrive; ``b""`` once the body is complete. Raises TimeoutError when
        nothing arrives for ``stall_s`` seconds, StreamError when the connection breaks mid-body."""
        while True:
            if self._mode == "done":
                return b""
            if self._rest:
                raw, self._rest = self._rest, b""
            else:
                assert self._reader is not None
                try:
                    if stall_s is None:
                        raw = await self._reader.read(READ_SIZE)
                    else:
                        async with asyncio.timeout(stall_s):
                            raw = await self._reader.read(READ_SIZE)
                except TimeoutError:
                    await self.close()
                    raise
                except OSError as e:
                    await self.close()
                    raise StreamError(f"connection failed mid-response: {e.strerror or e}") from None
                if not raw:
                    if self._mode == "close":
                        return await self._finish()
                    await self.close()
                    raise StreamError("connection closed mid-response")
            if self._mode == "chunked":
                assert self._chunks is not None
                data = self._chunks.feed(raw)
                if self._chunks.done:
                    await self._finish()
            elif self._mode == "length":
                data = raw[: self._left]
                self._left -= len(data)
                if self._left <= 0:
                    await self._finish()
            else:
                data = raw
            if data:
                return data

    async def _finish(self) -> bytes:
        self._mode = "done"
        if not self._keep:
            await self.close()
        return b""

    async def read_text(self, limit: int = 4096, *, stall_s: float = 10.0) -> str:
        """The (error) body, up to ``limit`` bytes, as text; the connection is closed if not fully read."""
        out = b""
        while len(out) < limit and (data := await self.read(stall_s=stall_s)):
            out += data
        if self._mode != "done":
            await self.close()
        return out[:limit].decode("utf-8", "replace")
