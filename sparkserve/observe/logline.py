"""One physical vLLM log line → its logical records: wrappers, prefixes, colour and glued bars taken off.

What a physical line may look like (all handled, in any combination):

* 0.31+ prefixes ``(Worker_TP1 pid=3190) INFO 11-29 16:02:41 [file.py:772] msg``; 0.10–0.30 stream-rewrite
  prefixes, which also land on uvicorn and tqdm output; old ``(VllmWorker rank=0 pid=N)``,
  ``(VllmWorker TP0 pid=N)``, ``(VllmWorkerProcess pid=N)``; V0 ``INFO 10-23 03:54:46 file.py:123] msg``;
  Ray ``(EngineCore_DP0 pid=1) (RayWorkerWrapper pid=2, ip=…) …`` and ``(RayWorkerProc pid=Y, ip=Z)
  (Worker_TP1 pid=Y) …`` with ``[repeated 14x across cluster]``; 0.32+ JSON lines.
* ANSI colour (raw ``\\x1b[36m``, or pasted as ``^[[36m`` / ``[36m``), ``\\r`` / pasted ``^M``, CRLF, tqdm
  bars glued onto log lines (split into separate records).
* Wrappers: ``docker logs --timestamps`` RFC 3339 stamps, ``docker compose`` ``name  | `` columns,
  journald ``Mon DD HH:MM:SS host unit[pid]: `` (the month in any locale), a ``2026-08-01 12:00:00,123 | ``
  timestamp-and-pipe column.
* PyTorch c10 ``[rank1]:[W1129 …]`` lines and NCCL ``host:pid:tid [dev] … NCCL WARN`` lines.

The message left (:attr:`Record.msg`) is what :mod:`sparkserve.observe.logpatterns` matches.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;?]*[A-Za-z]|(?<![\w\]])\[(?:\d{1,3};)*\d{1,3}m")
_DOCKER_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d) ")
#: A timestamp and a pipe before the line (a log shipper's or a wrapper script's column: `2026-08-01 12:00:00,123 | `,
#: `2026-08-01T12:00:00.123456Z | `; issue 32, kind 5).
_TS_PIPE = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*\| ")
_COMPOSE = re.compile(r"(?P<svc>[A-Za-z0-9][\w.-]*)\s+\| ")
_JOURNALD = re.compile(
    r"(?:[^\W\d_]{3,4}\.? [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?) "
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
    """``s`` without colour codes (raw ESC, pasted ``^[``, or a bare ``[36m`` whose ESC was lost)."""
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
                m = _TS_PIPE.match(s, end) or _DOCKER_TS.match(s, end)
        elif c.isalnum():
            m = _JOURNALD.match(s, end) if c.isalpha() else None  # `Nov 29 …`, a localised `авг 18 …`
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


def normalise(lineno: int, raw: str, *, ansi: bool = True, source: str | None = None) -> list[Record]:
    """One physical line → its logical records (usually one; a glued tqdm bar makes more).

    ``ansi=False`` skips colour stripping (the file holds no colour codes at all). ``source``: the writer the
    envelope stage read off the line's wrapper (:mod:`sparkserve.observe.envelope`), unless a wrapper left on
    the line names one.
    """
    s = raw
    if "^" in s:
        s = s.replace("^M", "\r")
    if ansi:
        s = strip_ansi(s)
    s = s.rstrip("\r")
    wrapper, body, named = _unwrap(s)
    source = named or source
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


def starts_prefixed(raw: str) -> bool:
    """Does ``raw`` open with a process prefix, a logger prefix or a docker stamp? Then it is a line of its
    own, never the continuation of a hard-wrapped message."""
    return bool(raw.startswith("(") and _PROC.match(raw) or _LOGGER.match(raw) or _DOCKER_TS.match(raw)
                or _TS_PIPE.match(raw))
