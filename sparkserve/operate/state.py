"""What the supervisor knows now — the one record the exporter, the status page and `--json` read.

The loop writes it under its lock after each round; readers take :meth:`SuperviseState.snapshot` (a deep
copy as plain data), so a scrape never sees half a round.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sparkserve.operate.checks import CHECKS, Band, Verdict, Window

HISTORY = 120  # rounds kept for the page's recent history


@dataclass
class SuperviseState:
    stack: dict[str, Any] = field(default_factory=dict)  # served name, api url, nodes, runtime, fingerprint
    phase: str = "starting"  # starting | watching | incident | recovering | gave_up | stopped
    started: float = field(default_factory=time.time)
    rounds: int = 0
    last_round_at: float | None = None
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    canary_s: float | None = None
    canary_ok: bool | None = None
    window: Window | None = None
    band: Band | None = None
    memfree: dict[str, int | None] = field(default_factory=dict)
    memfree_floor: int = 0
    incidents: list[dict[str, Any]] = field(default_factory=list)
    restarts: int = 0
    recoveries: int = 0
    gave_up: bool = False
    replicas: list[dict[str, Any]] = field(default_factory=list)  # a fleet: each replica's own view (operate/fleet)
    router: dict[str, Any] | None = None  # a fleet: the router's verdict, pid, workers
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=50))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def event(self, kind: str, text: str) -> None:
        self.events.appendleft({"time": time.time(), "kind": kind, "text": text})

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "stack": copy.deepcopy(self.stack), "phase": self.phase, "started": self.started,
                "rounds": self.rounds, "last_round_at": self.last_round_at,
                "gates": {c: (self.verdicts[c].to_json() if c in self.verdicts else
                              {"check": c, "ok": None, "summary": "not judged yet", "evidence": [], "node": None})
                          for c in CHECKS},
                "canary_s": self.canary_s, "canary_ok": self.canary_ok,
                "window": None if self.window is None else {
                    "drafts": self.window.drafts, "acceptance_length": self.window.acceptance_length,
                    "per_position": list(self.window.per_position)},
                "band": None if self.band is None else self.band.to_json(),
                "memfree": dict(self.memfree), "memfree_floor": self.memfree_floor,
                "incidents": copy.deepcopy(self.incidents[-20:]), "restarts": self.restarts,
                "recoveries": self.recoveries, "gave_up": self.gave_up,
                "history": list(self.history), "events": list(self.events),
                **({"replicas": copy.deepcopy(self.replicas), "router": copy.deepcopy(self.router)}
                   if self.replicas else {}),
            }
