"""Start a sparkserve plan's containers on the rig (docker SDK on each node's socket) and talk to the head.

A small stand-in used by the demo and the rig tests until ``sparkserve up`` drives everything itself:

    info = rig.load_info()
    plan = render_plan(info["rig_yaml"])                 # `sparkserve render --json` output (a dict)
    started = start_plan(info, plan)                     # followers first, then the head
    wait_ready(plan["api_url"], timeout=60)
    text, usage, tps = stream_completion(plan["api_url"], plan["served_name"], "hello", max_tokens=64)
    remove_containers(info, started)

All traffic stays on 127.0.0.0/8: node sockets are unix sockets, the API is the head's loopback address.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.types

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[2]
SPARKSERVE = [sys.executable, "-m", "sparkserve"]


class RunnerError(RuntimeError):
    pass


def node_clients(info: dict) -> dict[str, docker.DockerClient]:
    return {n["name"]: docker.DockerClient(base_url=f"unix://{n['docker_socket']}", version="1.41", timeout=60)
            for n in info["nodes"]}


def render_plan(config: str | Path, extra_env: dict[str, str] | None = None) -> dict:
    """``sparkserve render --config CONFIG --json`` → the plan as data."""
    import os

    env = dict(os.environ, **(extra_env or {}))
    p = subprocess.run([*SPARKSERVE, "render", "--config", str(config), "--json"], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=120)
    if p.returncode != 0:
        raise RunnerError(f"sparkserve render failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return json.loads(p.stdout)


def run_spec(client: docker.DockerClient, spec: dict, *, extra_env: dict[str, str] | None = None,
             memlock_cap: int | None = None):
    """``docker run -d`` of one ContainerSpec (as rendered), on the client's node.

    ``memlock_cap``: the node daemon's RLIMIT_MEMLOCK hard limit when it cannot grant ``memlock=-1`` (a
    machine without CAP_SYS_RESOURCE); the ulimit is lowered to it, loudly (see ``demo.py``).
    """
    ulimits = []
    for k, (soft, hard) in (spec.get("ulimits") or {}).items():
        if k == "memlock" and memlock_cap is not None:
            soft = memlock_cap if soft == -1 or soft > memlock_cap else soft
            hard = memlock_cap if hard == -1 or hard > memlock_cap else hard
        ulimits.append(docker.types.Ulimit(name=k, soft=soft, hard=hard))
    mounts = [docker.types.Mount(target=m["target"], source=m["source"], type="bind", read_only=m["read_only"])
              for m in spec["mounts"]]
    kw: dict = dict(
        image=spec["image"], command=spec["command"], name=spec["name"], detach=True,
        environment={**spec["env"], **(extra_env or {})}, labels=spec["labels"], mounts=mounts,
        network_mode=spec.get("network_mode", "host"), ipc_mode=spec.get("ipc_mode", "host"), ulimits=ulimits,
        cap_add=spec.get("cap_add") or None, devices=spec.get("devices") or None,
    )
    if kw["ipc_mode"] != "host":
        kw["shm_size"] = spec["shm_size"]
    if spec.get("gpus"):
        kw["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    kw.pop("detach")
    c = client.containers.create(**kw)
    try:
        c.start()
    except docker.errors.APIError:
        c.remove(force=True)
        raise
    return c


def remove_managed(info: dict) -> int:
    """Remove every container labelled io.sparkserve.managed=1 on every rig node; returns how many."""
    n = 0
    for client in node_clients(info).values():
        for c in client.containers.list(all=True, filters={"label": "io.sparkserve.managed=1"}):
            c.remove(force=True)
            n += 1
    return n


@dataclass
class Started:
    node: str
    name: str
    id: str


def memlock_caps(info: dict) -> dict[str, int | None]:
    """Per node: the memlock ceiling its daemon imposes (None: it can grant unlimited)."""
    import rig

    if rig.can_raise_memlock():
        return {n["name"]: None for n in info["nodes"]}
    return {n.name: rig.memlock_hard_limit(n) for n in rig.nodes_from_info(info)}


def make_plan_dirs(info: dict, plan: dict) -> None:
    """What every consumer of a plan does before starting a rank: create the spec's ``make_dirs`` on its node,
    as the node user, over sparkserve's own SSH node (the rig's config names how to reach each node)."""
    from sparkserve.config import load_config
    from sparkserve.nodes.factory import open_nodes

    wanted = {s["node"]: s.get("make_dirs") or [] for s in plan["specs"]}
    if not any(wanted.values()):
        return
    cfg = load_config(Path(info["rig_yaml"]))
    with open_nodes(cfg, names=[n for n, dirs in wanted.items() if dirs]) as nodes:
        for name, dirs in wanted.items():
            for d in dirs:
                nodes[name].makedirs(d)


def start_plan(info: dict, plan: dict, *, extra_env: dict[str, dict[str, str]] | None = None) -> list[Started]:
    """Start every rank: followers first, then the head. Each must be running before the next starts. The
    plan's ``make_dirs`` are made first (docker refuses a bind mount whose source does not exist)."""
    make_plan_dirs(info, plan)
    clients = node_clients(info)
    caps = memlock_caps(info)
    order = plan.get("start_order") or [s["node"] for s in plan["specs"][1:]] + [plan["specs"][0]["node"]]
    by_node = {s["node"]: s for s in plan["specs"]}
    started: list[Started] = []
    try:
        for node in order:
            spec = by_node[node]
            c = run_spec(clients[node], spec, extra_env=(extra_env or {}).get(node), memlock_cap=caps.get(node))
            started.append(Started(node, spec["name"], c.id))
            c.reload()
            if c.status != "running":
                raise RunnerError(f"{node}: {spec['name']} is {c.status}: {c.logs(tail=20).decode(errors='replace')}")
    except Exception:
        remove_containers(info, started)
        raise
    return started


