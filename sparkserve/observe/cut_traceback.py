"""A traceback of the engine core or a worker whose exception line is out of view: its last frame is the fault.

An excerpt may begin or end mid-traceback (issue 32, kind 4): the ``Traceback …`` line above it and the exception
line below it are cut off, and what is left are frame lines — ``logger.exception`` prefixed them ``ERROR`` in the
engine core (``(EngineCore_DP0 pid=N) ERROR … [core.py:N]   File "…", line N, in …``), or the process printed them
raw to stderr before it died (``(EngineCore_DP0 pid=N)   File "…"``). Such a run of frames is a fault of its own:
its last frame, which says where the process was. Where it was decides ``ready``
(:func:`~sparkserve.observe.logpatterns.frame_phase`): under start-up code the boot failed; under the busy loop the
engine died while serving (issue 32, kinds 1 and 6). Frames of the API server's request handlers are request errors,
never a fault; a run followed by its exception line is that line's fault, not this one.
"""

from __future__ import annotations

import re

from sparkserve.observe.events import Event
from sparkserve.observe.logline import Record
from sparkserve.observe.logpatterns import EXCEPTION_LINE, FaultKind, Kind
from sparkserve.observe.reader import LogReader

#: Processes whose tracebacks are the engine's: the engine core and the workers (every version's names).
ENGINE_PROCS = ("EngineCore", "Worker", "VllmWorker", "RayWorker", "WorkerProc")
#: vLLM logger files that log the engine core's or a worker's exceptions (``[core.py:N]``, ``[v1/engine/core.py:N]``).
ENGINE_FILES = frozenset({"core.py", "multiproc_executor.py", "gpu_worker.py", "gpu_model_runner.py", "worker.py",
                          "model_runner.py", "multiproc_worker_utils.py", "ray_utils.py"})
_LOGGER_FILE = re.compile(r"\[(?:[\w.-]+/)*(?P<file>[\w.-]+\.py):\d+\]")
#: Frames closer than this (code and caret lines between) belong to one run.
GAP = 4


def _engine_stream(rec: Record) -> bool:
    """The engine core's or a worker's line: by its process name, else by the vLLM logger file of an ERROR line."""
    if rec.proc is not None and rec.proc.name.startswith(ENGINE_PROCS):
        return rec.level in (None, "ERROR", "CRITICAL")
    m = _LOGGER_FILE.search(rec.text) if rec.level in ("ERROR", "CRITICAL") else None
    return m is not None and m.group("file") in ENGINE_FILES


def _exception_follows(reader: LogReader, idx: int, rec: Record) -> bool:
    """After the frame at ``idx``, does the writer print its exception line (past the frame's code/caret lines)?"""
    pos = idx
    for _ in range(GAP + 2):
        nxt = reader.next_in_stream(pos, rec.stream)
        if nxt is None:
            return False
        pos, r = nxt
        msg = r.msg.strip()
        if r.msg[:1].isspace() or msg[:1] in ("^", "~") or not msg:
            continue  # code, caret or blank line of the same frame
        return EXCEPTION_LINE.match(msg) is not None
    return False


def cut_traceback_faults(reader: LogReader, events: list[Event]) -> list[Event]:
    """One fault per run of engine frames whose exception line is not in view (module docstring)."""
    runs: list[list[Event]] = []
    last: dict[tuple[object, ...], Event] = {}
    frames = (e for e in events if e.kind is Kind.FRAME and not e.data.get("in_traceback") and e.data.get("path"))
    for e in sorted(frames, key=lambda x: x.sort_line):
        prev = last.get(e.rec.stream)
        if prev is not None and e.sort_line - prev.sort_line <= GAP:
            runs[-1 if runs and runs[-1][-1] is prev else _run_of(runs, prev)].append(e)
        else:
            runs.append([e])
        last[e.rec.stream] = e
    out: list[Event] = []
    for run in runs:
        end = run[-1]
        if not _engine_stream(end.rec) or _exception_follows(reader, end.sort_line, end.rec):
            continue
        phases = [f.data.get("phase") for f in run]
        phase = "serving" if "serving" in phases else ("startup" if "startup" in phases else None)
        where = {"startup": " under start-up code", "serving": " under the serving loop"}.get(phase or "", "")
        why = f"the last frame of an engine traceback whose exception line is cut off{where}"
        out.append(Event(Kind.FAULT, end.rec, {"cut_traceback": True, "phase": phase}, FaultKind.TRACEBACK,
                         sort_line=run[0].sort_line, why=why))
    return out


def _run_of(runs: list[list[Event]], e: Event) -> int:
    return next(i for i in range(len(runs) - 1, -1, -1) if runs[i][-1] is e)
