"""`sparkserve init`'s file makes no key mandatory (issue 33): "if `ssh spark1` works, sparkserve works" for a key
in the ssh-agent, a key named in ~/.ssh/config, or one of OpenSSH's default key files.

The init file is written by the real CLI; a command that would connect then gets past the identity check (it
fails later, at the connect, with exit 3 — never exit 2 on `ssh.identity_file`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from _fixtures import clean_env, cli

from sparkserve.config import load_config
from sparkserve.nodes.factory import check_identity_file
from sparkserve.nodes.ssh_connect import SSHTarget, _auth_kwargs
from sparkserve.nodes.ssh_resolve import resolve


def _init(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    env = clean_env(tmp_path)
    p = cli("init", str(tmp_path / "sparkserve.yaml"), env=env)
    assert p.returncode == 0, p.stderr
    return tmp_path / "sparkserve.yaml", env


def test_the_init_file_names_no_identity_file(tmp_path: Path) -> None:
    path, _ = _init(tmp_path)
    data = yaml.safe_load(path.read_text())
    assert "identity_file" not in data["ssh"]
    assert "# identity_file: ~/.ssh/id_ed25519" in path.read_text()  # there to uncomment, with what it is for


def test_a_command_on_the_init_file_gets_past_the_identity_check_with_no_key_file(tmp_path: Path) -> None:
    path, env = _init(tmp_path)
    text = path.read_text().replace("spark-a.lan", "127.0.0.1").replace("spark-b.lan", "127.0.0.2")
    path.write_text(text.replace("user: ubuntu", "user: ubuntu\n    port: 9"))  # nothing listens on port 9
    assert not (Path(env["HOME"]) / ".ssh" / "id_ed25519").exists()
    p = cli("doctor", "-c", str(path), env={**env, "SPARKSERVE_SSH__CONNECT_TIMEOUT_S": "2"})
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "identity_file" not in p.stderr and "127.0.0.1" in p.stdout + p.stderr


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return h


def _cfg(tmp_path: Path):  # the init file, hosts filled in as ~/.ssh/config aliases
    path, _ = _init(tmp_path)
    path.write_text(path.read_text().replace("spark-a.lan", "spark1").replace("spark-b.lan", "spark2"))
    return load_config(path)


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_a_key_named_in_the_ssh_config_is_offered(tmp_path: Path, home: Path) -> None:
    key = _keygen(home / ".ssh" / "spark_key")
    (home / ".ssh" / "config").write_text(f"Host spark1 spark2\n  IdentityFile {key}\n")
    cfg = _cfg(tmp_path)
    check_identity_file(cfg)  # no BadInput
    r = resolve(cfg.nodes[0], cfg.ssh)
    assert r.identities == (key,)
    assert _auth_kwargs(SSHTarget.from_config(cfg.nodes[0], cfg.ssh))["key_filename"] == [str(key)]


def test_openssh_default_key_files_are_offered_when_none_is_named(tmp_path: Path, home: Path) -> None:
    rsa = home / ".ssh" / "id_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)], check=True)
    cfg = _cfg(tmp_path)
    check_identity_file(cfg)
    assert resolve(cfg.nodes[0], cfg.ssh).identities == (rsa,)
    # a key the user names is what is offered: no default key files beside it
    (home / ".ssh" / "config").write_text(f"Host spark1\n  IdentityFile {_keygen(home / '.ssh' / 'k2')}\n")
    assert resolve(cfg.nodes[0], cfg.ssh).identities == (home / ".ssh" / "k2",)


def test_a_key_only_in_the_agent_logs_in(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = _keygen(tmp_path / "agent_only")
    agent = subprocess.run(["ssh-agent", "-s", "-a", str(tmp_path / "agent.sock")], capture_output=True, text=True,
                           check=True).stdout
    pid = int(agent.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
        subprocess.run(["ssh-add", "-q", str(key)], check=True, capture_output=True)
        key.unlink()  # only the agent holds it now
        cfg = _cfg(tmp_path)
        check_identity_file(cfg)
        t = SSHTarget.from_config(cfg.nodes[0], cfg.ssh)
        assert t.r.identities == () and t.r.use_agent
        assert _auth_kwargs(t)["allow_agent"] is True
    finally:
        subprocess.run(["kill", str(pid)], check=False)

