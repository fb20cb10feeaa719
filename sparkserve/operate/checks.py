"""One round's facts → one verdict per check. Pure: no node, no network, no clock (callers pass times).

    v = judge_progress(CanaryResult(ok=False, seconds=10.0, tokens=0, error="deadline"), deadline_s=10)
    stall = StallTracker(stall_s=15); v = stall.add(MetricsPoint(at=t, running=2, generation_tokens=812))
    v = judge_memory({"spark-a": MemFacts(free=3 << 30, available=60 << 30)}, floor=4 << 30)

Checks (the status page's gates, the exporter's ``gate`` label):

* ``progress`` — a canary generation finished within its deadline (``/health`` is never asked: it answers
  200 while the scheduler is wedged — sparkrun#252, dgx-spark-playbooks PR #104).
* ``wedge`` — ``/metrics``: requests running while ``vllm:generation_tokens_total`` stays frozen for
  ``stall_s`` (eugr#260: "tokens frozen AND requests held").
* ``ranks`` — every rank's process (container) alive, through the runtime seam.
* ``faults`` — the boot-log fault table (:mod:`sparkserve.observe.logpatterns`) on the lines logged since.
* ``kernel`` — ``NVRM`` / ``Xid`` lines in each node's kernel log (they never reach a container's log).
* ``memory`` — each node's MemFree above its floor (GB10: vllm#46307, dgx-spark-playbooks#97).
* ``acceptance`` — the live acceptance length per window against the band banked for this drafter.

A verdict's ``ok`` is None when the check had nothing to judge (no drafts in the window, no kernel log).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkserve.observe.logpatterns import NOT_FAULTS, PATTERNS, Kind
from sparkserve.units import human_bytes

CHECKS = ("progress", "wedge", "ranks", "faults", "kernel", "memory", "acceptance")


@dataclass
class Verdict:
    """One check's verdict this round, with the evidence a person reads first."""

    check: str
    ok: bool | None
    summary: str
    evidence: list[str] = field(default_factory=list)
    node: str | None = None  # the node it blames, when one

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def failing(verdicts: Iterable[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.ok is False]


# -- progress ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryResult:
    """One short generation: whether it finished in time, how long it took, how many tokens came back."""

    ok: bool
    seconds: float
    tokens: int
    error: str | None = None


def judge_progress(c: CanaryResult, deadline_s: float, *, tokens_meanwhile: float | None = None) -> Verdict:
    """The canary's verdict. ``tokens_meanwhile``: what ``vllm:generation_tokens_total`` gained over the round —
    a canary that waited past its deadline in a full batch while tokens flowed is a busy engine, not a wedged one
    (with max_num_seqs 4 and four long requests running, a canary queues)."""
    if c.ok and c.tokens > 0:
        return Verdict("progress", True, f"canary: {c.tokens} token(s) in {c.seconds:.2f}s")
    why = c.error or ("no tokens" if c.ok else "failed")
    if tokens_meanwhile and tokens_meanwhile > 0 and (why == "no answer before the deadline" or
                                                      why.startswith("took ")):
        return Verdict("progress", True, f"busy: the canary waited past its {deadline_s:g}s deadline while "
                       f"{tokens_meanwhile:g} tokens were generated", [why])
    return Verdict("progress", False, f"canary generation failed: {why} after {c.seconds:.1f}s "
                   f"(deadline {deadline_s:g}s)", [why])


# -- wedge ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricsPoint:
    """What one ``/metrics`` scrape says about progress."""

    at: float
    running: float | None
    generation_tokens: float | None
    boot_id: float | None = None


class StallTracker:
    """Requests running while the generation counter stays frozen for ``stall_s`` = wedged."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.frozen_since: float | None = None
        self.last: MetricsPoint | None = None

    def add(self, p: MetricsPoint | None) -> Verdict:
        if p is None or p.generation_tokens is None or p.running is None:
            self.frozen_since, self.last = None, None
            return Verdict("wedge", None, "no /metrics counters to judge")
        prev, self.last = self.last, p
        restarted = prev is not None and (prev.boot_id != p.boot_id or p.generation_tokens < prev.generation_tokens)
        if prev is None or restarted or p.running <= 0 or p.generation_tokens > prev.generation_tokens:
            self.frozen_since = None
            return Verdict("wedge", True, f"{p.running:g} running, {p.generation_tokens:g} tokens generated")
        if self.frozen_since is None:
            self.frozen_since = prev.at
        frozen = p.at - self.frozen_since
        what = (f"{p.running:g} request(s) running while vllm:generation_tokens_total stayed at "
                f"{p.generation_tokens:g} for {frozen:.1f}s")
        if frozen >= self.stall_s:
            return Verdict("wedge", False, f"wedged: {what}", [what])
        return Verdict("wedge", True, f"watching: {what} (wedged at {self.stall_s:g}s)")


# -- ranks ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankFact:
    node: str
    name: str
    running: bool
    exit_code: int | None = None


def judge_ranks(facts: Iterable[RankFact], expected_nodes: Iterable[str],
                unreachable: Mapping[str, str] | None = None) -> Verdict:
    facts = list(facts)
    problems: list[tuple[str, str]] = []
    for node, why in (unreachable or {}).items():
        problems.append((node, f"{node}: unreachable ({why})"))
    for node in expected_nodes:
        if unreachable and node in unreachable:
            continue
        mine = [f for f in facts if f.node == node]
        if not mine:
            problems.append((node, f"{node}: no rank runs"))
        for f in mine:
            if not f.running:
                code = "" if f.exit_code is None else f" (exit code {f.exit_code})"
                problems.append((node, f"{node}: {f.name} is not running{code}"))
    if problems:
        return Verdict("ranks", False, problems[0][1], [p[1] for p in problems], node=problems[0][0])
    return Verdict("ranks", True, f"{len(facts)} rank(s) alive")


# -- faults (the boot-log table on followed logs) ----------------------------------------------------

_FAULT_ROWS = tuple(p for p in PATTERNS if p.kind is Kind.FAULT and p.fault is not None and (
    p.fatal or "shared memory broadcast" in p.regex.pattern))


def fault_line(line: str) -> str | None:
    """The fault kind a log line reports (a row of the boot-log table), or None."""
    if NOT_FAULTS.search(line.split("] ", 1)[-1]):
        return None
    for p in _FAULT_ROWS:
        if any(n in line for n in p.needles) and p.regex.search(line):
            return str(p.fault)
    return None


def judge_faults(lines: Mapping[str, Iterable[str]]) -> Verdict:
    hits: list[tuple[str, str, str]] = []
    for node, ls in lines.items():
        for ln in ls:
            kind = fault_line(ln)
            if kind:
                hits.append((node, kind, ln))
    if hits:
        node, kind, ln = hits[0]
        return Verdict("faults", False, f"{node} logged a {kind} fault: {ln.strip()[:200]}",
                       [f"{n}: {x.strip()[:300]}" for n, _, x in hits[:10]], node=node)
    return Verdict("faults", True, "no fault line since the last round")


# -- kernel --------------------------------------------------------------------------------------------

#: NVIDIA driver lines in the kernel log: an Xid is a GPU fault; NV_ERR_NO_MEMORY is unified memory running dry
#: (dgx-spark-playbooks#97, vllm#46307).
KERNEL_FAULT = re.compile(r"NVRM: (?:Xid\b|.*NV_ERR_NO_MEMORY)|\bXid \(PCI:")
KERNEL_NOTE = re.compile(r"NVRM:")


def judge_kernel(lines: Mapping[str, Iterable[str] | None]) -> Verdict:
    faults: list[tuple[str, str]] = []
    unread = [n for n, ls in lines.items() if ls is None]
    for node, ls in lines.items():
        for ln in ls or ():
            if KERNEL_FAULT.search(ln):
                faults.append((node, ln.strip()))
    if faults:
        node, ln = faults[0]
        return Verdict("kernel", False, f"{node}: kernel: {ln[:200]}", [f"{n}: {x[:300]}" for n, x in faults[:10]],
                       node=node)
    if unread and len(unread) == len(lines):
        return Verdict("kernel", None, f"kernel log not readable on {', '.join(unread)}")
    note = f" (not readable on {', '.join(unread)})" if unread else ""
    return Verdict("kernel", True, f"no NVRM/Xid fault in the kernel log{note}")


# -- memory --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemFacts:
    """A node's memory: MemFree (what the GB10 driver allocates from) and MemAvailable, in bytes."""

    free: int | None
    available: int | None = None
    total: int | None = None
    error: str | None = None


def parse_meminfo(text: str) -> MemFacts:
    vals: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+):\s+(\d+)\s*kB", line)
        if m:
            vals[m.group(1)] = int(m.group(2)) * 1024
    if "MemFree" not in vals:
        return MemFacts(None, error="no MemFree line")
    return MemFacts(vals["MemFree"], vals.get("MemAvailable"), vals.get("MemTotal"))


