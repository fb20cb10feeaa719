"""The model card's banked rows (``drafter/all/*.json``) read, written, and set beside the user's own.

The card's rows are what its holdout client writes, one JSON per run (canada-quant/vllm-glm53-flash-sm121
``drafter/eval/holdout_client.py``): ``label, url, prompts, ok, fail, concurrency, max_tokens, wall_s,
output_tokens, output_tok_per_s, drafts, draft_tokens, accepted_tokens, mean_acceptance_length,
draft_token_acceptance_rate, per_position_acceptance_rate {"0": …}``. A row holds no hardware: the card's
``drafter/RESULTS.md`` table has it (its ``hw`` column, ``| label | hw | …``), and ``-b300`` labels say it too.
The rows sparkserve writes carry one more key, ``hardware``, so they can be sent back labelled.

How rows are compared (the card's own rules, drafter/README.md and the G card): acceptance length is a
property of target + drafter sampling, comparable across hardware "up to kernel numerics"; the protocol's
run-to-run noise is ±0.015, so two acceptance lengths within it are the same. Output tok/s depends on the
hardware and is never compared across it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from sparkserve.errors import BadInput
from sparkserve.measure.ab_report import Report
from sparkserve.measure.records import BenchResult

NOISE = 0.015  # the card's run-to-run noise of mean acceptance length (G card, "Honest read")
UNKNOWN_HW = "unknown hardware"
# the rows of the drafters the card names (E, F, G, the incoai reference), at the card's greedy sampling
DEFAULT_MATCH = r"^(dflash2[EFG]|incoai)-(?!.*-(prob|tk\d+)(-|$))"
_HW_SUFFIX = re.compile(r"-(b300|h200)(?:-|$)", re.IGNORECASE)


class CardRow(BaseModel):
    """One row in the card's JSON shape (extra keys kept)."""

    model_config = ConfigDict(extra="allow")

    label: str
    prompts: int
    concurrency: int
    max_tokens: int
    output_tok_per_s: float | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    mean_acceptance_length: float | None = None
    draft_token_acceptance_rate: float | None = None
    per_position_acceptance_rate: dict[str, float] = {}
    hardware: str | None = None

    @property
    def k(self) -> int | None:
        if self.per_position_acceptance_rate:
            return len(self.per_position_acceptance_rate)
        if self.drafts and self.draft_tokens:
            return round(self.draft_tokens / self.drafts)
        return None

    @property
    def per_position(self) -> list[float]:
        return [self.per_position_acceptance_rate[k] for k in sorted(self.per_position_acceptance_rate, key=int)]

    def shape(self) -> tuple[int, int, int | None]:
        """(concurrency, max_tokens, K): rows of one shape ran the same cell."""
        return self.concurrency, self.max_tokens, self.k


