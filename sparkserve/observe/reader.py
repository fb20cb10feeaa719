"""A log's bytes, read for the event scan: one pass over the bytes, then the lines worth reading and their context.

The pass reads the log in chunks and runs one Hyperscan database over each: every literal needle of
:data:`sparkserve.observe.logpatterns.NEEDLES` (derived from the pattern table at import, so a new row is
covered without touching this module), the PyTorch c10 error-level mark, and the colour codes. Only lines a
needle hits are parsed, plus the context the event scan asks for around them (traceback frames, the next
record of a writer, the nearest timestamp, a config dump's wrapped tail), found by walking from a hit line.
Nothing holds a list of all lines: a saved file is read with ``pread`` through a few cached blocks, and the
hits are kept as packed offsets. Hyperscan beat google-re2, pyahocorasick and one combined ``re`` by 7×, 33×
and 100× on a 50 MB serving log (bench/bench_logs_analyze.py has the figures of the whole reader).

A copy hard-wrapped at a fixed terminal width is re-joined first (line numbers stay those of the file); the
first :data:`WRAP_SAMPLE` bytes decide whether a file is such a copy (a terminal paste is far smaller).
"""

from __future__ import annotations

import os
import re
import stat
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Any, BinaryIO

import hyperscan

from sparkserve.observe.logline import Record, normalise, starts_prefixed, strip_ansi
from sparkserve.observe.logpatterns import EXCEPTION_LINE, NEEDLES, POINTER

CHUNK = 16 << 20  # bytes per scan of the one pass (a line longer than this grows the chunk)
BLOCK = 1 << 20  # bytes per cached block when lines are read again
WRAP_SAMPLE = 4 << 20  # the head of the file that decides whether it is a hard-wrapped terminal copy

# Prefilter ids past the needles: a c10 error-level line (`[rank1]:[E1129 …`: ERROR without the word), and
# colour codes anywhere (raw ESC, pasted `^[[`, or a bare `[36m` whose ESC was lost) — then lines are stripped.
_C10_ERROR = rb"\[[EF]\d{4} "
_ANSI = (rb"\x1b", rb"\^\[\[", rb"\[(?:\d{1,3};)*\d{1,3}m")
_ID_C10 = len(NEEDLES)
_DB: hyperscan.Database | None = None
_NAMES = tuple(frozenset({n}) for n in NEEDLES) + (frozenset({"ERROR"}),)  # prefilter id → the needles it means


def _database() -> hyperscan.Database:
    """The prefilter, compiled once per process on first use (~30 ms; most commands never read a log)."""
    global _DB
    if _DB is None:
        exprs = [re.escape(n.encode()) for n in NEEDLES] + [_C10_ERROR, *_ANSI]
        flags = [0] * (len(NEEDLES) + 1) + [hyperscan.HS_FLAG_SINGLEMATCH] * len(_ANSI)
        db = hyperscan.Database()
        db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs), flags=flags)
        _DB = db
    return _DB


class _FileBytes:
    """Random access to a regular file's bytes through a few cached blocks (``find``/``rfind``/slices of bytes)."""

    def __init__(self, file: BinaryIO, fd: int, size: int) -> None:
        self.file = file  # held: the descriptor stays open while the reader may still read through it
        self.fd, self.size = fd, size
        self._blocks: dict[int, bytes] = {}  # insertion order is recency: the oldest goes first
        self._last, self._last_block = -1, b""  # the block the last slice came from: the next one mostly does

    def _block(self, n: int) -> bytes:
        b = self._blocks.pop(n, None)
        if b is None:
            b = os.pread(self.fd, BLOCK, n * BLOCK)
            if len(self._blocks) >= 4:
                del self._blocks[next(iter(self._blocks))]
        self._blocks[n] = b
        return b

    def read(self, start: int, n: int) -> bytes:
        return os.pread(self.fd, n, start)

    def cut(self, a: int, b: int) -> bytes:
        b = min(b, self.size)
        if a >= b:
            return b""
        first, last = a // BLOCK, (b - 1) // BLOCK
        if first == last:
            if first != self._last:
                self._last, self._last_block = first, self._block(first)
            off = first * BLOCK
            return self._last_block[a - off : b - off]
        return b"".join(self._block(n)[max(a - n * BLOCK, 0) : b - n * BLOCK] for n in range(first, last + 1))

    def find(self, sep: bytes, start: int) -> int:
        n = start // BLOCK
        while n * BLOCK < self.size:
            i = self._block(n).find(sep, max(start - n * BLOCK, 0))
            if i != -1:
                return n * BLOCK + i
            n += 1
        return -1

    def rfind(self, sep: bytes, _zero: int, end: int) -> int:
        n = (end - 1) // BLOCK
        while n >= 0 and end > 0:
            i = self._block(n).rfind(sep, 0, end - n * BLOCK)
            if i != -1:
                return n * BLOCK + i
            n -= 1
            end = (n + 1) * BLOCK
        return -1


