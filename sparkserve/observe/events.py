"""A logical log record → its events: which rows of the pattern table its message matches.

A fault line yields at most one fault event, of the first fault row that matches (table order); an
``ERROR`` / ``CRITICAL`` line that no row names is a fault of kind ``other`` — unless it is one line of a
multi-line message (a traceback frame, code or caret line that ``logger.exception`` prefixed: its exception line
is the fault) or a request that failed (:data:`~sparkserve.observe.logpatterns.NOT_FAULTS`; such a line is a
``request_error`` event instead). A traceback frame line is a ``frame`` event that says whether it is start-up or
serving code. Quoted text in a
message (an error relayed from elsewhere) never decides a fault's kind. Each fault says ``why`` it is one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sparkserve.observe.logline import Record
from sparkserve.observe.logpatterns import (
    NEEDLE_INDEX,
    NOT_FAULTS,
    PATTERNS,
    REQUEST_ERROR,
    FaultKind,
    Kind,
    frame_phase,
)


@dataclass(slots=True)
class Event:
    """One matched line: its kind, the record it came from and the regex's named groups."""

    kind: Kind
    rec: Record
    data: dict[str, Any] = field(default_factory=dict)
    fault: FaultKind | None = None
    sort_line: int = 0  # position used to order faults (a traceback's start, not its root line)
    rank: str | None = None  # set by sparkserve.observe.ranks.attribute_ranks
    ts: tuple[int, ...] | None = None  # own stamp, or the nearest earlier stamp (faults and stops)
    why: str = ""  # for a fault: what made this line one (shown with faults[0])

    @property
    def line(self) -> int:
        return self.rec.lineno

    @property
    def text(self) -> str:
        return self.rec.text


_QUOTED = re.compile(r"'[^']*'")
#: One line of a multi-line message: a traceback frame (``  File "…", line N``), its code or ``^^^``/``~~~`` marks.
_CONTINUATION = re.compile(r'^(?:\s|[\^~]|File "|\.\.\.<\d+ lines>\.\.\.$)')


def _unquoted(msg: str) -> str:
    return _QUOTED.sub("''", msg) if "'" in msg else msg


def match_events(rec: Record, anchors: list[int] | None = None) -> list[Event]:
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
            if fmsg is None:
                fmsg = _unquoted(msg)
            m = p.regex.search(fmsg)
            if m:
                why = f"names a {p.fault.value if p.fault else 'fault'}: {m.group(0)!r}"
                events.append(Event(p.kind, rec, m.groupdict(), p.fault, why=why))
                got_fault = True
            continue
        m = p.regex.search(msg)
        if not m:
            continue
        data = m.groupdict()
        if p.kind is Kind.FRAME:
            data["phase"] = frame_phase(msg)
        events.append(Event(p.kind, rec, data, p.fault))
    if rec.level in ("ERROR", "CRITICAL") and REQUEST_ERROR.match(msg):  # answered with an error; no engine fault
        events.append(Event(Kind.REQUEST_ERROR, rec, {"level": rec.level}))
    if (
        not got_fault
        and rec.level in ("ERROR", "CRITICAL")
        and not any(e.kind is Kind.TRACEBACK_START for e in events)
        and not _not_a_fault(msg)
    ):
        why = f"an {rec.level} line that no pattern row names"
        events.append(Event(Kind.FAULT, rec, {"level": rec.level}, FaultKind.OTHER, why=why))
    return events


def _not_a_fault(msg: str) -> bool:
    """An ``ERROR`` line that is no fault of its own: part of a multi-line message, or a failed request."""
    return not msg.strip() or bool(_CONTINUATION.match(msg)) or bool(NOT_FAULTS.match(msg))


def classify_fault(msg: str) -> FaultKind | None:
    """The fault kind a message names, or None."""
    msg = _unquoted(msg)
    for p in PATTERNS:
        if p.kind is Kind.FAULT and any(n in msg for n in p.needles) and p.regex.search(msg):
            return p.fault
    return None
