"""The suite's own scheduling aid (tests/timing_report.py): under xdist's loadfile the modules go out longest
first by this checkout's last times, each module whole and in its own order; a module never timed is guessed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import timing_report
from timing_report import order_modules


def items(*ids: str) -> list:
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_modules_go_longest_first_whole_and_in_their_own_order() -> None:
    got = items("tests/unit/a.py::t1", "tests/unit/a.py::t2", "tests/unit/b.py::t1", "tests/rig/c.py::t1",
                "tests/unit/a.py::t3")
    order_modules(got, {"tests/unit/a.py::t1": 1.0, "tests/unit/a.py::t2": 1.0, "tests/unit/b.py::t1": 30.0})
    assert [i.nodeid for i in got] == ["tests/unit/b.py::t1", "tests/unit/a.py::t1", "tests/unit/a.py::t2",
                                       "tests/unit/a.py::t3", "tests/rig/c.py::t1"]
    # never timed: a rig-folder module (it starts stacks) before the unit modules of the same count
    fresh = items("tests/unit/a.py::t1", "tests/rig/c.py::t1")
    order_modules(fresh, {})
    assert [i.nodeid for i in fresh] == ["tests/rig/c.py::t1", "tests/unit/a.py::t1"]


def test_each_run_merges_its_times_into_the_checkouts_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(timing_report, "DURATIONS", tmp_path / ".test-durations.json")
    timing_report.remember({"tests/unit/a.py::t1": 2.0, "tests/unit/a.py::t2": 1.0})
    timing_report.remember({"tests/unit/a.py::t1": 3.5})  # a later, partial run: its own tests updated only
    assert json.loads((tmp_path / ".test-durations.json").read_text()) == {
        "tests/unit/a.py::t1": 3.5, "tests/unit/a.py::t2": 1.0}
    (tmp_path / ".test-durations.json").write_text("not json")
    assert timing_report.known_durations() == {}  # a broken file orders nothing, fails nothing


def test_every_xdist_worker_collects_the_same_order(tmp_path: Path) -> None:
    """Real pytest-xdist: the controller hands its workers one set of times (a worker that read another would
    collect another order, and xdist stops the run). One worker runs the modules longest first; two collect alike."""
    root = tmp_path / "proj"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "timing_report.py").write_text(Path(timing_report.__file__).read_text())
    (root / "tests" / "conftest.py").write_text(
        "from timing_report import order_for_xdist, pytest_addoption, pytest_configure, pytest_configure_node  "
        "# noqa: F401\n\ndef pytest_collection_modifyitems(config, items):\n    order_for_xdist(config, items)\n")
    ran = root / "ran"
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (root / "tests" / name).write_text(
            f"def test_one():\n    with open({str(ran)!r}, 'a') as f:\n        f.write({name!r} + '\\n')\n")
    times = {"tests/test_b.py::test_one": 50.0, "tests/test_c.py::test_one": 20.0}
    for workers in ("1", "2"):
        (root / ".test-durations.json").write_text(json.dumps(times))
        ran.unlink(missing_ok=True)
        p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", workers, "--dist",
                            "loadfile", "--no-loadscope-reorder", "--time-report=2", "tests"],
                           cwd=root, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        if workers == "1":
            assert ran.read_text().split() == ["test_b.py", "test_c.py", "test_a.py"]
    got = json.loads((root / ".test-durations.json").read_text())  # the run's own times replaced the file's
    assert set(got) == {f"tests/test_{m}.py::test_one" for m in "abc"} and got["tests/test_b.py::test_one"] < 5