class _MemBytes:
    """Bytes already in memory, with the reading interface of :class:`_FileBytes` (no copy)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)
        self.find = data.find
        self.rfind = data.rfind

    def read(self, start: int, n: int) -> bytes:
        return self.data if start == 0 and n >= self.size else self.data[start : start + n]

    def cut(self, a: int, b: int) -> bytes:
        return self.data[a:b]


_Bytes = _FileBytes | _MemBytes


@dataclass
class _Pass:
    """What the one pass over the bytes found: the hit lines (packed) and the facts of the whole file."""

    idx: array  # 0-based line index of each hit line, ascending
    start: array  # its first byte
    end: array  # the byte after it (its separator, or the end of the file)
    ids: array  # the prefilter id that hit it, or -1 when several did (then `multi` has them)
    multi: dict[int, frozenset[int]]  # position in the arrays → the ids of a line hit by more than one
    lines: int  # lines in the file
    ansi: bool  # colour codes anywhere
    has_sep: bool
    wrapped: bool  # the first WRAP_SAMPLE bytes look like a hard-wrapped terminal copy


def _one_pass(src: _Bytes, sep: bytes) -> _Pass:
    """Scan the file once, chunk by chunk (each cut at a line end), with the prefilter."""
    db = _database()
    scratch = hyperscan.Scratch(db)
    out = _Pass(array("q"), array("q"), array("q"), array("h"), {}, 0, False, False, False)
    pos = 0
    while pos < src.size:
        n = CHUNK
        while True:
            data = src.read(pos, n)
            cut = len(data) if pos + len(data) >= src.size else data.rfind(sep) + 1
            if cut or not data:
                break
            n *= 2  # one line longer than a chunk
        if not data:  # the file shrank under us: what was read is all there is
            break
        if pos == 0:
            head = data if len(data) >= WRAP_SAMPLE else src.read(0, WRAP_SAMPLE)
            out.wrapped = _looks_wrapped(head[:WRAP_SAMPLE].split(sep))
        out.has_sep = out.has_sep or sep in data
        hits: list[tuple[int, int]] = []
        db.scan(data, match_event_handler=_on_hit, context=hits, scratch=scratch)
        _collect(out, data, cut, pos, sep, hits)
        pos += cut
    if src.size and src.cut(src.size - 1, src.size) != sep:
        out.lines += 1
    return out


def _on_hit(i: int, _start: int, to: int, _flags: int, hits: list[tuple[int, int]]) -> None:
    hits.append((to, i))


def _collect(out: _Pass, data: bytes, cut: int, pos: int, sep: bytes, hits: list[tuple[int, int]]) -> None:
    """File the hits of one chunk under their lines (``map`` over C methods: no Python step per line)."""
    if any(i > _ID_C10 for _, i in hits):
        out.ansi = True
        hits = [h for h in hits if h[1] <= _ID_C10]
    hits = [h for h in hits if h[0] <= cut]  # a hit in the cut-off last line: the next chunk reads it again
    ids = [i for _, i in hits]
    seps = list(map(data.rfind, repeat(sep), repeat(0), [to for to, _ in hits]))  # the separator before each
    one = dict(zip(seps, ids, strict=True))  # line → its (last) id, in file order
    lines = list(one)
    starts = [s + 1 for s in lines]
    base = len(out.idx)
    for k in [k for k in range(1, len(seps)) if seps[k] == seps[k - 1]]:  # lines hit more than once
        at = base + bisect_left(lines, seps[k])
        got = out.multi.get(at, frozenset())
        out.multi[at] = got | {ids[k - 1], ids[k]}
        one[seps[k]] = -1
    line_of = accumulate(map(data.count, repeat(sep), [0, *starts[:-1]], starts), initial=out.lines)
    next(line_of)  # the chunk's own first line
    out.idx.extend(line_of)
    ends = [cut if e == -1 or e > cut else e for e in map(data.find, repeat(sep), starts)]
    out.start.extend(map(pos.__add__, starts))
    out.end.extend(map(pos.__add__, ends))
    out.ids.extend(one.values())
    last = starts[-1] if starts else 0  # the lines up to the last hit are counted already
    out.lines = (out.idx[-1] if starts else out.lines) + data.count(sep, last, cut)


_RECORD_START = re.compile(
    rb"(?:\x1b\[[0-9;]*m|\^\[\[[0-9;]*m|\[[0-9;]+m)?(?:\([A-Za-z_][\w.\-]*(?: [A-Za-z_][\w\-]*)?(?: rank=\d+)? pid=\d+"
    rb"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[ :]|\[rank\d+\]:|\[[IWEF]\d{4} |\{\"|Traceback |\d{4}-\d\d-\d\dT"
    rb"|[A-Z][a-z]{2} [ \d]\d \d\d:|[\w.-]+\s+\| |[\w.-]+:\d+:\d+ \[)"
)


def _wrap_width(lines: list[bytes]) -> int | None:
    """A log copied from a terminal is cut at a fixed width W: the longest length occurs again and again, and
    such a line is mostly followed by a fragment that starts no record. W, or None if not wrapped."""
    if lines and lines[-1] == b"":
        lines = lines[:-1]
    if len(lines) < 4:
        return None
    lens = list(map(len, lines))
    width = max(lens)
    if width < 40 or lens.count(width) < 3:
        return None
    cut = [i for i, n in enumerate(lens) if n == width and i + 1 < len(lines)]
    cont = [i for i in cut if not _RECORD_START.match(lines[i + 1])]
    return None if len(cont) * 2 < len(cut) else width


def _looks_wrapped(lines: list[bytes]) -> bool:
    return _wrap_width(lines) is not None


def _join_hard_wraps(lines: list[bytes], width: int) -> tuple[list[bytes], list[int]]:
    """Join each ``width``-long line with the fragments after it; returns the lines and each one's first line."""
    out: list[bytes] = []
    first: list[int] = []
    i = 0
    while i < len(lines):
        first.append(i + 1)
        cur = lines[i]
        while len(lines[i]) == width and i + 1 < len(lines) and not _RECORD_START.match(lines[i + 1]):
            i += 1
            cur += lines[i]
        out.append(cur)
        i += 1
    return out, first


