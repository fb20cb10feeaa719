"""SSHNode on the rig's real sshd: argv, timeouts, files, host keys, keepalive, reconnect."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import _nodes_rig
import pytest

from sparkserve.config import Config, NodeConfig, SSHConfig
from sparkserve.nodes import NodeError, SSHNode

pytestmark = pytest.mark.rig
globals().update(_nodes_rig.FIXTURES)  # rig_cfg, node_b, node_scratch, …

PWNED = "/tmp/pwned"


def _ssh(cfg: Config, **over: object) -> SSHConfig:
    return cfg.ssh.model_copy(update=over)


def _node(cfg: Config, i: int = 1, **ssh_over: object) -> SSHNode:
    return SSHNode(cfg.nodes[i], _ssh(cfg, **ssh_over))


def test_run_returns_stdout_stderr_and_exit_code(node_b: SSHNode) -> None:
    res = node_b.run(["sh", "-c", 'echo out; echo err >&2; exit 3'], check=False)
    assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")


def test_argv_values_are_never_interpreted_by_the_remote_shell(node_b: SSHNode, node_scratch: str) -> None:
    evil = f"{node_scratch}/m/x; touch {PWNED}"
    node_b.run(["rm", "-f", PWNED])
    node_b.run(["mkdir", "-p", evil])
    node_b.write_bytes(f"{evil}/config.json", b"{}")
    assert node_b.run(["ls", "--", evil]).stdout.split() == ["config.json"]
    assert node_b.run(["echo", "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "a'b\"c"]).stdout == \
        "$(touch /tmp/pwned) `touch /tmp/pwned` a'b\"c\n"
    assert not node_b.run(["test", "-e", PWNED], check=False).ok
    assert not Path(PWNED).exists()


def test_nonzero_exit_raises_naming_node_step_command_and_last_lines(node_b: SSHNode) -> None:
    with pytest.raises(NodeError) as ei:
        node_b.run(["sh", "-c", "echo first; echo 'the reason' >&2; exit 7"], step="disk check")
    e = ei.value
    quoted = "sh -c 'echo first; echo '\"'\"'the reason'\"'\"' >&2; exit 7'"
    assert e.line() == f"error: {node_b.name}: disk check: {quoted} exited 7"
    assert e.last_lines[-1] == "the reason" and e.exit_code == 3


def test_timeout_raises_and_kills_the_remote_process(node_b: SSHNode) -> None:
    t0 = time.monotonic()
    with pytest.raises(NodeError, match=r"timed out after 1s"):
        node_b.run(["sleep", "47.25"], timeout=1, step="wait")
    assert time.monotonic() - t0 < 4
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        if not node_b.run(["pgrep", "-f", "^sleep 47.25$"], check=False).ok:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the remote sleep survived the timeout")


def test_stdin_is_fed_to_the_command(node_b: SSHNode) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, binary
    res = node_b.run(["sha256sum"], stdin=data)
    import hashlib

    assert res.stdout.split()[0] == hashlib.sha256(data).hexdigest()


def test_put_get_read_write_roundtrip(node_b: SSHNode, node_scratch: str, tmp_path: Path) -> None:
    src = tmp_path / "blob"
    src.write_bytes(b"x" * 3_000_001)
    remote = f"{node_scratch}/deep/er/blob"
    node_b.put(src, remote, mode=0o640)
    assert node_b.run(["stat", "-c", "%s %a", remote]).stdout.split() == ["3000001", "640"]
    assert node_b.run(["ls", "-A", f"{node_scratch}/deep/er"]).stdout.split() == ["blob"]  # no temp left
    back = tmp_path / "back"
    node_b.get(remote, back)
    assert back.read_bytes() == src.read_bytes()
    node_b.makedirs(f"{node_scratch}/a/b/c")
    node_b.makedirs(f"{node_scratch}/a/b/c")  # exists: fine
    assert node_b.run(["test", "-d", f"{node_scratch}/a/b/c"]).ok
    node_b.write_bytes(f"{node_scratch}/t.txt", b"hello\n")
    assert node_b.read_text(f"{node_scratch}/t.txt") == "hello\n"
    with pytest.raises(NodeError, match=f"^{node_b.name}: read"):
        node_b.read_text(f"{node_scratch}/missing")


def test_unknown_host_key_is_refused_with_one_line(rig_cfg: Config, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    node = _node(rig_cfg, known_hosts=kh)
    with pytest.raises(NodeError) as ei:
        node.connect()
    line = ei.value.line()
    assert "\n" not in line
    assert line.startswith(f"error: {node.name}: ssh: host key for [{node.host}]:{node.port} is not in {kh}")
    assert "--accept-new-host-keys" in line
    assert kh.read_text() == ""


def test_missing_known_hosts_file_is_refused(rig_cfg: Config, tmp_path: Path) -> None:
    with pytest.raises(NodeError, match="does not exist"):
        _node(rig_cfg, known_hosts=tmp_path / "nope").connect()


def test_accept_new_host_keys_adds_the_key_once(rig_cfg: Config, tmp_path: Path) -> None:
    kh = tmp_path / "kh" / "known_hosts"
    node = _node(rig_cfg, known_hosts=kh, accept_new_host_keys=True)
    node.connect()
    node.close()
    lines = kh.read_text().splitlines()
    import paramiko

    assert len(lines) == 1 and lines[0].startswith("|1|")  # hashed, as `ssh-keyscan -H` / HashKnownHosts write
    assert paramiko.HostKeys(str(kh)).lookup(f"[{node.host}]:{node.port}") is not None
    strict = _node(rig_cfg, known_hosts=kh)  # the added key is now trusted without the flag
    assert strict.run(["true"]).ok
    strict.close()
    assert len(kh.read_text().splitlines()) == 1


def test_changed_host_key_is_refused_even_with_accept_new(rig_cfg: Config, tmp_path: Path) -> None:
    import paramiko

    n = rig_cfg.nodes[1]
    kh = tmp_path / "known_hosts"
    other = paramiko.Ed25519Key.from_private_key_file(str(rig_cfg.ssh.resolved_identity()))  # not a host key
    kh.write_text(f"[{n.host}]:{n.port} ssh-ed25519 {other.get_base64()}\n")
    with pytest.raises(NodeError, match="CHANGED"):
        _node(rig_cfg, known_hosts=kh, accept_new_host_keys=True).connect()


def test_wrong_key_and_closed_port_are_one_line_errors(rig_cfg: Config, tmp_path: Path) -> None:
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(NodeError, match=f"authentication as root failed \\(offered {key}\\).*ssh-copy-id"):
        _node(rig_cfg, identity_file=key).connect()
    closed = SSHNode(NodeConfig(name="gone", host="127.0.0.9", port=2, fabric_ip="127.0.0.9"),
                     _ssh(rig_cfg, connect_timeout_s=3))
    refused = r"^gone: ssh: cannot connect to root@127\.0\.0\.9:2: connection refused"
    with pytest.raises(NodeError, match=refused):
        closed.connect()


def test_keepalive_is_on_and_a_dropped_connection_is_reopened(rig_cfg: Config) -> None:
    node = _node(rig_cfg)
    client = node.ssh_client()
    t = client.get_transport()
    assert t is not None
    assert t.packetizer._Packetizer__keepalive_interval == rig_cfg.ssh.keepalive_s  # type: ignore[attr-defined]
    t.close()  # the link drops
    assert node.run(["echo", "again"]).stdout == "again\n"
    assert node.ssh_client() is not client
    node.close()


def test_connect_is_fast(rig_cfg: Config) -> None:
    node = _node(rig_cfg)
    node.connect()
    assert node.connect_seconds is not None and node.connect_seconds < 2.0
    node.close()


def test_an_interrupt_stops_put_mid_file_within_a_second_and_leaves_no_temp_file(
        node_b: SSHNode, node_scratch: str, tmp_path: Path) -> None:
    import threading

    from sparkserve import interrupts

    big = tmp_path / "big.bin"
    with big.open("wb") as f:
        f.truncate(8 * 2**30)  # sparse: read fast here, far more than a second to send
    remote = f"{node_scratch}/big.bin"
    seen: list[int] = []
    timer = threading.Timer(0.5, lambda: interrupts.note(KeyboardInterrupt()))
    try:
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(NodeError, match="interrupted: the copy of .* was stopped"):
            node_b.put(big, remote, on_bytes=seen.append)
        stopped_after = time.monotonic() - t0 - 0.5
    finally:
        timer.cancel()
        interrupts.reset()
    assert 0 < seen[-1] < big.stat().st_size and stopped_after < 1.5
    left = node_b.run(["ls", "-A", node_scratch]).stdout.split()
    assert left == [], left