def judge_memory(facts: Mapping[str, MemFacts], floor: int) -> Verdict:
    low = [(n, m) for n, m in facts.items() if m.free is not None and m.free < floor]
    unread = [f"{n}: {m.error}" for n, m in facts.items() if m.free is None]
    if low:
        node, m = min(low, key=lambda x: x[1].free or 0)
        return Verdict("memory", False, f"{node}: MemFree {human_bytes(m.free or 0)} is below the floor of "
                       f"{human_bytes(floor)}", [f"{n}: MemFree {human_bytes(x.free or 0)}" for n, x in low],
                       node=node)
    if unread and len(unread) == len(facts):
        return Verdict("memory", None, "memory not readable: " + "; ".join(unread))
    lowest = min((m.free for m in facts.values() if m.free is not None), default=None)
    lo = f", lowest MemFree {human_bytes(lowest)}" if lowest is not None else ""
    return Verdict("memory", True, f"every node above {human_bytes(floor)}{lo}", unread)


# -- acceptance ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """The acceptance this drafter is known to reach: length and per-position rates, and where it came from."""

    acceptance_length: float
    per_position: tuple[float, ...]
    source: str  # "bench #12", "first window after boot"

    def to_json(self) -> dict[str, Any]:
        return {"acceptance_length": self.acceptance_length, "per_position": list(self.per_position),
                "source": self.source}


