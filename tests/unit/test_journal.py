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


# -- per-boot gate verdicts -----------------------------------------------------------------------------


def test_gate_verdict_holds_for_its_boot_only_and_the_newest_wins(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        assert j.gate_verdict("fp", "boot-1") is None
        j.record_gate_run("fp", True, {"gates": []}, boot_id="boot-1")
        assert j.gate_verdict("fp", "boot-1") is True
        assert j.gate_verdict("fp", "boot-2") is None  # a restarted container: a new boot, never judged
        assert j.gate_verdict("other", "boot-1") is None
        j.record_gate_run("fp", False, {"gates": []}, boot_id="boot-1")
        assert j.gate_verdict("fp", "boot-1") is False
        j.record_gate_run("fp", True, {"gates": []})  # a partial judgement (skipped gates) vouches for no boot
        assert j.gate_verdict("fp", "boot-1") is False


def test_a_schema_1_journal_is_migrated_and_keeps_its_rows(jpath: Path) -> None:
    from sparkserve.journal import MIGRATIONS

    jpath.parent.mkdir(parents=True)
    conn = sqlite3.connect(jpath)
    conn.executescript(MIGRATIONS[0] + "; PRAGMA user_version = 1;")
    conn.execute("INSERT INTO gate_runs (fingerprint, time, ok, verdicts_json) VALUES ('fp', 't', 1, '[]')")
    conn.commit()
    conn.close()
    with Journal.open(jpath) as j:
        assert j.schema_version == SCHEMA_VERSION
        assert j.gate_verdict("fp", "any") is None  # an old pass names no boot
        assert [e.kind for e in j.history()] == ["gates"]


# -- a damaged or unwritable journal is a warning, not a failure ----------------------------------------


def fallback_lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def corrupt_journal(jpath: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default journal is ``jpath``, a file with SQLite's magic and garbage after it; no warning given yet."""
    from sparkserve.journal import best_effort as jmod

    monkeypatch.setattr(jmod, "_warned", set())
    monkeypatch.setenv(ENV_PATH, str(jpath))
    jpath.parent.mkdir(parents=True)
    jpath.write_bytes(b"SQLite format 3\x00" + b"\x5a" * 8192)


def test_corrupt_journal_record_goes_to_the_fallback_file_with_one_warning(
        jpath: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sparkserve.journal import best_effort as jmod

    corrupt_journal(jpath, monkeypatch)
    jmod.record("gate_run", fingerprint="fp", ok=True, verdicts={"gates": []}, boot_id="b1")
    jmod.record("banked_pool", fingerprint="fp", pool_tokens=366749)
    assert jmod.lookup(lambda j: j.get_banked_pool("fp"), None) is None
    err = capsys.readouterr().err.splitlines()
    fallback = jpath.with_name(jpath.name + ".fallback.jsonl")
    assert len(err) == 1 and err[0].startswith(f"warning: journal: {jpath}: ") and str(fallback) in err[0], err
    rows = fallback_lines(fallback)
    assert [r["kind"] for r in rows] == ["gate_run", "banked_pool"]
    assert rows[0]["fingerprint"] == "fp" and rows[0]["boot_id"] == "b1" and rows[1]["pool_tokens"] == 366749
    assert jpath.read_bytes().startswith(b"SQLite format 3\x00\x5a")  # the damaged file is left for inspection


def test_read_only_state_dir_records_to_the_temp_dir(
        read_only_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    _read_only_case(read_only_dir / "journal.sqlite", monkeypatch, capsys, tmp_path)


def test_a_file_where_the_state_dir_should_be_records_to_the_temp_dir(
        jpath: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The journal's dir is a regular file: nothing can be created in it."""
    jpath.parent.parent.mkdir(parents=True, exist_ok=True)
    jpath.parent.write_text("a file where the state dir should be\n")
    _read_only_case(jpath, monkeypatch, capsys, tmp_path)


def _read_only_case(jpath: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                    tmp_path: Path) -> None:
    """A record whose journal cannot be written lands in the temp-dir fallback file, with one warning."""
    from sparkserve.journal import best_effort as jmod

    monkeypatch.setattr(jmod, "_warned", set())
    monkeypatch.setenv(ENV_PATH, str(jpath))
    monkeypatch.setattr(jmod.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    jmod.record("deployment", fingerprint="fp", config={"a": 1}, image_ids={"n": "sha256:x"},
                drafter_manifest_sha256="d", outcome="up+gates")
    (warning,) = capsys.readouterr().err.splitlines()
    (fallback,) = (tmp_path / "tmp").iterdir()
    assert warning.startswith("warning: journal: ") and str(fallback) in warning
    (row,) = fallback_lines(fallback)
    assert row["kind"] == "deployment" and row["outcome"] == "up+gates"
    assert fallback.stat().st_mode & 0o077 == 0  # the temp dir is shared: the file is the user's alone


def test_history_of_a_damaged_journal_is_bad_input_not_a_traceback(jpath: Path) -> None:
    with Journal.open(jpath) as j:
        for i in range(300):  # enough rows for data pages beyond the schema page
            j.record_bench("fp", "smoke", json.dumps({"output_tok_s": i, "pad": "x" * 200}))
    conn = sqlite3.connect(jpath)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(jpath.read_bytes())
    page = 4096
    data[3 * page:6 * page] = b"\xa5" * (3 * page)  # pages 4-6: table data, not the header or the schema
    jpath.write_bytes(bytes(data))
    with Journal.open(jpath) as j, pytest.raises(BadInput, match="damaged"):
        j.history()


def test_history_command_says_damaged_in_one_line(jpath: Path, tmp_path: Path) -> None:
    jpath.parent.mkdir(parents=True)
    jpath.write_bytes(b"SQLite format 3\x00" + b"\x5a" * 8192)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")} | {ENV_PATH: str(jpath)}
    p = subprocess.run([sys.executable, "-m", "sparkserve", "history"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.splitlines()
    assert line.startswith(f"error: {jpath}: damaged"), line


def test_a_bench_on_a_damaged_journal_keeps_its_result_in_the_fallback(
        jpath: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The bench ran (minutes of it): a damaged journal must not lose its result or fail the command."""
    from sparkserve.config import load_config
    from sparkserve.measure import run
    from sparkserve.measure.records import CELLS, BenchResult

    corrupt_journal(jpath, monkeypatch)
    cell = CELLS["smoke"]
    done = BenchResult(cell=cell.name, prompts=cell.prompts, concurrency=cell.concurrency, max_tokens=cell.max_tokens,
                       requests_ok=20, stream_errors=0, output_tokens=10240, duration_s=9.5, output_tok_s=1077.9,
                       acceptance_length=3.57, per_position_acceptance=[0.74, 0.55], drafts=2868, draft_tokens=20076,
                       accepted_tokens=7372)
    monkeypatch.setattr(run, "run_cell", lambda *a, **k: done)  # the bench itself is not what is tested here
    cfg = load_config(Path(__file__).resolve().parents[2] / "sparkserve" / "data" / "default.yaml")
    result, bench_id = run.bench_and_record(cfg, cell, None, protocol="forced")  # no chat template needed
    assert result is done and bench_id is None
    rows = fallback_lines(jpath.with_name(jpath.name + ".fallback.jsonl"))
    assert [r["kind"] for r in rows] == ["bench"] and rows[0]["result_json"] == done.to_json()
    assert capsys.readouterr().err.count("warning: journal:") == 1
