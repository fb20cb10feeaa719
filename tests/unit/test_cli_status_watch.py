"""`status --watch`: one document per refresh (JSON Lines with --json) until Ctrl-C, which exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from _fixtures import clean_env, config_file


def test_status_watch_refreshes_until_ctrl_c_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "kh").write_text("")
    cfg = config_file(tmp_path / "c.yaml", {"nodes": [
        {"name": "a", "host": "127.0.0.1", "port": 1, "fabric_ip": "10.0.0.1"},
        {"name": "b", "host": "127.0.0.1", "port": 2, "fabric_ip": "10.0.0.2"}],
        "ssh": {"known_hosts": str(tmp_path / "kh"), "connect_timeout_s": 2}})
    env = clean_env(tmp_path)
    (Path(env["HOME"]) / ".ssh").mkdir()
    (Path(env["HOME"]) / ".ssh" / "id_ed25519").write_text("a key\n")
    p = subprocess.Popen([sys.executable, "-m", "sparkserve", "status", "--watch", "1", "--json", "-c", str(cfg)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert p.stdout is not None
        docs = [json.loads(p.stdout.readline()) for _ in range(2)]  # two refreshes, a line each
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and err == "", err
    for d in docs:
        assert d["schema"] == 1 and set(d["unreachable"]) == {"a", "b"} and d["serving"] is None