@dataclass(frozen=True)
class Window:
    """Acceptance over one window of ``/metrics`` deltas."""

    drafts: int
    acceptance_length: float | None
    per_position: tuple[float, ...]


def judge_acceptance(w: Window | None, band: Band | None, *, drop: float, min_drafts: int) -> Verdict:
    if w is None or w.acceptance_length is None or w.drafts < min_drafts:
        n = 0 if w is None else w.drafts
        return Verdict("acceptance", None, f"window holds {n} draft(s) (< {min_drafts}): not judged")
    live = f"acceptance length {w.acceptance_length:.2f} over {w.drafts} drafts"
    if band is None:
        return Verdict("acceptance", True, f"{live}; no band banked yet")
    floor = 1.0 + drop * (band.acceptance_length - 1.0)
    evidence = [f"live per-position {', '.join(f'{x:.3f}' for x in w.per_position)}",
                f"band ({band.source}) {band.acceptance_length:.2f}: "
                f"{', '.join(f'{x:.3f}' for x in band.per_position)}"]
    if w.acceptance_length < floor:
        return Verdict("acceptance", False, f"acceptance collapsed: {live}, below {floor:.2f} (band "
                       f"{band.acceptance_length:.2f} from {band.source})", evidence)
    return Verdict("acceptance", True, f"{live} (band {band.acceptance_length:.2f}, alarm below {floor:.2f})",
                   evidence)
