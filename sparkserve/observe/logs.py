"""vLLM log text → events. Version tolerant: reads logs from vLLM 0.10 through 0.33 as people save them.

    >>> from sparkserve.observe.logs import parse_log
    >>> log = parse_log(open("head.log").read(), file="head.log", node="spark-a")
    >>> [e.kind for e in log.events][:3]

What a physical line may look like (all handled, in any combination):

* 0.31+ prefixes ``(Worker_TP1 pid=3190) INFO 11-29 16:02:41 [file.py:772] msg``; 0.10–0.30 stream-rewrite
  prefixes, which also land on uvicorn and tqdm output; old ``(VllmWorker rank=0 pid=N)``,
  ``(VllmWorker TP0 pid=N)``, ``(VllmWorkerProcess pid=N)``; V0 ``INFO 10-23 03:54:46 file.py:123] msg``;
  Ray ``(EngineCore_DP0 pid=1) (RayWorkerWrapper pid=2, ip=…) …`` and ``(RayWorkerProc pid=Y, ip=Z)
  (Worker_TP1 pid=Y) …`` with ``[repeated 14x across cluster]``; 0.32+ JSON lines.
* ANSI colour (raw ``\\x1b[36m``, or pasted as ``^[[36m`` / ``[36m``), ``\\r`` / pasted ``^M``, CRLF, tqdm
  bars glued onto log lines (split into separate records).
* Wrappers: ``docker logs --timestamps`` RFC 3339 stamps, ``docker compose`` ``name  | `` columns,
  journald ``Mon DD HH:MM:SS host unit[pid]: ``.
* Multi-line messages (each continuation carries the same prefix; tracebacks), hard-wrapped long config
  lines, unprefixed follower main-process lines (0.25-style) and ``MainProcess`` (0.33); PyTorch c10
  ``[rank1]:[W1129 …]`` lines and NCCL ``host:pid:tid [dev] … NCCL WARN`` lines.

Only lines holding an anchor of :mod:`sparkserve.observe.logpatterns` are parsed (one C-speed ``bytes.find`` sweep
per anchor picks them), plus the lines of each traceback; that keeps big logs fast (bench/bench_logs_analyze.py).
A copy hard-wrapped at a fixed terminal width is re-joined first; line numbers stay those of the file.

Fault rules (explicit, tested):

1. A traceback is one fault: its root-cause line (the last ``XxxError: …`` line; a "see root cause
   above" pointer yields to an earlier exception line of the same traceback). The line that
   ``logger.exception`` wrote just before it, under the same prefix (``EngineCore failed to start.``), is
   folded into it. Its kind comes from the root line (quoted, relayed error text does not count).
2. A deliberate stop starts at the first stop marker (``[shutdown] …``, uvicorn ``Shutting down``,
   ``received signal=SIGTERM``, ``Parent process exited…``, a ``KeyboardInterrupt`` traceback) that is
   *not* preceded by a fault in the same file. Fault lines after it are shutdown artefacts, not faults.
3. Across files (see :mod:`sparkserve.observe.analyze`): when one file stopped deliberately at time T, fault
   lines of other files stamped at or after T are shutdown artefacts too (the follower's c10d
   ``TCPStore … recvValue failed`` after the head was stopped).
4. The same fault text twice in a file (``logger.exception`` plus the raw stderr traceback, a repeated
   shm-broadcast stall) is reported once.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from sparkserve.observe.logpatterns import (
    ANCHORS,
    EXCEPTION_LINE,
    NEEDLE_INDEX,
    PATTERNS,
    POINTER,
    STOP_EXCEPTIONS,
    FaultKind,
    Kind,
    LogPattern,
)

# ----------------------------------------------------------------------------------------------------
# line normalisation
# ----------------------------------------------------------------------------------------------------
_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;?]*[A-Za-z]|(?<![\w\]])\[(?:\d{1,3};)*\d{1,3}m")
_DOCKER_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) ")
_COMPOSE = re.compile(r"(?P<svc>[A-Za-z0-9][\w.-]*)\s+\| ")
_JOURNALD = re.compile(
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?) "
    r"(?P<host>[\w.-]+) (?P<unit>[^\s\[\]:]+)(?:\[(?P<pid>\d+)\])?: "
)
_PROC = re.compile(
    r"\((?P<name>[A-Za-z_][\w.\-]*(?: [A-Za-z_][\w\-]*)?)(?: rank=(?P<rank>\d+))? pid=(?P<pid>\d+)"
    r"(?:, ip=(?P<ip>[^)\s]+))?\) ?"
)
_LEVELS = "DEBUG|INFO|WARNING|ERROR|CRITICAL"
_LOGGER = re.compile(
    rf"(?P<level>{_LEVELS}) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \[?(?P<file>[^\]\s]+?):(?P<lineno>\d+)\] ?"
)
_LOGGER_ANYWHERE = re.compile(rf"(?:{_LEVELS}) \d\d-\d\d \d\d:\d\d:\d\d")
_UVICORN = re.compile(r"(?P<level>INFO|WARNING|ERROR|DEBUG|CRITICAL|TRACE):\s+")
_C10 = re.compile(
    r"(?:\[rank(?P<rank>\d+)\]:)?\[(?P<lv>[IWEF])(?P<mo>\d\d)(?P<dd>\d\d) (?P<hms>\d\d:\d\d:\d\d)\.\d+ "
    r"(?P<file>[^\]\s:]+):(?P<lineno>\d+)\] "
)
_NCCL = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")
_REPEATED = re.compile(r"\s*\[repeated (?P<n>\d+)x across cluster\]\s*$")
_GLUE = re.compile(
    rf"\([A-Za-z_][\w.\-]*(?: [A-Za-z_][\w\-]*)?(?: rank=\d+)? pid=\d+(?:, ip=[^)\s]+)?\) (?:{_LEVELS}|\()"
    rf"|(?:{_LEVELS}) \d\d-\d\d \d\d:\d\d:\d\d \["
)
_BAR = re.compile(r"\d+%\||it/s\]|s/it\]|\?it/s")
_C10_LEVEL = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}


@dataclass(frozen=True, slots=True)
class Proc:
    """One ``(name pid=N[, ip=X])`` prefix part."""

    name: str
    pid: int
    ip: str | None = None
    rank: int | None = None  # from the old `(VllmWorker rank=N pid=M)` form


@dataclass(slots=True)
class Record:
    """One logical log line."""

    lineno: int  # 1-based physical line number in the file
    text: str  # the line as written (ANSI codes and line-end CRs removed; wrappers kept)
    msg: str  # the message, prefixes removed
    procs: tuple[Proc, ...] = ()
    level: str | None = None
    ts: tuple[int, int, int, int, int] | None = None  # month, day, h, m, s
    source: str | None = None  # compose service / journald unit
    c10_rank: int | None = None
    nccl_pid: int | None = None
    json_proc: str | None = None
    repeated: int = 1
    glued_bar: bool = False

    @property
    def proc(self) -> Proc | None:
        return self.procs[-1] if self.procs else None

    @property
    def stream(self) -> tuple[Any, ...]:
        """Lines of one writer: the same process prefix chain (or none) from the same source."""
        return (self.source, tuple((p.name, p.pid, p.ip) for p in self.procs), self.json_proc)


def strip_ansi(s: str) -> str:
    if "[" not in s:
        return s
    return _ANSI.sub("", s)


def _ts(mmdd_hms: str) -> tuple[int, int, int, int, int]:
    # "11-29 16:02:41"
    return (
        int(mmdd_hms[0:2]),
        int(mmdd_hms[3:5]),
        int(mmdd_hms[6:8]),
        int(mmdd_hms[9:11]),
        int(mmdd_hms[12:14]),
    )


def _unwrap(s: str) -> tuple[str, str, str | None]:
    """Take docker/compose/journald wrappers off; returns (wrapper text, rest, source name)."""
    end = 0
    source = None
    for _ in range(4):
        c = s[end : end + 1]
        if not c:
            break
        m = None
        if c.isdigit():
            m = _JOURNALD.match(s, end)
            if m:
                source = m.group("unit")
            else:
                m = _DOCKER_TS.match(s, end)
        elif c.isalnum():
            m = _JOURNALD.match(s, end) if c.isupper() else None
            if m:
                source = m.group("unit")
            else:
                m = _COMPOSE.match(s, end)
                if m:
                    source = m.group("svc")
        if not m:
            break
        end = m.end()
    return s[:end], s[end:], source


def _parse_segment(
    lineno: int, wrapper: str, seg: str, source: str | None, inherit: tuple[Proc, ...]
) -> Record:
    pos = 0
    procs: list[Proc] = []
    while pos < len(seg) and seg[pos] == "(":
        m = _PROC.match(seg, pos)
        if not m:
            break
        procs.append(
            Proc(
                m.group("name"),
                int(m.group("pid")),
                m.group("ip"),
                int(m.group("rank")) if m.group("rank") else None,
            )
        )
        pos = m.end()
    rec = Record(
        lineno=lineno, text=wrapper + seg, msg="", procs=tuple(procs) if procs else inherit, source=source
    )
    rest = seg[pos:]
    m = _LOGGER.match(rest)
    if m is None and rest and not procs and rest[0] not in "[ ({" and "pid=" not in rest[:40]:
        # VLLM_LOGGING_PREFIX text before the level (≤0.30)
        a = _LOGGER_ANYWHERE.search(rest, 0, 96)
        if a:
            m = _LOGGER.match(rest, a.start())
    if m is not None:
        rec.level = m.group("level")
        rec.ts = _ts(m.group("ts"))
        msg = rest[m.end() :]
    elif rest.startswith(("INFO:", "WARNING:", "ERROR:", "DEBUG:", "CRITICAL:", "TRACE:")):
        u = _UVICORN.match(rest)
        if u:
            rec.level = u.group("level")
            msg = rest[u.end() :]
        else:
            msg = rest
    elif rest.startswith("[") and (c := _C10.match(rest)):
        rec.level = _C10_LEVEL[c.group("lv")]
        rec.ts = (int(c.group("mo")), int(c.group("dd")), *map(int, c.group("hms").split(":")))  # type: ignore[assignment]
        if c.group("rank") is not None:
            rec.c10_rank = int(c.group("rank"))
        msg = rest[c.end() :]
    elif rest.startswith("{") and rest.rstrip().endswith("}") and '"message"' in rest:
        msg = _parse_json_line(rec, rest)
    else:
        n = _NCCL.match(rest) if ":" in rest[:40] else None
        if n:
            rec.nccl_pid = int(n.group("pid"))
        msg = rest
    if "[repeated" in msg:
        r = _REPEATED.search(msg)
        if r:
            rec.repeated = int(r.group("n"))
            msg = msg[: r.start()]
    rec.msg = msg
    return rec


def _parse_json_line(rec: Record, rest: str) -> str:
    # 0.32+ `--logging-config.formatter json`: python-json-logger fields.
    try:
        obj = json.loads(rest)
    except ValueError:
        return rest
    if not isinstance(obj, dict):
        return rest
    rec.level = obj.get("levelname") if isinstance(obj.get("levelname"), str) else None
    proc = obj.get("processName")
    if isinstance(proc, str):
        rec.json_proc = proc
        pid = obj.get("process")
        if isinstance(pid, int):
            rec.procs = (Proc(proc, pid),)
    ts = obj.get("asctime")
    if isinstance(ts, str):
        m = re.search(r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)", ts)
        if m:
            rec.ts = tuple(int(x) for x in m.groups())  # type: ignore[assignment]
    msg = obj.get("message")
    return msg if isinstance(msg, str) else rest


def normalise(lineno: int, raw: str, *, ansi: bool = True) -> list[Record]:
    """One physical line → its logical records (usually one; a glued tqdm bar makes more).

    ``ansi=False`` skips colour stripping (the file holds no colour codes at all).
    """
    s = raw
    if "^" in s:
        s = s.replace("^M", "\r")
    if ansi:
        s = strip_ansi(s)
    s = s.rstrip("\r")
    wrapper, body, source = _unwrap(s)
    segments = body.split("\r") if "\r" in body else [body]
    out: list[Record] = []
    inherit: tuple[Proc, ...] = ()
    pending_bar: Record | None = None
    for seg in segments:
        for piece in _split_glued(seg):
            rec = _parse_segment(lineno, wrapper, piece, source, inherit)
            if not inherit and rec.procs and not rec.msg.strip():
                inherit = rec.procs  # `(Worker_TP0 pid=1) \rLoading …` — the bar belongs to that process
                if len(segments) > 1:
                    continue
            if len(segments) > 1 and _BAR.search(rec.msg):
                rec.glued_bar = True
                pending_bar = rec  # consecutive bar updates: keep the final state
                continue
            if pending_bar is not None:
                out.append(pending_bar)
                pending_bar = None
            out.append(rec)
    if pending_bar is not None:
        out.append(pending_bar)
    if not out:
        out.append(_parse_segment(lineno, wrapper, "", source, inherit))
    return out


def _split_glued(seg: str) -> list[str]:
    """``…100%|██| 49/49 [00:02<00:00](Worker_TP0 pid=1) INFO …`` → the bar, then the log line."""
    if len(seg) < 24 or not ("%|" in seg or "it/s]" in seg or "s/it]" in seg or seg.count("pid=") > 1):
        return [seg]
    pos = 0  # end of the leading prefix chain: Ray's nested prefixes are not glue
    while pos < len(seg) and seg[pos] == "(":
        m = _PROC.match(seg, pos)
        if not m:
            break
        pos = m.end()
    out: list[str] = []
    last = 0
    for m in _GLUE.finditer(seg, pos + 1):
        c = m.start()
        before = seg[last:c]
        # glue follows text written without a newline: a tqdm bar (maybe space-padded) or a bare message
        if before.strip() and (not before[-1].isspace() or _BAR.search(before)):
            out.append(before)
            last = c
    out.append(seg[last:])
    return out


# ----------------------------------------------------------------------------------------------------
# events
# ----------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Event:
    kind: Kind
    rec: Record
    data: dict[str, Any] = field(default_factory=dict)
    fault: FaultKind | None = None
    sort_line: int = 0  # position used to order faults (a traceback's start, not its root line)
    rank: str | None = None  # set by sparkserve.observe.analyze.attribute_ranks
    ts: tuple[int, ...] | None = None  # own stamp, or the nearest earlier stamp (faults and stops)

    @property
    def line(self) -> int:
        return self.rec.lineno

    @property
    def text(self) -> str:
        return self.rec.text


@dataclass
class ParsedLog:
    """One file's events. ``artefacts`` are fault lines after a deliberate stop (rule 2)."""

    file: str
    node: str
    events: list[Event]
    faults: list[Event]
    artefacts: list[Event]
    stop: Event | None
    line_count: int

    def of(self, *kinds: Kind) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]


