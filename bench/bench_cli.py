#!/usr/bin/env python3
"""What the operator waits for at the command line: `--help`, `status`, and warm `up` overhead on 2/3/4 nodes.

    .venv/bin/python bench/bench_cli.py [--runs 7] [--up-runs 5] [--no-up]

* ``--help``: wall time of ``sparkserve --help`` (a fresh interpreter each run), median; anchors: the
  0.25 s goal, and ``python -c pass``.
* ``status``: wall time of ``sparkserve status --json`` against the shared two-node rig (nothing running:
  it connects to both nodes, lists their containers, asks the head's API).
* warm ``up`` overhead for 2, 3 and 4 nodes: a separate four-node rig is brought up for this (its own
  SSRIG_DIR, 127.0.0.40-43, port 2226, node root /srv/spark-bc; the shared rig is not touched) and removed
  after. For N nodes the config is that rig's first N nodes at TP=N; each run is ``down`` (not timed), then
  ``up --no-gates --json`` timed as a subprocess. overhead = wall − the emulator's own boot (head container
  start → ``Application startup complete.``, docker log timestamps), split into the part before the head starts
  (interpreter, config, SSH, preflight, the followers' start) and the part after it serves (seeing it, parity,
  exit).
  ``gates.settle_s`` is 0 (the settle window is a configured watch, not overhead). Anchors: the 1.5 s goal,
  and the 2-node overhead (goal: 4 nodes ≤ 1.1× of it). The first run of each N warms caches and is not counted.
The timed parts hold the shared rig's test lock, so no test runs beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rig"))
sys.path.insert(0, str(REPO / "bench"))

import rig as riglib  # noqa: E402
from bench_up_overhead import head_boot_seconds  # noqa: E402

SPARKSERVE = REPO / ".venv" / "bin" / "sparkserve"
PYTHON = REPO / ".venv" / "bin" / "python"
HELP_GOAL_S = 1 / 4
UP_GOAL_S = 1.5
FLAT_GOAL = 1.1
RIG4_ENV = {"SSRIG_NODE_ROOT": "/srv/spark-bc", "SSRIG_IP_BASE": "40", "SSRIG_SSH_PORT": "2226"}


def wall(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds: user + sys of the child) of ``argv``. The CPU figure holds
    on a busy machine (this one has 2 cores shared by everyone); the wall one is what a person waits."""
    times, cpus = [], []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        subprocess.run(argv, env=env, capture_output=True, timeout=300)
        times.append(time.monotonic() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return statistics.median(times), statistics.median(cpus)


def rigcmd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(Path(riglib.__file__).resolve()), *args], capture_output=True,
                          text=True, env=env, timeout=1200)


def machine_busy() -> float:
    """CPU-seconds this whole machine has spent busy since boot (every process: the rig's daemons and
    engines too), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def head_started_at(client, container_id: str) -> float:
    """The head container's start (docker State.StartedAt), unix seconds."""
    from bench_up_overhead import ts

    return ts(client.containers.get(container_id).attrs["State"]["StartedAt"])


