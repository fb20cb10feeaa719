"""``scripts/rig`` on a separate, three-node rig: up, up again (reused), status, down leaves nothing behind.

It runs beside the session rig (own directory, addresses 127.0.0.20-22, port 2223, node root /srv/spark-lc)
and shares only the cache of the base rootfs tarball and model fixtures.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

RIG_PY = Path(__file__).resolve().parent / "rig.py"
pytestmark = pytest.mark.rig


def rigcmd(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RIG_PY), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def pids_referencing(path: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if path in p.joinpath("cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def test_up_reuse_status_and_down_leave_nothing(rig) -> None:
    rig_dir = Path(tempfile.mkdtemp(prefix="ssrig-"))  # short: unix socket paths live below it
    env = {**os.environ, "SSRIG_DIR": str(rig_dir), "SSRIG_NODE_ROOT": "/srv/spark-lc", "SSRIG_IP_BASE": "20",
           "SSRIG_SSH_PORT": "2223", "SSRIG_CACHE": str(rig.dir / "cache")}
    try:
        t0 = time.monotonic()
        p = rigcmd(env, "up", "--nodes", "3")
        cold = time.monotonic() - t0
        assert p.returncode == 0, p.stderr
        info = json.loads((rig_dir / "rig.json").read_text())
        assert [n["host"] for n in info["nodes"]] == ["127.0.0.20", "127.0.0.21", "127.0.0.22"]
        first_pids = info["pids"]

        t0 = time.monotonic()
        p = rigcmd(env, "up")
        warm = time.monotonic() - t0
        assert p.returncode == 0, p.stderr
        assert json.loads((rig_dir / "rig.json").read_text())["pids"] == first_pids  # reused, not restarted
        assert warm < cold and warm < 10
        print(f"\nthree-node rig (base tarball cached): up {cold:.1f}s, warm up {warm:.1f}s")

        assert rigcmd(env, "status").returncode == 0
        node_c = info["nodes"][2]
        subprocess.run(["docker", "-H", f"unix://{node_c['docker_socket']}", "run", "-d", "--network", "none",
                        info["image"]["ref"], "sleep", "600"], check=True, capture_output=True)
        with socket.create_connection((node_c["host"], 2223), timeout=5):
            pass

        p = rigcmd(env, "down")
        assert p.returncode == 0, p.stderr
        assert pids_referencing(str(rig_dir)) == []
        assert [ln for ln in Path("/proc/self/mounts").read_text().splitlines() if str(rig_dir) in ln] == []
        for pid_group in first_pids.values():
            for pid in pid_group.values():
                assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        for n in info["nodes"]:
            with pytest.raises(OSError):
                socket.create_connection((n["host"], 2223), timeout=1).close()
        assert rigcmd(env, "status").returncode == 1
        assert not Path("/srv/spark-lc").exists()
    finally:
        rigcmd(env, "down", "--purge")
    assert not (rig_dir / "nodes").exists() and pids_referencing(str(rig_dir)) == []
    shutil.rmtree(rig_dir, ignore_errors=True)
