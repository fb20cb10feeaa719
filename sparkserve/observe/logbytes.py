"""The one pass over a log's bytes: the Hyperscan prefilter, the byte sources it reads, hard-wrap detection.

The pass reads the log in chunks of :data:`CHUNK` and runs one Hyperscan database over each: every literal
needle of :data:`sparkserve.observe.logpatterns.NEEDLES` (derived from the pattern table at import, so a new
row is covered without touching this module), the PyTorch c10 error-level mark, and the colour codes. Hits
are kept as packed offsets (:class:`Pass`). A saved file is read in place with ``pread`` through a few cached
blocks (:class:`FileBytes`); bytes given in memory are read as they are (:class:`MemBytes`).
"""

from __future__ import annotations

import os
import re
import stat
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import BinaryIO

import hyperscan

from sparkserve.observe.logpatterns import NEEDLES

CHUNK = 16 << 20  # bytes per scan of the one pass (a line longer than this grows the chunk)
BLOCK = 1 << 20  # bytes per cached block when lines are read again
WRAP_SAMPLE = 4 << 20  # the head of the file that decides whether it is a hard-wrapped terminal copy

# Prefilter ids past the needles: a c10 error-level line (`[rank1]:[E1129 …`: ERROR without the word), and
# colour codes anywhere (raw ESC, pasted `^[[`, or a bare `[36m` whose ESC was lost) — then lines are stripped.
_C10_ERROR = rb"\[[EF]\d{4} "
_ANSI = (rb"\x1b", rb"\^\[\[", rb"\[(?:\d{1,3};)*\d{1,3}m")
_ID_C10 = len(NEEDLES)
_DB: hyperscan.Database | None = None
NAMES = tuple(frozenset({n}) for n in NEEDLES) + (frozenset({"ERROR"}),)  # prefilter id → the needles it means


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


class FileBytes:
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


class MemBytes:
    """Bytes already in memory, with the reading interface of :class:`FileBytes` (no copy)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)
        self.find = data.find
        self.rfind = data.rfind

    def read(self, start: int, n: int) -> bytes:
        return self.data if start == 0 and n >= self.size else self.data[start : start + n]

    def cut(self, a: int, b: int) -> bytes:
        return self.data[a:b]


Bytes = FileBytes | MemBytes


@dataclass
class Pass:
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


def one_pass(src: Bytes, sep: bytes) -> Pass:
    """Scan the file once, chunk by chunk (each cut at a line end), with the prefilter."""
    db = _database()
    scratch = hyperscan.Scratch(db)
    out = Pass(array("q"), array("q"), array("q"), array("h"), {}, 0, False, False, False)
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


def _collect(out: Pass, data: bytes, cut: int, pos: int, sep: bytes, hits: list[tuple[int, int]]) -> None:
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
    rb"|[A-Z][a-z]{2} [ \d]\d \d\d:|[\w.-]+\s+\| |[\w.-]+:\d+:\d+ \["
    # a tqdm bar, one per line (bars are all one width: never the fragments of a hard wrap; issue 44, kind 3)
    rb"|[\w ().,/-]{1,100}: +\d{1,3}%(?:\||\s+Completed))"
)


def wrap_width(lines: list[bytes]) -> int | None:
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
    return wrap_width(lines) is not None


def join_hard_wraps(lines: list[bytes], width: int) -> tuple[list[bytes], list[int]]:
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



def source_of(log: bytes | BinaryIO) -> Bytes:
    """The bytes of a log: in memory as given, or a regular file read in place (anything else is read whole)."""
    if isinstance(log, bytes):
        return MemBytes(log)
    try:
        fd = log.fileno()
        st = os.fstat(fd)
    except (OSError, ValueError):  # io.UnsupportedOperation is both: a stream with no descriptor
        return MemBytes(log.read())
    if stat.S_ISREG(st.st_mode):
        return FileBytes(log, fd, st.st_size)
    return MemBytes(log.read())


