"""vLLM log text → events. Version tolerant: reads logs from vLLM 0.10 through 0.33 as people save them.

    >>> from sparkserve.observe.logs import parse_log
    >>> log = parse_log(open("head.log").read(), file="head.log", node="spark-a")
    >>> [e.kind for e in log.events][:3]

Reading a line (wrappers, prefixes, colour, glued bars) is :mod:`sparkserve.observe.logline`'s; picking the
lines worth reading and following tracebacks is :mod:`sparkserve.observe.reader`'s; which table row a message
matches is :mod:`sparkserve.observe.events`'. Here the events of one file are put together: multi-line
messages (each continuation carries the same prefix; tracebacks), hard-wrapped long config lines, unprefixed
follower main-process lines (0.25-style) and ``MainProcess`` (0.33).

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
10. A request the API server answered with an error (its ERROR line or its traceback: a prompt over the context
   length, a wrong model name, a 400) is a ``request_error`` event, never a fault; an engine or worker traceback
   whose exception line is cut off is a fault at its last frame (:mod:`sparkserve.observe.cut_traceback`); the
   frames of every traceback say whether a process was starting up or serving (issue 32).
"""

from __future__ import annotations

import gc
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

from sparkserve.observe.cut_traceback import cut_traceback_faults
from sparkserve.observe.envelope import Envelope
from sparkserve.observe.events import Event, classify_fault, match_events
from sparkserve.observe.logline import Record, strip_ansi
from sparkserve.observe.logpatterns import (
    BOOT_FAILED,
    EXCEPTION_LINE,
    PATTERNS,
    POINTER,
    PROCESS_HEADER,
    RELAYED,
    REQUEST_ERROR,
    STOP_EXCEPTIONS,
    THREAD_HEADER,
    FaultKind,
    Kind,
)
from sparkserve.observe.reader import LogReader, Traceback, bracket_depth


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
    # Every `SpecDecoding metrics:` line (a serving log is half made of them): its position and mean acceptance
    # length, in file order. Only the first (and any the fast path left to the table) is also in ``events``.
    spec_at: list[int] = field(default_factory=list)
    spec_al: list[str] = field(default_factory=list)
    envelope: Envelope | None = None  # the encoding and the wrapper the envelope stage found

    def of(self, *kinds: Kind) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]


def parse_log(text: str | bytes | BinaryIO, *, file: str, node: str | None = None) -> ParsedLog:
    """Parse one log into events (rules: module docstring): its text, its bytes (read as UTF-8), or an open
    binary file — a regular file is read in place, in one pass, never whole into memory."""
    with collector_paused():
        return _parse(text, file, node)


