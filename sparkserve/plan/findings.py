"""What the pre-flight rules find: a :class:`Finding` (``where``: the config field or file, ``what``: one
sentence) and the :class:`Report` that collects them — errors stop the deploy (BadInput, exit 2, the first
one), warnings are printed — with the drafter's and target's facts the rules read, as `validate --json`
prints it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sparkserve.errors import BadInput
from sparkserve.models.completeness import Completeness
from sparkserve.models.drafter import DrafterFacts
from sparkserve.models.target import TargetFacts


@dataclass
class Finding:
    where: str
    what: str


@dataclass
class Report:
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    drafter: DrafterFacts | None = None
    target: TargetFacts | None = None
    argv_judge: str | None = None
    argvs_checked: int = 0
    completeness: dict[str, Completeness] = field(default_factory=dict)  # "drafter" / "target"
    drafter_identity: dict[str, str | None] | None = None  # which of the card's drafters (plan.profile_checks)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, where: str, what: str) -> None:
        self.errors.append(Finding(where, what))

    def warn(self, where: str, what: str) -> None:
        self.warnings.append(Finding(where, what))

    def raise_first(self) -> None:
        """Raise BadInput for the first error (one line; the count of the others appended)."""
        if not self.errors:
            return
        first, more = self.errors[0], len(self.errors) - 1
        plural = "s" if more > 1 else ""
        suffix = f" (and {more} more problem{plural}; `sparkserve validate` lists them)" if more else ""
        raise BadInput(first.where, first.what + suffix)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": [asdict(f) for f in self.errors],
            "warnings": [asdict(f) for f in self.warnings],
            "drafter": self.drafter.to_json() if self.drafter else None, "drafter_identity": self.drafter_identity,
            "target": self.target.to_json() if self.target else None,
            "argv_judge": self.argv_judge,
            "argvs_checked": self.argvs_checked,
        }
