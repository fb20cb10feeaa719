"""A stack for `sparkserve supervise` to watch: N nodes that are all this machine (``local: true``,
``runtime: process``), each rank the engine emulator as a host process — the shape of the real-GPU run
(tests/real: one box, vLLM from a venv) and of bench/bench_up_local.py. No SSH, no docker: a fault test
boots in ~2 s, so every serving-time fault fits the suite's budget.

    st = LocalStack.make(tmp_path, nodes=2, env={"SSEMU_FAULTS": "wedge@after=3"}, supervise={"interval_s": 1})
    st.cli("up")                       # the real CLI, this stack's own state dir (journal, incidents)
    sup = st.supervise()               # `sparkserve supervise` in the background; sup.status() = /status.json
    st.rank_pids()                     # every live process carrying one of this stack's rank markers
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EMULATOR = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
SERVE_ARGS = REPO / "sparkserve" / "data" / "vllm-0.33.0-serve-args.json"
MARKER_ENV = "SPARKSERVE_RANK_ID"
IP0 = 110  # 127.0.0.110 + i: each node's fabric address (bench_up_local uses 100+)
FAST_ENV = {"SSEMU_BOOT_SECONDS": "0.8", "VLLM_RINGBUFFER_WARNING_INTERVAL": "2", "SSEMU_PEER_TIMEOUT_S": "3",
            "SSEMU_NCCL_TIMEOUT_S": "1", "VLLM_LOG_STATS_INTERVAL": "2"}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def write_sysfs(root: Path, ips: list[str]) -> None:
    """One CX-7 port whose RoCE v2 GID table holds every node's address (all nodes read this one tree)."""
    def w(p: Path, text: str) -> None:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    ifname, hca = "enp1s0f1np1", "rocep1s0f1"
    for f, v in {"operstate": "up", "carrier": "1", "mtu": "9000", "address": "02:00:00:00:00:01"}.items():
        w(root / "class" / "net" / ifname / f, v)
    port = root / "class" / "infiniband" / hca / "ports" / "1"
    for f, v in {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "Ethernet"}.items():
        w(port / f, v)
    (root / "class" / "infiniband" / hca / "device" / "net" / ifname).mkdir(parents=True, exist_ok=True)
    for i, ip in enumerate(ips):
        o = [int(x) for x in ip.split(".")]
        w(port / "gids" / str(i), f"0000:0000:0000:0000:0000:ffff:{o[0]:02x}{o[1]:02x}:{o[2]:02x}{o[3]:02x}")
        w(port / "gid_attrs" / "types" / str(i), "RoCE v2")
        w(port / "gid_attrs" / "ndevs" / str(i), ifname)


def healthy_meminfo(free_gib: float = 90.0) -> str:
    kb = int(free_gib * (1 << 20))
    return (f"MemTotal:       {int(119.7 * (1 << 20))} kB\nMemFree:        {kb} kB\n"
            f"MemAvailable:   {kb + (8 << 20)} kB\n")


def tiny_models() -> Path:
    sys.path.insert(0, str(REPO / "tests" / "rig"))
    import rig as riglib

    return riglib.ensure_models()


@dataclass
class Supervisor:
    proc: subprocess.Popen
    url: str
    log: Path

    def status(self, timeout: float = 3.0) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/status.json", timeout=timeout) as r:
            return json.loads(r.read())

    def wait_status(self, pred, timeout: float, what: str) -> dict[str, Any]:
        end = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"supervise exited {self.proc.returncode} waiting for {what}:\n{self.text()}")
            try:
                last = self.status()
                if pred(last):
                    return last
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last status:\n"
                             f"{json.dumps(last, indent=1)[:3000]}\nsupervise said:\n{self.text()[-3000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@dataclass
