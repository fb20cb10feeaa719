"""Unified-memory watchdog: while a stack boots, watch free memory on every node.

On a DGX Spark the GPU and the OS share one memory pool; running it dry takes the whole host down
(spark-field-notes.md, pain point 1). Phases follow the log, as the sfxnz UMA watcher does: LOAD until every
rank logged ``Model loading took``, PROFILE until the KV pool is sized, KV_READY until the API
answers, then SERVING. On every phase each look reads (:meth:`Floors.look`):

* ``MemFree`` (not ``MemAvailable``: the GB10 driver allocates from free pages, never from page cache) and the
  free memory in blocks of order >= 9 of ``/proc/buddyinfo`` (the driver's 2 MiB blocks);
* below the soft floor (or too few high-order blocks) it syncs, drops the page cache and compacts (at most every
  ``drop_interval_s``), as the field fix for the load-time wedge does (tonyd2wild GLM-5.3 #19);
* below the hard floor, after a drop, `up` saves the logs and stops every rank at once.

A node with a discrete GPU is watched on ``MemAvailable``: there page cache is the host's to reclaim.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sparkserve.config import Config
from sparkserve.errors import SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.hostfacts import TEE, HostFacts, high_order_free
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


def mem_free(meminfo: str) -> int:
    """Bytes of ``MemFree`` from /proc/meminfo text."""
    m = re.search(r"^MemFree:\s+(\d+)\s+kB", meminfo, re.M)
    if not m:
        raise ValueError("no MemFree line in /proc/meminfo")
    return int(m.group(1)) * 1024


@dataclass
class Floors:
    """Free-memory floors in bytes: the hard floor, one per phase where set, ``default`` for the others; the
    soft floor and the high-order floor, under which the page cache is dropped and memory compacted."""

    default: int
    per_phase: dict[Phase, int] = field(default_factory=dict)
    soft: int = 0
    high_order: int = 0
    drop_interval_s: float = 15.0
    proc_root: str = "/proc"
    unified: dict[str, bool] = field(default_factory=dict)  # node → unified memory (else: a discrete GPU)
    page_size: dict[str, int] = field(default_factory=dict)
    drop: bool = True
    dropped_at: dict[str, float] = field(default_factory=dict)  # node → monotonic time of its last drop
    drops: dict[str, int] = field(default_factory=dict)  # node → drops done during this boot
    drop_failed: dict[str, str] = field(default_factory=dict)  # node → why its drop could not be done

    def for_phase(self, phase: Phase) -> int:
        return self.per_phase.get(phase, self.default)

    def look(self, name: str, node: Node, phase: Phase) -> tuple[int, Breach | None]:
        """One look at ``node``: free bytes, and the breach when they stay below the hard floor after a drop."""
        free, high = self._read(name, node)
        floor = self.for_phase(phase)
        unified = self.unified.get(name, True)
        low_high = unified and high is not None and high < self.high_order
        if unified and self.drop and (free < floor or ((free < max(self.soft, floor) or low_high)
                                                         and self._due(name))):
            self._drop(name, node)
            free, high = self._read(name, node)
        return free, check(name, phase, free, self, high_order=high)

    def _read(self, name: str, node: Node) -> tuple[int, int | None]:
        meminfo = node.read_text(f"{self.proc_root}/meminfo")
        if not self.unified.get(name, True):
            return mem_available(meminfo), None
        try:
            buddy = node.read_text(f"{self.proc_root}/buddyinfo")
        except SparkserveError:
            buddy = ""
        return mem_free(meminfo), high_order_free(buddy, self.page_size.get(name, 4096))

    def _due(self, name: str) -> bool:
        last = self.dropped_at.get(name)
        return last is None or time.monotonic() - last >= self.drop_interval_s

    def _drop(self, name: str, node: Node) -> None:
        """sync; drop the page cache; compact (sudo -n tee, the sudoers rule `doctor` prints)."""
        self.dropped_at[name] = time.monotonic()
        if name in self.drop_failed:  # no rule: asking again every look only costs round trips
            return
        try:
            node.run(["sync"], step="memory watchdog", check=False, timeout=120)
            for vm, value in (("drop_caches", b"3"), ("compact_memory", b"1")):
                res = node.run(["sudo", "-n", TEE, f"{self.proc_root}/sys/vm/{vm}"], stdin=value,
                               step="memory watchdog", check=False, timeout=300)
                if not res.ok:
                    self.drop_failed[name] = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
                    return
        except SparkserveError as e:  # a drop that timed out: the next look judges the memory as it is
            self.drop_failed[name] = e.what
            return
        self.drops[name] = self.drops.get(name, 0) + 1


@dataclass
class Breach:
    """Free memory on a node fell below its phase's floor."""

    node: str
    phase: Phase
    available: int
    floor: int
    high_order: int | None = None
    dropped: int = 0
    drop_failed: str | None = None

    def message(self) -> str:
        blocks = f" ({human_bytes(self.high_order)} in 2 MiB+ blocks)" if self.high_order is not None else ""
        drop = (f" after {self.dropped} page-cache drop(s)" if self.dropped else
                f" (the page cache could not be dropped: {self.drop_failed})" if self.drop_failed else "")
        return (
            f"free memory on {self.node} fell to {human_bytes(self.available)}{blocks} during {self.phase.value}"
            f"{drop}, below the floor of {human_bytes(self.floor)}; stopped every rank before unified memory ran out"
        )


def check(node: str, phase: Phase, available: int, floors: Floors, *, high_order: int | None = None) -> Breach | None:
    """The breach when ``available`` bytes are below the floor of ``phase``, else None."""
    floor = floors.for_phase(phase)
    if available >= floor:
        return None
    return Breach(node, phase, available, floor, high_order, floors.drops.get(node, 0), floors.drop_failed.get(node))


def watchdog_floors(cfg: Config, hosts: Mapping[str, HostFacts]) -> Floors:
    """The watchdog of a boot from the config, with what the pre-start look learned of each node (unified
    memory or a discrete GPU, the page size)."""
    w = cfg.watchdog
    unified = {}
    for n in cfg.nodes:
        f = hosts.get(n.name)
        mem = f.memory([]) if f is not None else None
        unified[n.name] = mem.unified if mem is not None else True
    return Floors(w.memory_floor_bytes, soft=max(w.soft_floor_bytes, w.memory_floor_bytes),
                  high_order=w.high_order_floor_bytes, drop_interval_s=w.drop_interval_s,
                  proc_root=str(cfg.host.proc_root).rstrip("/") or "/", unified=unified,
                  page_size={k: f.page_size for k, f in hosts.items()}, drop=w.drop_caches)
