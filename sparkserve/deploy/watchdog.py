"""Unified-memory watchdog: while a stack boots, watch free memory on every node.

On a DGX Spark the GPU and the OS share one memory pool; running it dry takes the whole host down
(spark-field-notes.md, pain point 1). Below the floor for the current boot phase, `up` saves the logs
and stops every rank at once. Phases follow the log, as the sfxnz UMA watcher does: LOAD until every
rank logged ``Model loading took``, PROFILE until the KV pool is sized, KV_READY until the API
answers, then SERVING.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from sparkserve.observe.logpatterns import Milestone, milestone_of
from sparkserve.units import human_bytes


class Phase(StrEnum):
    """Boot phase of one node, in order; each has its own free-memory floor."""

    START = "start"
    LOAD = "load"
    PROFILE = "profile"
    CAPTURE = "capture"
    KV_READY = "kv_ready"
    SERVING = "serving"


#: The phase a node enters when its log shows a milestone (the lines live in observe.logpatterns).
_PHASE_AT: dict[Milestone, Phase] = {
    Milestone.LOADING: Phase.LOAD,
    Milestone.LOADED: Phase.PROFILE,
    Milestone.CAPTURE: Phase.CAPTURE,
    Milestone.KV_SIZED: Phase.KV_READY,
    Milestone.READY: Phase.SERVING,
}
_ORDER = list(Phase)


def phase_of_line(line: str, current: Phase) -> Phase:
    """The boot phase a node is in after ``line`` (phases only move forward)."""
    m = milestone_of(line)
    nxt = _PHASE_AT[m] if m is not None else current
    return nxt if _ORDER.index(nxt) > _ORDER.index(current) else current


def mem_available(meminfo: str) -> int:
    """Bytes of ``MemAvailable`` from /proc/meminfo text."""
    m = re.search(r"^MemAvailable:\s+(\d+)\s+kB", meminfo, re.M)
    if not m:
        raise ValueError("no MemAvailable line in /proc/meminfo")
    return int(m.group(1)) * 1024


@dataclass
class Floors:
    """Free-memory floors in bytes: one per phase where set, ``default`` for the others."""

    default: int
    per_phase: dict[Phase, int] = field(default_factory=dict)

    def for_phase(self, phase: Phase) -> int:
        return self.per_phase.get(phase, self.default)


@dataclass
class Breach:
    """Free memory on a node fell below its phase's floor."""

    node: str
    phase: Phase
    available: int
    floor: int

    def message(self) -> str:
        return (
            f"free memory on {self.node} fell to {human_bytes(self.available)} during {self.phase.value}, "
            f"below the floor of {human_bytes(self.floor)}; stopped every rank before unified memory ran out"
        )


def check(node: str, phase: Phase, available: int, floors: Floors) -> Breach | None:
    """The breach when ``available`` bytes are below the floor of ``phase``, else None."""
    floor = floors.for_phase(phase)
    return Breach(node, phase, available, floor) if available < floor else None
