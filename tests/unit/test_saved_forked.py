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


_HANDLERS_RAISED = r"""
import json, multiprocessing, sys, time
from pathlib import Path
from sparkserve import interrupts
from sparkserve.observe import saved
from sparkserve.observe.saved import LogFile, parse_files

interrupts.install()               # the CLI's handlers, as `sparkserve gates --from-log` has them
interrupts._state["raised"] = True  # an earlier interrupt in this process: the handler swallows later ones
saved.FORK_MIN_BYTES = 0
saved._fork_workers = lambda files: 2
if sys.argv[1] == "broken":
    def broken(job):
        raise ValueError("worker broke")
    saved._parse_path = broken
files = [LogFile(Path(p), node=f"n{i}") for i, p in enumerate(sys.argv[2:])]
t = time.monotonic()
try:
    out = [log.line_count for log in parse_files(files)]
except ValueError as e:
    out = str(e)
print(json.dumps({"took": time.monotonic() - t, "out": out,
                  "children": [p.pid for p in multiprocessing.active_children()]}))
"""


@pytest.mark.parametrize("mode", ["ok", "broken"])
def test_workers_never_run_the_parents_handlers(mode: str) -> None:
    """Issue 25: with the CLI's handlers installed and an interrupt already raised once (so the handler
    swallows SIGTERM), a forked parse still ends in seconds and leaves no worker, on success and on error."""
    import json
    import os
    import signal
    import subprocess
    import sys

    import psutil

    paths = [str(f.path) for f in _files()]
    p = subprocess.Popen([sys.executable, "-c", _HANDLERS_RAISED, mode, *paths], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the forked parse hung: a worker kept the parent's SIGTERM handler")
    d = json.loads(out)
    assert p.returncode == 0
    assert d["took"] < 10
    assert d["children"] == []
    if mode == "ok":
        assert len(d["out"]) == 3 and all(n > 0 for n in d["out"])
    else:
        assert d["out"] == "worker broke"
    left = [q for q in psutil.process_iter(["pid"]) if _session_of(q.pid) == p.pid]
    assert left == [], f"workers left behind: {left}"


def _session_of(pid: int) -> int | None:
    import os

    try:
        return os.getsid(pid)
    except OSError:
        return None
