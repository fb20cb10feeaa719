"""pytest imports test modules by basename (rootdir import mode): two test files with one name break the
whole collection, so CI would stop before running a test."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