def _parse(text: str | bytes | BinaryIO, file: str, node: str | None) -> ParsedLog:
    reader = LogReader(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    events, tracebacks, spec = _scan(reader)
    tb_events = _traceback_events(reader, tracebacks)
    events = _fold_headers(reader, events, tracebacks, tb_events)
    events.extend(tb_events)
    events = _bare_exceptions(reader, events)
    events.extend(cut_traceback_faults(reader, events))
    events = _fold_message_lines(reader, events)
    events.sort(key=lambda e: (e.sort_line, e.rec.lineno))
    stop, faults, artefacts = _split_at_stop(events)
    for ev in (*faults, *artefacts, *([stop] if stop else [])):
        ev.ts = ev.rec.ts or reader.stamp_before(ev.sort_line)
    return ParsedLog(
        file=file,
        node=node or file,
        events=events,
        faults=faults,
        artefacts=artefacts,
        stop=stop,
        line_count=reader.line_count,
        envelope=reader.envelope,
        spec_at=[i for i, _ in spec],
        spec_al=[al for _, al in spec],
    )


_GC_LOCK = threading.Lock()
_gc_parses = 0  # parses running now (logs are parsed side by side in threads)
_gc_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector paused while logs are parsed and judged. A parse allocates a few objects per hit
    line and frees almost none, so each generation-2 collection walks the whole growing heap again: 30 % of the
    time, and super-linear in the log's size. Events hold no reference cycles; the collector resumes (if it
    was on) when the last holder is done. Re-entrant and thread-safe."""
    global _gc_parses, _gc_was_enabled
    with _GC_LOCK:
        if _gc_parses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_parses += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_parses -= 1
            if _gc_parses == 0 and _gc_was_enabled:
                gc.enable()


_SPEC_PATTERN = next(p for p in PATTERNS if p.kind is Kind.SPEC_METRICS)
_SPEC_ONLY = frozenset(_SPEC_PATTERN.needles)  # a line holding only this needle takes the fast path
# The stats line (every 10 s under load) matters once: the first that shows work proves requests were served.
_SERVED_ONLY = frozenset(next(p for p in PATTERNS if p.kind is Kind.SERVED).needles)
_FRAME_NEEDLES = frozenset(next(p for p in PATTERNS if p.kind is Kind.FRAME).needles)


def _shows_work(ev: Event) -> bool:
    return ev.kind is Kind.SERVED and float(ev.data["prompt"]) + float(ev.data["gen"]) > 0


def _scan(reader: LogReader) -> tuple[list[Event], dict[int, Traceback], list[tuple[int, str]]]:
    """Events of every line a needle hit, in file order, the tracebacks found (by their first line), and every
    SpecDecoding line as (position, mean acceptance length): after the first, one needs no Event of its own."""
    events: list[Event] = []
    tracebacks: dict[int, Traceback] = {}
    consumed: set[int] = set()
    spec_lines: list[tuple[int, str]] = []
    served = False  # a stats line with work seen: the later ones say nothing new (and are half a serving log)
    fast = not reader.ansi
    for idx, needles, raw in reader.candidates():
        if idx in consumed and needles & _FRAME_NEEDLES:  # a frame of a traceback in view: where the process was
            for e in (e for rec in reader.records(idx) for e in match_events(rec) if e.kind is Kind.FRAME):
                e.sort_line = idx
                e.data["in_traceback"] = True
                events.append(e)
            continue
        if idx in consumed or (served and needles == _SERVED_ONLY):
            continue
        if needles == _SPEC_ONLY:
            al = _spec_al(raw) if fast and spec_lines else None
            if al is not None:
                spec_lines.append((idx, al))
                continue
            spec = _spec_metrics(reader, idx, raw.decode("utf-8", "replace"))
            if spec is not None:
                events.append(spec)
                spec_lines.append((idx, spec.data["al"]))
                continue
        for rec in reader.records(idx):
            for ev in match_events(rec):
                if ev.kind is Kind.SPEC_METRICS:
                    spec_lines.append((idx, ev.data["al"]))
                if ev.kind is Kind.TRACEBACK_START:
                    tb = reader.traceback(idx, rec)
                    tracebacks[idx] = tb
                    consumed |= tb.lines - {idx}
                    continue
                if ev.kind in (Kind.ENGINE_CONFIG, Kind.NON_DEFAULT_ARGS) and bracket_depth(rec.msg) > 0:
                    consumed.update(_join_wrapped(reader, idx, ev))
                ev.sort_line = idx
                events.append(ev)
                served = served or _shows_work(ev)
    return events, tracebacks, spec_lines


_SPEC_HEAD_B = b"SpecDecoding metrics: Mean acceptance length: "


def _spec_al(raw: bytes) -> str | None:
    """The mean acceptance length of a SpecDecoding line in vLLM's 0.10.2+ wording, from its bytes (no decode, no
    Event): the table regex's ``al`` wherever this answers (a test compares them); None leaves the line to
    :func:`_spec_metrics` (another wording, a CR, a foreign character)."""
    k = raw.find(_SPEC_HEAD_B)
    if k < 0 or raw.find(b"SpecDecoding metrics: ") != k or b"\r" in raw:
        return None
    a = k + len(_SPEC_HEAD_B)
    e = raw.find(b",", a)  # `[\d.]+` is greedy: it ends at the first other character, here the comma
    al = raw[a:e]
    if e < 0 or not al or al.strip(b"0123456789."):
        return None
    return al.decode("ascii")


def _spec_metrics(reader: LogReader, idx: int, line: str) -> Event | None:
    """The one line a serving log repeats every 10 s (``line``, line ``idx``), read without prefix parsing; None
    when the line needs it (glued bars, colour inside the number)."""
    groups = _spec_groups(line) if _SPEC_FAST else None
    if groups is None:
        m = _SPEC_PATTERN.regex.search(line)
        if not m:
            return None
        groups = m.groupdict()
    if ("\r" in line and "\r" in line.rstrip("\r")) or (reader.ansi and "[" in groups["al"]):
        return None
    text = strip_ansi(line).rstrip("\r") if reader.ansi else line.rstrip("\r")
    rec = Record(reader.lineno(idx), text, text[text.find("SpecDecoding metrics:") :])
    return Event(Kind.SPEC_METRICS, rec, groups, sort_line=idx)


# The table regex's groups for vLLM's 0.10.2+ wording, found by string search: 3× faster than the lazy regex on
# the line that makes up most of a serving log. Same result wherever it answers (a test compares them on every
# variant); anything else goes to the regex.
_SPEC_HEAD = "SpecDecoding metrics: Mean acceptance length: "
_SPEC_POS_HEAD = "Per-position acceptance rate: "
_SPEC_FAST = set(_SPEC_PATTERN.regex.groupindex) == {"al", "pos"}  # the table row still has these groups only


def _spec_groups(line: str) -> dict[str, str | None] | None:
    k = line.find(_SPEC_HEAD)
    if k < 0 or line.find("SpecDecoding metrics: ") != k:
        return None
    a = k + len(_SPEC_HEAD)
    e = line.find(",", a)  # `[\d.]+` is greedy: it ends at the first other character, here the comma
    al = line[a:e]
    if e < 0 or not al or al.strip("0123456789."):
        return None
    p = line.find(_SPEC_POS_HEAD, e)
    if p < 0:
        return {"al": al, "pos": None}
    b = p + len(_SPEC_POS_HEAD)
    q = line.find(", Avg", b)  # `[\d., ]+?(?:, Avg|$)` is lazy: it ends at the first `, Avg`, else at the end
    pos = line[b:] if q < 0 else line[b:q]
    return {"al": al, "pos": pos} if pos and not pos.strip("0123456789., ") else None


def _join_wrapped(reader: LogReader, idx: int, ev: Event) -> list[int]:
    """Complete a config dump cut by a hard wrap (its brackets do not balance); returns the lines it took."""
    full, used = reader.wrapped_tail(idx, ev.rec.msg)
    key = "config" if ev.kind is Kind.ENGINE_CONFIG else "args"
    m = re.search(r"with config: (.*)$" if key == "config" else r"non-default args: (.*)$", full)
    if m:
        ev.data[key] = m.group(1)
    return used


def _traceback_events(reader: LogReader, tracebacks: dict[int, Traceback]) -> list[Event]:
    """Rule 1: one event per traceback, at its root-cause line — a stop for KeyboardInterrupt/SystemExit.
    Rule 5: a traceback logged below ERROR (``logger.warning(…, exc_info=True)``) or printed for a background
    thread (``Exception in thread …:``) is no fault: the process goes on. A ``Process <name>:`` header whose
    traceback lost its exception line (the log was cut) is that process's death, a fault of its own."""
    out: list[Event] = []
    for start, tb in sorted(tracebacks.items()):
        prev = reader.prev_in_stream(start, tb.stream)
        header = prev[1].msg.strip() if prev is not None else ""
        if tb.first is not None and tb.first.level in _BELOW_ERROR or THREAD_HEADER.match(header):
            continue
        process = PROCESS_HEADER.match(header)
        if tb.root is None:
            if process is not None and prev is not None:
                name = process.group("name")
                kind = FaultKind.ENGINE_DEAD if name.startswith("EngineCore") else FaultKind.WORKER_DIED
                why = f"process {name} died of an uncaught exception (its exception line is cut off)"
                out.append(Event(Kind.FAULT, prev[1], {"cut_traceback_start": start + 1}, kind, sort_line=prev[0],
                                 why=why))
            continue
        exc = EXCEPTION_LINE.match(tb.root.msg)
        name = exc.group("exc").rsplit(".", 1)[-1] if exc else ""
        # a request the server answered with an error (issue 32, kind 2): no engine fault. Its header, when in view,
        # is the request_error event already; a stream cut by a dead engine (a relayed root) stays a fault.
        if REQUEST_ERROR.match(header) and not RELAYED.search(tb.root.msg):
            continue
        if REQUEST_ERROR.match(tb.root.msg.strip()):
            out.append(Event(Kind.REQUEST_ERROR, tb.root, {"traceback_start": start + 1}, sort_line=start))
            continue
        if name in STOP_EXCEPTIONS:
            out.append(Event(Kind.STOP, tb.root, {"exception": name}, sort_line=start))
            continue
        kind = classify_fault(tb.root.msg) or FaultKind.TRACEBACK
        root = tb.root
        data: dict[str, Any] = {"traceback_start": start + 1}
        if tb.reason:  # `1 validation error for X` reads alike for every mistake: the reason is the fault
            root = replace(root, text=f"{root.text}: {tb.reason}", msg=f"{root.msg}: {tb.reason}")
            data["reason"] = tb.reason
        if process is not None:
            data.setdefault("header", header)
        out.append(Event(Kind.FAULT, root, data, kind, sort_line=start))
    return out


