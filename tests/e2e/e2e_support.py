"""End-to-end helpers: the real `sparkserve` CLI against the rig's real sshd + dockerd nodes.

    def test_x(e2e):                                    # pytestmark = pytest.mark.rig
        cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "crash_boot@rank=1"}}})
        p = e2e.cli("up", cfg=cfg)                      # subprocess: .venv/bin/sparkserve up -c cfg
        e2e.assert_explained(p, code=3, node="node-b", step="boot")
        assert e2e.leftovers() == {}                    # no container we started, on any node

Every test module holds the rig exclusively while it runs (``rig.exclusive_use()``: an flock on
``$SSRIG_DIR/.test-lock``, also taken by the shared ``rig_clean`` fixture): other test processes and manual
experiments (``flock /var/lib/sparkserve-rig/.test-lock CMD``) wait for it.
Per-test configs are rig.yaml plus overrides: free API/rendezvous ports on the head's loopback address, a
container name prefix of our own, a short emulator boot, a small smoke cell, a low GMU (the machine is
shared) and a private state dir (journal, saved logs) for the session.

Both runtimes: a test parametrised with ``@BOTH_RUNTIMES`` gets an ``e2e`` whose configs say ``runtime:
process`` in the second run (the emulator as a host process on each node: ``/srv/spark/bin/vllm``, run dirs
under :data:`PROCESS_RUN_DIR`); ``managed``, ``leftovers``, ``running_ids``, ``kill_rank`` and ``clean`` then
look at the nodes' processes and manifests instead of their containers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SPARKSERVE = REPO / ".venv" / "bin" / "sparkserve"
PREFIX = "e2e"  # container.name_prefix of every stack these tests start
FAST_ENV = {  # emulator timings short enough for tests (real vLLM: 60 s / 600 s)
    "SSEMU_BOOT_SECONDS": "1.2",
    "VLLM_RINGBUFFER_WARNING_INTERVAL": "2",
    "SSEMU_PEER_TIMEOUT_S": "3",
    "SSEMU_NCCL_TIMEOUT_S": "2",
}
SETTLE_S = 1.0  # gates.settle_s of every e2e config (default 3 s): a test about the settle window sets its own
SMALL_SMOKE = {"prompts": 3, "concurrency": 1, "max_tokens": 32, "request_timeout_s": 10}
ONE_SCREEN = 40  # lines from the `error:` line to the end of stderr
RUNTIMES = ["docker", "process"]
BOTH_RUNTIMES = pytest.mark.parametrize("e2e", RUNTIMES, indirect=True)  # the test runs on each runtime
PROCESS_RUN_DIR = "/srv/spark/e2e-run"  # runtime process: process.run_dir of every e2e config (node-local)
MARKER_ENV = "SPARKSERVE_RANK_ID"  # what every process of a rank carries (sparkserve.nodes.process_remote)

RIG_TESTS = Path(__file__).resolve().parents[1] / "rig"
if str(RIG_TESTS) not in sys.path:
    sys.path.insert(0, str(RIG_TESTS))


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class E2E:
    rig: Any  # tests/rig/rig.py RigHandle
    docker: dict  # node name -> docker.DockerClient on the node's own unix socket
    state: Path  # XDG_STATE_HOME of every sparkserve run (journal, saved logs)
    tmp: Path
    configs: list[Path] = field(default_factory=list)
    runtime: str = "docker"

    # -- configs ----------------------------------------------------------------------------------------

    def base(self) -> dict:
        data = yaml.safe_load(self.rig.rig_yaml.read_text())
        head = self.rig.head.host
        # Memory asks are small (GMU 0.1, a 1 GiB watchdog floor): the emulator uses none of it, and a test
        # that is not about memory must not fail because the machine is busy (seen: 5.9 GiB free under load).
        body = merge(data, {
            "serve": {"port": free_port(head), "gpu_memory_utilization": 0.1, "env": dict(FAST_ENV),
                      "ready_timeout_s": 60},
            "watchdog": {"memory_floor_bytes": "1GiB"},
            "fabric": {"master_port": free_port(head)},
            "container": {"name_prefix": PREFIX, "stop_timeout_s": 3},
            "gates": {"smoke": dict(SMALL_SMOKE), "settle_s": SETTLE_S},
        })
        if self.runtime == "process":
            body = merge(body, {"runtime": "process", "serve": {"vllm": str(self.process_vllm())},
                                "process": {"run_dir": PROCESS_RUN_DIR}})
        return body

    def process_vllm(self) -> Path:
        """The emulator launcher on every node (installed if this rig predates it)."""
        import rig as riglib

        for n in self.rig.nodes:
            riglib.install_process_engine(n)
        return riglib.PROCESS_VLLM

    def config(self, overrides: dict | None = None, *, name: str | None = None, data: dict | None = None) -> Path:
        """rig.yaml + the e2e defaults + ``overrides``, written to a file of its own."""
        body = merge(data if data is not None else self.base(), overrides or {})
        path = self.tmp / f"{name or 'cfg-' + uuid.uuid4().hex[:8]}.yaml"
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        self.configs.append(path)
        return path

    def derive(self, cfg: Path, overrides: dict, *, name: str | None = None) -> Path:
        """Another config: ``cfg`` (same ports, same everything) with ``overrides``."""
        return self.config(overrides, name=name, data=yaml.safe_load(cfg.read_text()))

    def load(self, path: Path) -> Any:
        from sparkserve.config import load_config

        return load_config(path)

    # -- the CLI ----------------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
        env["XDG_STATE_HOME"] = str(self.state)
        env["COLUMNS"] = "200"
        return env

    def cli(self, *args: str, cfg: Path | None, timeout: float = 180) -> subprocess.CompletedProcess:
        argv = [str(SPARKSERVE), *args] + (["-c", str(cfg)] if cfg is not None else [])
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env())

    def popen(self, *args: str, cfg: Path) -> subprocess.Popen:
        argv = [str(SPARKSERVE), *args, "-c", str(cfg)]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env())

    def json(self, *args: str, cfg: Path, code: int | None = 0, timeout: float = 180) -> dict:
        p = self.cli(*args, "--json", cfg=cfg, timeout=timeout)
        if code is not None:
            assert p.returncode == code, f"{args} exited {p.returncode}, wanted {code}:\n{p.stdout}\n{p.stderr}"
        return json.loads(p.stdout)

    @staticmethod
    def assert_explained(p: subprocess.CompletedProcess, *, code: int, node: str | None, step: str | None = None,
                         says: tuple[str, ...] = ()) -> str:
        """Exit ``code``; one ``error: …`` line naming ``node`` and ``step``; one screen, no traceback.

        Returns the explanation (the error line and everything after it)."""
        err = p.stderr
        assert p.returncode == code, f"exit {p.returncode}, wanted {code}\nstdout:\n{p.stdout}\nstderr:\n{err}"
        lines = err.splitlines()
        # our own traceback starts at column 0; engine log lines quoted as evidence are indented
        assert not any(ln.startswith("Traceback") for ln in lines), err
        first = [i for i, ln in enumerate(lines) if ln.startswith("error: ")]
        assert len(first) == 1, f"want exactly one error line:\n{err}"
        block = lines[first[0]:]
        assert len(block) <= ONE_SCREEN, f"explanation longer than one screen ({len(block)} lines):\n{err}"
        head = block[0]
        if node is not None:
            assert node in head, f"the error line does not name {node}: {head}"
        if step is not None:
            assert step in head, f"the error line does not name the step {step!r}: {head}"
        text = "\n".join(block)
        for s in says:
            assert s in text, f"{s!r} not in the explanation:\n{text}"
        return text

    # -- what runs on the nodes -------------------------------------------------------------------------

    def ours(self, node: str) -> list:
        """Containers (runtime process: ranks) on ``node`` that these tests (or sparkserve) started: labelled
        or named like ours."""
        if self.runtime == "process":
            return self._ranks(node)
        return self._containers(node)

    def _containers(self, node: str) -> list:
        import docker.errors

        for _ in range(5):  # a container removed between the listing and its inspect: list again
            try:
                found = self.docker[node].containers.list(all=True)
                break
            except docker.errors.NotFound:
                time.sleep(0.1)
        else:
            found = self.docker[node].containers.list(all=True)
        out = []
        for c in found:
            labels = c.labels or {}
            if labels.get("io.sparkserve.managed") == "1" or c.name.startswith(f"{PREFIX}-"):
                out.append(c)
        return out

    def leftovers(self) -> dict[str, list[str]]:
        """Everything of ours on each node: containers, and (either runtime) rank manifests and processes."""
        found = {n.name: [f"{c.name} ({c.status})" for c in self._containers(n.name) + self._ranks(n.name)]
                 for n in self.rig.nodes}
        return {k: v for k, v in found.items() if v}

    def managed(self, node: str) -> list:
        return [c for c in self.ours(node) if (c.labels or {}).get("io.sparkserve.managed") == "1"]

    def clean(self) -> None:
        """Remove every container we started, on every node (graceful first), and every rank process and
        run dir of runtime process (SIGKILL: a test's leftovers)."""
        for n in self.rig.nodes:
            for c in self._containers(n.name):
                with contextlib.suppress(Exception):
                    c.stop(timeout=2)
                with contextlib.suppress(Exception):
                    c.remove(force=True)
            for pid in self._marked_pids(n.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self.node_path(n.name, PROCESS_RUN_DIR), ignore_errors=True)

    # -- runtime process: the ranks as the node sees them -----------------------------------------------

    def _node_mnt(self, node: str) -> str | None:
        holder = (Path(self.rig.node(node).dir) / "ns.pid").read_text().strip()
        return os.readlink(f"/proc/{holder}/ns/mnt")

    def _marked_pids(self, node: str) -> list[int]:
        """Live processes in ``node``'s namespace carrying a rank marker (what sparkserve's stop looks for)."""
        mnt, out = self._node_mnt(node), []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                alive = (d / "stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
                same_node = os.readlink(d / "ns" / "mnt") == mnt
            except (OSError, IndexError):
                continue
            if alive and same_node and any(e.startswith(MARKER_ENV.encode() + b"=") for e in env):
                out.append(int(d.name))
        return sorted(out)

    def _ranks(self, node: str) -> list:
        """The node's rank manifests (status from the pid and its start time) and any marked process that no
        manifest names."""
        root, out, named = self.node_path(node, PROCESS_RUN_DIR), [], set()
        for p in sorted(root.glob("*/rank*.json")) if root.exists() else []:
            with contextlib.suppress(OSError, ValueError):
                m = json.loads(p.read_text())
                named.add(m["pid"])
                out.append(SimpleNamespace(name=m["name"], id=m["id"], pid=m["pid"], labels=m["labels"],
                                           argv=m["argv"],
                                           status="running" if _lives(m["pid"], m["start_time"]) else "exited"))
        for pid in self._marked_pids(node):
            if pid not in named:
                out.append(SimpleNamespace(name=f"pid {pid}", id=str(pid), pid=pid, labels={}, argv=[],
                                           status="running"))
        return out

    def kill_rank(self, node: str) -> None:
        """SIGKILL the engine of the running rank on ``node`` (``docker kill`` of its container)."""
        (c,) = [c for c in self.managed(node) if c.status == "running"]
        if self.runtime == "process":
            os.kill(c.pid, signal.SIGKILL)
        else:
            subprocess.run(["docker", "-H", self.rig.node(node).docker_url, "kill", c.name], check=True,
                           capture_output=True)

    def running_ids(self) -> dict[str, str]:
        return {n.name: c.id for n in self.rig.nodes for c in self.managed(n.name) if c.status == "running"}

    def node_path(self, node: str, path: str | Path) -> Path:
        """Host path of a node-local path (under /srv/spark)."""
        return self.rig.node(node).host_path(path)


def _lives(pid: int, start_time: int) -> bool:
    """pid alive, not a zombie, and started when the manifest says (a reused pid is not the rank)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return False
    return rest[0] not in "ZX" and int(rest[19]) == start_time


def kill_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    os.kill(pid, sig)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z":
                return
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still alive {timeout:.0f}s after signal {sig}")
