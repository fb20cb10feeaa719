"""Best effort: :func:`record` and :func:`lookup` never fail their caller — a deploy or a bench that works must
not fail over its record. A journal that cannot be used gets one ``warning: journal: …`` line per process and
its records go to a fallback JSON-lines file (:func:`fallback_candidates`)."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sparkserve.errors import BadInput
from sparkserve.journal.schema import now
from sparkserve.journal.store import Journal, default_path

FALLBACK_SUFFIX = ".fallback.jsonl"
T = TypeVar("T")
_WRITERS: dict[str, Callable[..., Any]] = {
    "deployment": Journal.record_deployment,
    "gate_run": Journal.record_gate_run,
    "banked_pool": Journal.put_banked_pool,
    "bench": Journal.record_bench,
    "active_drafter": Journal.set_active_drafter,
    "clear_active_drafter": Journal.clear_active_drafter,
    "supervise_event": Journal.record_supervise_event,
    "host_facts": Journal.record_host_facts,
}
_warned: set[Path] = set()  # journals already warned about in this process: one line each


def fallback_candidates(path: Path) -> list[Path]:
    """Where records go when the journal at ``path`` cannot take them, in order of preference: next to it,
    else in the temp dir (the journal's own dir may be the read-only or full one)."""
    tmp = Path(tempfile.gettempdir()) / f"sparkserve-{os.getuid()}-journal{FALLBACK_SUFFIX}"
    return [path.with_name(path.name + FALLBACK_SUFFIX), tmp]


def fallback_note(path: Path) -> str:
    """``; records it could not take are in …`` when a fallback file holds records, else nothing."""
    held = [p for p in fallback_candidates(path) if p.is_file()]
    return f"; records it could not take are in {', '.join(map(str, held))}" if held else ""


def _warn_once(path: Path, err: BaseException, where: Path | None) -> None:
    if path in _warned:
        return
    _warned.add(path)
    what = err.what if isinstance(err, BadInput) else (getattr(err, "strerror", None) or str(err))
    dest = f"records go to {where}" if where else "records are lost (no writable fallback file)"
    print(f"warning: journal: {path}: {what}; {dest}", file=sys.stderr)


def _append_fallback(path: Path, line: dict[str, Any]) -> Path | None:
    """Append one JSON line to the first fallback file that takes it (created 0600, never through a
    symlink: the temp dir is shared); None when none does."""
    text = json.dumps(line, sort_keys=True, default=str) + "\n"
    for cand in fallback_candidates(path):
        try:
            fd = os.open(cand, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            os.write(fd, text.encode())
            return cand
        except OSError:
            continue
        finally:
            os.close(fd)
    return None


def record(kind: str, **fields: Any) -> Any:
    """Write one record (``kind``: deployment, gate_run, banked_pool, bench; ``fields``: that
    ``Journal`` method's arguments) to the journal and return what that method returns (a bench's id), or,
    when it cannot take it, write it to the fallback file with one warning and return None. Never raises:
    a deploy or a bench that works must not fail, or be torn down, over its record."""
    path = default_path()
    try:
        with Journal.open(path) as j:
            return _WRITERS[kind](j, **fields)
    except (BadInput, sqlite3.Error, OSError) as e:
        err: BaseException = e
    where = _append_fallback(path, {"kind": kind, "time": now(), "journal": str(path), "error": str(err),
                                    **fields})
    _warn_once(path, err, where)


def lookup(read: Callable[[Journal], T], default: T) -> T:
    """``read(journal)``, or ``default`` (with the one warning) when the journal cannot be read."""
    path = default_path()
    try:
        with Journal.open(path) as j:
            return read(j)
    except (BadInput, sqlite3.Error, OSError) as e:
        _warn_once(path, e, next((p for p in fallback_candidates(path) if _writable(p)), None))
        return default


def _writable(p: Path) -> bool:
    """Whether a fallback file could be appended at ``p`` (for the warning of a failed read)."""
    return os.access(p, os.W_OK) if p.exists() else os.access(p.parent, os.W_OK)