_BELOW_ERROR = frozenset({"WARNING", "INFO", "DEBUG"})


def _prefix(rec: Record) -> str:
    """The text before a record's message: for a logger line, its whole prefix with level, time and file:line."""
    return rec.text[: len(rec.text) - len(rec.msg)] if rec.text.endswith(rec.msg) else rec.text


def _fold_message_lines(reader: LogReader, events: list[Event]) -> list[Event]:
    """Rule 9: the lines that continue an exception's message outside a traceback in view (``torch.AcceleratorError:
    CUDA error: …`` then `Search for `cudaErrorIllegalAddress' …`, `CUDA kernel errors might be …`, each carrying the
    logger's same prefix) are part of that fault, never faults of their own — also when the exception line itself is
    cut off and the message's first line in view is an ERROR line no row names (issue 32, kind 4)."""
    run: dict[int, tuple[str, bool]] = {}  # line index → (the prefix of its message, begun by an exception line)
    drop: set[int] = set()
    for e in sorted((e for e in events if e.kind is Kind.FAULT), key=lambda x: x.sort_line):
        idx = e.sort_line
        prev = reader.prev_in_stream(idx, e.rec.stream, window=1)
        exc = e.rec.level is not None and EXCEPTION_LINE.match(e.rec.msg) is not None
        unnamed = e.rec.level is not None and "level" in e.data and not exc
        if prev is not None and prev[0] in run and run[prev[0]][0] == _prefix(e.rec) and (run[prev[0]][1] or unnamed):
            run[idx] = run[prev[0]]  # the message goes on (even a line that reads like an exception line)
            drop.add(id(e))
        elif exc or unnamed:
            run[idx] = (_prefix(e.rec), exc)  # an exception's message, or an ERROR message no row names, may go on
    return [e for e in events if id(e) not in drop]


