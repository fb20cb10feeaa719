"""The troubleshooting page's first-contact entries say what the CLI prints (issue 33): each message is made by
the code that prints it, and the real CLI, run as a user would, prints the same line."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest
from _fixtures import REPO, clean_env, cli, config_file

from sparkserve.docgen import faults as docs_faults
from sparkserve.docgen import first_contact as docs_first_contact
from sparkserve.observe.gate_report import GATE_NAMES

PAGE = REPO / "docs" / "troubleshooting.md"


def _entry(anchor: str) -> str:
    e = next(e for e in docs_first_contact.ENTRIES if e.anchor == anchor)
    return e.message()


def test_every_first_contact_error_the_issue_names_has_an_entry_on_the_page() -> None:
    text = PAGE.read_text()
    for anchor in ("placeholder-host", "unknown-host-key", "missing-ssh-identity", "image-not-on-a-node",
                   "port-in-use", "sudo-for-the-page-cache-drop", "no-known-hosts", "connection-refused"):
        e = next(e for e in docs_first_contact.ENTRIES if e.anchor == anchor)
        assert f"{{ #{anchor} }}" in text and e.message() in text and e.fix in text, anchor
    for gate in GATE_NAMES:
        assert f"{{ #gate-{gate} }}" in text and gate in docs_faults.GATE_ADVICE


def test_the_placeholder_line_is_what_validate_prints(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    assert cli("init", str(tmp_path / "sparkserve.yaml"), env=env).returncode == 0
    p = cli("validate", "-c", str(tmp_path / "sparkserve.yaml"), env=env)
    assert p.returncode == 2 and p.stderr.strip() == _entry("placeholder-host")


def test_the_identity_line_is_what_doctor_prints(tmp_path: Path) -> None:
    key = docs_first_contact.HOME / ".ssh" / "id_ed25519"
    assert not key.exists()
    cfg = config_file(tmp_path / "c.yaml", {"ssh": {"identity_file": str(key)},
                                            "nodes": [{"name": "spark-a", "host": "spark1", "fabric_ip": "10.0.0.1"},
                                                      {"name": "spark-b", "host": "spark2", "fabric_ip": "10.0.0.2"}]})
    p = cli("doctor", "-c", str(cfg), env=clean_env(tmp_path))
    assert p.returncode == 2 and p.stderr.strip() == _entry("missing-ssh-identity")


@pytest.mark.parametrize("anchor", ["connection-refused", "no-known-hosts"])
def test_the_ssh_lines_are_what_doctor_prints(tmp_path: Path, anchor: str) -> None:
    with socket.socket() as s:  # bound, never listening: refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        home = tmp_path / "home"
        (home / ".ssh").mkdir(parents=True)
        if anchor == "connection-refused":  # past the host-key and key checks, to the TCP connect
            (home / ".ssh" / "known_hosts").write_text("")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")],
                           check=True)
        cfg = config_file(tmp_path / "c.yaml", {
            "nodes": [{"name": "spark-a", "host": "127.0.0.1", "port": port, "user": "ubuntu",
                       "fabric_ip": "10.0.0.1"}], "serve": {"tensor_parallel_size": 1}})
        p = cli("doctor", "-c", str(cfg), env=clean_env(tmp_path))
    want = _entry(anchor).replace("spark1:22", f"127.0.0.1:{port}").replace(
        "ssh-keyscan -H spark1", f"ssh-keyscan -H -p {port} 127.0.0.1").replace(
        str(docs_first_contact.HOME), str(home))
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("error: "))
    assert p.returncode == 3 and line == want, (line, want)


def test_the_lines_built_inline_are_the_codes() -> None:
    doctor = (REPO / "sparkserve" / "deploy" / "doctor.py").read_text()
    assert 'f"' + docs_first_contact.PORT_IN_USE + '"' in doctor
    up = (REPO / "sparkserve" / "deploy" / "preflight.py").read_text()
    assert 'say(f"warning: {name}: the page cache was not dropped before the boot ({f.drop}) — "' in up
    assert re.search(r"sudo -n cannot drop the page cache \(\{f\.sudo\}\) — \"", (
        REPO / "sparkserve" / "nodes" / "hostfacts.py").read_text())
