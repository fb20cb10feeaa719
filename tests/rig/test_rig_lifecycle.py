"""``scripts/rig`` on a separate, three-node rig: up, up again (reused), status, down leaves nothing behind —
and two rigs at once cannot interfere.

It runs beside the session rig (own directory, addresses 127.0.0.20-22, port 2223) and shares with it the
cache (base rootfs tarball, model fixtures) and, on purpose, the node root ``/srv/spark``: every node of both
rigs mounts its own directory there in its own mount namespace, and each node has a private ``/tmp``. Taking
the second rig down while a session-rig node serves must leave that node's mounts, files and /tmp alone (once,
``down`` removed the empty host ``/srv/spark``, which silently unmounted it inside every other rig's nodes).
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
import urllib.request
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
    rig_dir = Path(tempfile.mkdtemp(prefix="ssrig-", dir="/var/tmp"))  # short (unix sockets), not under /tmp
    env = {**os.environ, "SSRIG_DIR": str(rig_dir), "SSRIG_NODE_ROOT": str(rig.node_root), "SSRIG_IP_BASE": "20",
           "SSRIG_SSH_PORT": "2223", "SSRIG_CACHE": str(rig.dir / "cache")}
    head = rig.head
    served = subprocess.run(  # a session-rig node serving its own node-local files while the other rig lives
        ["docker", "-H", head.docker_url, "run", "-d", "--rm", "--network", "host", "-v",
         f"{rig.node_root}/models:/models:ro", rig.image_ref, "python3", "-m", "http.server", "18089", "--bind",
         head.host, "--directory", "/models"], check=True, capture_output=True, text=True).stdout.strip()
    url = f"http://{head.host}:18089/target/config.json"
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
        # each node's /tmp is its own: a file made on the second rig's node is nowhere else
        marker = f"ssrig-isolation-{os.getpid()}"
        second = subprocess.run(["/usr/bin/ssh", "-F", str(rig_dir / "ssh" / "config"), "-p", "2223",
                                 f"root@{info['nodes'][0]['host']}", f"touch /tmp/{marker} && ls /tmp"],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 0 and marker in second.stdout.split(), second.stderr
        assert not Path("/tmp", marker).exists()
        mine = subprocess.run(rig.ssh_argv(head, "ls", "/tmp"), capture_output=True, text=True, timeout=30)
        assert mine.returncode == 0 and marker not in mine.stdout.split(), mine.stderr
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
        # the session rig still serves, through the same mount point the other rig's nodes used
        assert rig.node_root.is_dir()
        with urllib.request.urlopen(url, timeout=10) as r:
            assert json.loads(r.read())["architectures"]
        still = subprocess.run(rig.ssh_argv(head, "test", "-f", f"{rig.node_root}/models/target/config.json"),
                               capture_output=True, text=True, timeout=30)
        assert still.returncode == 0, still.stderr
    finally:
        rigcmd(env, "down", "--purge")
        subprocess.run(["docker", "-H", head.docker_url, "rm", "-f", served], capture_output=True)
    assert not (rig_dir / "nodes").exists() and pids_referencing(str(rig_dir)) == []
    shutil.rmtree(rig_dir, ignore_errors=True)
