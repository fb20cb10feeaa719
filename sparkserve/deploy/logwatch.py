"""Ranks' logs followed as they are written, so the one wait (:mod:`sparkserve.deploy.wait`) wakes the moment
every rank has logged a line, instead of finding it on its next look.

    with follow_logs({node: (engine, container_id)}, marker) as watch:
        watch.woke.wait(0.2)        # set: every rank logged ``marker``, or one's log ended (it stopped)
        watch.seen                  # the ranks whose log showed it
        watch.followed              # False: some runtime's log cannot be stopped from another thread (its
                                    # ``cancellable_logs`` is not set), or following failed: the waiter
                                    # looks on its own schedule

One streaming request per rank for the whole wait, where looking again every few milliseconds would cost a
few requests per rank each time (and the CPU the booting ranks need). Each stream is read in its own daemon
thread and cancelled when the block ends; a failure to follow only means waking later, never an error: the
wait's own looks decide what happened.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

from sparkserve.nodes import interrupts
from sparkserve.nodes.runtime import Runtime

JOIN_S = 2.0  # a reader whose stream was cancelled ends within milliseconds; never wait longer than this


class LogWatch:
    """What the followed logs showed so far (see the module docstring)."""

    def __init__(self, nodes: set[str]) -> None:
        self.woke = threading.Event()
        self.seen: set[str] = set()
        self.followed = True
        self._pending = set(nodes)
        self._streams: list[Any] = []
        self._lock = threading.Lock()
        self._closing = False

    def read(self, node: str, eng: Runtime, container: str, marker: re.Pattern[str]) -> None:
        """One rank's reader thread: follow its log until ``marker`` shows or the log ends."""
        found = False
        try:
            if not getattr(eng, "cancellable_logs", False):
                self.followed = False  # nothing could stop this reader: it does not start
                return
            stream = eng.logs(container, follow=True)
            with self._lock:
                self._streams.append(stream)
                closing = self._closing
            if closing:  # the block ended while the request was on its way
                stream.cancel()
                return
            for line in stream:
                if marker.search(line):
                    found = True
                    break
        except Exception:  # noqa: BLE001 - the wait's own looks decide what happened; they come faster now
            with self._lock:
                self.followed = False
        finally:
            with self._lock:
                self._pending.discard(node)
                if found:
                    self.seen.add(node)
                # every rank logged it, or this log ended without it (the rank stopped: the next look says)
                if not found or not self._pending:
                    self.woke.set()

    def close(self) -> None:
        """Cancel every stream still open (their readers see the end of the log)."""
        with self._lock:
            self._closing = True
            streams = list(self._streams)
        for s in streams:
            s.cancel()


@contextlib.contextmanager
def follow_logs(ranks: dict[str, tuple[Runtime, str]], marker: re.Pattern[str]) -> Iterator[LogWatch]:
    """Follow each rank's log (``{node: (runtime, container)}``) in a thread until ``marker`` shows or the log
    ends; every stream still open is cancelled when the block ends."""
    watch = LogWatch(set(ranks))
    threads = [threading.Thread(target=watch.read, args=(node, eng, cid, marker), daemon=True,
                                name=f"sparkserve-logwatch-{node}") for node, (eng, cid) in ranks.items()]
    try:
        with interrupts.deferred(raise_after=True):  # every reader started is one the block's end stops
            for t in threads:
                t.start()
        yield watch
    finally:
        watch.close()
        for t in threads:
            if t.ident is not None:  # started
                t.join(timeout=JOIN_S)
