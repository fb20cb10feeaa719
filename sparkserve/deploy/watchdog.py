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

from sparkserve.units import human_bytes


class Phase(StrEnum):
    START = "start"
    LOAD = "load"
    PROFILE = "profile"
    CAPTURE = "capture"
    KV_READY = "kv_ready"
    SERVING = "serving"


_MODEL_LOADED = re.compile(r"Model loading took [\d.]+ GiB (?:memory )?and")
_KV_SIZED = re.compile(r"KV cache size: [\d,]+ tokens|reserved [\d.]+ GiB memory for KV Cache|"
                       r"Available KV cache memory: ")
_CAPTURE = re.compile(r"Graph capturing finished|Capturing model for|Cudagraph is disabled under eager mode")
_LOADING = re.compile(r"Loading model from scratch|Starting to load model|Loading weights took")
_READY = re.compile(r"Application startup complete\.")


def phase_of_line(line: str, current: Phase) -> Phase:
    """The boot phase a node is in after ``line`` (phases only move forward)."""
    order = list(Phase)
    nxt = current
    if _READY.search(line):
        nxt = Phase.SERVING
    elif _KV_SIZED.search(line):
        nxt = Phase.KV_READY
    elif _CAPTURE.search(line):
        nxt = Phase.CAPTURE
    elif _MODEL_LOADED.search(line):
        nxt = Phase.PROFILE
    elif _LOADING.search(line):
        nxt = Phase.LOAD
    return nxt if order.index(nxt) > order.index(current) else current


def mem_available(meminfo: str) -> int:
    """Bytes of ``MemAvailable`` from /proc/meminfo text."""
    m = re.search(r"^MemAvailable:\s+(\d+)\s+kB", meminfo, re.M)
    if not m:
        raise ValueError("no MemAvailable line in /proc/meminfo")
    return int(m.group(1)) * 1024


@dataclass
class Floors:
    default: int
    per_phase: dict[Phase, int] = field(default_factory=dict)

    def for_phase(self, phase: Phase) -> int:
        return self.per_phase.get(phase, self.default)


@dataclass
class Breach:
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
    floor = floors.for_phase(phase)
    return Breach(node, phase, available, floor) if available < floor else None
