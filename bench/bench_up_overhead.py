#!/usr/bin/env python3
"""Warm `sparkserve up` overhead on the rig: wall time beyond the engine emulator's own boot.

    .venv/bin/python bench/bench_up_overhead.py [--runs 5] [--boot-seconds 2.5] [--gates]

Each run: `sparkserve down` (not timed), then `sparkserve up --no-gates --json` timed as a subprocess (what
the operator waits for: interpreter start, config, SSH connect, input validation, preflight, identity,
drafter check, start followers then head, readiness, parity). The emulator's own boot is read from the
head's log: from the head container's start (docker State.StartedAt) to its ``Application startup
complete.`` line (docker log timestamps). overhead = wall − boot. The first run warms caches and is not
counted. Also printed: the in-process figure (`up()`'s own seconds, from --json) minus the same boot.
Goal (issue 4): overhead ≤ 1.5 s with the nodes handled in parallel. Holds the rig's test lock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import docker
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rig"))

import rig as riglib  # noqa: E402

SPARKSERVE = REPO / ".venv" / "bin" / "sparkserve"
GOAL_S = 1.5


def ts(text: str) -> float:
    """Docker's RFC 3339 nanosecond timestamp → unix seconds."""
    text = text.rstrip("Z")
    base, _, frac = text.partition(".")
    return datetime.fromisoformat(base + "+00:00").timestamp() + float(f"0.{frac or 0}")


def head_boot_seconds(client: docker.DockerClient, container_id: str) -> float:
    c = client.containers.get(container_id)
    started = ts(c.attrs["State"]["StartedAt"])
    for raw in c.logs(timestamps=True).decode(errors="replace").splitlines():
        stamp, _, line = raw.partition(" ")
        if "Application startup complete." in line:
            return ts(stamp) - started
    raise RuntimeError("the head never logged 'Application startup complete.'")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--boot-seconds", type=float, default=2.5, help="SSEMU_BOOT_SECONDS (the emulator's boot)")
    ap.add_argument("--gates", action="store_true", help="also run the gates (smoke cell 3 x 32 tokens)")
    a = ap.parse_args()

    info = riglib.load_info()
    nodes = riglib.nodes_from_info(info)
    head = nodes[0]
    data = yaml.safe_load(Path(info["rig_yaml"]).read_text())
    data["serve"]["env"] = {**(data["serve"].get("env") or {}), "SSEMU_BOOT_SECONDS": str(a.boot_seconds)}
    data["serve"]["gpu_memory_utilization"] = 0.3
    data.setdefault("gates", {})["smoke"] = {"prompts": 3, "max_tokens": 32, "request_timeout_s": 20}
    tmp = Path(tempfile.mkdtemp(prefix="bench-up-"))
    cfg = tmp / "bench.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state")}
    client = docker.DockerClient(base_url=head.docker_url, version="1.41", timeout=60)
    up = [str(SPARKSERVE), "up", "--json", "-c", str(cfg)] + ([] if a.gates else ["--no-gates"])
    down = [str(SPARKSERVE), "down", "-c", str(cfg)]
    rows = []
    with riglib.exclusive_use():
        for i in range(a.runs + 1):
            subprocess.run(down, env=env, capture_output=True, check=True)
            t0 = time.monotonic()
            p = subprocess.run(up, env=env, capture_output=True, text=True)
            wall = time.monotonic() - t0
            if p.returncode != 0:
                print(p.stderr, file=sys.stderr)
                return 1
            res = json.loads(p.stdout)
            boot = head_boot_seconds(client, res["containers"][head.name])
            if i == 0:
                print(f"warm-up run: wall {wall:.2f}s (not counted)")
                continue
            rows.append((wall, res["seconds"], boot))
            print(f"run {i}: wall {wall:.2f}s  up() {res['seconds']:.2f}s  emulator boot {boot:.2f}s  "
                  f"overhead {wall - boot:.2f}s (in-process {res['seconds'] - boot:.2f}s)", flush=True)
        subprocess.run(down, env=env, capture_output=True, check=True)
        steps, noop = timeline(cfg, env)
    wall = statistics.median(r[0] for r in rows)
    inproc = statistics.median(r[1] - r[2] for r in rows)
    over = statistics.median(r[0] - r[2] for r in rows)
    boot = statistics.median(r[2] for r in rows)
    print()
    print(f"{len(nodes)} nodes, {a.runs} warm runs (medians), {'with' if a.gates else 'without'} gates")
    print(f"emulator boot (head start -> 'Application startup complete.'): {boot:.2f} s")
    print(f"`sparkserve up` wall: {wall:.2f} s -> overhead {over:.2f} s = {over / GOAL_S:.2f}x the 1.5 s goal")
    print(f"in-process up() overhead (input validation included; no interpreter start, no SSH connect): "
          f"{inproc:.2f} s = {inproc / GOAL_S:.2f}x the goal")
    print()
    print("one in-process up(), step by step (seconds since the call):")
    for t, msg in steps:
        print(f"  {t:5.2f}  {msg}")
    print(f"a no-op remote command (`true` over the node's SSH connection) costs {noop * 1000:.0f} ms on this rig")
    return 0


def timeline(cfg: Path, env: dict[str, str]) -> tuple[list[tuple[float, str]], float]:
    """One in-process up() with a timestamp on every step it reports; and the cost of one no-op command."""
    os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
    from sparkserve.config import load_config
    from sparkserve.deploy.stack import down
    from sparkserve.deploy.up import up
    from sparkserve.nodes.factory import open_nodes

    c = load_config(cfg)
    steps: list[tuple[float, str]] = []
    with open_nodes(c) as nodes:
        t0 = time.monotonic()
        res = up(c, nodes, run_gates=False, say=lambda m: steps.append((time.monotonic() - t0, m[:90])))
        steps.append((time.monotonic() - t0, f"up() returned ({res.status})"))
        down(c, nodes)
        node = nodes[c.nodes[-1].name]
        costs = []
        for _ in range(7):
            t = time.monotonic()
            node.run(["true"], step="bench")
            costs.append(time.monotonic() - t)
    return steps, statistics.median(costs)


if __name__ == "__main__":
    sys.exit(main())
