"""The reader scored on real public vLLM logs (bench/score_logs.py over tests/fixtures/logs/public): no crash,
at least 98 % of the verdicts a person wrote by reading each log, and no (log, field) that was right goes wrong.

`right.json` is the committed baseline of the pairs that are right. After a fix makes more pairs right, refresh it:

    .venv/bin/python bench/score_logs.py --json | .venv/bin/python -c \
        'import json,sys; print(json.dumps(json.load(sys.stdin)["right"], indent=0))' \
        > tests/fixtures/logs/public/right.json
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT / "tests" / "fixtures" / "logs" / "public"


def _scorer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("score_logs", ROOT / "bench" / "score_logs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("score_logs", mod)  # its dataclass looks its module up while it is defined
    spec.loader.exec_module(mod)
    return mod


def test_the_reader_scores_98_percent_on_public_logs_without_a_crash() -> None:
    s = _scorer().score(PUBLIC)
    assert s.crashes == {}
    assert s.fraction() >= 0.98, s.misses


def test_no_field_that_was_right_goes_wrong() -> None:
    s = _scorer().score(PUBLIC)
    baseline = set(json.loads((PUBLIC / "right.json").read_text()))
    now = {f"{name}:{field}" for name, field in s.right}
    assert sorted(baseline - now) == []


def test_every_public_log_has_verdicts_and_its_sha256_in_the_corpus_index() -> None:
    expected = json.loads((PUBLIC / "expected.json").read_text())
    assert {p.name for p in PUBLIC.glob("*.log")} == set(expected)
    assert len(expected) >= 40
    index = (PUBLIC / "CORPUS.md").read_text()
    for name in expected:
        sha = hashlib.sha256((PUBLIC / name).read_bytes()).hexdigest()
        row = next((x for x in index.splitlines() if f"`{name}`" in x), "")
        assert sha in row and re.search(r"https://github\.com/\S+", row), name


def test_the_scorer_counts_a_wrong_fault_as_a_miss() -> None:
    mod = _scorer()
    assert mod.field_right("fault", ["EngineDeadError"], "x EngineDeadError: y")
    assert not mod.field_right("fault", ["EngineDeadError"], None)
    assert not mod.field_right("fault", None, "ERROR something")
    assert mod.field_right("ready", None, None) and not mod.field_right("ready", False, None)


def test_the_scorer_counts_each_kind_over_the_fields_of_the_logs_that_name_it() -> None:
    mod = _scorer()
    s = mod.Score(kinds={"a.log": [2], "b.log": [2, 5], "c.log": []},
                  scored=[("a.log", "fault"), ("b.log", "fault"), ("b.log", "ready"), ("c.log", "ready")],
                  right={("a.log", "fault"), ("b.log", "ready"), ("c.log", "ready")})
    per = s.per_kind()
    assert per[2] == (2, 3) and per[5] == (1, 2) and per[1] == (0, 0)
    s = mod.score(PUBLIC)
    assert all(n in s.kinds for n, _ in s.scored) and sum(t for _, t in s.per_kind().values()) > 0