def _line_index(data: bytes) -> tuple[list[bytes], list[int]]:
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


_QUOTED = re.compile(r"'[^']*'")
_DIGITS = re.compile(r"\d+")


def _match(rec: Record, anchors: list[int] | None = None) -> list[Event]:
    """Events of one record; ``anchors`` (indices into ANCHORS found on its line) narrow the needles tried."""
    msg = rec.msg
    index = NEEDLE_INDEX if anchors is None else [NEEDLE_INDEX[a] for a in anchors]
    hit = sorted({i for a, pairs in index if a in msg for n, i in pairs if n in msg})
    events: list[Event] = []
    got_fault = False
    fmsg = None
    for i in hit:
        p = PATTERNS[i]
        if p.kind is Kind.FAULT:
            if got_fault:
                continue
            if fmsg is None:  # a relayed error in quotes does not decide the kind
                fmsg = _QUOTED.sub("''", msg) if "'" in msg else msg
            m = p.regex.search(fmsg)
            if m:
                events.append(Event(p.kind, rec, m.groupdict(), p.fault))
                got_fault = True
            continue
        m = p.regex.search(msg)
        if not m:
            continue
        events.append(Event(p.kind, rec, m.groupdict(), p.fault))
    if (
        not got_fault
        and rec.level in ("ERROR", "CRITICAL")
        and not any(e.kind is Kind.TRACEBACK_START for e in events)
    ):
        events.append(Event(Kind.FAULT, rec, {"level": rec.level}, FaultKind.OTHER))
    return events


