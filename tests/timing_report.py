"""Where the suite's time goes (issue 39): the N slowest tests and the time per top-level folder, printed at the
end of a run that asks for it with ``--time-report[=N]`` (``scripts/test`` always does).

A test's time is its setup + call + teardown, so a fixture that boots a stack is charged to the test that paid
for it (the first of a module, for a module-scoped fixture). Under pytest-xdist the workers' reports reach the
controller, which adds them up: a folder's figure is then the sum of its tests' times, more than the wall time
when they ran side by side. ``--time-report-json FILE`` also writes every test's time, to compare two runs.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("time-report", "where the suite's time goes (tests/timing_report.py)")
    g.addoption("--time-report", nargs="?", type=int, const=30, default=None, metavar="N",
                help="at the end, print the N slowest tests (default 30) and the time per top-level folder")
    g.addoption("--time-report-json", default=None, metavar="FILE",
                help="also write {nodeid: seconds} of every test to FILE")


XDIST_GROUP = re.compile(r"@[^\[\]]*$")  # "test_x[crash@rank=1]@rig" -> "test_x[crash@rank=1]"


class TimeReport:
    def __init__(self, slowest: int, json_path: str | None) -> None:
        self.slowest = slowest
        self.json_path = json_path
        self.per_test: dict[str, float] = defaultdict(float)
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = XDIST_GROUP.sub("", report.nodeid)  # --dist loadgroup appends "@group" to the test's id
        self.per_test[nodeid] += report.duration

    @staticmethod
    def folder(nodeid: str) -> str:
        parts = nodeid.split("::", 1)[0].split("/")
        return "/".join(parts[:2]) if len(parts) > 2 else parts[0]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        if not self.per_test:
            return
        wall = time.monotonic() - self.started
        tr.write_sep("=", f"time report: {self.slowest} slowest tests (setup + call + teardown)")
        for nodeid, s in sorted(self.per_test.items(), key=lambda kv: -kv[1])[: self.slowest]:
            tr.write_line(f"{s:8.2f}s  {nodeid}")
        tr.write_sep("=", "time report: per folder (sum of test times)")
        folders: dict[str, list[float]] = defaultdict(list)
        for nodeid, s in self.per_test.items():
            folders[self.folder(nodeid)].append(s)
        for name, times in sorted(folders.items()):
            tr.write_line(f"{sum(times):9.1f}s  {len(times):5d} tests  {name}")
        tr.write_line(f"{sum(self.per_test.values()):9.1f}s  {len(self.per_test):5d} tests  all; "
                      f"wall time of this pytest run {wall:.1f}s")
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(
                {k: round(v, 3) for k, v in sorted(self.per_test.items())}, indent=0) + "\n")
            tr.write_line(f"per-test times written to {self.json_path}")


def pytest_configure(config: pytest.Config) -> None:
    n = config.getoption("--time-report")
    if n is None or hasattr(config, "workerinput"):  # an xdist worker: its controller reports
        return
    config.pluginmanager.register(TimeReport(n, config.getoption("--time-report-json")), "time-report")
