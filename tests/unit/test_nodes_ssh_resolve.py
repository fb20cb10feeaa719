"""A node's SSH settings resolved the OpenSSH way (~/.ssh/config aliases, keys, agent), and rsync's ssh argv
resolving to the same place as paramiko (checked with OpenSSH's own `ssh -G`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sparkserve.config import NodeConfig, SSHConfig
from sparkserve.nodes.base import NodeError
from sparkserve.nodes.ssh_connect import SSHTarget, _auth_kwargs
from sparkserve.nodes.ssh_resolve import resolve, ssh_argv

CONFIG = """\
Host spark1
  HostName 192.0.2.11
  User alice
  Port 2200
  IdentityFile {home}/.ssh/spark_key
Host spark2
  HostName 192.0.2.12
  IdentitiesOnly yes
  IdentityFile {home}/.ssh/spark_key
  UserKnownHostsFile {home}/.ssh/kh_spark
  StrictHostKeyChecking accept-new
Host jumped
  HostName 10.9.9.9
  ProxyJump bob@spark1:2201
Host noagent
  IdentityAgent none
Host *
  ServerAliveInterval 30
"""


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "config").write_text(CONFIG.format(home=h))
    (h / ".ssh" / "spark_key").write_text("key\n")
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    return h


def _node(host: str, **kw: object) -> NodeConfig:
    return NodeConfig(name="n", host=host, fabric_ip="10.0.0.1", **kw)  # type: ignore[arg-type]


def test_an_alias_takes_hostname_user_port_and_key_from_the_ssh_config(home: Path) -> None:
    r = resolve(_node("spark1"), SSHConfig())
    assert (r.hostname, r.port, r.user) == ("192.0.2.11", 2200, "alice")
    assert r.identities == (home / ".ssh" / "spark_key",)  # the default ~/.ssh/id_ed25519 is absent: skipped
    assert r.missing_identities == (home / ".ssh" / "id_ed25519",)
    assert r.use_agent and not r.identities_only and r.in_config
    assert r.known_hosts == (home / ".ssh" / "known_hosts",) and not r.accept_new


def test_what_the_sparkserve_config_writes_wins_over_the_ssh_config(home: Path) -> None:
    r = resolve(_node("spark1", user="root", port=22), SSHConfig(known_hosts=home / "mine"))
    assert (r.hostname, r.port, r.user) == ("192.0.2.11", 22, "root")
    assert r.known_hosts == (home / "mine",)


def test_identities_only_known_hosts_and_accept_new_come_from_the_host_block(home: Path) -> None:
    r = resolve(_node("spark2"), SSHConfig())
    assert r.identities_only and r.accept_new
    assert r.known_hosts == (home / ".ssh" / "kh_spark",)
    assert r.user == "root"  # neither file names one: sparkserve's default


def test_the_agent_is_off_with_identity_agent_none_or_without_a_socket(home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert not resolve(_node("noagent"), SSHConfig()).use_agent
    monkeypatch.delenv("SSH_AUTH_SOCK")
    assert not resolve(_node("spark1"), SSHConfig()).use_agent


def test_a_plain_address_with_no_ssh_config_is_taken_as_is(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    r = resolve(_node("10.1.1.1", user="ubuntu"), SSHConfig())
    assert (r.hostname, r.port, r.user, r.ssh_config, r.in_config) == ("10.1.1.1", 22, "ubuntu", None, False)


def test_proxy_jump_resolves_its_hop_through_the_same_config(home: Path) -> None:
    t = SSHTarget.from_config(_node("jumped"), SSHConfig())
    assert t.r.proxy_jump == "bob@spark1:2201" and t.jump is not None
    assert (t.jump.host, t.jump.port, t.jump.user) == ("192.0.2.11", 2201, "bob")


def test_no_key_anywhere_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    t = SSHTarget.from_config(_node("10.1.1.1"), SSHConfig())
    with pytest.raises(NodeError) as e:
        _auth_kwargs(t)
    assert e.value.line().startswith("error: n: ssh: no key to offer: no key file (")
    assert "SSH_AUTH_SOCK is not set); run `eval $(ssh-agent) && ssh-add`" in e.value.line()


@pytest.mark.parametrize("alias", ["spark1", "spark2", "jumped", "10.1.1.1"])
def test_openssh_resolves_the_rsync_argv_to_what_paramiko_connects_to(home: Path, alias: str) -> None:
    r = resolve(_node(alias), SSHConfig())
    argv = ssh_argv(r, connect_timeout=5, keepalive=15)
    p = subprocess.run([*argv, "-G", alias], capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    got = dict(line.split(" ", 1) for line in p.stdout.splitlines() if " " in line)
    assert got["hostname"] == r.hostname and got["port"] == str(r.port) and got["user"] == r.user
    assert got["userknownhostsfile"] == " ".join(str(k) for k in r.known_hosts)
    assert got["stricthostkeychecking"] == ("accept-new" if r.accept_new else "true")
    assert got["batchmode"] == "yes"
    assert got.get("proxyjump", "none") == (r.proxy_jump or "none")
    for key in r.identities:
        assert f"identityfile {key}" in p.stdout
