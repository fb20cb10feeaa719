"""A log file's bytes, read for the event scan: lines, the anchor sweep, records per line, traceback extents.

Only lines holding an anchor of :mod:`sparkserve.observe.logpatterns` are parsed (one C-speed ``bytes.find``
sweep per anchor picks them), plus the lines of each traceback; that keeps big logs fast
(bench/bench_logs_analyze.py). A copy hard-wrapped at a fixed terminal width is re-joined first; line numbers
stay those of the file.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from sparkserve.observe.logline import Record, normalise, starts_prefixed, strip_ansi
from sparkserve.observe.logpatterns import ANCHORS, EXCEPTION_LINE, POINTER


def _line_index(data: bytes) -> tuple[list[bytes], list[int]]:
    """Physical lines (split on CR when the file has no LF) and the byte offset each starts at."""
    lines = data.split(b"\r") if b"\n" not in data and b"\r" in data else data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    starts = [0, *accumulate(len(x) + 1 for x in lines)]
    return lines, starts


_ANCHOR_BYTES = tuple(a.encode() for a in ANCHORS)
_ANSI_BYTES = re.compile(rb"\[(?:\d{1,3};)*\d{1,3}m")


def _candidates(data: bytes, starts: list[int]) -> dict[int, list[int]]:
    """Lines holding an anchor → the anchors they hold: one C-speed ``bytes.find`` sweep per anchor."""
    hits: list[tuple[int, int]] = []
    find = data.find
    append = hits.append
    for ai, nd in enumerate(_ANCHOR_BYTES):
        i = find(nd)
        while i != -1:
            append((i, ai))
            j = find(b"\n", i)
            if j == -1:
                break
            i = find(nd, j)
    hits.sort()
    out: dict[int, list[int]] = {}
    for p, ai in hits:
        idx = bisect_right(starts, p) - 1
        got = out.get(idx)
        if got is None:
            out[idx] = [ai]
        elif ai not in got:
            got.append(ai)
    return out


_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")


@dataclass
class Traceback:
    """The extent of one Python traceback in one writer's stream, and its root-cause line."""

    start: int  # 0-based physical index of the `Traceback` line
    stream: tuple[Any, ...]
    lines: set[int]
    root: Record | None
    first: Record | None = None  # the `Traceback (most recent call last):` record


_RECORD_START = re.compile(
    rb"(?:\x1b\[[0-9;]*m|\^\[\[[0-9;]*m|\[[0-9;]+m)?(?:\([A-Za-z_][\w.\-]*(?: [A-Za-z_][\w\-]*)?(?: rank=\d+)? pid=\d+"
    rb"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[ :]|\[rank\d+\]:|\[[IWEF]\d{4} |\{\"|Traceback |\d{4}-\d\d-\d\dT"
    rb"|[A-Z][a-z]{2} [ \d]\d \d\d:|[\w.-]+\s+\| |[\w.-]+:\d+:\d+ \[)"
)


def _join_hard_wraps(lines: list[bytes]) -> tuple[list[bytes], list[int]] | None:
    """A log copied from a terminal is cut at a fixed width W: the longest length occurs again and again, and
    such a line is followed by a fragment that starts no record. Join those; None if the file is not wrapped."""
    if len(lines) < 4:
        return None
    lens = list(map(len, lines))
    width = max(lens)
    if width < 40 or lens.count(width) < 3:
        return None
    cut = [i for i, n in enumerate(lens) if n == width and i + 1 < len(lines)]
    cont = [i for i in cut if not _RECORD_START.match(lines[i + 1])]
    if len(cont) * 2 < len(cut):
        return None
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


class LogReader:
    """One file's lines, decoded and normalised on demand (each line at most once)."""

    def __init__(self, data: bytes) -> None:
        self.lines, self.starts = _line_index(data)
        self.first_line: list[int] | None = None
        joined = _join_hard_wraps(self.lines)
        if joined is not None:
            self.lines, self.first_line = joined
            data = b"\n".join(self.lines)
            self.starts = [0, *accumulate(len(x) + 1 for x in self.lines)]
        self.data = data
        # colour codes anywhere in the file? (raw ESC, pasted ^[, or bare `[36m`) — else skip stripping
        self.ansi = (
            b"\x1b" in data  # memchr-fast single bytes first; `[` is everywhere in a log, `^` and ESC are not
            or (b"^" in data and b"^[[" in data)
            or _ANSI_BYTES.search(data) is not None
        )
        self._cache: dict[int, list[Record]] = {}

    def candidates(self) -> dict[int, list[int]]:
        """Indices of the lines holding an anchor → indices into ANCHORS of the anchors they hold."""
        return _candidates(self.data, self.starts)

    def text(self, idx: int) -> str:
        return self.lines[idx].decode("utf-8", "replace")

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
        j = idx + 1
        n = len(self.lines)
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
        return tb

    def next_in_stream(self, idx: int, stream: tuple[Any, ...], window: int = 4) -> tuple[int, Record] | None:
        """The next record of the same writer within ``window`` lines after ``idx``, with its line index."""
        for j in range(idx + 1, min(idx + 1 + window, len(self.lines))):
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
        while depth > 0 and j < len(self.lines) and j <= idx + limit:
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
