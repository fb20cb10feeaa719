"""Replicas on the rig: a rig of its own with N nodes (for a session, as conftest's rig4, or a module), a fleet
config, and a load of streamed and non-streamed requests through the router judged at the client.

    yield from own_rig(rig_exclusive, nodes=6, ip_base=50, ssh_port=2226, root="/srv/spark-e6")   # test_replicas_six
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import rig as riglib
from e2e_support import E2E, free_port

RIG_PY = Path(riglib.__file__).resolve()

E4_ROOT = "/srv/spark-e4"  # what the four-node replicas rig's nodes see as their root


def rigcmd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RIG_PY), *args], capture_output=True, text=True, env=env, timeout=900)


def own_rig(shared: Any, *, nodes: int, ip_base: int, ssh_port: int, root: str) -> Iterator[tuple[Any, dict]]:
    """A rig of ``nodes`` nodes of its own (its own SSRIG_DIR, addresses, port and node root; the shared rig's
    cache), brought up for a module and removed (with --purge) after it; the session's rig is not touched."""
    d = Path(tempfile.mkdtemp(prefix=f"ssrig{nodes}-", dir="/var/tmp"))  # short (unix sockets); not under /tmp
    env = {**os.environ, "SSRIG_DIR": str(d), "SSRIG_NODE_ROOT": root, "SSRIG_IP_BASE": str(ip_base),
           "SSRIG_SSH_PORT": str(ssh_port), "SSRIG_CACHE": str(shared.dir / "cache")}
    try:
        p = rigcmd(env, "up", "--nodes", str(nodes))
        if p.returncode != 0:
            pytest.fail(f"the {nodes}-node rig cannot come up: {p.stderr.strip()[-2000:]}", pytrace=False)
        handle = riglib.RigHandle.from_info(json.loads((d / "rig.json").read_text()))
        clients = {n.name: docker.DockerClient(base_url=n.docker_url, version="1.41", timeout=120)
                   for n in handle.nodes}
        yield handle, clients
        for c in clients.values():
            c.close()
    finally:
        p = rigcmd(env, "down", "--purge")
        shutil.rmtree(d, ignore_errors=True)
    assert p.returncode == 0, p.stderr


def fleet_config(e: E2E, replicas: int, **over: object) -> Path:
    """The rig's config as ``replicas`` two-node replicas, the router on free loopback ports, ~1 s per 250-token
    request (so streams are in flight when a head dies)."""
    base = {"replicas": replicas, "router": {"port": free_port("127.0.0.1"), "metrics_port": free_port("127.0.0.1")},
            "serve": {"tensor_parallel_size": 2}}  # the rig's yaml spans every node with one TP
    cfg = e.derive(e.config(base), {"serve": {"env": {"SSEMU_TOKEN_RATE": "250"}}})  # added to the emulator env
    return e.derive(cfg, dict(over)) if over else cfg  # deep-merged


class Load:
    """Requests through the router from two threads, one streaming and one not, until stopped; each outcome
    judged at the client (a stream cut on a dying replica arrives as HTTP 200 without ``data: [DONE]`` when its
    API server dies, or with an error event before ``[DONE]`` when only its EngineCore dies, as real vLLM does)."""

    def __init__(self, url: str, model: str, per_kind: int = 3) -> None:
        self.url, self.model = url, model
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = {"stream": 0, "plain": 0}
        self.failed: dict[str, list[str]] = {"stream": [], "plain": []}
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True)
                        for k in ("stream", "plain") for _ in range(per_kind)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _one(self, kind: str, i: int) -> str | None:
        body = {"model": self.model, "max_tokens": 250, "messages": [{"role": "user", "content": f"{kind} {i}"}],
                "stream": kind == "stream"}
        try:
            with httpx.Client(trust_env=False, timeout=60) as c:
                if kind == "stream":
                    with c.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                        text = "".join(r.iter_text())
                    if r.status_code != 200:
                        return f"HTTP {r.status_code}"
                    if '"error"' in text:  # real vLLM 0.25.1: an EngineCore death ends the stream with an
                        return "cut: error event"  # error event, then [DONE] (tests/real/runs/2026-12-02-session7)
                    return None if "data: [DONE]" in text else "cut: no [DONE]"
                r = c.post(self.url + "/v1/chat/completions", json=body)
                ok = r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
                return None if ok else f"HTTP {r.status_code} {r.text[:80]}"
        except (httpx.HTTPError, ValueError, KeyError) as ex:
            return f"{type(ex).__name__}: {ex}"

    def _run(self, kind: str) -> None:
        i = 0
        while not self.stop.is_set():
            why = self._one(kind, i)
            with self.lock:
                if why:
                    self.failed[kind].append(why)
                self.done[kind] += 1
            i += 1


def routers_on(port: int) -> list[int]:
    """Pids of the processes listening on TCP ``port`` on this machine (vllm-router retitles itself
    "vllm::router", so its argv cannot tell): the listening socket's inode, then who holds it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (d / "fd").iterdir()):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def interrupt_at(e: E2E, cfg: Path, marker: str, sig: int, *, timeout: float = 300) -> subprocess.CompletedProcess:
    """``sparkserve up -c CFG``; ``sig`` once stderr shows ``marker``; the finished process (stderr whole)."""
    proc = e.popen("up", cfg=cfg)
    guard = threading.Timer(timeout, proc.kill)
    guard.start()
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if marker in line:
                break
        else:
            pytest.fail(f"{marker!r} never appeared; exit {proc.wait()}:\n{''.join(seen)}")
        proc.send_signal(sig)
        out, err = proc.communicate()
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err)


def stop_routers(e: E2E) -> None:
    """Every router the test's runs recorded in its state dir, stopped: a test that fails before its `down` leaves
    no router behind."""
    from sparkserve.nodes import router

    d = e.state / "sparkserve" / "router"
    old = os.environ.get("SSROUTER_STATE")
    os.environ["SSROUTER_STATE"] = str(d)
    try:
        for f in d.glob("*.json"):
            router.stop_router(int(f.stem))
    finally:
        if old is None:
            os.environ.pop("SSROUTER_STATE", None)
        else:
            os.environ["SSROUTER_STATE"] = old
