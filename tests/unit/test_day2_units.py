"""Issue 31's small parts, each against the real thing: alert URLs redacted per apprise scheme, the engine identity
cached by vLLM's RECORD (the node program run as a real ``python3``), `status` asking a real HTTP port for the
supervisor's verdict, and `up --timings`' spans."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _fixtures import config_file

from sparkserve.config import load_config
from sparkserve.deploy import timings
from sparkserve.nodes.process_remote import PROGRAM
from sparkserve.operate.supervisor_view import supervisor_view, view_lines
from sparkserve.plan.alert_urls import ScrubFilter, redact_url, scrub_text, url_secrets
from sparkserve.plan.build import build_plan

# -- alert URLs ------------------------------------------------------------------------------------------------

CASES = [  # (url, secrets that must be found, what may be shown)
    ("tgram://123456789:AAHsecretBotToken/987654", {"123456789:AAHsecretBotToken", "AAHsecretBotToken"},
     "tgram://<redacted>/…"),
    ("slack://TTTTTTTTT/BBBBBBBBB/xoxbSecretWebhook/#chan", {"xoxbSecretWebhook", "TTTTTTTTT", "BBBBBBBBB"},
     "slack://<redacted>/…"),
    ("discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js", {"JHMHI8qBe7bk2ZwO5U711o3dV_js"}, "discord://<redacted>/…"),
    ("mailto://ops:p%40ssw0rd!@smtp.example.org:587?to=a@example.org", {"p%40ssw0rd!", "p@ssw0rd!"},
     "mailto://smtp.example.org/…"),
    ("ntfys://tk_AccessToken123@ntfy.example.org/topic", {"tk_AccessToken123"}, "ntfys://ntfy.example.org/…"),
    ("ntfy://ntfy.example.org/topic?token=tk_QueryToken456", {"tk_QueryToken456"}, "ntfy://ntfy.example.org/…"),
    ("json://user:BasicAuthPw@hooks.example.org:8443/path", {"BasicAuthPw"}, "json://hooks.example.org/…"),
    ("https://user:HttpsPw99@hooks.example.org/x", {"HttpsPw99"}, "https://hooks.example.org/…"),
]


@pytest.mark.parametrize(("url", "secrets", "shown"), CASES)
def test_each_scheme_is_shown_as_scheme_and_host_and_its_secrets_are_found(url: str, secrets: set[str],
                                                                        shown: str) -> None:
    assert redact_url(url) == shown
    found = url_secrets([url])
    assert secrets <= found, secrets - found
    text = scrub_text(f"sending to {url} failed", found)
    for s in secrets:
        assert s not in text
    assert "example.org" not in shown or "example.org" in redact_url(url)


def test_ordinary_words_are_not_scrubbed() -> None:
    found = url_secrets(["json://user:pw@h.example.org/a"])  # "pw", "a", "user": too short or not secret
    assert "user" not in found and "pw" not in found and "a" not in found


def test_apprise_log_lines_lose_their_secrets() -> None:
    log = logging.getLogger("apprise.test-day2")
    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    log.addHandler(Keep())
    log.addFilter(ScrubFilter(url_secrets([CASES[0][0]])))
    log.warning("Failed to send to https://api.telegram.org/bot%s/sendMessage", "123456789:AAHsecretBotToken")
    assert got and "AAHsecretBotToken" not in got[0] and "<redacted>" in got[0]


# -- engine identity cache -------------------------------------------------------------------------------------


def _identity(root: Path, exe: Path) -> dict[str, Any]:
    q = {"verb": "identity", "exe": str(exe), "root": str(root), "timeout_s": 20}
    p = subprocess.run(["python3", "-c", PROGRAM], input=json.dumps(q), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _venv(tmp: Path, record: bool) -> tuple[Path, Path]:
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp / "calls"
    exe = venv / "bin" / "vllm"
    exe.write_text(f"#!/bin/sh\necho x >> {calls}\necho 0.25.1\n")
    exe.chmod(0o755)
    if record:
        d = venv / "lib" / "python3.12" / "site-packages" / "vllm-0.25.1.dist-info"
        d.mkdir(parents=True)
        (d / "RECORD").write_text("vllm/__init__.py,sha256=x,1\n")
    return exe, calls


def test_engine_identity_is_cached_by_the_vllm_record_and_asked_again_when_it_changes(tmp_path: Path) -> None:
    exe, calls = _venv(tmp_path, record=True)
    root = tmp_path / "run"
    a = _identity(root, exe)
    b = _identity(root, exe)
    assert (a["cached"], b["cached"]) == (False, True) and a["id"] == b["id"] and a["version"] == "0.25.1"
    assert len(calls.read_text().splitlines()) == 1  # `--version` ran once
    record = next(tmp_path.rglob("RECORD"))
    record.write_text(record.read_text() + "vllm/new.py,sha256=y,2\n")  # a pip install of another vLLM
    c = _identity(root, exe)
    assert c["cached"] is False and len(calls.read_text().splitlines()) == 2


def test_without_a_record_the_version_is_asked_every_time(tmp_path: Path) -> None:
    exe, calls = _venv(tmp_path, record=False)
    for _ in range(2):
        assert _identity(tmp_path / "run", exe)["cached"] is False
    assert len(calls.read_text().splitlines()) == 2


def test_a_launcher_script_naming_a_site_dir_is_keyed_by_that_site_record(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm-0.25.1.dist-info").mkdir(parents=True)
    (site / "vllm-0.25.1.dist-info" / "RECORD").write_text("r\n")
    calls = tmp_path / "calls"
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nexport PYTHONPATH={site} X=1\necho x >> {calls}\necho 0.25.1\n")
    exe.chmod(0o755)
    first, second = _identity(tmp_path / "run", exe), _identity(tmp_path / "run", exe)
    assert first["records"] == [str(site / "vllm-0.25.1.dist-info" / "RECORD")]
    assert (first["cached"], second["cached"]) == (False, True)


# -- status reads the supervisor --------------------------------------------------------------------------------


def _serve(doc: dict[str, Any]) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(doc).encode()
            self.send_response(200 if self.path == "/status.json" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_status_names_the_failing_check_and_the_incident(tmp_path: Path) -> None:
    probe = _serve({})
    port = probe.server_address[1]
    probe.shutdown()
    probe.server_close()
    cfg = load_config(config_file(tmp_path / "c.yaml", {"supervise": {"listen": f"127.0.0.1:{port}"}}))
    v = supervisor_view(cfg)
    assert v["running"] is False and view_lines(v)[0].startswith("supervisor: none runs for this deployment")
    assert len(view_lines(v)) == 1
    plan = build_plan(cfg)
    doc = {"stack": {"api_url": plan.api_url, "served_name": plan.served_name}, "phase": "incident", "rounds": 7,
           "last_round_at": time.time() - 2,
           "gates": {"progress": {"check": "progress", "ok": False, "summary": "the canary got nothing in 10s"},
                     "ranks": {"check": "ranks", "ok": True, "summary": "all up"}},
           "incidents": [{"dir": "/x/20261202T0101Z-progress", "time": "20261202T0101Z",
                          "verdict": [{"check": "progress"}], "pyspy_ok": True}]}
    srv = _serve(doc)
    try:
        listen = f"0.0.0.0:{srv.server_address[1]}"  # a wildcard listen is asked on loopback
        cfg = load_config(config_file(tmp_path / "d.yaml", {"supervise": {"listen": listen}}))
        v = supervisor_view(cfg)
        assert v["running"] and v["failing_now"] and [f["check"] for f in v["failing"]] == ["progress"]
        assert v["last_incident"]["dir"] == "/x/20261202T0101Z-progress"
        text = "\n".join(view_lines(v))
        assert "FAILING progress: the canary got nothing" in text and "last incident" in text
        doc["stack"] = {"api_url": "http://10.0.0.9:8000", "served_name": "other"}  # another deployment's
        assert supervisor_view(cfg)["running"] is False
        doc["stack"] = {"api_url": plan.api_url, "served_name": plan.served_name}
        doc["phase"], doc["gates"]["progress"]["ok"] = "watching", True
        assert supervisor_view(cfg)["failing_now"] is False
    finally:
        srv.shutdown()
        srv.server_close()


# -- up --timings ------------------------------------------------------------------------------------------------


def test_timings_report_each_span_from_any_thread_in_start_order() -> None:
    timings.reset()
    with timings.span("preflight"):
        t = threading.Thread(target=timings.timed("preflight: engine identity", time.sleep), args=(0.05,))
        t.start()
        t.join()
    rows = timings.spans()
    assert [r["span"] for r in rows] == ["preflight: engine identity", "preflight"]  # in the order they ended
    assert rows[0]["seconds"] >= 0.05 and rows[1]["seconds"] >= rows[0]["seconds"]
    report = timings.report().splitlines()
    assert report[0].startswith("timings: ") and report[1].endswith("preflight")


# -- doctor: will an incident hold stacks? ------------------------------------------------------------------------


def test_doctor_forensics_row_finds_the_py_spy_beside_sparkserve(tmp_path: Path) -> None:
    import platform

    from sparkserve.nodes.local import LocalNode
    from sparkserve.operate.pyspy import arch_cache_dir, binary_for, forensics_checks, local_pyspy

    mine = local_pyspy()
    assert mine is not None and mine.is_file()  # a dependency of sparkserve: installed beside it
    node = LocalNode("n0")
    for runtime, want in (("process", f"py-spy at {mine}"), ("docker", "helper container")):
        cfg = load_config(config_file(tmp_path / f"{runtime}.yaml", {
            "runtime": runtime, "supervise": {"pyspy": "/nonexistent/py-spy"},
            "process": {"run_dir": str(tmp_path / "run")}}))
        (row,) = forensics_checks(cfg, {"n0": node})
        assert (row.node, row.name, row.status) == ("n0", "forensics", "ok") and want in row.detail, row
    other = "aarch64" if platform.machine() != "aarch64" else "x86_64"
    data, why = binary_for(other)
    assert data is None and str(arch_cache_dir(other)) in why and f"manylinux2014_{other}" in why
