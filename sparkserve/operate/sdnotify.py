"""systemd's notify protocol: ``READY=1``, ``WATCHDOG=1``, ``STATUS=…``, ``STOPPING=1`` to ``$NOTIFY_SOCKET``.

Hand-written on purpose: the protocol is one datagram on a unix socket (sd_notify(3)), ~15 lines; the PyPI
``sdnotify`` package has had no release since 2017 and does not take abstract socket names (``@…``), and
python-systemd needs libsystemd headers to build. Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import threading
import time


def notify(state: str, *, env: dict[str, str] | None = None) -> bool:
    """Send ``state`` (``"READY=1"``, ``"WATCHDOG=1\\nSTATUS=…"``); False when there is no socket or it fails."""
    addr = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # an abstract socket name
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.setblocking(False)  # never wait: a receiver that does not read must not stall the supervisor
            s.connect(addr)
            s.send(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval_s(env: dict[str, str] | None = None) -> float | None:
    """Half of ``$WATCHDOG_USEC`` (systemd's advice), when the watchdog is on for this process."""
    e = env if env is not None else os.environ
    usec = e.get("WATCHDOG_USEC")
    pid = e.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


class Heartbeat:
    """WATCHDOG=1 every half watchdog period, only while the loop's last promise (``expect(s)``) holds."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.period = watchdog_interval_s(env)
        self.until = time.monotonic() + 60.0
        self._stop = threading.Event()
        if self.period:
            threading.Thread(target=self._beat, name="supervise-watchdog", daemon=True).start()

    def expect(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def _beat(self) -> None:
        assert self.period
        while not self._stop.wait(self.period):
            if time.monotonic() < self.until:
                notify("WATCHDOG=1")

    def stop(self) -> None:
        self._stop.set()
