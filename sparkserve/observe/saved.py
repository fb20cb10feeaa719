"""Saved logs, read and judged offline: what ``sparkserve logs analyze FILE…`` and ``gates --from-log`` run.

A saved log is a local file or ``-`` (stdin); one that cannot be read is a :class:`BadInput` naming the
option it was given with. Nothing here touches a node: ``smoke`` and ``identity`` cannot be observed in a
log, so :func:`judge_files` reports them "not run" unless skipped, and container liveness is not checked.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkserve.config import Config
from sparkserve.errors import BadInput
from sparkserve.models.drafter import MASK_FILE
from sparkserve.observe.analyze import Analysis, analyze
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import GateReport
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import ParsedLog, parse_log


@dataclass(frozen=True)
class LogFile:
    """One saved log as the user named it."""

    path: Path  # ``-``: standard input
    node: str | None = None  # the node it came from, when given
    given_as: str = "FILE"  # the argument or option it was given with, for the error when it cannot be read


def read_log(f: LogFile) -> bytes:
    """The bytes of a saved log (stdin for ``-``)."""
    if str(f.path) == "-":
        return sys.stdin.buffer.read()
    try:
        return f.path.read_bytes()
    except FileNotFoundError:
        raise BadInput(f.given_as, f"{f.path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f.given_as, f"{f.path}: is a directory") from None
    except OSError as e:
        raise BadInput(f.given_as, f"{f.path}: {e.strerror or e}") from None


def parse_files(files: Iterable[LogFile]) -> list[ParsedLog]:
    """Each saved log parsed (bytes read as UTF-8, undecodable bytes replaced), in order."""
    return [parse_log(read_log(f), file=str(f.path), node=f.node) for f in files]


def analyze_files(files: Iterable[LogFile]) -> Analysis:
    """The ``logs analyze`` analysis of saved logs."""
    return analyze(parse_files(files))


def judge_files(cfg: Config, files: Sequence[LogFile], *, skip: Iterable[str] = ()) -> GateReport:
    """The gates on saved logs, one per node (``LogFile.node``, else the file's name)."""
    logs = {f.node or f.path.name: log for f, log in zip(files, parse_files(files), strict=True)}
    expect = Expectations.from_config(cfg, mask_file=drafter_has_mask(cfg.drafter.path), check_nodes=False)
    return judge(logs, expect, skip=skip)


def drafter_has_mask(path: Path | str) -> bool | None:
    """Does the drafter directory hold the mask embedding? None when the directory is not on this machine."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    return (p / MASK_FILE).is_file()
