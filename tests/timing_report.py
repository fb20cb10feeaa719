"""Where the suite's time goes (issue 39): the N slowest tests and the time per top-level folder, printed at the
end of a run that asks for it with ``--time-report[=N]`` (``scripts/test`` always does).

A test's time is its setup + call + teardown, so a fixture that boots a stack is charged to the test that paid
for it (the first of a module, for a module-scoped fixture). Under pytest-xdist the workers' reports reach the
controller, which adds them up: a folder's figure is then the sum of its tests' times, more than the wall time
when they ran side by side. ``--time-report-json FILE`` writes every test's time (and the run's wall time), so
two runs can be compared test by test, and runs made side by side reported as one::

    python tests/timing_report.py rig.json norig.json      # scripts/test: the rig run and the one beside it

Every reported run also merges its tests' times into ``.test-durations.json`` (this checkout's, ignored by git).
Under pytest-xdist, ``--dist loadfile`` hands out whole modules, and a long module handed out last runs alone at
the end (``--quick``: test_supervise.py's ~100 s started 140 s in, and the run waited 40-60 s on it): the
controller sends those times to its workers, which put the modules in order of their time, longest first
(:func:`order_modules`; with ``--no-loadscope-reorder`` xdist keeps that order). A module never timed counts as
1 s a test under tests/rig (they start stacks), 0.1 s elsewhere.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

WALL = "(wall time of the run)"  # the JSON's key for the run's own wall time
DURATIONS = Path(__file__).resolve().parent.parent / ".test-durations.json"  # {test id: seconds}, merged per run


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("time-report", "where the suite's time goes (tests/timing_report.py)")
    g.addoption("--time-report", nargs="?", type=int, const=30, default=None, metavar="N",
                help="at the end, print the N slowest tests (default 30) and the time per top-level folder")
    g.addoption("--time-report-json", default=None, metavar="FILE",
                help="write {test id: seconds} of every test, and the run's wall time, to FILE")


def folder(nodeid: str) -> str:
    """tests/unit/test_x.py::test_y -> tests/unit"""
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def render(per_test: dict[str, float], walls: list[float], slowest: int, write: Callable[[str], None]) -> None:
    """The report: the ``slowest`` tests, then each folder's sum and count, then the total and the wall time."""
    write(f"time report: the {slowest} slowest tests (setup + call + teardown)")
    for nodeid, s in sorted(per_test.items(), key=lambda kv: -kv[1])[:slowest]:
        write(f"{s:8.2f}s  {nodeid}")
    write("time report: per folder (the sum of its tests' times)")
    folders: dict[str, list[float]] = defaultdict(list)
    for nodeid, s in per_test.items():
        folders[folder(nodeid)].append(s)
    for name, times in sorted(folders.items()):
        write(f"{sum(times):9.1f}s  {len(times):5d} tests  {name}")
    side = " side by side" if len(walls) > 1 else ""
    write(f"{sum(per_test.values()):9.1f}s  {len(per_test):5d} tests  all; wall time {max(walls, default=0):.1f}s"
          f" ({len(walls)} pytest run{'s' if len(walls) != 1 else ''}{side})")


class TimeReport:
    def __init__(self, slowest: int | None, json_path: str | None) -> None:
        self.slowest = slowest
        self.json_path = json_path
        self.per_test: dict[str, float] = defaultdict(float)
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.per_test[report.nodeid] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        wall = time.monotonic() - self.started
        remember(self.per_test)
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(
                {WALL: round(wall, 3)} | {k: round(v, 3) for k, v in sorted(self.per_test.items())}, indent=0) + "\n")
        if self.slowest is not None and self.per_test:
            tr = terminalreporter
            render(self.per_test, [wall], self.slowest, lambda s: tr.write_sep("=", s) if s.startswith("time report")
                   else tr.write_line(s))


def known_durations() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}


def remember(per_test: dict[str, float]) -> None:
    """Merge this run's times into the checkout's file (atomically: runs side by side each merge theirs)."""
    if not per_test:
        return
    merged = known_durations() | {k: round(v, 3) for k, v in per_test.items()}
    tmp = DURATIONS.with_name(f"{DURATIONS.name}.{time.monotonic_ns()}.tmp")
    try:
        tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
        tmp.replace(DURATIONS)
    except OSError:
        tmp.unlink(missing_ok=True)


def order_modules(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Reorder ``items`` in place: whole modules, the longest first by their tests' known times; the tests of a
    module keep their order (module fixtures, and tests that build on the one before)."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def cost(name: str) -> float:
        guess = 1.0 if name.startswith("tests/rig/") else 0.1
        return sum(durations.get(i.nodeid, guess) for i in modules[name])

    items[:] = [i for name in sorted(modules, key=lambda m: -cost(m)) for i in modules[name]]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 - xdist's WorkerController
    """The controller reads the times once and gives each worker the same: every worker must collect one order."""
    node.workerinput["test_durations"] = known_durations()


def order_for_xdist(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Called by the conftest's collection hook, last."""
    durations = getattr(config, "workerinput", {}).get("test_durations")
    if durations is not None:  # an xdist worker: the order its controller's scheduler hands modules out in
        order_modules(items, durations)


def pytest_configure(config: pytest.Config) -> None:
    n, path = config.getoption("--time-report"), config.getoption("--time-report-json")
    if (n is None and path is None) or hasattr(config, "workerinput"):  # an xdist worker: its controller reports
        return
    config.pluginmanager.register(TimeReport(n, path), "time-report")


def main(argv: list[str]) -> int:
    """One report over the JSON files of runs made side by side."""
    if not argv:
        print("usage: python tests/timing_report.py RUN.json [RUN.json ...]", file=sys.stderr)
        return 2
    per_test: dict[str, float] = {}
    walls: list[float] = []
    for p in argv:
        data = json.loads(Path(p).read_text())
        walls.append(data.pop(WALL, 0.0))
        per_test.update(data)
    render(per_test, walls, 30, print)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
