"""The operator's own SSH setup on the rig: a private HOME with a real ~/.ssh/config (hosts as aliases), hashed
known_hosts from `ssh-keyscan -H`, and the key held only by a real ssh-agent — for paramiko, for rsync's
OpenSSH, and for the CLI as the README's quick start runs it. Each way it can be wrong is one line saying
what to run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sparkserve.config import NodeConfig, SSHConfig
from sparkserve.nodes import NodeError, SSHNode

pytestmark = pytest.mark.rig
REPO = Path(__file__).resolve().parents[2]


@dataclass
class OperatorHome:
    home: Path
    env: dict[str, str]  # HOME and SSH_AUTH_SOCK of this operator
    key: Path  # held by the agent; not in ~/.ssh, not named in any config
    aliases: dict[str, str]  # alias -> rig node name


@pytest.fixture()
def operator(rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OperatorHome]:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    aliases = {f"spark{i + 1}": n.name for i, n in enumerate(rig.nodes[:2])}
    blocks = [f"Host spark{i + 1}\n  HostName {n.host}\n  Port {n.port}\n  User {rig.user}\n"
              for i, n in enumerate(rig.nodes[:2])]
    (ssh / "config").write_text("".join(blocks))
    scan = subprocess.run(["ssh-keyscan", "-H", "-p", str(rig.nodes[0].port), *[n.host for n in rig.nodes[:2]]],
                          capture_output=True, text=True, timeout=30, check=True)
    assert scan.stdout.startswith("|1|"), scan.stdout
    (ssh / "known_hosts").write_text(scan.stdout)
    key = tmp_path / "keys" / "operator_key"
    key.parent.mkdir()
    shutil.copy(rig.identity_file, key)
    key.chmod(0o600)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        env = {"HOME": str(home), "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(key)], env={**os.environ, **env}, check=True, timeout=20,
                       capture_output=True)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        yield OperatorHome(home, env, key, aliases)
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def _node(alias: str, **ssh: object) -> SSHNode:
    return SSHNode(NodeConfig(name=alias, host=alias, fabric_ip="10.0.0.1"), SSHConfig(**ssh))  # type: ignore[arg-type]


def test_an_alias_and_the_agent_reach_the_node_for_paramiko_and_rsync(operator: OperatorHome, rig) -> None:  # type: ignore[no-untyped-def]
    node = _node("spark2")
    try:
        assert node.address == f"{rig.user}@{rig.nodes[1].host}:{rig.nodes[1].port}"
        assert node.run(["cat", "/etc/hostname"]).ok
        r = node.rsync_remote()
        assert "-i" not in r.ssh_argv  # no key file: the agent's key is the only one
        p = subprocess.run([*r.ssh_argv, r.target, "echo", "via-openssh"], capture_output=True, text=True,
                           timeout=30, env={**os.environ, **operator.env})
        assert p.returncode == 0 and p.stdout == "via-openssh\n", p.stderr
    finally:
        node.close()


def test_proxy_jump_reaches_a_node_through_another(operator: OperatorHome, rig) -> None:  # type: ignore[no-untyped-def]
    b = rig.nodes[1]
    with (operator.home / ".ssh" / "config").open("a") as f:
        f.write(f"Host spark2-via-1\n  HostName {b.host}\n  Port {b.port}\n  User {rig.user}\n  ProxyJump spark1\n")
    node = _node("spark2-via-1")
    try:
        assert node.target.jump is not None and node.target.jump.host == rig.nodes[0].host
        assert node.run(["echo", "jumped"]).stdout == "jumped\n"
        r = node.rsync_remote()
        assert any(a.startswith("ProxyCommand=ssh ") and a.endswith(" -W %h:%p spark1") for a in r.ssh_argv)
        p = subprocess.run([*r.ssh_argv, r.target, "echo", "jumped-too"], capture_output=True, text=True,
                           timeout=30, env={**os.environ, **operator.env})
        assert p.returncode == 0 and p.stdout == "jumped-too\n", p.stderr
    finally:
        node.close()


def test_each_way_to_be_wrong_is_one_line_that_says_what_to_run(operator: OperatorHome, rig) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NodeError) as e:
        _node("spark9").connect()
    assert e.value.line() == (
        f"error: spark9: ssh: cannot resolve 'spark9': not a known host name and no `Host spark9` block in "
        f"{operator.home / '.ssh' / 'config'}; add one (Host spark9 / HostName <address> / User <user>) or use "
        "the address")

    kh = operator.home / "kh_changed"
    n = rig.nodes[1]
    import paramiko

    wrong = paramiko.Ed25519Key.from_private_key_file(str(operator.key))  # not node-b's host key
    kh.write_text(f"{paramiko.HostKeys.hash_host(f'[{n.host}]:{n.port}')} ssh-ed25519 {wrong.get_base64()}\n")
    with pytest.raises(NodeError) as e:
        _node("spark2", known_hosts=kh, accept_new_host_keys=True).connect()
    assert "CHANGED" in e.value.line() and f"ssh-keygen -R '[{n.host}]:{n.port}' -f {kh}" in e.value.line()

    with pytest.raises(NodeError) as e:
        _node("spark2", known_hosts=operator.home / "empty_kh").connect()
    assert f"`ssh-keyscan -H -p {n.port} {n.host} >> {operator.home / 'empty_kh'}`" in e.value.line()

    subprocess.run(["ssh-add", "-D"], env={**os.environ, **operator.env}, check=True, capture_output=True)
    with pytest.raises(NodeError) as e:
        _node("spark2").connect()
    assert e.value.line() == (
        f"error: spark2: ssh: no key to offer: no key file ({operator.home / '.ssh' / 'id_ed25519'} does not "
        "exist) and the ssh-agent holds no keys; run `ssh-add` (or `ssh-add ~/.ssh/id_ed25519`)")


def test_the_readme_quick_start_runs_with_aliases_and_the_agent(operator: OperatorHome, rig, tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(Path(rig.rig_yaml).read_text())
    by_name = {v: k for k, v in operator.aliases.items()}
    data["nodes"] = [dict(n, host=by_name[n["name"]]) for n in data["nodes"] if n["name"] in by_name]
    for n in data["nodes"]:
        n.pop("port", None)  # from ~/.ssh/config
        n.pop("user", None)
    data.pop("ssh", None)  # ~/.ssh/known_hosts, the agent: what `sparkserve init` leaves
    data["serve"]["tensor_parallel_size"] = len(data["nodes"])
    cfg = tmp_path / "sparkserve.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, **operator.env, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("SPARKSERVE_CONFIG", None)
    p = subprocess.run([sys.executable, "-m", "sparkserve", "doctor", "--json"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    doc = json.loads(p.stdout)
    ssh = {c["node"]: c for c in doc["checks"] if c["name"] == "ssh"}
    assert set(ssh) == set(by_name) and all(c["status"] == "ok" for c in ssh.values()), p.stdout
    assert doc["schema"] == 1
    assert p.returncode in (0, 1), p.stderr  # 1: a node check (ports/memory on a busy rig) may fail; ssh did not
    p = subprocess.run([sys.executable, "-m", "sparkserve", "validate", "--parser", "list"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    head = data["nodes"][0]["name"]
    assert f"[on {head} (head): {data['drafter']['path']}]" in p.stdout  # the laptop has no model: the head does
