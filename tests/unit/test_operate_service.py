"""The systemd unit `sparkserve service install` writes, and sd_notify spoken over a real unix socket."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from sparkserve.config import load_config
from sparkserve.operate import sdnotify
from sparkserve.operate.service import quote, unit_text

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


def test_the_unit_is_notify_with_a_watchdog_ordered_after_network_and_docker(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    text = unit_text(load_config(path), path, scope="user", python="/opt/venv/bin/python")
    lines = text.splitlines()
    assert "Type=notify" in lines and "After=network-online.target docker.service" in lines
    assert "Wants=network-online.target" in lines and "WantedBy=default.target" in lines
    assert f'ExecStart="/opt/venv/bin/python" "-m" "sparkserve" "supervise" "--up" "-c" "{path.resolve()}"' in lines
    assert "WatchdogSec=60" in lines  # max(60, 6 × 5 + 2 × 10)
    assert "RestartPreventExitStatus=1 2" in lines and "Restart=on-failure" in lines
    assert "WantedBy=multi-user.target" in unit_text(load_config(path), path, scope="system")


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
