"""What supervise journals: incidents, recoveries, give-ups and banked bands, one deployment's apart from another's;
and the band it reads back (a bench result first, never the gates' smoke run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve.journal import Journal, record
from sparkserve.operate.loop import SMOKE_CELLS


def test_events_are_kept_per_deployment_newest_first(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.sqlite") as j:
        j.record_supervise_event("fp-a", "incident", json.dumps({"n": 1}))
        j.record_supervise_event("fp-a", "recovered", json.dumps({"restart_s": 9.5}))
        j.record_supervise_event("fp-b", "incident", json.dumps({"n": 2}))
        j.record_supervise_event("fp-a", "gave_up", json.dumps({"why": "budget"}))
        assert [k for _, _, k, _ in j.supervise_events("fp-a")] == ["gave_up", "recovered", "incident"]
        assert [json.loads(x)["n"] for *_, x in j.supervise_events(kind="incident")] == [2, 1]
        j.record_bench("fp-a", SMOKE_CELLS[0], json.dumps({"acceptance_length": 3.0}))
        j.record_bench("fp-a", "c1", json.dumps({"acceptance_length": 3.4}))
        assert [c for _, c, _ in j.bench_results_for("fp-a")] == ["c1", SMOKE_CELLS[0]]


def test_record_never_fails_its_caller_and_writes_through_the_default_journal(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("SSJOURNAL_PATH", raising=False)
    record("supervise_event", fingerprint="fp", event="band",
           event_json=json.dumps({"acceptance_length": 3.5, "per_position": [0.7], "source": "first window"}))
    with Journal.open(tmp_path / "sparkserve" / "journal.sqlite") as j:
        ((_, _, kind, raw),) = j.supervise_events("fp")
    assert kind == "band" and json.loads(raw)["source"] == "first window"
