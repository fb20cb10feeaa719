"""Boot the rig config (with overrides) on the rig nodes and watch each node's logs — for the rig tests.

    with cluster(rig, rig_docker, overrides={"serve": {"enforce_eager": True}},
                 node_env={"node-b": {"SSEMU_FAULTS": "crash_boot@rank=1"}}) as c:
        c.wait_log("node-a", "EngineCore failed to start.")
        out, err = c.logs("node-b")

Ports are picked free on the head's loopback address for every cluster, so runs never collide. The plan
comes from sparkserve's own ``load_config`` + ``build_plan`` (what ``sparkserve render --json`` prints).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import runner

from sparkserve.config import load_config
from sparkserve.plan.build import build_plan


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def plan_for(config: Path, overrides: dict | None = None) -> dict:
    cfg = load_config(config, overrides=overrides or {})
    plan = build_plan(cfg)
    data = plan.model_dump(mode="json")
    data["api_url"] = plan.api_url
    data["start_order"] = [s.node for s in plan.followers] + [plan.head.node]
    return data


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class Cluster:
    rig: object
    clients: dict
    plan: dict
    started: list

    @property
    def api_url(self) -> str:
        return self.plan["api_url"]

    @property
    def served(self) -> str:
        return self.plan["served_name"]

    def container(self, node: str):
        s = next(s for s in self.started if s.node == node)
        return self.clients[node].containers.get(s.id)

    def logs(self, node: str) -> tuple[str, str]:
        c = self.container(node)
        return (c.logs(stdout=True, stderr=False).decode(errors="replace"),
                c.logs(stdout=False, stderr=True).decode(errors="replace"))

    def text(self, node: str) -> str:
        out, err = self.logs(node)
        return out + err

    def status(self, node: str) -> str:
        c = self.container(node)
        c.reload()
        return c.status

    def exit_code(self, node: str) -> int | None:
        c = self.container(node)
        c.reload()
        return c.attrs["State"]["ExitCode"] if c.status == "exited" else None

    def wait_log(self, node: str, text: str, timeout: float = 30.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if text in self.text(node):
                return time.monotonic() - t0
            time.sleep(0.2)
        raise AssertionError(f"{node}: {text!r} not logged within {timeout:.0f}s; last lines:\n"
                             + "\n".join(self.text(node).splitlines()[-15:]))

    def wait_exit(self, node: str, timeout: float = 30.0) -> int:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            code = self.exit_code(node)
            if code is not None:
                return code
            time.sleep(0.2)
        raise AssertionError(f"{node}: still {self.status(node)} after {timeout:.0f}s")

    def wait_ready(self, timeout: float = 60.0) -> float:
        return runner.wait_ready(self.api_url, timeout=timeout)


@contextlib.contextmanager
def cluster(rig, clients, *, overrides: dict | None = None, env: dict[str, str] | None = None,
            node_env: dict[str, dict[str, str]] | None = None) -> Iterator[Cluster]:
    head = rig.nodes[0].host
    ports = {"serve": {"port": free_port(head)}, "fabric": {"master_port": free_port(head)}}
    plan = plan_for(rig.rig_yaml, _merge(ports, overrides or {}))
    extra = {n.name: {**(env or {}), **(node_env or {}).get(n.name, {})} for n in rig.nodes}
    started = runner.start_plan(rig.info, plan, extra_env=extra)
    try:
        if plan["executor"] == "ray":
            time.sleep(1.0)  # every `ray start` has joined (they connect within ~0.2 s)
            head = plan["specs"][0]
            head["env"] = {**head["env"], **extra[head["node"]]}
            runner.exec_serve(rig.info, plan, started)
        yield Cluster(rig, clients, plan, started)
    finally:
        runner.remove_containers(rig.info, started)