def _bare_exceptions(reader: LogReader, events: list[Event]) -> list[Event]:
    """Rule 6: an exception line with no log level outside every traceback in view (its candidates are the
    ``bare_exception`` events) is a root cause when frames precede it (the traceback's first line is out of view),
    when a relayed error follows it in the file (``EngineDeadError … See stack trace (above)``), or when it says
    the boot failed (:data:`BOOT_FAILED`: a one-line excerpt); otherwise it is dropped. Returns the events with the
    candidates resolved."""
    relays = [e.sort_line for e in events if e.kind is Kind.FAULT and (POINTER.search(e.rec.msg)
                                                                       or RELAYED.search(e.rec.msg))]
    out: list[Event] = []
    for ev in events:
        if ev.kind is not Kind.BARE_EXCEPTION:
            out.append(ev)
            continue
        if ev.rec.level is not None or POINTER.search(ev.rec.msg) or RELAYED.search(ev.rec.msg):
            continue
        exc = EXCEPTION_LINE.match(ev.rec.msg)
        if exc is None or exc.group("exc").rsplit(".", 1)[-1] in STOP_EXCEPTIONS:
            continue
        frames = reader.frames_before(ev.sort_line, ev.rec.stream)
        kind = classify_fault(ev.rec.msg) or FaultKind.TRACEBACK
        if frames is not None:
            why = f"an exception line with no log level after traceback frames from line {frames + 1}"
            out.append(Event(Kind.FAULT, ev.rec, {"bare": True}, kind, sort_line=frames, why=why))
        elif any(r > ev.sort_line for r in relays):
            why = "an exception line with no log level, before the relayed error that points above"
            out.append(Event(Kind.FAULT, ev.rec, {"bare": True}, kind, sort_line=ev.sort_line, why=why))
        elif BOOT_FAILED.search(ev.rec.msg):  # a one-line excerpt of a failed start-up (issue 44, kind 4)
            why = "an exception line with no log level that says the boot failed"
            out.append(Event(Kind.FAULT, ev.rec, {"bare": True}, kind, sort_line=ev.sort_line, why=why))
    out.sort(key=lambda e: (e.sort_line, e.rec.lineno))
    return out


def _fold_headers(
    reader: LogReader, events: list[Event], tracebacks: dict[int, Traceback], tb_events: list[Event]
) -> list[Event]:
    """Rule 1: a fault line that ``logger.exception`` wrote just before its traceback is folded into the
    traceback's event (which takes the header's position); returns the events without the folded headers."""
    folded: set[int] = set()
    for ev in events:
        if ev.kind is not Kind.FAULT:
            continue
        idx = ev.sort_line
        nxt = reader.next_in_stream(idx, ev.rec.stream)
        tb = tracebacks.get(nxt[0]) if nxt is not None else None
        # logger.exception: the header and its traceback share the whole prefix (level and time included)
        if (
            tb is None
            or tb.root is None
            or tb.first is None
            or ev.rec.level is None
            or (tb.first.level, tb.first.ts) != (ev.rec.level, ev.rec.ts)
        ):
            continue
        folded.add(id(ev))
        for te in tb_events:
            if te.sort_line == tb.start:
                te.sort_line = idx
                te.data.setdefault("header", ev.rec.text)
                if te.fault is FaultKind.TRACEBACK and ev.fault not in (None, FaultKind.OTHER):
                    te.data["header_kind"] = ev.fault.value
    return [e for e in events if e.kind is not Kind.FAULT or id(e) not in folded]


_DIGITS = re.compile(r"\d+")


def _split_at_stop(events: list[Event]) -> tuple[Event | None, list[Event], list[Event]]:
    """Rules 2 and 4: (the deliberate stop — the first stop marker not preceded by a fault —, the faults before
    it, each text once, the fault lines after it: shutdown artefacts)."""
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
    return stop, faults, artefacts
