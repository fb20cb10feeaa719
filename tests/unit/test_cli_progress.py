"""Progress as people expect it: the live boot view never cuts node or phase and stays printed; piped, one
timestamped line per change and a heartbeat; drafter copy bars with bytes, rate and ETA; NO_COLOR."""

from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass

import pytest
from rich.console import Console

from sparkserve.commands.progress import Progress
from sparkserve.deploy.watchdog import Phase

STAMP = re.compile(r"^\d\d:\d\d:\d\d · ")


@dataclass
class View:  # what deploy.wait hands the boot watcher (NodeView's fields the view reads)
    node: str
    rank: int
    phase: Phase
    available: int | None = None
    last_line: str = ""


def _console(tty: bool, width: int = 60) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=tty, width=width, color_system="standard" if tty else None), buf


def test_the_live_boot_view_keeps_node_and_phase_whole_and_stays_printed() -> None:
    con, buf = _console(tty=True, width=90)
    views = [View("spark-a-very-long-node-name", 0, Phase.KV_READY, 40 * 2**30, "x" * 300),
             View("spark-b-very-long-node-name", 1, Phase.PROFILE, None, "INFO profiling " * 20)]
    with Progress(console=con) as p:
        p.boot(views, 12.0)
        views[1].phase = Phase.CAPTURE
        p.boot(views, 20.0)
    out = buf.getvalue()
    last = out[out.rindex("booting — 20s"):]  # the final table, left on screen after the view ends
    for word in ("spark-a-very-long-node-name", "spark-b-very-long-node-name", "kv_ready", "capture"):
        assert word in last
    assert "…" in last  # the long log line is what gets cut


def test_piped_every_phase_change_is_one_timestamped_line_and_a_quiet_phase_gets_a_heartbeat() -> None:
    con, buf = _console(tty=False)
    views = [View("node-a", 0, Phase.START), View("node-b", 1, Phase.START)]
    with Progress(console=con, heartbeat_s=0.3) as p:
        p.say("preflight: every node")
        p.boot(views, 1.0)
        p.boot(views, 2.0)  # no change: no line
        views[0].phase = Phase.LOAD
        p.boot(views, 3.0)
        time.sleep(1.1)
    lines = buf.getvalue().splitlines()
    assert all(STAMP.match(ln) for ln in lines), lines
    assert lines[0].endswith("preflight: every node")
    changes = [ln for ln in lines if "(rank" in ln]
    assert [c.split(" · ", 1)[1] for c in changes] == [
        "node-a (rank 0): start after 1.0s", "node-b (rank 1): start after 1.0s", "node-a (rank 0): load after 3.0s"]
    beats = [ln for ln in lines if "still working" in ln]
    assert beats and "since: preflight: every node" in beats[0] and "node-a load; node-b start" in beats[0]
    assert "\x1b[" not in buf.getvalue()


def test_piped_drafter_copy_says_bytes_rate_and_eta() -> None:
    con, buf = _console(tty=False)
    t = [100.0]
    with Progress(console=con, clock=lambda: t[0], heartbeat_s=3600) as p:
        p.copy("node-b", 0, 4_000_000_000)
        t[0] += 10
        p.copy("node-b", 1_000_000_000, 4_000_000_000)
        p.copy("node-b", 4_000_000_000, 4_000_000_000)
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("node-b: drafter 0 B of 4.0 GB (0%), 0 B/s")
    assert lines[-1].endswith("node-b: drafter 4.0 GB of 4.0 GB (100%), 400.0 MB/s")


def test_on_a_terminal_the_copy_is_a_bar_with_bytes_rate_and_eta() -> None:
    con, buf = _console(tty=True, width=120)
    with Progress(console=con) as p:
        p.copy("node-b", 0, 3_000_000)
        p.copy("node-b", 1_500_000, 3_000_000)
        p.copy("node-b", 3_000_000, 3_000_000)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "node-b: drafter" in out and "3.0/3.0 MB" in out


def test_no_color_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=80)
    with Progress(console=con) as p:
        p.say("syncing")
        p.boot([View("node-a", 0, Phase.LOAD)], 1.0)
    assert not re.search(r"\x1b\[[0-9;]*3\dm", buf.getvalue())  # no colour codes (cursor moves are fine)


def test_the_heartbeat_names_the_step_in_progress_never_the_last_warning() -> None:
    """`up` on a real engine printed `still working (10s since: warning: gpu: swappiness: …)` while it identified
    the engine (issue 45): a warning is a remark, the step is the timed span under way."""
    from sparkserve.deploy.timings import span

    con, buf = _console(tty=False, width=200)
    with Progress(console=con, heartbeat_s=0.2) as p:
        p.say("preflight: checking every node")
        p.say("warning: gpu: swappiness: vm.swappiness is 60 (the card's hosts run 1)")
        with span("preflight"), span("preflight: engine identity"):
            deadline = time.monotonic() + 10
            while "still working" not in buf.getvalue() and time.monotonic() < deadline:
                time.sleep(0.05)
        beats = [ln for ln in buf.getvalue().splitlines() if "still working" in ln]
        assert beats and re.fullmatch(r"still working \(\d+s since: preflight: engine identity\)",
                                      beats[0].split(" · ", 1)[1]), beats
        p.say("image: ready")
    assert all("since: warning" not in ln for ln in buf.getvalue().splitlines())


def test_without_a_span_the_heartbeat_names_the_last_step_said_not_a_warning() -> None:
    con, buf = _console(tty=False, width=200)
    with Progress(console=con, heartbeat_s=0.2) as p:
        p.say("drafter: syncing /d to /models/d on every node")
        p.say("warning: node-b: iommu: not passthrough")
        deadline = time.monotonic() + 10
        while "still working" not in buf.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    (beat, *_) = [ln for ln in buf.getvalue().splitlines() if "still working" in ln]
    assert "since: drafter: syncing /d to /models/d on every node)" in beat