def exec_serve(info: dict, plan: dict, started: list[Started]) -> None:
    """Ray plans: once every ``ray start`` runs, exec the head's ``vllm serve`` in its container; its output joins
    the container's log (as sparkserve does)."""
    head = plan["specs"][0]
    argv = head.get("exec_after_join")
    if not argv:
        return
    s = next(x for x in started if x.node == head["node"])
    c = node_clients(info)[s.node].containers.get(s.id)
    c.exec_run(["sh", "-c", 'exec "$@" >/proc/1/fd/1 2>/proc/1/fd/2', "sh", *argv], detach=True,
               environment=head["env"])


def remove_containers(info: dict, started: list[Started]) -> None:
    clients = node_clients(info)
    for s in started:
        with contextlib.suppress(docker.errors.NotFound):
            clients[s.node].containers.get(s.id).remove(force=True)


def container_logs(info: dict, s: Started) -> str:
    return node_clients(info)[s.node].containers.get(s.id).logs().decode(errors="replace")


def _conn(api_url: str, timeout: float) -> http.client.HTTPConnection:
    u = urllib.parse.urlparse(api_url)
    if not (u.hostname or "").startswith("127."):
        raise RunnerError(f"{api_url}: rig traffic stays on 127.0.0.0/8")
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def http_get(api_url: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    c = _conn(api_url, timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_ready(api_url: str, timeout: float = 90.0, alive=None) -> float:
    """Poll /health until 200; ``alive()`` (optional) returning False aborts early. Returns seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if alive is not None and not alive():
            raise RunnerError("a rank exited before the head became ready")
        try:
            if http_get(api_url, "/health", timeout=2)[0] == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.2)
    raise RunnerError(f"{api_url}/health not 200 after {timeout:.0f}s")


def stream_completion(api_url: str, model: str, prompt: str, *, max_tokens: int = 64, chat: bool = False,
                      timeout: float = 60.0, **extra) -> tuple[str, dict, float]:
    """One streamed request with usage; returns (text, usage, output tokens/s)."""
    body = {"model": model, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            **extra}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    c = _conn(api_url, timeout)
    t0 = time.monotonic()
    try:
        c.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RunnerError(f"POST {path}: {r.status} {r.read()[:300]!r}")
        try:
            text, usage = _read_events(r)
        finally:
            _drain(r)
        dt = time.monotonic() - t0
    finally:
        c.close()
    return text, usage, (usage.get("completion_tokens", 0) / dt if dt > 0 else 0.0)


def _read_events(r: http.client.HTTPResponse) -> tuple[str, dict]:
    """(text, usage) of an SSE completion stream, up to ``data: [DONE]``; RunnerError on an error event."""
    text, usage = [], {}
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        obj = json.loads(data)
        if "error" in obj:
            raise RunnerError(f"stream error: {obj['error']}")
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj.get("choices") or []:
            text.append(ch.get("text") or (ch.get("delta") or {}).get("content") or "")
    return "".join(text), usage


def _drain(r: http.client.HTTPResponse, limit: int = 2**20) -> None:
    """Read the rest of the response, up to its chunked terminator (sent after ``data: [DONE]``, or after an
    error event). Closing with those bytes unread makes the kernel answer them with a reset, which the
    server then sees as a client fault in its keep-alive loop (issue 15 item 11: 17 of 300 streams)."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        got = 0
        while got < limit and (chunk := r.read(65536)):
            got += len(chunk)