class LocalStack:
    work: Path
    config: Path
    state: Path
    api_url: str
    listen: str
    data: dict[str, Any]
    sups: list[Supervisor] = field(default_factory=list)
    prefixes: set[str] = field(default_factory=set)

    @classmethod
    def make(cls, work: Path, *, nodes: int = 2, env: dict[str, str] | None = None,
             supervise: dict[str, Any] | None = None, models: Path | None = None) -> LocalStack:
        models = models or tiny_models()
        work.mkdir(parents=True, exist_ok=True)
        launcher = work / "venv" / "bin" / "vllm"
        launcher.parent.mkdir(parents=True, exist_ok=True)
        launcher.write_text(f"#!/bin/sh\nexport PYTHONUNBUFFERED=1 SSEMU_SERVE_ARGS={SERVE_ARGS}\n"
                            f'exec {sys.executable} {EMULATOR} "$@"\n')
        launcher.chmod(0o755)
        ips = [f"127.0.0.{IP0 + i}" for i in range(nodes)]
        write_sysfs(work / "sys", ips)
        port = free_port(ips[0])
        listen = f"127.0.0.1:{free_port()}"
        for i in range(nodes):
            (work / f"n{i}.meminfo").write_text(healthy_meminfo())
        (work / "kmsg").mkdir(exist_ok=True)
        for i in range(nodes):
            (work / "kmsg" / f"n{i}").write_text("")
        sup = {"interval_s": 1, "canary_deadline_s": 3, "stall_s": 3, "acceptance_window_s": 3,
               "acceptance_min_drafts": 20, "backoff_s": 0.2, "backoff_max_s": 1, "max_restarts": 5,
               "budget_window_s": 600, "meminfo_path": str(work / "{node}.meminfo"),
               "kmsg_path": str(work / "kmsg" / "{node}"), "listen": listen,
               "incidents_dir": str(work / "incidents"), **(supervise or {})}
        data = {
            "nodes": [{"name": f"n{i}", "host": "localhost", "fabric_ip": ip, "local": True, "gpus": 1}
                      for i, ip in enumerate(ips)],
            "runtime": "process", "process": {"run_dir": str(work / "run")}, "image": {"ref": "unused"},
            "model": {"target": str(models / "target"), "served_name": "tiny"},
            "drafter": {"path": str(models / "drafter")},
            "serve": {"tensor_parallel_size": nodes, "host": ips[0], "port": port,
                      "vllm": str(launcher.parent.parent), "max_model_len": 262144, "kv_cache_dtype": "fp8_e4m3",
                      "kv_cache_memory_bytes": "8GiB", "gpu_memory_utilization": 0.1,
                      "env": {**FAST_ENV, **(env or {})}, "ready_timeout_s": 60},
            "fabric": {"master_port": free_port(ips[0]), "sysfs_root": str(work / "sys")},
            "container": {"stop_timeout_s": 3},
            "gates": {"settle_s": 0, "pool_tokens": None, "smoke": {"prompts": 2, "concurrency": 1, "max_tokens": 16,
                                                                    "request_timeout_s": 10}},
            "watchdog": {"memory_floor_bytes": "1GiB"},
            "supervise": sup,
        }
        cfg = work / "sparkserve.yaml"
        cfg.write_text(yaml.safe_dump(data, sort_keys=False))
        state = work / "state"
        state.mkdir(exist_ok=True)
        return cls(work, cfg, state, f"http://{ips[0]}:{port}", listen, data)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_") and k != "SSJOURNAL_PATH"}
        env["XDG_STATE_HOME"] = str(self.state)
        # the head's deploy lock is one per machine (/tmp); these stacks pretend machines of their own on one host,
        # so each keeps its own: another test's stack holding /tmp's lock blocked this one's restart (a wedge test
        # whose fault was lifted before the lock came free then saw no restart at all)
        env["SPARKSERVE_DEPLOY_LOCK"] = str(self.work / "deploy.lock")
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        return env

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        end = time.monotonic() + 90
        while True:  # the head's deploy lock is /tmp's: another local stack on this machine may hold it a while
            p = subprocess.run([sys.executable, "-m", "sparkserve", *args, "-c", str(self.config)],
                               capture_output=True, text=True, timeout=timeout, env=self.env())
            if "another sparkserve run holds" not in p.stderr or time.monotonic() > end:
                break
            time.sleep(1.0)
        if check and p.returncode != 0:
            raise AssertionError(f"sparkserve {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr[-4000:]}")
        return p

    def supervise(self, *extra: str, env: dict[str, str] | None = None) -> Supervisor:
        log = self.work / f"supervise-{len(self.sups)}.log"
        f = log.open("w")
        proc = subprocess.Popen([sys.executable, "-m", "sparkserve", "supervise", *extra, "-c", str(self.config)],
                                stdout=f, stderr=subprocess.STDOUT, env={**self.env(), **(env or {})},
                                start_new_session=True)
        f.close()
        sup = Supervisor(proc, f"http://{self.listen}", log)
        self.sups.append(sup)
        sup.wait_status(lambda s: s["rounds"] >= 1, 30, "the first round")
        return sup

    def rank_pids(self) -> list[int]:
        """Live processes on this machine carrying one of this stack's rank markers (``<fingerprint16>-r<R>``:
        every deployment this stack's run dir has held, remembered across `down`)."""
        run = self.work / "run"
        if run.exists():
            self.prefixes.update(p.name for p in run.iterdir() if p.is_dir())
        want = tuple(f"{MARKER_ENV}={p}-r".encode() for p in self.prefixes)
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or not want:
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                alive = (d / "stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
            except (OSError, IndexError):
                continue
            if alive and any(e.startswith(want) for e in env):
                out.append(int(d.name))
        return out

    def api_get(self, path: str, timeout: float = 3.0) -> int:
        try:
            with urllib.request.urlopen(self.api_url + path, timeout=timeout) as r:
                return r.status
        except OSError:
            return 0

    def complete(self, max_tokens: int = 8, timeout: float = 5.0) -> dict[str, Any]:
        body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": max_tokens, "ignore_eos": True}).encode()
        req = urllib.request.Request(self.api_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def incidents(self) -> list[Path]:
        root = self.work / "incidents"
        return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []

    def close(self) -> None:
        for s in self.sups:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait(10)
        self.cli("down", check=False)  # waits out another local stack's hold on the head's deploy lock