_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
#: pydantic's exception header (vLLM's configs are pydantic dataclasses): the reason is on the next lines.
VALIDATION_ERROR = re.compile(r"\b\d+ validation errors? for \S+")
_PYDANTIC_TYPE = re.compile(r"\s*\[type=[^\]]*(?:\]|$).*$")


@dataclass
class Traceback:
    """The extent of one Python traceback in one writer's stream, and its root-cause line."""

    start: int  # 0-based physical index of the `Traceback` line
    stream: tuple[Any, ...]
    lines: set[int]
    root: Record | None
    first: Record | None = None  # the `Traceback (most recent call last):` record
    reason: str | None = None  # a pydantic `N validation error(s) for X` root: what its next lines say


def _source(log: bytes | BinaryIO) -> _Bytes:
    """The bytes of a log: in memory as given, or a regular file read in place (anything else is read whole)."""
    if isinstance(log, bytes):
        return _MemBytes(log)
    try:
        fd = log.fileno()
        st = os.fstat(fd)
    except (OSError, ValueError):  # io.UnsupportedOperation is both: a stream with no descriptor
        return _MemBytes(log.read())
    if stat.S_ISREG(st.st_mode):
        return _FileBytes(log, fd, st.st_size)
    return _MemBytes(log.read())


class LogReader:
    """One log's hit lines and, on demand, any line near them, decoded and normalised (each at most once)."""

    def __init__(self, log: bytes | BinaryIO) -> None:
        src = _source(log)
        self.sep = b"\n"
        scan = _one_pass(src, self.sep)
        if not scan.has_sep and src.size and b"\r" in src.cut(0, src.size):
            self.sep = b"\r"  # a file of CRs only (pasted tqdm output): its lines end at CR
            scan = _one_pass(src, self.sep)
        self.first_line: list[int] | None = None
        if scan.wrapped:  # a terminal paste: small; joined in memory as it always was
            lines = src.cut(0, src.size).split(self.sep)
            if lines and lines[-1] == b"":
                lines.pop()
            width = _wrap_width(lines)
            if width is not None:
                lines, self.first_line = _join_hard_wraps(lines, width)
                src = _MemBytes(b"\n".join(lines))
                self.sep = b"\n"
                scan = _one_pass(src, self.sep)
        self._src = src
        self._scan = scan
        self.line_count = len(self.first_line) if self.first_line is not None else scan.lines
        self.ansi = scan.ansi
        self._spans: dict[int, tuple[int, int]] = {}  # context lines found by walking from a hit line
        self._cache: dict[int, list[Record]] = {}
        self._hit: tuple[int, tuple[int, int]] = (-1, (0, 0))  # the hit line candidates() is at

    def candidates(self) -> Iterator[tuple[int, frozenset[str], bytes]]:
        """The lines a needle hit, in file order: (0-based index, the needles it holds — ``ERROR`` for a c10
        error-level line —, its bytes)."""
        s = self._scan
        cut = self._src.cut
        for k, (idx, i, a, b) in enumerate(zip(s.idx, s.ids, s.start, s.end, strict=True)):
            self._hit = idx, (a, b)
            yield idx, _NAMES[i] if i >= 0 else frozenset().union(*(_NAMES[j] for j in s.multi[k])), cut(a, b)

    def _span(self, j: int) -> tuple[int, int]:
        """The byte extent of line ``j``: a hit line's is known; another's is found by walking from the nearest."""
        if j == self._hit[0]:
            return self._hit[1]
        s = self._scan
        k = bisect_left(s.idx, j)
        if k < len(s.idx) and s.idx[k] == j:
            return s.start[k], s.end[k]
        got = self._spans.get(j)
        if got is not None:
            return got
        prev = self._spans.get(j - 1)
        if prev is None and k > 0 and s.idx[k - 1] == j - 1:
            prev = s.start[k - 1], s.end[k - 1]
        if prev is not None:
            start = prev[1] + 1
            end = self._src.find(self.sep, start)
            got = start, self._src.size if end == -1 else end
        else:
            nxt = self._spans.get(j + 1)
            if nxt is None and k < len(s.idx) and s.idx[k] == j + 1:
                nxt = s.start[k], s.end[k]
            if nxt is None:  # nearest known line: walk to j from the hit line before it (or after it)
                return self._walk(j, k)
            end = nxt[0] - 1
            got = self._src.rfind(self.sep, 0, end) + 1, end
        self._spans[j] = got
        return got

    def _walk(self, j: int, k: int) -> tuple[int, int]:
        s = self._scan
        if k > 0 and (k == len(s.idx) or j - s.idx[k - 1] <= s.idx[k] - j):
            steps = range(s.idx[k - 1] + 1, j + 1)
        elif k < len(s.idx):
            steps = range(s.idx[k] - 1, j - 1, -1)
        else:  # no hit line at all: walk from the file's start
            self._spans.setdefault(0, (0, self._end_of(0)))
            steps = range(1, j + 1)
        got = self._spans.get(j, (0, 0))
        for i in steps:
            got = self._span(i)
        return got

    def _end_of(self, start: int) -> int:
        end = self._src.find(self.sep, start)
        return self._src.size if end == -1 else end

    def text(self, idx: int) -> str:
        a, b = self._span(idx)
        return self._src.cut(a, b).decode("utf-8", "replace")

    def lineno(self, idx: int) -> int:
        """1-based line number in the file as given (hard-wrapped lines count from their first piece)."""
        return self.first_line[idx] if self.first_line is not None else idx + 1

    def records(self, idx: int) -> list[Record]:
        """The logical records of line ``idx`` (normalised once, then cached)."""
        got = self._cache.get(idx)
        if got is None:
            got = normalise(self.lineno(idx), self.text(idx), ansi=self.ansi)
            self._cache[idx] = got
        return got

    def traceback(self, idx: int, rec: Record, max_lines: int = 4000) -> Traceback:
        """The traceback that ``rec`` (line ``idx``) opens: its frame and chain lines in the same stream, and
        its root cause (the last exception line; a "see root cause above" pointer yields to an earlier one)."""
        stream = rec.stream
        tb = Traceback(idx, stream, {idx}, None, rec)
        excs: list[Record] = []
        exc_at: dict[int, int] = {}  # id(record) -> its line index
        j = idx + 1
        n = self.line_count
        done = False
        while j < n and j < idx + max_lines and not done:
            for r in self.records(j):
                if r.stream != stream:
                    continue
                m = r.msg
                if (
                    not m.strip()
                    or m[0] in " \t"
                    or m.startswith(_CHAIN)
                    or m.startswith("Traceback (most recent")
                ):
                    tb.lines.add(j)
                    continue
                if EXCEPTION_LINE.match(m):
                    excs.append(r)
                    exc_at[id(r)] = j
                    tb.lines.add(j)
                    continue
                done = True
                break
            j += 1
        if excs:
            root = excs[-1]
            if POINTER.search(root.msg):
                earlier = [r for r in excs[:-1] if not POINTER.search(r.msg)]
                if earlier:
                    root = earlier[-1]
            tb.root = root
            if VALIDATION_ERROR.search(root.msg):
                tb.reason = self.validation_reason(exc_at[id(root)], stream)
        return tb

    def validation_reason(self, idx: int, stream: tuple[Any, ...], max_lines: int = 12) -> str | None:
        """What pydantic's ``N validation error(s) for X`` at line ``idx`` says on its next lines: per error
        an unindented location (absent for a model-level error), an indented message ending in ``[type=…]``
        and an indented ``For further information visit …`` link. ``loc: message; …`` (at most three)."""
        items: list[str] = []
        loc: str | None = None
        for j in range(idx + 1, min(idx + 1 + max_lines, self.line_count)):
            recs = [r for r in self.records(j) if r.stream == stream]
            if not recs:
                continue
            m = recs[0].msg
            if (not m.strip() or recs[0].level is not None or EXCEPTION_LINE.match(m)
                    or m.startswith(("Traceback (most recent", *_CHAIN))):
                break
            text = m.strip()
            if text.startswith("For further information visit"):
                continue
            if m[0] not in " \t":
                loc = text
                continue
            what = _PYDANTIC_TYPE.sub("", text)
            items.append(f"{loc}: {what}" if loc else what)
            loc = None
            if len(items) == 3:
                break
        if loc and not items:  # a location whose message is out of view
            items.append(loc)
        return "; ".join(items) or None

    def next_in_stream(self, idx: int, stream: tuple[Any, ...], window: int = 4) -> tuple[int, Record] | None:
        """The next record of the same writer within ``window`` lines after ``idx``, with its line index."""
        for j in range(idx + 1, min(idx + 1 + window, self.line_count)):
            for r in self.records(j):
                if r.stream == stream:
                    return j, r
        return None

    def stamp_before(self, idx: int, window: int = 200) -> tuple[int, ...] | None:
        """Timestamp of the nearest line at or before ``idx`` that has one (vLLM or c10 form)."""
        for j in range(idx, max(-1, idx - window), -1):
            for r in self.records(j):
                if r.ts is not None:
                    return r.ts
        return None

    def wrapped_tail(self, idx: int, msg: str, limit: int = 400) -> tuple[str, list[int]]:
        """Join hard-wrapped continuation lines of a long config message until its brackets balance."""
        used: list[int] = []
        depth = bracket_depth(msg)
        j = idx + 1
        while depth > 0 and j < self.line_count and j <= idx + limit:
            raw = strip_ansi(self.text(j)).rstrip("\r")
            if starts_prefixed(raw):
                break
            msg += raw
            used.append(j)
            depth += bracket_depth(raw)
            j += 1
        return msg, used


def bracket_depth(s: str) -> int:
    """Opening minus closing brackets: above 0, a config dump was cut and continues on the next line."""
    return s.count("{") + s.count("(") + s.count("[") - s.count("}") - s.count(")") - s.count("]")

