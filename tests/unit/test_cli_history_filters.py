"""`history --kind/--since` pick records from the journal; a bad filter is usage (exit 2)."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from _fixtures import clean_env, cli

from sparkserve.journal import Journal, since_time


def test_since_time_takes_durations_and_iso_times() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert since_time("90m", now=now) == "2026-12-01T10:30:00+00:00"
    assert since_time("2d", now=now) == "2026-11-29T12:00:00+00:00"
    assert since_time("2026-11-30") == "2026-11-30T00:00:00+00:00"


def test_history_filters_by_kind_and_since(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        old = j.record_deployment("f" * 64, {"a": 1}, {"n": "sha256:aa"}, "d" * 64, "up")
        j.record_deployment("e" * 64, {"a": 2}, {"n": "sha256:aa"}, "d" * 64, "up")
        j.record_bench("e" * 64, "smoke", json.dumps({"cell": "smoke", "output_tok_s": 1.0}))
    with sqlite3.connect(path) as c:
        c.execute("UPDATE deployments SET time = '2020-01-01T00:00:00+00:00' WHERE id = ?", (old,))
    env = clean_env(tmp_path, SSJOURNAL_PATH=str(path))
    p = cli("history", "--json", "--kind", "deployment", env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == 1 and [e["kind"] for e in doc["entries"]] == ["deployment", "deployment"]
    p = cli("history", "--json", "--since", "1d", env=env)
    kinds = sorted(e["kind"] for e in json.loads(p.stdout)["entries"])
    assert kinds == ["bench", "deployment"]
    p = cli("history", "--kind", "nope", env=env)
    assert p.returncode == 2 and p.stderr.startswith("error: --kind: 'nope' is not one of deployment, gates")
    p = cli("history", "--since", "yesterday", env=env)
    assert p.returncode == 2 and p.stderr.startswith("error: --since: 'yesterday' is not a duration")
