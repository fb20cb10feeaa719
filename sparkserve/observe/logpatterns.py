"""The one table of vLLM log patterns: message regexes keyed by event kind, with their version notes.

The table is written by family — a boot's progress (:mod:`~sparkserve.observe.patterns_boot`), NCCL
(:mod:`~sparkserve.observe.patterns_nccl`), faults and the message rules (:mod:`~sparkserve.observe.patterns_faults`),
its vocabulary in :mod:`~sparkserve.observe.logrows` — and assembled here, once, as :data:`PATTERNS`: every reader
imports the table and its derived structures from this module.

Every pattern matches the *message* part of a line (after the ``(name pid=N) LEVEL MM-DD HH:MM:SS
[file:line]`` prefix has been taken off by :mod:`sparkserve.observe.logline`), never a ``[file:line]`` — those
move every release. Each pattern also names literal *needles*: a line that contains none of them is
never tried against the regex, which is what keeps ``logs analyze`` fast on big logs.

Two readers besides the log reader take their lines from here, so a new vLLM wording is added once:
:data:`FATAL` (the rows marked ``fatal``: lines that end a boot for sure, the fast path of
:mod:`sparkserve.deploy.wait`) and :func:`milestone_of` (the rows marked with a :class:`Milestone`: how far a
boot got, which the unified-memory watchdog's phases follow).

Sources: vllm-facts.md (format strings read from the vLLM 0.10.1.1 … 0.33.0 wheels), the real vLLM
0.25.1 logs in the test fixtures, and for V0 the executor's ``# GPU blocks`` line. Third-party lines
(uvicorn, tqdm, NCCL, PyTorch c10) are labelled as such.
"""

from __future__ import annotations

import re

from sparkserve.observe.logrows import FaultKind, Kind, LogPattern, Milestone
from sparkserve.observe.patterns_boot import BOOT_ROWS
from sparkserve.observe.patterns_faults import (
    BOOT_FAILED,
    DIED_SERVING,
    EXCEPTION_LINE,
    NOT_FAULTS,
    PEER_LOST,
    POINTER,
    PROCESS_FAULTS,
    PROCESS_HEADER,
    RELAYED,
    REQUEST_ERROR,
    STARTUP_FAULTS,
    STOP_EXCEPTIONS,
    THREAD_HEADER,
    frame_phase,
)
from sparkserve.observe.patterns_nccl import (
    NCCL_FAULTS,
    NCCL_INFO_ROWS,
    NCCL_INFORMATIONAL,
    NCCL_TRANSPORT_WARN,
    WATCHDOG,
)

__all__ = [
    "ANCHORS", "BOOT_FAILED", "CUDAGRAPH_MODE_VALUES", "DIED_SERVING", "EXCEPTION_LINE", "FATAL", "FaultKind", "Kind",
    "LEVEL_NEEDLES", "LogPattern", "MILESTONE_LINES", "Milestone", "NCCL_INFORMATIONAL", "NCCL_TRANSPORT_WARN",
    "NEEDLES", "NEEDLE_INDEX", "NOT_FAULTS", "PATTERNS", "PEER_LOST", "POINTER", "PROCESS_HEADER", "RELAYED",
    "REQUEST_ERROR", "STOP_EXCEPTIONS", "THREAD_HEADER", "WATCHDOG", "frame_phase", "milestone_of",
]

# Order matters only within the fault rows: the first matching fault row of a line wins (an `Engine core proc …
# died unexpectedly` is engine_dead, not worker_died); the families keep the order the one table always had.
PATTERNS: tuple[LogPattern, ...] = (*BOOT_ROWS, *NCCL_INFO_ROWS, *STARTUP_FAULTS, *NCCL_FAULTS, *PROCESS_FAULTS)

#: Literal needles of every pattern, plus the words that make a prefixed line an error line.
LEVEL_NEEDLES: tuple[str, ...] = ("ERROR", "CRITICAL")
NEEDLES: tuple[str, ...] = tuple(sorted({n for p in PATTERNS for n in p.needles} | set(LEVEL_NEEDLES)))

#: Short anchors for the whole-text sweep: every needle contains one of them (a test keeps it so), so a
#: line with no anchor holds no needle. Fewer, shared anchors = fewer passes over a big log; each was
#: chosen to be rare in a serving log's steady state (access lines, stats, SpecDecoding lines).
ANCHORS: tuple[str, ...] = (
    "LLM ", "non-default", "world", "took", "KV cache size:", " blocks: ", "emory", "aptur", "eager", "udagraph",
    "Loaded DFlash", "SpecDecoding metrics:", "odel", "startup complete", "hut",
    "ngine core", "EngineCore ", "EngineDead", "NCCL", "ibv_", "graph addresses", "stored in KV", "marked dead",
    "throughput:",
    "RPC call", "orker", "TCPStore", "c10d", "Xid", "Traceback", "ERR", "CRITICAL", "rror: ", "xception: ",
    "NET/", "network ", "nccl", "event", "GID table", "cache layout for", "DFLASH2-", 'File "', "engine_core",
    "Cuda error", ", exit code", "watchdog thread", "rror): ",
)
#: anchor → ((needle, index into PATTERNS), …) for the needles holding that anchor.
NEEDLE_INDEX: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = tuple(
    (a, tuple((n, i) for i, p in enumerate(PATTERNS) for n in p.needles if a in n)) for a in ANCHORS
)

#: CUDAGraphMode values as the 0.10–0.11 JSON config dump prints them (enum value tuples).
CUDAGRAPH_MODE_VALUES: dict[str, str] = {
    "0": "NONE",
    "1": "PIECEWISE",
    "2": "FULL",
    "2,0": "FULL_DECODE_ONLY",
    "2,1": "FULL_AND_PIECEWISE",
}


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


def _union(rows: tuple[LogPattern, ...]) -> re.Pattern[str]:
    """One regex matching wherever any row's does. Group names are dropped: rows may share them."""
    return re.compile("|".join(f"(?:{_NAMED_GROUP.sub('(?:', p.regex.pattern)})" for p in rows))


#: Lines that end a boot for sure (the rows marked ``fatal``), searched on whole raw lines: the boot
#: watcher's fast path. The full classification (tracebacks, stops, artefacts) is the log reader's.
FATAL: re.Pattern[str] = _union(tuple(p for p in PATTERNS if p.fatal))

#: Milestone → the lines that prove it, in boot order.
MILESTONE_LINES: tuple[tuple[Milestone, re.Pattern[str]], ...] = tuple(
    (m, _union(tuple(p for p in PATTERNS if p.milestone is m))) for m in Milestone
)


def milestone_of(line: str) -> Milestone | None:
    """The furthest boot milestone ``line`` proves (a prefixed raw line or a bare message), or None."""
    for m, regex in reversed(MILESTONE_LINES):
        if regex.search(line):
            return m
    return None

