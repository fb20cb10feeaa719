"""Saved logs parsed side by side in forked workers: the same verdicts as one process, no worker left behind."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.observe import saved
from sparkserve.observe.analyze import analyze
from sparkserve.observe.saved import LogFile, parse_files

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-0.25.1"
PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "public"


def _files() -> list[LogFile]:
    return [
        LogFile(REAL / "A-head.log", node="spark-a"),
        LogFile(REAL / "A-follower.log", node="spark-b"),
        LogFile(PUBLIC / "dspark-b12x-serving-head.log", node="spark-c"),
    ]


def _summary(logs) -> list[tuple]:
    return [
        (log.file, log.node, log.line_count, [(e.kind, e.rec.lineno) for e in log.events],
         [(e.kind, e.rec.lineno) for e in log.faults], log.spec_at, log.spec_al)
        for log in logs
    ]


def _broken(job: tuple[str, str | None]) -> None:  # module level: a worker finds it by name
    raise ValueError("worker broke")


def test_forked_parse_equals_the_in_process_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    in_process = parse_files(_files())
    monkeypatch.setattr(saved, "FORK_MIN_BYTES", 0)
    monkeypatch.setattr(saved, "_fork_workers", lambda files: 2)  # even on a one-CPU runner
    forked = parse_files(_files())
    assert _summary(forked) == _summary(in_process)
    assert analyze(forked).to_json() == analyze(in_process).to_json()
    assert multiprocessing.active_children() == []


def test_small_logs_one_log_and_stdin_stay_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert saved._fork_workers(_files()) == 0  # a few hundred KB: the fork would cost more than it saves
    monkeypatch.setattr(saved, "FORK_MIN_BYTES", 0)
    assert saved._fork_workers(_files()[:1]) == 0
    assert saved._fork_workers([*_files()[:1], LogFile(Path("-"))]) == 0


def test_a_worker_that_fails_fails_the_call_and_leaves_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saved, "_fork_workers", lambda files: 1)
    monkeypatch.setattr(saved, "_parse_path", _broken)
    with pytest.raises(ValueError, match="worker broke"):
        parse_files(_files()[:2])
    assert multiprocessing.active_children() == []


def test_a_bad_name_fails_before_any_worker_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(saved, "_fork_workers", lambda files: 1)
    with pytest.raises(BadInput, match="no such file"):
        parse_files([*_files()[:1], LogFile(tmp_path / "gone.log", given_as="--from-log")])
    assert multiprocessing.active_children() == []