def up_overhead(info: dict, n: int, runs: int, tmp: Path, env: dict[str, str]) -> tuple[float, ...]:
    """Medians of warm `up` on the first ``n`` nodes: (overhead = wall − head boot, wall, head boot, before
    the head starts = `up` started → the head container started, after it serves = its ``Application
    startup complete.`` → `up` exited, the machine's busy CPU-seconds during `up`, the `up` process's own
    CPU-seconds). The rig's clocks are this machine's, so the stamps compare."""
    import docker

    data = yaml.safe_load(Path(info["rig_yaml"]).read_text())
    data["nodes"] = data["nodes"][:n]
    data["serve"]["tensor_parallel_size"] = n
    data["serve"]["env"] = {**(data["serve"].get("env") or {}), "SSEMU_BOOT_SECONDS": "1.5"}
    data["serve"]["gpu_memory_utilization"] = 0.1
    data.setdefault("watchdog", {})["memory_floor_bytes"] = "1GiB"
    data.setdefault("gates", {})["settle_s"] = 0
    cfg = tmp / f"up{n}.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    rig_nodes = riglib.nodes_from_info(info)[:n]
    head = rig_nodes[0]
    clients = [docker.DockerClient(base_url=x.docker_url, version="1.41", timeout=60) for x in rig_nodes]
    client = clients[0]
    up = [str(SPARKSERVE), "up", "--no-gates", "--json", "-c", str(cfg)]
    down = [str(SPARKSERVE), "down", "-c", str(cfg)]
    rows = []
    try:
        for i in range(runs + 1):
            subprocess.run(down, env=env, capture_output=True, check=True, timeout=300)
            b0, r0 = machine_busy(), resource.getrusage(resource.RUSAGE_CHILDREN)
            t0, u0 = time.monotonic(), time.time()
            p = subprocess.run(up, env=env, capture_output=True, text=True, timeout=300)
            w = time.monotonic() - t0
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            busy, own_cpu = machine_busy() - b0, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
            if p.returncode != 0:
                raise RuntimeError(f"up on {n} nodes failed:\n{p.stderr[-3000:]}")
            started = json.loads(p.stdout)["containers"]
            boot = head_boot_seconds(client, started[head.name])
            before = head_started_at(client, started[head.name]) - u0
            if i:
                rows.append((w - boot, w, boot, before, w - boot - before, busy, own_cpu))
        subprocess.run(down, env=env, capture_output=True, check=True, timeout=300)
    finally:
        for c in clients:
            c.close()
    return tuple(statistics.median(r[k] for r in rows) for k in range(7))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs of --help and status")
    ap.add_argument("--up-runs", type=int, default=5, help="warm `up` runs per node count")
    ap.add_argument("--no-up", action="store_true", help="skip the 2/3/4-node `up` part (no second rig)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "XDG_CACHE_HOME": str(tmp / "cache")}
    env.pop("SPARKSERVE_CONFIG", None)
    shared = riglib.load_info()

    subprocess.run([str(SPARKSERVE), "--help"], env=env, capture_output=True)  # fills the command index cache
    results: dict[str, tuple[float, float]] = {}
    with riglib.exclusive_use():
        results["pass"] = wall([str(PYTHON), "-c", "pass"], env, a.runs)
        results["help"] = wall([str(SPARKSERVE), "--help"], env, a.runs)
        results["status"] = wall([str(SPARKSERVE), "status", "--json", "-c", shared["rig_yaml"]], env, a.runs)
    load = os.getloadavg()[0]
    (hw, hc), (pw, _), (sw, sc) = results["help"], results["pass"], results["status"]
    print(f"(load average {load:.1f} on {os.cpu_count()} cores)")
    print(f"`sparkserve --help`: wall {hw:.3f} s = {hw / HELP_GOAL_S:.2f}x the 0.25 s goal; CPU {hc:.3f} s = "
          f"{hc / HELP_GOAL_S:.2f}x ({hw / pw:.1f}x `python -c pass`, {pw:.3f} s)")
    print(f"`sparkserve status --json` (2 rig nodes, nothing running): wall {sw:.3f} s, CPU {sc:.3f} s")
    if a.no_up:
        return 0

    # short (the daemons' unix sockets live below it), and not under /tmp (each node has a private /tmp)
    d = Path(tempfile.mkdtemp(prefix="ssrigbc-", dir="/var/tmp"))
    renv = {**os.environ, **RIG4_ENV, "SSRIG_DIR": str(d), "SSRIG_CACHE": str(riglib.CACHE_DIR)}
    try:
        t0 = time.monotonic()
        p = rigcmd(renv, "up", "--nodes", "4")
        if p.returncode != 0:
            print(f"the four-node rig cannot come up:\n{p.stderr[-3000:]}", file=sys.stderr)
            return 1
        print(f"(four-node bench rig up in {time.monotonic() - t0:.0f} s)")
        info = json.loads((d / "rig.json").read_text())
        over: dict[int, tuple[float, ...]] = {}
        with riglib.exclusive_use():
            for n in (2, 3, 4):
                over[n] = up_overhead(info, n, a.up_runs, tmp, env)
                o, w, b, before, after, busy, own_cpu = over[n]
                print(f"warm `up` on {n} nodes: wall {w:.2f} s, emulator boot {b:.2f} s -> overhead {o:.2f} s = "
                      f"{o / UP_GOAL_S:.2f}x the 1.5 s goal (before the head starts {before:.2f} s, after it "
                      f"serves {after:.2f} s); CPU: the machine {busy:.2f} s ({busy / w / (os.cpu_count() or 1):.0%}"
                      f" of its {os.cpu_count()} cores), the `up` process {own_cpu:.2f} s", flush=True)
        print(f"overhead 4 nodes / 2 nodes: {over[4][0] / over[2][0]:.2f}x (goal <= {FLAT_GOAL}x; every node's "
              f"sshd, dockerd and engine share this machine's {os.cpu_count()} cores); per node added, the machine "
              f"spends {(over[4][5] - over[2][5]) / 2:.2f} CPU-s more, the `up` process "
              f"{(over[4][6] - over[2][6]) / 2:.2f}")
    finally:
        rigcmd(renv, "down", "--purge")
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
