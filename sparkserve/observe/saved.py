"""Saved logs, read and judged offline: what ``sparkserve logs analyze FILE…`` and ``gates --from-log`` run.

A saved log is a local file or ``-`` (stdin); one that cannot be read is a :class:`BadInput` naming the
option it was given with. Nothing here touches a node: ``smoke`` and ``identity`` cannot be observed in a
log, so :func:`judge_files` reports them "not run" unless skipped, and container liveness is not checked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sparkserve.config import Config
from sparkserve.config.profiles import drafter_path
from sparkserve.errors import BadInput
from sparkserve.models.drafter import MASK_FILE
from sparkserve.models.files import read_config
from sparkserve.observe.analyze import Analysis, analyze
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import GateReport
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import ParsedLog, collector_paused, parse_log


@dataclass(frozen=True)
class LogFile:
    """One saved log as the user named it."""

    path: Path  # ``-``: standard input
    node: str | None = None  # the node it came from, when given
    given_as: str = "FILE"  # the argument or option it was given with, for the error when it cannot be read


def open_log(f: LogFile) -> BinaryIO:
    """A saved log opened for reading (stdin for ``-``); one that cannot be opened is a BadInput."""
    if str(f.path) == "-":
        return sys.stdin.buffer
    try:
        return f.path.open("rb")
    except FileNotFoundError:
        raise BadInput(f.given_as, f"{f.path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f.given_as, f"{f.path}: is a directory") from None
    except OSError as e:
        raise BadInput(f.given_as, f"{f.path}: {e.strerror or e}") from None


def parse_files(files: Iterable[LogFile]) -> list[ParsedLog]:
    """Each saved log parsed (bytes read as UTF-8, undecodable bytes replaced), in order. Every file is opened
    first, so a bad name fails before any is read; then each is read in one pass. Big logs are parsed side by
    side in forked processes (:func:`_parse_forked`); otherwise in this one."""
    files = list(files)
    with ExitStack() as stack:
        handles = [open_log(f) for f in files]
        for h in handles:
            if h is not sys.stdin.buffer:  # stdin is not ours to close
                stack.enter_context(h)

        def one(i: int) -> ParsedLog:
            return parse_log(handles[i], file=str(files[i].path), node=files[i].node)

        workers = _fork_workers(files)
        if workers:
            return _parse_forked(files, one, workers)
        return [one(i) for i in range(len(files))]


FORK_MIN_BYTES = 8 << 20  # below this, a fork and the pickled result cost more than the second core saves


def _fork_workers(files: Sequence[LogFile]) -> int:
    """How many forked workers to parse with: 0 (this process alone) for one log, stdin, small logs, one CPU,
    or where fork is not the safe default (only Linux)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if len(files) < 2 or cpus < 2 or not sys.platform.startswith("linux"):
        return 0
    if any(str(f.path) == "-" or not f.path.is_file() for f in files):
        return 0
    if sum(f.path.stat().st_size for f in files) < FORK_MIN_BYTES:
        return 0
    return min(len(files) - 1, cpus - 1)


def _parse_forked(files: list[LogFile], one: Callable[[int], ParsedLog], workers: int) -> list[ParsedLog]:
    """The first log parsed here while forked workers parse the others (the parser is pure Python: threads
    would share one core). A parsed log pickles to ~1 % of the text (50 MB → 0.55 MB, 5 ms).

    Each worker is a plain forked process with a pipe of its own, not a ``multiprocessing.Pool`` (issue 25):
    a pool's workers share one task queue and its lock, and ``Pool.terminate()`` ends them with SIGTERM while
    holding that lock — a worker that had inherited the CLI's SIGTERM handler swallowed the signal, and the
    parent's ``join()`` waited forever. Here nothing is shared and nothing depends on a worker's handlers:

    * a worker starts with the parent's handlers undone (:func:`_worker_signals`): SIGINT ignored (Ctrl-C
      reaches this process, which ends them), SIGTERM and SIGHUP back to the default;
    * on success each worker sends its results and exits, and is reaped;
    * on any error or interrupt each worker gets SIGKILL (a parse holds nothing worth a graceful exit) and
      is reaped: no lock can be left held, so the reaping cannot wait on anything.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    jobs = [(i, str(f.path), f.node) for i, f in enumerate(files) if i > 0]
    procs = []
    try:
        for w in range(workers):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(send, jobs[w::workers]), daemon=True)
            p.start()
            send.close()
            procs.append((p, recv))
        results: dict[int, ParsedLog] = {0: one(0)}
        for _, recv in procs:
            try:
                ok, payload = recv.recv()
            except EOFError:
                raise RuntimeError("a log-parsing worker died before it sent its results") from None
            if not ok:
                raise payload
            results.update(payload)
    except BaseException:
        for p, _ in procs:
            with contextlib.suppress(OSError, ValueError):
                p.kill()
        raise
    finally:
        for p, recv in procs:
            p.join()
            recv.close()
    return [results[i] for i in range(len(files))]


def _worker(send: object, jobs: list[tuple[int, str, str | None]]) -> None:
    """A forked worker: its share of the logs, parsed, sent back as (True, {index: ParsedLog}) — or
    (False, the exception) — then gone."""
    _worker_signals()
    try:
        msg: tuple[bool, object] = (True, {i: _parse_path((path, node)) for i, path, node in jobs})
    except Exception as e:  # noqa: BLE001 - handed to the parent, which raises it
        msg = (False, e)
    send.send(msg)  # type: ignore[attr-defined]
    send.close()  # type: ignore[attr-defined]


def _worker_signals() -> None:
    """A forked worker's first act: none of the parent's signal handlers stay (see :func:`_parse_forked`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _parse_path(job: tuple[str, str | None]) -> ParsedLog:
    """In a worker: one saved log, by its path (opened before the fork, so it exists)."""
    path, node = job
    with open(path, "rb") as f:
        return parse_log(f, file=path, node=node)


def analyze_files(files: Iterable[LogFile]) -> Analysis:
    """The ``logs analyze`` analysis of saved logs."""
    with collector_paused():  # over the analysis too: it walks every event
        return analyze(parse_files(files))


def judge_files(cfg: Config, files: Sequence[LogFile], *, skip: Iterable[str] = ()) -> GateReport:
    """The gates on saved logs, one per node (``LogFile.node``, else the file's name)."""
    with collector_paused():  # over the judging too: it walks every event
        logs = {f.node or f.path.name: log for f, log in zip(files, parse_files(files), strict=True)}
        dpath = drafter_path(cfg)  # None: mtp, no drafter
        expect = Expectations.from_config(cfg, mask_file=drafter_has_mask(dpath) if dpath else False,
                                          check_nodes=False, drafter_layers=drafter_layers(dpath) if dpath else None)
        return judge(logs, expect, skip=skip)


def drafter_layers(path: Path | str) -> int | None:
    """The drafter's ``num_hidden_layers`` (the signature gate's drafter_layers) when its config.json is on
    this machine, else None."""
    try:
        n = read_config(Path(path).expanduser()).get("num_hidden_layers")
    except BadInput:
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def drafter_has_mask(path: Path | str) -> bool | None:
    """Does the drafter directory hold the mask embedding? None when the directory is not on this machine."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    return (p / MASK_FILE).is_file()
