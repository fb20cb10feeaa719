"""The docs site's reference pages, generated from the code (`scripts/gen-docs`; `--check` fails on drift).

    scripts/gen-docs            # (re)write docs/reference/* and docs/troubleshooting.md
    scripts/gen-docs --check    # exit 1 naming every page that differs from what the code says now

One module per page: :mod:`~sparkserve.docgen.cli` (the CLI from the Typer app; the exit codes from
:mod:`sparkserve.errors`), :mod:`~sparkserve.docgen.config` (the config from the pydantic model, by
section), :mod:`~sparkserve.docgen.schemas` (the JSON contracts as JSON Schemas),
:mod:`~sparkserve.docgen.faults` (the fault catalogue and troubleshooting: log faults, gates, and
:mod:`~sparkserve.docgen.first_contact`'s errors). Not imported by any command: only the generator and
its tests use it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sparkserve.docgen.base import HEADER, REGENERATE, REPO
from sparkserve.docgen.cli import _click_root, cli_page, exit_codes_page
from sparkserve.docgen.config import _is_model, _unwrap, config_page
from sparkserve.docgen.faults import FAULT_ADVICE, GATE_ADVICE, faults_page, troubleshooting_page
from sparkserve.docgen.schemas import _gates_doc, infer_schema, json_page, json_schemas

DOCS = REPO / "docs"

__all__ = ["DOCS", "FAULT_ADVICE", "GATE_ADVICE", "HEADER", "REPO", "_click_root", "_gates_doc", "_is_model",
           "_unwrap", "cli_page", "config_page", "drift", "infer_schema", "json_schemas", "main", "pages"]


def _missing_advice() -> list[str]:
    from sparkserve.observe.gate_report import GATE_NAMES
    from sparkserve.observe.logpatterns import FaultKind

    return ([f"FAULT_ADVICE has no advice for fault kind {k.value}" for k in FaultKind if k.value not in FAULT_ADVICE]
            + [f"GATE_ADVICE has no advice for gate {g}" for g in GATE_NAMES if g not in GATE_ADVICE])


def pages() -> dict[Path, str]:
    """Every generated page: path under the repo → its text."""
    missing = _missing_advice()
    if missing:
        raise SystemExit(f"error: sparkserve/docgen/faults.py: {'; '.join(missing)}: add what it means on "
                         "a Spark and what to do")
    schemas = json_schemas()
    out = {
        DOCS / "reference" / "cli.md": cli_page(),
        DOCS / "reference" / "config.md": config_page(),
        DOCS / "reference" / "json.md": json_page(schemas),
        DOCS / "reference" / "exit-codes.md": exit_codes_page(),
        DOCS / "reference" / "faults.md": faults_page(),
        DOCS / "troubleshooting.md": troubleshooting_page(),
    }
    for name, schema in schemas.items():
        out[DOCS / "reference" / "schemas" / f"{name}.schema.json"] = json.dumps(schema, indent=2) + "\n"
    return out


def drift() -> list[str]:
    """The generated pages that differ from (or are missing on) disk, relative to the repo."""
    return [str(p.relative_to(DOCS.parent)) for p, text in pages().items()
            if not p.is_file() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("COLUMNS", "120")
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        stale = drift()
        for p in stale:
            print(f"error: {p}: differs from the code; run {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    if args:
        print(f"usage: {REGENERATE} [--check]", file=sys.stderr)
        return 2
    for path, text in pages().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
