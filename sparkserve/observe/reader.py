"""A log's bytes, read for the event scan: one pass over the bytes, then the lines worth reading and their context.

The pass (:mod:`sparkserve.observe.logbytes`) runs one Hyperscan prefilter built from the pattern table's
needles over the bytes in chunks. Only lines a needle hits are parsed, plus the context the event scan asks
for around them (traceback frames, the next record of a writer, the nearest timestamp, a config dump's
wrapped tail), found by walking from a hit line. Nothing holds a list of all lines: a saved file is read with
``pread`` through a few cached blocks, and the hits are kept as packed offsets. Hyperscan beat google-re2,
pyahocorasick and one combined ``re`` by 7×, 33× and 100× on a 50 MB serving log (bench/bench_logs_analyze.py
has the figures of the whole reader).

The bytes come through the envelope stage first (:mod:`sparkserve.observe.envelope`): decoded, and the wrapper
learnt from the file taken off every line. A copy hard-wrapped at a fixed terminal width is then re-joined (line
numbers stay those of the file); the first :data:`~sparkserve.observe.logbytes.WRAP_SAMPLE` bytes decide whether
a file is such a copy.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from sparkserve.observe.envelope import Envelope, open_log
from sparkserve.observe.logbytes import NAMES, MemBytes, join_hard_wraps, one_pass, source_of, wrap_width
from sparkserve.observe.logline import Record, normalise, starts_prefixed, strip_ansi
from sparkserve.observe.logpatterns import EXCEPTION_LINE, POINTER

_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
#: At most this many unindented lines after an exception line are read as the rest of its message.
MESSAGE_LINES = 8
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


class LogReader:
    """One log's hit lines and, on demand, any line near them, decoded and normalised (each at most once)."""

    def __init__(self, log: bytes | BinaryIO) -> None:
        unwrapped = open_log(log)  # the envelope stage: decoded, the wrapper learnt from the file taken off
        self.envelope: Envelope = unwrapped.envelope
        self._sources = unwrapped.sources  # per physical line: the names in its wrapper, where they differ
        src = source_of(unwrapped.data)
        self.sep = b"\n"
        scan = one_pass(src, self.sep)
        if not scan.has_sep and src.size and b"\r" in src.cut(0, src.size):
            self.sep = b"\r"  # a file of CRs only (pasted tqdm output): its lines end at CR
            scan = one_pass(src, self.sep)
        self.first_line: list[int] | None = None
        if scan.wrapped:  # a terminal paste: small; joined in memory as it always was
            lines = src.cut(0, src.size).split(self.sep)
            if lines and lines[-1] == b"":
                lines.pop()
            width = wrap_width(lines)
            if width is not None:
                lines, self.first_line = join_hard_wraps(lines, width)
                src = MemBytes(b"\n".join(lines))
                self.sep = b"\n"
                scan = one_pass(src, self.sep)
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
            yield idx, NAMES[i] if i >= 0 else frozenset().union(*(NAMES[j] for j in s.multi[k])), cut(a, b)

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
            n = self.lineno(idx)
            got = normalise(n, self.text(idx), ansi=self.ansi,
                            source=self._sources[n - 1] if self._sources is not None else None)
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
        message = 0  # >0: lines of the last exception's message still running (Python prints it verbatim)
        while j < n and j < idx + max_lines and not done:
            for r in self.records(j):
                if r.stream != stream:
                    continue
                m = r.msg
                if m.startswith(_CHAIN) or m.startswith("Traceback (most recent"):
                    message = 0
                    tb.lines.add(j)
                    continue
                if message and m.strip() and m[0] not in " \t" and self._same_record(rec, r):
                    # a continuation of the exception's message (`Search for `cudaErrorIllegalAddress' …`,
                    # `CompilationError: at 1:0:` under a BackendCompilerFailed): part of it, never a new root
                    message -= 1
                    tb.lines.add(j)
                    continue
                if not m.strip() or m[0] in " \t":
                    tb.lines.add(j)
                    continue
                if EXCEPTION_LINE.match(m):
                    excs.append(r)
                    exc_at[id(r)] = j
                    tb.lines.add(j)
                    message = MESSAGE_LINES
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

    @staticmethod
    def _same_record(first: Record, r: Record) -> bool:
        """Is ``r`` written as part of the same message as ``first``: a logger.exception traceback's lines all
        carry its level and time; a bare (stderr) traceback's carry no level at all."""
        if first.level is None:
            return r.level is None and not starts_prefixed(r.msg)
        return (r.level, r.ts) == (first.level, first.ts)

    def prev_in_stream(self, idx: int, stream: tuple[Any, ...], window: int = 3) -> tuple[int, Record] | None:
        """The previous record of the same writer within ``window`` lines before ``idx``, with its line index."""
        for j in range(idx - 1, max(-1, idx - 1 - window), -1):
            for r in reversed(self.records(j)):
                if r.stream == stream:
                    return j, r
        return None

    def frames_before(self, idx: int, stream: tuple[Any, ...], window: int = 400) -> int | None:
        """The first line of the run of traceback frame lines (``  File "…", line N, in f`` and their code
        lines) that ends just before ``idx`` in the same writer's stream: a traceback whose
        ``Traceback (most recent call last):`` line is out of view. None when no frame line precedes ``idx``."""
        first = None
        for j in range(idx - 1, max(-1, idx - 1 - window), -1):
            recs = [r for r in self.records(j) if r.stream == stream]
            if not recs:
                continue
            m = recs[0].msg
            if m.startswith(("  File \"", "    ")) or (m.strip() and set(m.strip()) <= set("^~")):
                first = j
                continue
            break
        return first

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

