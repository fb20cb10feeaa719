"""Bounded recovery: when to restart, how long to wait first, and when to give up.

    policy = Budget(max_restarts=3, window_s=1800, backoff_s=10, backoff_max_s=300)
    decision = policy.decide(now)        # Decision("restart", wait_s=10.0) or Decision("give_up", …)
    policy.note_restart(now)

An unbounded loop is worse than down: compose's `restart: unless-stopped` restarted a GB10 stack ~35 times,
leaking unified memory until SSH died (eugr/spark-vllm-docker#257). So restarts are counted in a sliding
window; past the budget the supervisor stops everything cleanly and alerts. The waits double from
``backoff_s`` (10, 20, 40, … up to ``backoff_max_s``), counted over the restarts still in the window.

The actions (:func:`restart`, :func:`stop_everything`) go through deploy/'s own paths: `down` stops each
rank gracefully (SIGINT/SIGTERM, docker stop with its timeout — never ``rm -f`` of a running container)
and saves its log; `sparkserve up` (a child process) boots the same plan and runs the gates again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkserve.config import Config
from sparkserve.errors import RemoteFailure
from sparkserve.nodes.base import Node


@dataclass(frozen=True)
class Decision:
    action: Literal["restart", "give_up"]
    wait_s: float
    why: str


@dataclass
class Budget:
    max_restarts: int
    window_s: float
    backoff_s: float
    backoff_max_s: float
    restarts: list[float] = field(default_factory=list)  # when each restart was made (monotonic seconds)

    @classmethod
    def from_config(cls, cfg: Config) -> Budget:
        s = cfg.supervise
        return cls(s.max_restarts, s.budget_window_s, s.backoff_s, s.backoff_max_s)

    def in_window(self, now: float) -> list[float]:
        return [t for t in self.restarts if now - t < self.window_s]

    def decide(self, now: float) -> Decision:
        recent = self.in_window(now)
        if len(recent) >= self.max_restarts:
            return Decision("give_up", 0.0, f"{len(recent)} restart(s) in the last {self.window_s:g}s "
                            f"(budget {self.max_restarts})")
        wait = min(self.backoff_s * (2 ** len(recent)), self.backoff_max_s)
        return Decision("restart", wait, f"restart {len(recent) + 1} of {self.max_restarts} in "
                        f"{self.window_s:g}s, after {wait:g}s")

    def note_restart(self, now: float) -> None:
        self.restarts = [*self.in_window(now), now]


Say = Callable[[str], None]
LOCK_BUSY = "another sparkserve run holds"  # deploy/lock.py's words when someone else's up/down holds the head


class LockBusy(RemoteFailure):
    """Another sparkserve run (a person's `up`, `down`, `swap-drafter`) holds the head's deploy lock: the
    supervisor must not fight it. Not a failed restart: it waits and looks again."""


def busy(what: str) -> bool:
    return LOCK_BUSY in what


def stop_everything(cfg: Config, nodes: dict[str, Node], say: Say) -> dict[str, list[str]]:
    """Every sparkserve rank on every node, stopped gracefully and removed (logs saved first)."""
    from sparkserve.deploy.stack import down

    result = down(cfg, nodes, say=say)
    return result.removed


def restart(cfg: Config, nodes: dict[str, Node], say: Say, *, config_path: Path) -> tuple[float, float]:
    """Graceful `down`, then the normal `sparkserve up -c CONFIG` (gates included) as a child process. Returns
    the seconds of each part (stop, up); RemoteFailure with `up`'s own error line when it does not come back
    (a failed `up` tears down what it started itself).

    A child, not a call: the supervisor never holds the whole boot stack in memory (its RSS stays that of a
    watcher), and a boot that crashes cannot take the watcher with it. A signal to the supervisor while the
    child runs is passed on to it (it cleans up as `up` does on Ctrl-C)."""
    t0 = time.monotonic()
    try:
        stop_everything(cfg, nodes, say)
    except RemoteFailure as e:
        if busy(e.what):
            raise LockBusy(e.where, e.what) from None
        raise
    t1 = time.monotonic()
    argv = [sys.executable, "-m", "sparkserve", "up", "-c", str(config_path)]
    if cfg.ssh.accept_new_host_keys:
        argv.append("--accept-new-host-keys")
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            say(line)
        code = child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGTERM)
        child.wait()
        raise
    if code != 0:
        err = next((ln for ln in lines if ln.startswith("error: ")), f"exit {code}")
        if busy(err):
            raise LockBusy("up", err.removeprefix("error: "))
        raise RemoteFailure("up", f"the restart's `up` failed ({err.removeprefix('error: ')})", details=lines[-5:])
    return t1 - t0, time.monotonic() - t1
