"""The A/B table of record: bench results set against the first (the baseline), like cells only.

Example::

    table = compare_files([Path("a.json"), Path("b.json")])    # BadInput on an unreadable or unlike file
    table.rows[1].output_tok_s_delta                            # +0.042 = 4.2 % faster than a.json
    table.model_dump(mode="json")                               # what ``sparkserve ab --json`` prints

Deltas are relative, ``(x − baseline) / baseline``, and ``None`` where either side has no figure.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ValidationError

from sparkserve.errors import BadInput
from sparkserve.measure.records import BenchResult


class AbRow(BaseModel):
    """One result file's figures and their deltas against the baseline. Field order is the JSON order."""

    file: str
    cell: str
    ok: bool
    refused: list[str]
    stream_errors: int
    output_tok_s: float
    output_tok_s_delta: float | None
    acceptance_length: float | None
    acceptance_length_delta: float | None
    acceptance_rate: float | None
    acceptance_rate_delta: float | None
    per_position_acceptance: list[float]
    per_position_delta: list[float | None]
    boot_id: float | None


class AbTable(BaseModel):
    """The whole table: the baseline's file and cell, then one row per file, the baseline first."""

    baseline: str
    cell: str
    rows: list[AbRow]


def load_result(path: Path) -> BenchResult:
    """A ``bench --json`` file read back; BadInput naming the file and the first wrong field."""
    try:
        return BenchResult.model_validate_json(path.read_bytes())
    except OSError as e:
        raise BadInput(str(path), f"cannot read ({e.strerror or e})") from e
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise BadInput(str(path), f"not a bench result: {loc + ': ' if loc else ''}{err['msg']}") from e


def _rel(x: float | None, base: float | None) -> float | None:
    if x is None or base is None or base == 0:
        return None
    return (x - base) / base


def _shape(r: BenchResult) -> str:
    return f"{r.cell} ({r.prompts}×c{r.concurrency}×{r.max_tokens})"


def _row(name: str, r: BenchResult, base: BenchResult) -> AbRow:
    n = max(len(r.per_position_acceptance), len(base.per_position_acceptance))
    pp = r.per_position_acceptance + [None] * (n - len(r.per_position_acceptance))
    bp = base.per_position_acceptance + [None] * (n - len(base.per_position_acceptance))
    return AbRow(
        file=name,
        cell=r.cell,
        ok=r.ok and not r.refused,
        refused=r.refused,
        stream_errors=r.stream_errors,
        output_tok_s=r.output_tok_s,
        output_tok_s_delta=_rel(r.output_tok_s, base.output_tok_s),
        acceptance_length=r.acceptance_length,
        acceptance_length_delta=_rel(r.acceptance_length, base.acceptance_length),
        acceptance_rate=r.acceptance_rate,
        acceptance_rate_delta=_rel(r.acceptance_rate, base.acceptance_rate),
        per_position_acceptance=r.per_position_acceptance,
        per_position_delta=[_rel(a, b) for a, b in zip(pp, bp, strict=True)],
        boot_id=r.boot_id,
    )


def ab_table(results: list[tuple[str, BenchResult]]) -> AbTable:
    """Compare named results against the first. Raises BadInput naming a result of an unlike cell."""
    base_name, base = results[0]
    cell = (base.cell, base.prompts, base.concurrency, base.max_tokens)
    for name, r in results:
        if (r.cell, r.prompts, r.concurrency, r.max_tokens) != cell:
            raise BadInput(
                name,
                f"cell {_shape(r)} differs from the baseline {base_name}'s {_shape(base)}: compare like with like",
            )
    return AbTable(baseline=base_name, cell=base.cell, rows=[_row(name, r, base) for name, r in results])


def compare_files(paths: list[Path]) -> AbTable:
    """``sparkserve ab``: read every result file, then compare them against the first."""
    return ab_table([(str(p), load_result(p)) for p in paths])
