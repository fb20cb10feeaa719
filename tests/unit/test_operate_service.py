"""The systemd unit `sparkserve service install` writes, and sd_notify spoken over a real unix socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sparkserve.config import load_config
from sparkserve.errors import RemoteFailure
from sparkserve.operate import sdnotify
from sparkserve.operate.service import WAIT_S, node_endpoints, quote, unit_text, wait_for_nodes

CONFIG = """
nodes: [{name: a, host: a.example, fabric_ip: 10.0.0.1}]
image: {ref: img}
model: {target: /m/t, served_name: glm}
drafter: {path: /m/d}
serve: {tensor_parallel_size: 1}
supervise: {interval_s: 5, canary_deadline_s: 10}
"""


def write_config(tmp_path: Path) -> Path:
    p = tmp_path / "dir with space" / "sparkserve.yaml"
    p.parent.mkdir()
    p.write_text(CONFIG)
    return p


def test_the_unit_is_notify_with_a_watchdog_and_comes_back_after_a_reboot_in_either_scope(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    cfg = load_config(path)
    lines = unit_text(cfg, path, scope="user", python="/opt/venv/bin/python").splitlines()
    assert "Type=notify" in lines and "WantedBy=default.target" in lines
    assert f'ExecStart="/opt/venv/bin/python" "-m" "sparkserve" "supervise" "--up" "-c" "{path.resolve()}"' in lines
    assert "WatchdogSec=60" in lines  # max(60, 6 × 5 + 2 × 10)
    assert "RestartPreventExitStatus=1 2" in lines and "Restart=on-failure" in lines
    # a user manager ignores ordering on system units (network-online.target, docker.service): the unit waits
    assert not [ln for ln in lines if ln.startswith(("After=", "Wants="))]
    assert (f'ExecStartPre="/opt/venv/bin/python" "-m" "sparkserve" "service" "wait" "-c" "{path.resolve()}" '
            f'"--timeout" "{WAIT_S}"') in lines
    system = unit_text(cfg, path, scope="system", user="alice").splitlines()
    assert "WantedBy=multi-user.target" in system and "User=alice" in system
    assert "After=network-online.target docker.service" in system and "Wants=network-online.target" in system
    assert not [ln for ln in system if ln.startswith("ExecStartPre=")]


@pytest.mark.parametrize("scope", ["user", "system"])
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path: Path, scope: str) -> None:
    import getpass

    path = write_config(tmp_path)
    unit = tmp_path / "sparkserve-supervise.service"
    unit.write_text(unit_text(load_config(path), path, scope=scope, user=getpass.getuser()))  # type: ignore[arg-type]
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    p = subprocess.run(["systemd-analyze", *(["--user"] if scope == "user" else []), "verify", "--man=no", str(unit)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
    assert p.returncode == 0 and p.stderr == "" and p.stdout == "", p.stderr or p.stdout


def test_the_wait_returns_once_every_node_answers_and_names_the_one_that_never_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen()
        b.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        docker = tmp_path / "docker.sock"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(docker))
        srv.listen()

        def answer() -> None:
            conn, _ = srv.accept()
            conn.recv(100)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        monkeypatch.setenv("DOCKER_HOST", f"unix://{docker}")
        nodes = [{"name": "head", "host": "h", "fabric_ip": "10.0.0.1", "local": True},
                 {"name": "b", "host": "127.0.0.1", "port": a.getsockname()[1], "fabric_ip": "10.0.0.2"}]
        cfg = load_config(write_config(tmp_path), overrides={"nodes": nodes, "ssh": {"config_file": None}})
        assert node_endpoints(cfg) == [("head", "docker"), ("b", f"127.0.0.1:{a.getsockname()[1]}")]
        assert wait_for_nodes(cfg, timeout_s=10, interval_s=0.1) < 10
        nodes[1]["port"] = b.getsockname()[1]
        (tmp_path / "2").mkdir()
        cfg = load_config(write_config(tmp_path / "2"), overrides={"nodes": nodes[1:], "ssh": {"config_file": None}})
        with pytest.raises(RemoteFailure) as e:
            wait_for_nodes(cfg, timeout_s=0.5, interval_s=0.1)
        assert e.value.where == "b" and f"127.0.0.1:{b.getsockname()[1]} did not answer within 0.5s" in e.value.what
        srv.close()


def test_exec_start_words_are_quoted_as_systemd_reads_them() -> None:
    assert quote('a "b" c\\d') == '"a \\"b\\" c\\\\d"'
    assert quote("50%$HOME") == '"50%%$$HOME"'


def test_install_status_uninstall_through_the_cli(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    units = tmp_path / "units"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sparkserve", "service", *args], capture_output=True, text=True,
                              timeout=60)

    assert cli("status", "--unit-dir", str(units)).returncode == 1
    p = cli("install", "-c", str(cfg), "--unit-dir", str(units))
    assert p.returncode == 0, p.stderr
    unit = units / "sparkserve-supervise.service"
    assert "Type=notify" in unit.read_text() and "wrote" in p.stdout
    p = cli("status", "--unit-dir", str(units))
    assert p.returncode == 0 and "installed" in p.stdout
    assert cli("install", "-c", str(cfg), "--unit-dir", str(units), "--scope", "galaxy").returncode == 2
    assert cli("uninstall", "--unit-dir", str(units)).returncode == 0 and not unit.exists()


def test_sd_notify_sends_one_datagram_to_the_notify_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        assert sdnotify.notify("READY=1\nSTATUS=watching", env={"NOTIFY_SOCKET": path})
        assert s.recv(100) == b"READY=1\nSTATUS=watching"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0sparkserve-test-notify")
        assert sdnotify.notify("WATCHDOG=1", env={"NOTIFY_SOCKET": "@sparkserve-test-notify"})
        assert s.recv(100) == b"WATCHDOG=1"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:  # a receiver that never reads: no send blocks
        s.bind(str(tmp_path / "full"))
        sent = [sdnotify.notify("WATCHDOG=1", env={"NOTIFY_SOCKET": str(tmp_path / "full")}) for _ in range(2000)]
        assert sent[0] and not sent[-1]  # the queue filled up; the rest were dropped, none waited
    assert not sdnotify.notify("READY=1", env={})
    assert not sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "nobody")})


def test_the_watchdog_period_is_half_of_watchdog_usec_for_this_process() -> None:
    import os

    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "60000000"}) == 30.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}) == 30.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval_s({}) is None
