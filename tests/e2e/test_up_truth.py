"""What `sparkserve up` claims must be true, on the two-node rig: "already up" only for a stack whose gates
passed for this very boot; with an API key the readiness probe authenticates; a damaged journal is a
warning, not a failed deploy; a rank that dies just after the gates fails `up` (the settle window)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.rig

API_KEY = "sk-e2e-7b1f3c9d2a"  # must never appear in any output


def head_api(e2e, cfg: Path) -> str:
    c = e2e.load(cfg)
    return f"http://{c.serve.host}:{c.serve.port}"


def test_up_after_no_gates_judges_the_boot_and_names_the_failed_gate(e2e) -> None:
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "graphs_off@rank=1"}}})
    first = e2e.cli("up", "--no-gates", cfg=cfg)
    assert first.returncode == 0, first.stderr
    assert len(e2e.running_ids()) == 2

    p = e2e.cli("up", cfg=cfg)
    assert "already up" not in p.stdout + p.stderr
    text = e2e.assert_explained(p, code=1, node=None, step="graphs")
    assert "node-b" in text  # the failing rank
    assert e2e.leftovers() == {}  # as for a failed first boot: the stack was stopped


def test_up_again_after_passing_gates_is_already_up_without_rejudging(e2e) -> None:
    cfg = e2e.config()
    assert e2e.cli("up", cfg=cfg).returncode == 0
    again = e2e.json("up", cfg=cfg)
    assert again["status"] == "unchanged" and again["gates"] is None  # the journal holds this boot's verdict
    e2e.cli("down", cfg=cfg)


def test_up_with_an_api_key_is_ready_within_the_boot_time(e2e, tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    cfg = e2e.config({"serve": {"api_key_file": str(key_file), "ready_timeout_s": 25}})
    t0 = time.monotonic()
    p = e2e.cli("up", cfg=cfg)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert took < 25, f"up took {took:.0f}s"
    api = head_api(e2e, cfg)
    assert httpx.get(f"{api}/v1/models", timeout=5).status_code == 401  # the engine does enforce the key
    again = e2e.cli("up", cfg=cfg)  # the "already up" check authenticates too
    assert again.returncode == 0 and again.stdout.startswith("already up"), again.stdout + again.stderr
    st = e2e.cli("status", "--json", cfg=cfg)
    for out in (p.stdout, p.stderr, again.stdout, again.stderr, st.stdout, st.stderr):
        assert API_KEY not in out
    e2e.cli("down", cfg=cfg)


def test_corrupt_journal_warns_and_the_stack_keeps_serving(e2e, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    journal = tmp_path / "journal.sqlite"
    journal.write_bytes(b"SQLite format 3\x00" + b"\x5a" * 8192)  # a damaged file, not a journal
    monkeypatch.setenv("SSJOURNAL_PATH", str(journal))
    cfg = e2e.config()
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    warnings = [ln for ln in p.stderr.splitlines() if ln.startswith("warning: journal:")]
    assert len(warnings) == 1, p.stderr
    assert "Traceback" not in p.stderr
    time.sleep(1)
    assert len(e2e.running_ids()) == 2  # still serving: the journal is a record, not a gate
    assert httpx.get(f"{head_api(e2e, cfg)}/v1/models", timeout=5).status_code == 200
    fallback = journal.with_name(journal.name + ".fallback.jsonl")
    assert str(fallback) in warnings[0]
    kinds = [json.loads(ln)["kind"] for ln in fallback.read_text().splitlines()]
    assert "gate_run" in kinds and "deployment" in kinds

    h = e2e.cli("history", cfg=None)
    e2e.assert_explained(h, code=2, node=None, says=("damaged",))
    e2e.cli("down", cfg=cfg)


def test_follower_dying_after_the_gates_fails_up(e2e) -> None:
    cfg = e2e.config({"gates": {"settle_s": 8}})
    proc = e2e.popen("up", cfg=cfg)
    assert proc.stderr is not None
    settling = False
    for line in proc.stderr:  # the progress lines: wait for the gates to pass
        if "settle" in line:
            settling = True
            break
    if not settling:
        proc.wait(timeout=60)
        pytest.fail(f"up ended (exit {proc.returncode}) without a settle window after the gates")
    (follower,) = [c for c in e2e.managed("node-b") if c.status == "running"]
    follower.kill()
    try:
        _, err_rest = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    p = subprocess.CompletedProcess(proc.args, proc.returncode, "", err_rest)
    e2e.assert_explained(p, code=3, node="node-b", step="settle")
    assert e2e.leftovers() == {}