def _has_needle(msg: str, p: LogPattern) -> bool:
    return any(n in msg for n in p.needles)


def classify_fault(msg: str) -> FaultKind | None:
    """The fault kind a message names, or None. Quoted text (an error relayed from elsewhere) does not count."""
    if "'" in msg:
        msg = _QUOTED.sub("''", msg)
    for p in PATTERNS:
        if p.kind is Kind.FAULT and _has_needle(msg, p) and p.regex.search(msg):
            return p.fault
    return None


_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")


@dataclass
class _Traceback:
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


class _Reader:
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

    def text(self, idx: int) -> str:
        return self.lines[idx].decode("utf-8", "replace")

    def lineno(self, idx: int) -> int:
        """1-based line number in the file as given (hard-wrapped lines count from their first piece)."""
        return self.first_line[idx] if self.first_line is not None else idx + 1

    def records(self, idx: int) -> list[Record]:
        got = self._cache.get(idx)
        if got is None:
            got = normalise(self.lineno(idx), self.text(idx), ansi=self.ansi)
            self._cache[idx] = got
        return got

    def traceback(self, idx: int, rec: Record, max_lines: int = 4000) -> _Traceback:
        stream = rec.stream
        tb = _Traceback(idx, stream, {idx}, None, rec)
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
        depth = _bracket_depth(msg)
        j = idx + 1
        while depth > 0 and j < len(self.lines) and j <= idx + limit:
            raw = strip_ansi(self.text(j)).rstrip("\r")
            if raw.startswith("(") and _PROC.match(raw) or _LOGGER.match(raw) or _DOCKER_TS.match(raw):
                break
            msg += raw
            used.append(j)
            depth += _bracket_depth(raw)
            j += 1
        return msg, used


