"""Progress on long work, as people expect it: on a terminal rich bars and a live table; piped (CI logs,
``| cat``) one timestamped line per change and a heartbeat every :data:`HEARTBEAT_S` so a long phase is
never silent. ``NO_COLOR`` is honoured (rich reads it). Everything goes to stderr: stdout stays for the
result (and --json).

    with Progress(enabled=not json_out) as p:
        up(cfg, nodes, say=p.say, on_update=p.boot)        # p.copy(node, done, total): drafter bytes
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:  # imported where drawn: `up --json` and piped runs never draw a bar or a table
    from rich.live import Live
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID
    from rich.table import Table

HEARTBEAT_S = 10.0


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    """One command's progress reporter (see the module docstring). ``console`` defaults to stderr."""

    def __init__(self, enabled: bool = True, console: Console | None = None, *,
                 heartbeat_s: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.tty = self.console.is_terminal
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self._lock = threading.RLock()
        self._last_out = clock()
        self._current = ""  # what is being done now (the last line said), for the heartbeat
        self._t_current = clock()
        self._phases: dict[str, str] = {}
        self._boot_live: Live | None = None
        self._boot_table: Table | None = None
        self._copy: RichProgress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._copied: dict[str, tuple[int, int, float]] = {}  # node -> (done, total, t0)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        if self.enabled and not self.tty:
            self._beat = threading.Thread(target=self._heartbeat, name="sparkserve-heartbeat", daemon=True)
            self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=2)
        self._end_copy()
        with self._lock:
            if self._boot_live is not None:
                self._boot_live.stop()  # not transient: the last table stays printed as the boot's summary
                self._boot_live = None

    # -- lines ------------------------------------------------------------------------------------------

    def _line(self, text: str) -> None:
        with self._lock:
            self._last_out = self.clock()
            if self.tty:
                self.console.print(f"[dim]·[/dim] {text}", highlight=False, markup=True, soft_wrap=True)
            else:
                self.console.print(f"{_stamp()} · {text}", highlight=False, markup=False, soft_wrap=True)

    def say(self, msg: str) -> None:
        """A step began or ended (the deploy functions' reporter)."""
        if not self.enabled:
            return
        with self._lock:
            if not msg.startswith(("warning:", "error:")):  # a remark, not a step: the step goes on
                self._current, self._t_current = msg, self.clock()
            if self._boot_live is not None:  # the boot is over once the command speaks again: its table stays
                self._boot_live.stop()
                self._boot_live = None
        self._line(msg if not self.tty else _escape(msg))

    def _heartbeat(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                quiet = self.clock() - self._last_out
                if quiet < self.heartbeat_s:
                    continue
                parts = [self._still_working()]
                if self._phases:
                    parts.append("; ".join(f"{n} {p}" for n, p in self._phases.items()))
                for node, (done, total, t0) in self._copied.items():
                    if done < total:
                        parts.append(self._copy_text(node, done, total, t0))
            self._line(" — ".join(parts))

    def _still_working(self) -> str:
        """The heartbeat's head: the step in progress — the innermost timed spans under way
        (:func:`sparkserve.deploy.timings.under_way`: "preflight: engine identity"), else the last step said."""
        from sparkserve.deploy.timings import under_way

        steps = under_way()
        if steps:
            since = time.monotonic() - steps[0][1]
            return f"still working ({since:.0f}s since: {'; '.join(n for n, _ in steps)})"
        return f"still working ({self.clock() - self._t_current:.0f}s since: {self._current or 'start'})"

    # -- drafter copy -----------------------------------------------------------------------------------

    def _copy_text(self, node: str, done: int, total: int, t0: float) -> str:
        dt = max(self.clock() - t0, 1e-6)
        rate = done / dt
        eta = (total - done) / rate if rate > 0 else None
        pct = 100 * done / total if total else 100
        eta_s = f", ETA {eta:.0f}s" if eta is not None and done < total else ""
        return f"{node}: drafter {_human(done)} of {_human(total)} ({pct:.0f}%), {_human(rate)}/s{eta_s}"

    def copy(self, node: str, done: int, total: int) -> None:
        """``done`` of ``total`` drafter bytes are on ``node`` (called from the copy threads)."""
        if not self.enabled:
            return
        with self._lock:
            first = node not in self._copied
            t0 = self.clock() if first else self._copied[node][2]
            self._copied[node] = (done, total, t0)
            if self.tty:
                if self._copy is None:
                    from rich.progress import (
                        BarColumn,
                        DownloadColumn,
                        TextColumn,
                        TimeRemainingColumn,
                        TransferSpeedColumn,
                    )
                    from rich.progress import Progress as RichProgress

                    self._copy = RichProgress(  # transient: once done, one summary line per node stays
                        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=self.console, transient=True)
                    self._copy.start()
                if node not in self._tasks:
                    self._tasks[node] = self._copy.add_task(f"{node}: drafter", total=total)
                self._copy.update(self._tasks[node], completed=done, total=total)
                if all(d >= t for d, t, _ in self._copied.values()):
                    self._end_copy()
                return
            if first or done >= total:
                self._line(self._copy_text(node, done, total, t0))

    def _end_copy(self) -> None:
        with self._lock:
            if self._copy is not None:
                self._copy.stop()
                self._copy = None
                self._tasks.clear()
                for node, (done, total, t0) in self._copied.items():  # the bars are gone: one line each
                    self._line(self._copy_text(node, done, total, t0))

    # -- boot -------------------------------------------------------------------------------------------

    def boot(self, views: list[Any], elapsed: float) -> None:
        """The boot watcher's callback: every rank's phase, free memory and last log line."""
        if not self.enabled:
            return
        changes = []
        with self._lock:
            for v in views:
                phase = v.phase.value
                if self._phases.get(v.node) != phase:
                    self._phases[v.node] = phase
                    changes.append(v)
            if self.tty:
                self._end_copy()
                table = boot_table(views, elapsed)
                if self._boot_live is None:
                    from rich.live import Live

                    self._boot_live = Live(table, console=self.console, refresh_per_second=4, transient=False)
                    self._boot_live.start()
                else:
                    self._boot_live.update(table)
                return
        for v in changes:
            mem = f", {v.available / 2**30:.1f} GiB free" if v.available is not None else ""
            self._line(f"{v.node} (rank {v.rank}): {v.phase.value} after {elapsed:.1f}s{mem}")


def boot_table(views: list[Any], elapsed: float) -> Table:
    """The live boot view: node, rank and phase are never cut (only the last log line is)."""
    from rich.table import Table

    t = Table(title=f"booting — {elapsed:.0f}s", title_justify="left", expand=True)
    node_w = max([len("node")] + [len(v.node) for v in views])
    phase_w = max([len("phase")] + [len(v.phase.value) for v in views])
    t.add_column("node", no_wrap=True, min_width=node_w)
    t.add_column("rank", no_wrap=True, min_width=4, justify="right")
    t.add_column("phase", no_wrap=True, min_width=phase_w)
    t.add_column("free mem", no_wrap=True, min_width=9, justify="right")
    t.add_column("last log line", no_wrap=True, overflow="ellipsis", ratio=1)
    for v in views:
        mem = f"{v.available / 2**30:.1f} GiB" if v.available is not None else "-"
        t.add_row(v.node, str(v.rank), v.phase.value, mem, _escape(v.last_line))
    return t


def _escape(s: str) -> str:
    from rich.markup import escape

    return escape(s)
