"""The emulator's format table is vLLM 0.33.0's own: every entry is proven against the installed package.

Needs vLLM 0.33.0 importable (scripts/test installs the lite wheel into .venv); a missing vLLM fails.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tools"))
sys.path.insert(0, str(HERE / "emulator"))

import formats_033 as F  # noqa: E402
import vllm_emulator as emu  # noqa: E402
import vllm_formats as vf  # noqa: E402

pytestmark = pytest.mark.rig


@pytest.fixture(scope="module")
def vllm_root() -> Path:
    root = vf.package_root()
    assert root is not None, "vLLM 0.33.0 must be importable: scripts/test installs it into .venv"
    version = (root / "_version.py").read_text()
    assert "0.33.0" in version, f"expected vLLM 0.33.0 at {root}"
    return root


@pytest.fixture(scope="module")
def calls(vllm_root: Path) -> set[tuple[str, int, str, str]]:
    return {(c.path, c.line, c.level, c.fmt) for c in vf.logger_calls(vllm_root)}


def _pieces(fmt: str) -> list[str]:
    return [p for p in re.split(r"%%|%0?\d*(?:\.\d+)?[sdfr]|\{\}|\{:03d\}", fmt) if p.strip()]


def test_every_format_is_a_real_vllm_033_log_call(vllm_root: Path, calls: set) -> None:
    wrong = []
    for f in F.FORMATS:
        src = vllm_root / f.path
        if f.verify == "call":
            if (f.path, f.line, f.level, f.fmt) not in calls:
                wrong.append(f"{f.key}: no logger.{f.level.lower()}({f.fmt[:60]!r}…) at {f.path}:{f.line}")
            continue
        lits = vf.string_literals(src)
        line_text = src.read_text(encoding="utf-8").splitlines()[f.line - 1]
        if not re.search(r"\b(?:logger|lgr|log_fn)\b\.?\w*\(", line_text):
            wrong.append(f"{f.key}: {f.path}:{f.line} is not a log call: {line_text.strip()!r}")
        if f.verify == "literal":
            if not any(t == f.fmt and ln in (f.line, f.line + 1) for ln, t in lits):
                wrong.append(f"{f.key}: no string literal {f.fmt[:60]!r}… at {f.path}:{f.line}")
        else:
            text = "\n".join(t for _, t in lits)
            for piece in f.fragments or _pieces(f.fmt):
                if piece not in text:
                    wrong.append(f"{f.key}: {piece!r} is not in {f.path}'s string literals")
    assert not wrong, "\n".join(wrong)


def test_exception_texts_come_from_the_named_vllm_file(vllm_root: Path) -> None:
    wrong = []
    for rx, path in F.EXCEPTIONS:
        if not path:
            continue  # torch / CPython / the emulator's own OS errors
        literal = re.split(r"\\.|[()\[\]{}.*+?]", rx.split(": ", 1)[1])[0]
        text = "\n".join(t for _, t in vf.string_literals(vllm_root / path))
        if literal.strip() and literal not in text:
            wrong.append(f"{literal!r} not in {path}")
    assert not wrong, "\n".join(wrong)


def test_the_emulator_prints_only_from_table_locations() -> None:
    wheres = {f.where for f in F.FORMATS + F.FORK_FORMATS}
    missing = {k: w for k, w in emu.AT.items() if w not in wheres}
    assert not missing, f"emulator locations without a table entry: {missing}"
    fork_at = {f.key: f.where for f in F.FORK_FORMATS}
    assert all(emu.AT.get(k) == w for k, w in fork_at.items()), (fork_at, emu.AT)


def test_the_fork_lines_are_the_cards_boot_gates_and_no_033_line(vllm_root: Path, calls: set) -> None:
    """The fork-only lines are the card README's boot gates 1 and 2 (card-stack.md), word for word with the
    drafter's layer count filled in; vLLM 0.33.0 has no call that prints them, and its checker rejects them."""
    card = Path("/work/shared/docs/card-stack.md").read_text()
    gates = re.findall(r"^\d\. `([^`]+)`", card, re.M)
    assert len(gates) >= 2, "card-stack.md's 'Expected boot gates' list moved"
    for f in F.FORK_FORMATS:
        assert f.verify == "card" and f.key in emu.AT
        rx = F.fmt_regex(f)
        assert any(rx.fullmatch(g) or rx.fullmatch(g + ".") for g in gates), f"{f.key}: not a card gate line"
        assert not any(c[3] == f.fmt for c in calls), f"{f.key}: 0.33.0 prints it; move it to FORMATS"
        line = f"(Worker_TP0 pid=9) INFO 11-29 16:03:57 [{f.where}] {f.fmt.replace('%d', '8')}\n"
        assert F.unmatched_lines(line), f"the 0.33 checker accepted the fork-only line {f.key}"


def test_the_checker_rejects_lines_no_033_format_produces() -> None:
    ok = "(APIServer pid=7) INFO 11-29 16:03:57 [entry.py:139] Starting vLLM server on http://0.0.0.0:8000\n"
    assert F.unmatched_lines(ok) == []
    made_up = [
        "(APIServer pid=7) INFO 11-29 16:03:57 [entry.py:139] Starting vLLM API server 0 on http://0.0.0.0:8000\n",
        "(APIServer pid=7) INFO 11-29 16:03:57 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000\n",
        "(Engine pid=7) INFO 11-29 16:03:57 [entry.py:139] Starting vLLM server on http://0.0.0.0:8000\n",
        "(EngineCore pid=8) INFO 11-29 16:03:58 [kv_cache_utils.py:1147] GPU KV cache size: 1,677,712 tokens\n",
        "Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)\n",
        "(APIServer pid=7) INFO:     Application startup complete.\n",  # the <=0.30 prefixed uvicorn form
    ]
    for line in made_up:
        assert F.unmatched_lines(line), f"accepted a line no 0.33 format produces: {line!r}"


def test_the_checker_reads_real_0_33_shapes_from_the_assembled_log() -> None:
    text = Path("/work/shared/docs/assembled-boot-log-0.33.txt")
    if not text.exists():
        pytest.fail("/work/shared/docs/assembled-boot-log-0.33.txt is needed by this test")
    kv = [ln for ln in text.read_text().splitlines() if "KV cache size" in ln]
    assert kv and F.unmatched_lines(kv[0] + "\n") == []