def results_hardware(text: str) -> dict[str, str]:
    """{label: hw} from the card's RESULTS.md table (``| `label` | hw | …``)."""
    out = {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 2 and cols[0].startswith("`") and cols[0].endswith("`"):
            out[cols[0].strip("`")] = cols[1]
    return out


def read_reference(directory: Path, *, match: str | None = DEFAULT_MATCH) -> list[CardRow]:
    """Every ``*.json`` row in ``directory`` whose label matches ``match`` (None: all), with its hardware from
    the row itself, else the RESULTS.md beside or above the directory, else its label's ``-b300`` suffix."""
    if not directory.is_dir():
        raise BadInput("--reference", f"{directory} is not a directory (the card's drafter/all)")
    hw: dict[str, str] = {}
    for results in (directory / "RESULTS.md", directory.parent / "RESULTS.md"):
        if results.is_file():
            hw = results_hardware(results.read_text(errors="replace"))
            break
    try:
        pattern = re.compile(match) if match else None
    except re.error as e:
        raise BadInput("--reference-match", f"not a regular expression: {e}") from None
    rows = []
    for f in sorted(directory.glob("*.json")):
        try:
            row = CardRow.model_validate_json(f.read_bytes())
        except (ValidationError, OSError) as e:
            raise BadInput(str(f), f"not a row in the card's shape: {str(e).splitlines()[0]}") from None
        if pattern and not pattern.search(row.label):
            continue
        if row.hardware is None:
            m = _HW_SUFFIX.search(row.label)
            row.hardware = hw.get(row.label) or (m.group(1).upper() if m else UNKNOWN_HW)
        rows.append(row)
    if not rows:
        raise BadInput("--reference", f"no row in {directory} (*.json in the card's shape"
                       + (f", label matching {match!r})" if match else ")"))
    return rows


def card_label(name: str, k: int | None, concurrency: int, max_tokens: int) -> str:
    """The card's label grammar (``<run>-k<K>[-c1|-mt<tokens>]``) for a row of ours."""
    label = f"{name}-k{k}" if k else name
    if concurrency == 1:
        label += "-c1"
    if max_tokens != 1024:
        label += f"-mt{max_tokens}"
    return label


def row_from_result(name: str, r: BenchResult, hardware: str) -> CardRow:
    """A bench result as a row in the card's shape (one row per cell run), labelled with its hardware."""
    per = {str(i): round(x, 4) for i, x in enumerate(r.per_position_acceptance)}
    return CardRow(
        label=card_label(name, r.k or (len(per) or None), r.concurrency, r.max_tokens), url=r.url or "",
        prompts=r.prompts, ok=r.requests_ok, fail=r.prompts - r.requests_ok, concurrency=r.concurrency,
        max_tokens=r.max_tokens, wall_s=round(r.duration_s, 1), output_tokens=r.output_tokens,
        output_tok_per_s=round(r.output_tok_s, 1), drafts=float(r.drafts or 0), draft_tokens=float(r.draft_tokens or 0),
        accepted_tokens=float(r.accepted_tokens or 0),
        mean_acceptance_length=None if r.acceptance_length is None else round(r.acceptance_length, 3),
        draft_token_acceptance_rate=None if r.acceptance_rate is None else round(r.acceptance_rate, 4),
        per_position_acceptance_rate=per, hardware=hardware,
    )


#: The card client's keys, in its order (a row of ours adds ``hardware`` after them).
CARD_KEYS = ("label", "url", "prompts", "ok", "fail", "concurrency", "max_tokens", "wall_s", "output_tokens",
             "output_tok_per_s", "drafts", "draft_tokens", "accepted_tokens", "mean_acceptance_length",
             "draft_token_acceptance_rate", "per_position_acceptance_rate")


def row_json(row: CardRow) -> dict[str, Any]:
    data = row.model_dump(mode="json")
    out = {k: data.get(k) for k in CARD_KEYS}
    out.update({k: v for k, v in data.items() if k not in out})
    return out


def write_rows(rows: list[CardRow], directory: Path) -> list[Path]:
    """Each row as ``<label>.json`` in ``directory`` (the card's ``all/`` layout), indented as the card's are."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput("--card-rows", f"cannot make {directory}: {e.strerror or e}") from None
    out = []
    for row in rows:
        p = directory / f"{row.label}.json"
        p.write_text(json.dumps(row_json(row), indent=2) + "\n")
        out.append(p)
    return out


def rows_from_report(report: Report, hardware: str) -> list[CardRow]:
    """A campaign's figures as rows in the card's shape: each drafter on each cell, its counted waves' point
    figures (the counts are per wave in the journal: left out here)."""
    cells = {c.name: c for c in report.spec.cells}
    ks: dict[tuple[str, str], int | None] = {}
    for w in report.waves:
        ks.setdefault((str(w["drafter"]), str(w["cell"])), w.get("k"))  # type: ignore[arg-type]
    rows = []
    for f in report.analysis.figures:
        c = cells.get(f.cell)
        if c is None:
            continue
        per = {str(i): round(x.point, 4) for i, x in enumerate(f.per_position) if x.point is not None}
        k = ks.get((f.drafter, f.cell)) or (len(per) or None)
        al = f.acceptance_length.point
        rows.append(CardRow(label=card_label(f.drafter, k, c.concurrency, c.max_tokens), prompts=c.prompts,
                            concurrency=c.concurrency, max_tokens=c.max_tokens,
                            output_tok_per_s=None if f.tok_s.point is None else round(f.tok_s.point, 1),
                            mean_acceptance_length=None if al is None else round(al, 3),
                            per_position_acceptance_rate=per, hardware=hardware, campaign=report.campaign,
                            waves=f.waves))
    return rows


def beside_lines(pairs: list[Beside], refs: list[CardRow]) -> list[str]:
    """The side-by-side table as text lines (acceptance to 3 decimals, tok/s to 1, each row's hardware)."""
    if not pairs:
        shapes = sorted({f"c{r.concurrency} × {r.max_tokens} tok, K={r.k}" for r in refs})
        return ["beside the card's rows: none of ours has a cell shape the reference rows have "
                f"({'; '.join(shapes)})"]
    out = [f"beside the card's rows (acceptance compared within the protocol's ±{NOISE}; tok/s only on the same "
           "hardware):"]
    for b in pairs:
        o, r = b.ours, b.ref
        mine = f"{o.label} [{o.hardware}] {_n(o.mean_acceptance_length, '.3f')} / {_n(o.output_tok_per_s, ',.1f')}"
        card = f"{r.label} [{r.hardware}] {_n(r.mean_acceptance_length, '.3f')} / {_n(r.output_tok_per_s, ',.1f')}"
        out.append(f"  {mine}  vs  {card}:  acceptance {b.acceptance}; tok/s {b.tok_s}")
    return out


def _n(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


@dataclass(frozen=True)
class Beside:
    """One of ours beside one of the card's rows of the same cell shape."""

    ours: CardRow
    ref: CardRow
    acceptance: str  # "same (within ±0.015)" / "+0.044 above" / "0.031 below" / "—"
    tok_s: str  # the comparison, or why there is none

    def to_json(self) -> dict[str, Any]:
        return {"ours": self.ours.label, "ours_hardware": self.ours.hardware, "reference": self.ref.label,
                "reference_hardware": self.ref.hardware, "ours_acceptance": self.ours.mean_acceptance_length,
                "reference_acceptance": self.ref.mean_acceptance_length, "acceptance": self.acceptance,
                "ours_tok_s": self.ours.output_tok_per_s, "reference_tok_s": self.ref.output_tok_per_s,
                "tok_s": self.tok_s}


def compare(ours: CardRow, ref: CardRow) -> Beside:
    a, b = ours.mean_acceptance_length, ref.mean_acceptance_length
    if a is None or b is None:
        acc = "—"
    elif abs(a - b) <= NOISE:
        acc = f"same (within ±{NOISE})"
    else:
        acc = f"{a - b:+.3f} {'above' if a > b else 'below'}"
    if ours.hardware and ref.hardware and ours.hardware.lower() == ref.hardware.lower() \
            and ours.output_tok_per_s and ref.output_tok_per_s:
        tok = f"{ours.output_tok_per_s / ref.output_tok_per_s - 1:+.1%}"
    else:
        tok = f"not compared: {ours.hardware or UNKNOWN_HW} vs {ref.hardware or UNKNOWN_HW}"
    return Beside(ours, ref, acc, tok)


def beside(ours: list[CardRow], refs: list[CardRow]) -> list[Beside]:
    """Every row of ours beside each reference row of its shape (concurrency, max_tokens, K)."""
    return [compare(o, r) for o in ours for r in refs if r.shape() == o.shape()]


def bench_rows(files: list[Path], hardware: str) -> list[CardRow]:
    """`bench --json` result files as rows of ours (each named by its file's stem)."""
    rows = []
    for f in files:
        try:
            r = BenchResult.model_validate_json(f.read_bytes())
        except (ValidationError, OSError) as e:
            raise BadInput(str(f), f"not a `bench --json` result: {str(e).splitlines()[0]}") from None
        rows.append(row_from_result(f.stem, r, hardware))
    return rows
