"""The gates' verdict records: what ``sparkserve gates --json`` prints (DESIGN.md contract) and ``up`` returns.

Each verdict carries its evidence lines ``{node, line, text}`` or says what it looked for and did not find.
A skipped gate stays in the report with ``ok: true`` and a reason that starts with ``skipped``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

#: The model card's five production gates, in its words (drafter card GLM-5.3-Flash-DFlash2-E.md, "Serving
#: state": "pool discriminator, graphs live on both ranks, mask-loader line, zero-error smoke, zero engine faults").
CARD_GATES: dict[str, str] = {
    "pool": "pool discriminator",
    "graphs": "graphs live on both ranks",
    "mask": "mask-loader line",
    "smoke": "zero-error smoke",
    "faults": "zero engine faults",
}
#: sparkserve's gates beyond the card's (the card's README boot-log lines 1 and 2 are judged by ``signature``).
EXTRA_GATES: dict[str, str] = {
    "runner": "the V2 model runner on every rank",
    "signature": "the profile's signature lines on every rank",
    "identity": "one image and one drafter on every node",
}
GATE_NAMES: tuple[str, ...] = (*CARD_GATES, *EXTRA_GATES)


def gate_story() -> str:
    """The gate list as every page and ``--help`` says it."""
    words = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    return (f"the model card's {words[len(CARD_GATES)]} ({', '.join(CARD_GATES)}) and sparkserve's "
            f"{words[len(EXTRA_GATES)]} more ({', '.join(EXTRA_GATES)})")


@dataclass(frozen=True)
class Evidence:
    """A line that backs a verdict (``line`` None: a fact not read from a log, e.g. a container state)."""

    node: str
    line: int | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "line": self.line, "text": self.text}


@dataclass
class Verdict:
    """One gate's outcome: what was expected, what was observed, why it passed or failed."""

    name: str
    ok: bool
    expected: Any
    observed: Any
    reason: str
    evidence: list[Evidence] = field(default_factory=list)
    skipped: bool = False
    blame: list[str] = field(default_factory=list)  # the nodes a failure is about (evidence may cite healthy ones)

    def headline(self) -> str:
        """``graphs (node-b)``: the gate and the nodes its failure is about — those it blames, else every
        node its evidence cites."""
        where = list(dict.fromkeys(self.blame)) or list(dict.fromkeys(e.node for e in self.evidence if e.node))
        return f"{self.name} ({', '.join(where)})" if where else self.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "expected": self.expected,
            "observed": self.observed,
            "reason": self.reason,
            "evidence": [e.to_json() for e in self.evidence],
        }


@dataclass
class GateReport:
    """The verdicts of every gate, in GATE_NAMES order; ``ok`` when all passed (or were skipped)."""

    gates: list[Verdict]

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.gates)

    def failed(self) -> list[Verdict]:
        return [g for g in self.gates if not g.ok]

    def get(self, name: str) -> Verdict:
        return next(g for g in self.gates if g.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "gates": [g.to_json() for g in self.gates]}

    def with_skipped(self, names: Iterable[str]) -> GateReport:
        """The same report with the gates named marked skipped (passing, with no evidence)."""
        names = set(names)
        return GateReport([_skipped(g) if g.name in names else g for g in self.gates])


def _skipped(g: Verdict) -> Verdict:
    return replace(
        g, ok=True, observed=None, evidence=[], skipped=True, reason=f"skipped (--skip {g.name}): not judged"
    )

