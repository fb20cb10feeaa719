"""``ready`` and the line it was decided on: the strongest evidence a set of logs holds, first.

True on the readiness line or when requests were visibly served (a throughput line with work done, SpecDecoding
metrics, or a request the API server answered with an error); false when the boot plainly failed — a fault that
says so (:data:`~sparkserve.observe.logpatterns.BOOT_FAILED`), a fatal line (a process exits) after a boot step
(loading, KV sizing, capture) with no readiness (issue 44, kind 4), or a fault in a log whose tracebacks run through
start-up code and never through the serving loop (issue 32, kind 1: a worker's fatal signal, a raylet death, a
CUDA OOM or an NCCL failure during start-up) — or an API server started and never got ready; null when the log
cannot tell, among others when the engine died while serving with the start out of view (an output handler's death,
a traceback through the busy loop: issue 32, kind 6).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sparkserve.observe.events import Event
from sparkserve.observe.logpatterns import BOOT_FAILED, DIED_SERVING, FATAL, Kind
from sparkserve.observe.logs import ParsedLog
from sparkserve.observe.ranks import API_NAMES


class EventIndex(Protocol):
    """The events of several logs, by kind, each with its log (:class:`sparkserve.observe.analyze._Events`)."""

    logs: list[ParsedLog]
    all: list[tuple[ParsedLog, Event]]

    def of(self, kind: Kind) -> list[tuple[ParsedLog, Event]]: ...


@dataclass(frozen=True)
class ReadyEvidence:
    """The line ``ready`` was decided on, and why."""

    log: ParsedLog
    event: Event
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.log.file, "line": self.event.line, "text": self.event.text, "why": self.why}


def _phase(log: ParsedLog) -> tuple[str | None, Event | None]:
    """Where a log's tracebacks ran: ``serving`` if any frame is serving code, else ``startup`` if any is start-up
    code (with that frame), else None."""
    # a traceback logged below ERROR (logger.warning(…, exc_info=True)) was survived: it says nothing of a death
    frames = [f for f in log.of(Kind.FRAME) if f.rec.level in (None, "ERROR", "CRITICAL")]
    if any(f.data.get("phase") == "serving" for f in frames):
        return "serving", None
    first = next((f for f in frames if f.data.get("phase") == "startup"), None)
    return ("startup", first) if first is not None else (None, None)


#: Lines that show a boot step: the last before a fatal line says whether the boot was still under way.
_BOOT_STEPS = frozenset({Kind.CAPTURE_BAR, Kind.GRAPH_CAPTURED, Kind.KV_TOKENS, Kind.KV_MEMORY, Kind.RANK_PRESENCE})


def _boot_under_way(log: ParsedLog, fault: Event) -> str | None:
    """``CUDA graph capture`` when the last boot step ``log`` shows before ``fault`` is a capture bar short of 100 %
    (the process died capturing: vllm#50557), else None. A follower's log that finished its capture has no
    readiness line of its own: a later death there says nothing of its boot."""
    steps = [e for e in log.events if e.kind in _BOOT_STEPS and e.sort_line < fault.sort_line]
    last = steps[-1] if steps else None
    if last is not None and last.kind is Kind.CAPTURE_BAR and last.data.get("pct") not in (None, "100"):
        return "CUDA graph capture"
    return None


def decide_ready(ev: EventIndex, faults: Sequence[tuple[ParsedLog, Event]]) -> tuple[bool | None, ReadyEvidence | None]:
    """``ready`` and the line it was decided on (rules: module docstring), strongest evidence first."""
    for log, e in ev.of(Kind.READY):
        return True, ReadyEvidence(log, e, "the API server logged its readiness line")
    for log, e in ev.of(Kind.SERVED) + ev.of(Kind.SPEC_METRICS):
        if e.data.get("prompt") is None or float(e.data["prompt"]) + float(e.data["gen"]) > 0:
            return True, ReadyEvidence(log, e, "requests were served")
    for log, e in faults:
        if BOOT_FAILED.search(e.rec.msg) or BOOT_FAILED.search(e.data.get("header") or ""):
            return False, ReadyEvidence(log, e, "the boot failed before the API server got ready")
    for log, e in faults:
        under_way = _boot_under_way(log, e)
        if under_way is not None and FATAL.search(e.rec.msg):
            why = f"a process died during start-up ({under_way} was under way; no readiness line)"
            return False, ReadyEvidence(log, e, why)
    phases = {id(log): _phase(log) for log in ev.logs}
    for log, e in faults:
        phase, frame = phases[id(log)]
        if phase == "startup" and frame is not None:
            where = frame.data.get("func") or "start-up code"
            why = f"the boot failed before the API server got ready (its traceback runs through `{where}`)"
            return False, ReadyEvidence(log, e, why)
    for log, e in faults:
        if (DIED_SERVING.search(e.rec.msg) or DIED_SERVING.search(e.data.get("header") or "")
                or phases[id(log)][0] == "serving"):
            return None, ReadyEvidence(log, e, "the engine died while serving; its start is not in the log")
    for log, e in ev.of(Kind.REQUEST_ERROR):
        return True, ReadyEvidence(log, e, "the API server answered requests (a request error, the server went on)")
    api = ev.of(Kind.API_SERVER) or ev.of(Kind.NON_DEFAULT_ARGS)
    named = [(log, e) for log, e in ev.all if e.rec.proc is not None and e.rec.proc.name.startswith(API_NAMES)]
    for log, e in (api or named)[:1]:
        return False, ReadyEvidence(log, e, "an API server started and never logged `Application startup complete.`")
    return None, None