def _bracket_depth(s: str) -> int:
    return s.count("{") + s.count("(") + s.count("[") - s.count("}") - s.count(")") - s.count("]")


def parse_log(text: str | bytes, *, file: str, node: str | None = None) -> ParsedLog:
    """Parse one log file's text (str, or bytes read as UTF-8) into events (rules: module docstring)."""
    reader = _Reader(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    data = reader.data
    events: list[Event] = []
    tracebacks: dict[int, _Traceback] = {}
    consumed: set[int] = set()
    spec_only = [ANCHORS.index("SpecDecoding metrics:")]
    spec_pattern = next(p for p in PATTERNS if p.kind is Kind.SPEC_METRICS)
    for idx, anchors in _candidates(data, reader.starts).items():
        if idx in consumed:
            continue
        if anchors == spec_only:
            # fast path for the one line a serving log repeats every 10 s: no prefix parsing needed
            line = reader.text(idx)
            m = spec_pattern.regex.search(line)
            if m and "\r" not in line.rstrip("\r") and (not reader.ansi or "[" not in m.group("al")):
                text = strip_ansi(line).rstrip("\r") if reader.ansi else line.rstrip("\r")
                rec = Record(lineno=reader.lineno(idx), text=text, msg=text[text.find("SpecDecoding metrics:") :])
                events.append(Event(Kind.SPEC_METRICS, rec, m.groupdict(), sort_line=idx))
                continue
        for rec in reader.records(idx):
            for ev in _match(rec, anchors):
                if ev.kind is Kind.TRACEBACK_START:
                    tb = reader.traceback(idx, rec)
                    tracebacks[idx] = tb
                    consumed |= tb.lines - {idx}
                    continue
                if ev.kind in (Kind.ENGINE_CONFIG, Kind.NON_DEFAULT_ARGS) and _bracket_depth(rec.msg) > 0:
                    full, used = reader.wrapped_tail(idx, rec.msg)
                    consumed.update(used)
                    key = "config" if ev.kind is Kind.ENGINE_CONFIG else "args"
                    m = re.search(
                        r"with config: (.*)$" if key == "config" else r"non-default args: (.*)$", full
                    )
                    if m:
                        ev.data[key] = m.group(1)
                ev.sort_line = idx
                events.append(ev)
    # faults: fold fatal headers into the traceback that follows them; a traceback is one fault
    tb_events: list[Event] = []
    for start, tb in sorted(tracebacks.items()):
        if tb.root is None:
            continue
        exc = EXCEPTION_LINE.match(tb.root.msg)
        name = exc.group("exc").rsplit(".", 1)[-1] if exc else ""
        if name in STOP_EXCEPTIONS:
            tb_events.append(Event(Kind.STOP, tb.root, {"exception": name}, sort_line=start))
            continue
        kind = classify_fault(tb.root.msg) or FaultKind.TRACEBACK
        tb_events.append(Event(Kind.FAULT, tb.root, {"traceback_start": start + 1}, kind, sort_line=start))
    folded: set[int] = set()
    for ev in events:
        if ev.kind is not Kind.FAULT:
            continue
        idx = ev.sort_line
        nxt = reader.next_in_stream(idx, ev.rec.stream)
        tb = tracebacks.get(nxt[0]) if nxt is not None else None
        # logger.exception: the header and its traceback share the whole prefix (level and time included)
        if (
            tb is not None
            and tb.root is not None
            and tb.first is not None
            and ev.rec.level is not None
            and (tb.first.level, tb.first.ts) == (ev.rec.level, ev.rec.ts)
        ):
            assert nxt is not None
            folded.add(id(ev))
            for te in tb_events:
                if te.sort_line == nxt[0]:
                    te.sort_line = idx
                    te.data.setdefault("header", ev.rec.text)
                    if te.fault is FaultKind.TRACEBACK and ev.fault not in (None, FaultKind.OTHER):
                        te.data["header_kind"] = ev.fault.value
    events = [e for e in events if e.kind is not Kind.FAULT or id(e) not in folded]
    events.extend(tb_events)
    events.sort(key=lambda e: (e.sort_line, e.rec.lineno))
    # rule 2: a deliberate stop — the first stop marker not preceded by a fault
    stop: Event | None = None
    faults: list[Event] = []
    artefacts: list[Event] = []
    seen: set[tuple[str, str]] = set()
    for ev in events:
        if ev.kind is Kind.STOP and stop is None and not faults:
            stop = ev
        elif ev.kind is Kind.FAULT:
            # `other` lines (c10d store warnings, …) repeat with fresh fds and times: compare them digit-blind
            norm = _DIGITS.sub("#", ev.rec.msg) if ev.fault is FaultKind.OTHER else ev.rec.msg
            key = (ev.fault.value if ev.fault else "", norm.strip())
            if stop is not None:
                artefacts.append(ev)
            elif key not in seen:
                seen.add(key)
                faults.append(ev)
    for ev in (*faults, *artefacts, *([stop] if stop else [])):
        ev.ts = ev.rec.ts or reader.stamp_before(ev.sort_line)
    return ParsedLog(
        file=file,
        node=node or file,
        events=events,
        faults=faults,
        artefacts=artefacts,
        stop=stop,
        line_count=len(reader.lines),
    )
