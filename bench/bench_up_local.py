#!/usr/bin/env python3
"""Warm `up` overhead on 2/3/4 nodes that are all this machine: ``local: true``, ``runtime: process``.

    .venv/bin/python bench/bench_up_local.py [--up-runs 5] [--work DIR]

The same measure as bench/bench_cli.py's warm `up` part (overhead = wall − the head's own boot, the settle
window 0, the first run of each N not counted), without SSH and docker: each node is a ``local: true``
entry with its own fabric address (127.0.0.100 …, one fake ConnectX-7 sysfs holding all their RoCE v2
GIDs), and each rank is the engine emulator as a host process (``serve.vllm`` = a launcher running
tests/rig/emulator/vllm_emulator.py with this Python). What is left is sparkserve's own orchestration and
the ranks' own CPU, so the same script shows how the overhead grows with nodes on a 2-core VM (every rank
shares its cores) and on a machine with a core or more per rank (the GPU box of tests/real, 16 cores).

The head's boot: its process start (the rank manifest's ``started_at``) → its ``Application startup
complete.`` line (the log's arrival stamps). Needs the rig's tiny models (scripts/rig up makes them), or
``--models DIR`` holding ``target/`` and ``drafter/``. Anchors: the 1.5 s goal and the 2-node overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EMULATOR = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
SERVE_ARGS = REPO / "sparkserve" / "data" / "vllm-0.33.0-serve-args.json"
UP_GOAL_S = 1.5
FLAT_GOAL = 1.1
IP0 = 100  # 127.0.0.100 + i: each node's fabric address (and the head's API host)


def stamp(text: str) -> float:
    """An RFC 3339 stamp (the process runtime's, as docker's) → unix seconds."""
    base, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(base + "+00:00").timestamp() + float(f"0.{frac or 0}")


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


def find_models(given: Path | None) -> Path:
    if given is not None:
        return given
    sys.path.insert(0, str(REPO / "tests" / "rig"))
    import rig as riglib

    return riglib.ensure_models()


def config_for(n: int, work: Path, models: Path, port: int) -> Path:
    launcher = work / "venv" / "bin" / "vllm"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(f"#!/bin/sh\nexport PYTHONUNBUFFERED=1 SSEMU_SERVE_ARGS={SERVE_ARGS}\n"
                        f'exec {sys.executable} {EMULATOR} "$@"\n')
    launcher.chmod(0o755)
    data = {
        "nodes": [{"name": f"n{i}", "host": "localhost", "fabric_ip": f"127.0.0.{IP0 + i}", "local": True,
                   "gpus": 1} for i in range(n)],
        "runtime": "process", "process": {"run_dir": str(work / "run")}, "image": {"ref": "unused"},
        "model": {"target": str(models / "target"), "served_name": "tiny"},
        "drafter": {"path": str(models / "drafter")},
        "serve": {"tensor_parallel_size": n, "host": f"127.0.0.{IP0}", "port": port,
                  "vllm": str(launcher.parent.parent),
                  "max_model_len": 262144, "kv_cache_dtype": "fp8_e4m3", "kv_cache_memory_bytes": "8GiB",
                  "gpu_memory_utilization": 0.1, "env": {"SSEMU_BOOT_SECONDS": "1.5"}, "ready_timeout_s": 60},
        "fabric": {"master_port": port + 1, "sysfs_root": str(work / "sys")},
        "container": {"stop_timeout_s": 3},
        "gates": {"settle_s": 0},
        "watchdog": {"memory_floor_bytes": "1GiB"},
    }
    cfg = work / f"up{n}.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg


def head_boot(cfg_path: Path, head_id: str) -> float:
    """The head rank's own boot: process start → ``Application startup complete.``."""
    from sparkserve.config import load_config
    from sparkserve.nodes.factory import open_nodes
    from sparkserve.nodes.runtime import engine_for

    cfg = load_config(cfg_path)
    with open_nodes(cfg, names=[cfg.head.name]) as nodes:
        eng = engine_for(nodes[cfg.head.name], cfg)
        started = stamp(eng.state(head_id).started_at)
        for raw in eng.logs(head_id, timestamps=True):
            at, _, line = raw.partition(" ")
            if "Application startup complete." in line:
                return stamp(at) - started
    raise RuntimeError("the head never logged 'Application startup complete.'")


def up_overhead(cfg: Path, runs: int, env: dict[str, str]) -> tuple[float, float, float]:
    """Medians of warm `up`: (overhead, wall, head boot)."""
    sparkserve = [sys.executable, "-m", "sparkserve"]
    up = [*sparkserve, "up", "--no-gates", "--json", "-c", str(cfg)]
    down = [*sparkserve, "down", "-c", str(cfg)]
    rows = []
    try:
        for i in range(runs + 1):
            subprocess.run(down, env=env, capture_output=True, check=True, timeout=300)
            t0 = time.monotonic()
            p = subprocess.run(up, env=env, capture_output=True, text=True, timeout=300)
            w = time.monotonic() - t0
            if p.returncode != 0:
                raise RuntimeError(f"up failed:\n{p.stderr[-3000:]}")
            ids = json.loads(p.stdout)["containers"]
            boot = head_boot(cfg, ids["n0"])
            if i:
                rows.append((w - boot, w, boot))
    finally:
        subprocess.run(down, env=env, capture_output=True, timeout=300)
    return tuple(statistics.median(r[k] for r in rows) for k in range(3))  # type: ignore[return-value]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--up-runs", type=int, default=5, help="warm `up` runs per node count")
    ap.add_argument("--models", type=Path, help="a directory with target/ and drafter/ (default: the rig's)")
    ap.add_argument("--port", type=int, default=8123)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-up-local-"))
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "XDG_CACHE_HOME": str(work / "cache")}
    env.pop("SPARKSERVE_CONFIG", None)
    try:
        models = find_models(a.models)
        write_sysfs(work / "sys", [f"127.0.0.{IP0 + i}" for i in range(4)])
        print(f"({os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f})", flush=True)
        over = {}
        for n in (2, 3, 4):
            over[n] = up_overhead(config_for(n, work, models, a.port), a.up_runs, env)
            o, w, b = over[n]
            print(f"warm `up` on {n} local process nodes: wall {w:.2f} s, emulator boot {b:.2f} s -> overhead "
                  f"{o:.2f} s = {o / UP_GOAL_S:.2f}x the 1.5 s goal", flush=True)
        print(f"overhead 4 nodes / 2 nodes: {over[4][0] / over[2][0]:.2f}x (goal <= {FLAT_GOAL}x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
