"""The journal: schema, pins, history, and what a crash mid-write leaves behind."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.journal import ENV_PATH, SCHEMA_VERSION, Journal, default_path, sha256_text


@pytest.fixture
def jpath(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.sqlite"


def test_path_comes_from_env_else_user_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_PATH, str(tmp_path / "j.sqlite"))
    assert default_path() == tmp_path / "j.sqlite"
    monkeypatch.delenv(ENV_PATH)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "sparkserve" / "journal.sqlite"


def test_new_journal_is_wal_and_at_current_schema(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        assert j.schema_version == SCHEMA_VERSION >= 1
    conn = sqlite3.connect(jpath)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"deployments", "gate_runs", "banked_pools", "bench_results"} <= tables


def test_reopen_does_not_migrate_twice(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        j.put_banked_pool("fp", 1)
    with Journal.open(jpath) as j:
        assert j.get_banked_pool("fp") == 1
        assert j.schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused(jpath: Path) -> None:
    Journal.open(jpath).close()
    conn = sqlite3.connect(jpath)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(BadInput, match="newer than this sparkserve"):
        Journal.open(jpath)


def test_not_a_database_is_bad_input(jpath: Path) -> None:
    jpath.parent.mkdir(parents=True)
    jpath.write_text("this is not sqlite, just a text file that happens to be long enough " * 20)
    with pytest.raises(BadInput, match="not a usable sparkserve journal"):
        Journal.open(jpath)


def test_banked_pool_put_get_and_replace(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        assert j.get_banked_pool("abc") is None
        j.put_banked_pool("abc", 366749)
        assert j.get_banked_pool("abc") == 366749
        j.put_banked_pool("abc", 366750)
        assert j.get_banked_pool("abc") == 366750
        assert j.get_banked_pool("other") is None


def test_deployment_pins_and_config_lookup(jpath: Path) -> None:
    config = {"b": 1, "a": {"x": [1, 2]}}
    with Journal.open(jpath) as j:
        images = {"spark-a": "sha256:aa", "spark-b": "sha256:aa"}
        dep = j.record_deployment("full-fp", config, images, "d1", "up")
        j.set_deployment_outcome(dep, "down")
        config_sha = sha256_text(json.dumps(config, sort_keys=True, separators=(",", ":")))
        assert j.latest_fingerprint_for_config(config_sha) == "full-fp"
        assert j.latest_fingerprint_for_config("nope") is None
        [entry] = j.history()
        assert entry.kind == "deployment" and entry.fingerprint == "full-fp"
        assert "down on 2 node(s)" in entry.summary and "aa" in entry.summary


def test_config_lookup_matches_config_fingerprint(jpath: Path) -> None:
    from sparkserve.config import load_config

    cfg = load_config(None)
    with Journal.open(jpath) as j:
        j.record_deployment("deployed-fp", cfg.normalized(), {}, None, "up")
        assert j.latest_fingerprint_for_config(cfg.fingerprint()) == "deployed-fp"


def test_bench_result_stored_verbatim_with_sha256(jpath: Path) -> None:
    raw = json.dumps({"cell": "smoke", "output_tok_s": 123.4, "acceptance_length": 3.5, "stream_errors": 0})
    with Journal.open(jpath) as j:
        bid = j.record_bench("fp", "smoke", raw)
        stored, sha = j.bench_result(bid)  # type: ignore[misc]
        assert stored == raw and sha == sha256_text(raw)
        [e] = j.history()
        assert e.kind == "bench" and e.sha256_ok is True
        assert "123.4 tok/s" in e.summary and "AL 3.50" in e.summary


def test_history_flags_a_bench_row_edited_after_recording(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        bid = j.record_bench("fp", "c1", '{"output_tok_s": 10}')
    conn = sqlite3.connect(jpath)
    conn.execute("UPDATE bench_results SET result_json = '{\"output_tok_s\": 99}' WHERE id = ?", (bid,))
    conn.commit()
    conn.close()
    with Journal.open(jpath) as j:
        [e] = j.history()
        assert e.sha256_ok is False


def test_history_interleaves_kinds_newest_first_and_limits(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        j.record_deployment("fp", {}, {"n": "i"}, None, "up")
        verdicts = {"ok": False, "gates": [{"name": "pool", "ok": False}, {"name": "mask", "ok": True}]}
        j.record_gate_run("fp", False, verdicts)
        j.put_banked_pool("fp", 5)
        j.record_bench("fp", "smoke", '{"output_tok_s": 1, "refused": ["contaminated"], "ok": false}')
        kinds = [e.kind for e in j.history()]
        assert kinds == ["bench", "pool", "gates", "deployment"]
        gates = next(e for e in j.history() if e.kind == "gates")
        assert gates.ok is False and "failed: pool" in gates.summary
        bench = j.history()[0]
        assert bench.ok is False and "refused: contaminated" in bench.summary
        assert len(j.history(limit=2)) == 2


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from sparkserve.journal import Journal
    j = Journal.open(Path(sys.argv[1]))
    j.record_bench("fp", "smoke", '{"committed": 1}')
    conn = j._conn
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO bench_results (fingerprint, cell, time, result_json, sha256)"
                 " VALUES ('fp', 'c16', 't', '{\\"half\\": 1}', 'x')")
    conn.execute("INSERT INTO banked_pools (fingerprint, pool_tokens, time) VALUES ('fp', 1, 't')")
    print("in-transaction", flush=True)
    time.sleep(60)
    """
)


def test_kill_mid_transaction_leaves_a_readable_journal(jpath: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(jpath)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "in-transaction"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with Journal.open(jpath) as j:
        rows = [e for e in j.history() if e.kind == "bench"]
        assert len(rows) == 1 and rows[0].sha256_ok  # the committed write survived, the half one did not
        assert j.get_banked_pool("fp") is None
        j.put_banked_pool("fp", 7)  # and it is writable again (no stale lock)
        assert j.get_banked_pool("fp") == 7
    assert sqlite3.connect(jpath).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


HAMMER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sparkserve.journal import Journal
    j = Journal.open(Path(sys.argv[1]))
    i = 0
    while True:
        j.record_bench("fp", "smoke", '{"i": %d, "pad": "%s"}' % (i, "x" * 4000))
        i += 1
        if i == 50:
            print("going", flush=True)
    """
)


def test_kill_during_a_stream_of_writes_keeps_every_committed_row_intact(jpath: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HAMMER, str(jpath)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "going"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    with Journal.open(jpath) as j:
        rows = j.history(limit=100000)
        assert len(rows) >= 50
        assert all(e.sha256_ok for e in rows)
    assert sqlite3.connect(jpath).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
