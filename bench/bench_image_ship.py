#!/usr/bin/env python3
"""`image ship` (only the layers a target lacks, node to node) against `docker save | ssh docker load`.

    flock /tmp/rig.lock .venv/bin/python bench/bench_image_ship.py [--mb 200] [--change-mb 1]

Brings up its own four-node rig (own SSRIG_DIR, 127.0.0.40-43, port 2226; the session's rig is untouched)
and builds on the head, ``FROM scratch``: a random ``--mb`` MB layer, a random 30 MB layer and a random
``--change-mb`` MB layer (v1); v2 replaces only the last layer. Cases, each from a clean target:

* cold: v1 into a node with none of it — throughput, goal ≥ 0.9× the pipe's;
* unchanged: v1 again — goal 0 bytes in < 1 s (the pipe re-sends everything);
* one-layer change: v2 into a node with v1 — goal ≤ 1.1× the changed layer's bytes;
* three targets in parallel, cold — goal ≤ 1.2× the time of one target.

Each case also ``--via registry`` (a temporary registry on the head, pulled from by the targets; its
one-layer change is measured on a node that got v1 by the registry, as docker pull knows layers by their
registry digest).

The anchor is the pipe users run by hand (eugr/spark-vllm-docker ``build-and-copy.sh``): ``docker save`` on
the head piped into ``ssh <node> docker load`` (bytes counted in the pipe), in parallel for three nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rig"))

import docker  # noqa: E402
import rig as riglib  # noqa: E402

from sparkserve.config import load_config  # noqa: E402
from sparkserve.image.registry import ship_via_registry  # noqa: E402
from sparkserve.image.ship import ship_layers  # noqa: E402
from sparkserve.nodes.factory import open_nodes  # noqa: E402

RIG_PY = Path(riglib.__file__).resolve()
REPO_NAME = "sparkserve-bench/ship"


def rigcmd(env: dict[str, str], *args: str) -> None:
    p = subprocess.run([sys.executable, str(RIG_PY), *args], capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode:
        raise SystemExit(f"rig {' '.join(args)} failed: {p.stderr.strip()[-2000:]}")


def clear(client: docker.DockerClient) -> None:
    for img in client.images.list(name=REPO_NAME):
        for t in img.tags:
            client.images.remove(t, force=True)
    client.images.prune(filters={"dangling": False})


def cpu_busy_s(roots: list[int]) -> float:
    """CPU seconds used so far by the rig's processes (each node's namespace holder, dockerd and sshd, and
    everything under them: the ship programs, docker CLIs, containerd) and by this process — not by whatever
    else shares the machine. A living process's own time plus that of the children it reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(f[1]), []).append(int(d.name))
        times[int(d.name)] = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    total, todo, seen = 0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += times.get(pid, 0)
        todo += kids.get(pid, [])
    me = os.times()
    return total / tick + me.user + me.system


def pipe(head, node, ssh_base: list[str], ref: str) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """`docker save ref` on the head | `ssh node docker load`, bytes counted in the pipe."""
    t0 = time.monotonic()
    save = subprocess.Popen(["docker", "-H", head.docker_url, "save", ref], stdout=subprocess.PIPE)
    load = subprocess.Popen([*ssh_base, "-p", str(node.port), f"root@{node.host}", "docker", "load", "-q"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    n = 0
    assert save.stdout is not None and load.stdin is not None
    for chunk in iter(lambda: save.stdout.read(1 << 20), b""):
        n += len(chunk)
        load.stdin.write(chunk)
    load.stdin.close()
    if save.wait() or load.wait():
        raise SystemExit("the pipe failed")
    return n, time.monotonic() - t0


def report(rows: list[tuple[str, int, float, int, float, int, float]], size: int, changed_layer: int,
           n_targets: int, cpu: tuple[float, float], floor: tuple[float, float]) -> None:
    """Print the table and the goals (the bench's output)."""
    (cpu_one, cpu_par), (floor_one, floor_par) = cpu, floor
    print(f"image: {size / 1e6:.1f} MB in 3 layers; changed layer {changed_layer / 1e6:.3f} MB "
          f"({changed_layer} B)")
    print(f"{'case':34} {'pipe bytes':>13} {'pipe s':>7} {'ship bytes':>13} {'ship s':>7} "
          f"{'registry bytes':>14} {'reg. s':>7}")
    for name, pb, ps, tb, ts, rb, rs in rows:
        print(f"{name:34} {pb:13,d} {ps:7.2f} {tb:13,d} {ts:7.2f} {rb:14,d} {rs:7.2f}")
    cold_ratio = (rows[0][3] / rows[0][4]) / (rows[0][1] / rows[0][2])
    print("goals:")
    print(f"  unchanged: {rows[1][3]} bytes in {rows[1][4]:.2f}s (goal 0 bytes, < 1 s): "
          f"{'PASS' if rows[1][3] == 0 and rows[1][4] < 1 else 'FAIL'}")
    ratio = rows[2][3] / changed_layer
    print(f"  one-layer change: {ratio:.3f}× the changed layer's bytes (goal ≤ 1.1×): "
          f"{'PASS' if ratio <= 1.1 else 'FAIL'}")
    print(f"  cold throughput: {cold_ratio:.2f}× the pipe's (goal ≥ 0.9×; ship {rows[0][3] / 1e6 / rows[0][4]:.1f}"
          f" MB/s, pipe {rows[0][1] / 1e6 / rows[0][2]:.1f} MB/s): {'PASS' if cold_ratio >= 0.9 else 'FAIL'}")
    par = rows[3][4] / rows[0][4]
    print(f"  {n_targets} targets in parallel: {par:.2f}× the time of one (goal ≤ 1.2×; the pipe: "
          f"{rows[3][2] / rows[0][2]:.2f}×): {'PASS' if par <= 1.2 else 'FAIL'}")
    ncpu = os.cpu_count() or 1
    print(f"  CPU (the rig's processes only): one target used {cpu_one:.1f} CPU-s in {rows[0][4]:.2f}s, "
          f"{n_targets} targets "
          f"{cpu_par:.1f} CPU-s in {rows[3][4]:.2f}s; on {ncpu} cores the {n_targets} can take no less than "
          f"{cpu_par / ncpu:.2f}s = {cpu_par / ncpu / rows[0][4]:.2f}× the time of one (every daemon shares "
          "those cores; on real nodes each target loads on its own)")
    print(f"  --via registry (push into the head's temporary registry included; a node's layers from "
          f"`docker load` are unknown to docker pull, so cold = all): one-layer change "
          f"{rows[2][5] / changed_layer:.3f}× the changed layer's bytes, unchanged {rows[1][5]} bytes in "
          f"{rows[1][6]:.2f}s, {n_targets} targets {rows[3][6] / rows[0][6]:.2f}× the time of one")
    print(f"  this machine's floor: `docker load -i` of the same tar into 1 daemon {floor_one:.2f}s, into "
          f"{n_targets} at once {floor_par:.2f}s = {floor_par / floor_one:.2f}× ({os.cpu_count()} cores "
          "host every node)")


def pipe_parallel(head, targets, ssh_base: list[str], ref: str) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """The pipe to every target at once (eugr's ``tee >(…)``): total bytes, wall time."""
    results: dict[str, tuple[int, float]] = {}
    t0 = time.monotonic()
    threads = [threading.Thread(target=lambda t=t: results.__setitem__(t.name, pipe(head, t, ssh_base, ref)))
               for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(b for b, _ in results.values()), time.monotonic() - t0


def load_floor(head, targets, clients, ref: str, d: Path) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The machine's own floor: the same image loaded from a local file into 1, then N daemons at once (no
    network, no save): on a VM whose cores host every node, N loads compete for the same cores."""
    tar = d / "v1.tar"
    subprocess.run(["docker", "-H", head.docker_url, "save", "-o", str(tar), ref], check=True)

    def load(t) -> None:  # type: ignore[no-untyped-def]
        subprocess.run(["docker", "-H", t.docker_url, "load", "-q", "-i", str(tar)], check=True,
                       stdout=subprocess.DEVNULL)

    for t in targets:
        clear(clients[t.name])
    t0 = time.monotonic()
    load(targets[0])
    floor_one = time.monotonic() - t0
    for t in targets:
        clear(clients[t.name])
    t0 = time.monotonic()
    threads = [threading.Thread(target=load, args=(t,)) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    floor_par = time.monotonic() - t0
    tar.unlink()
    return floor_one, floor_par


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--change-mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of the cold one/N-target ships")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="ssrig-bi-", dir="/var/tmp"))  # not /tmp: nodes mount a private one
    env = {**os.environ, "SSRIG_DIR": str(d), "SSRIG_NODE_ROOT": "/srv/spark-bi", "SSRIG_IP_BASE": "40",
           "SSRIG_SSH_PORT": "2226", "SSRIG_CACHE": str(riglib.CACHE_DIR)}
    try:
        print("bringing up a four-node bench rig …", file=sys.stderr)
        rigcmd(env, "up", "--nodes", "4")
        info = json.loads((d / "rig.json").read_text())
        handle = riglib.RigHandle.from_info(info)
        roots = [pid for node in info["pids"].values() for pid in node.values() if pid]
        clients = {n.name: docker.DockerClient(base_url=n.docker_url, version="1.41", timeout=600)
                   for n in handle.nodes}
        head, targets = handle.nodes[0], handle.nodes[1:]
        hc = clients[head.name]
        riglib.build_image(hc, f"{REPO_NAME}:base", None,
                           {"big": os.urandom(args.mb * 10**6), "mid": os.urandom(30 * 10**6)})
        change = int(args.change_mb * 10**6)
        riglib.build_image(hc, f"{REPO_NAME}:v1", f"{REPO_NAME}:base", {"stamp": os.urandom(change)})
        riglib.build_image(hc, f"{REPO_NAME}:v2", f"{REPO_NAME}:base", {"stamp": os.urandom(change)})
        v1, v2 = f"{REPO_NAME}:v1", f"{REPO_NAME}:v2"
        size = int(hc.images.get(v1).attrs["Size"])
        changed_layer = int(hc.api.history(v2)[0]["Size"])
        ssh_base = ["ssh", "-i", str(handle.identity_file), "-o", f"UserKnownHostsFile={handle.known_hosts}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
        cfg = load_config(Path(handle.rig_yaml))
        rows: list[tuple[str, int, float, int, float, int, float]] = []
        with open_nodes(cfg) as nodes:
            src = nodes[head.name]

            def thin(ref: str, names: list[str], via=ship_layers) -> tuple[int, float]:  # type: ignore[no-untyped-def]
                t0 = time.monotonic()
                got = via(src, [nodes[n] for n in names], ref, source_ip=head.fabric_ip)
                return sum(r.bytes for r in got.values()), time.monotonic() - t0

            def reg(ref: str, names: list[str]) -> tuple[int, float]:
                return thin(ref, names, ship_via_registry)

            one = targets[0]
            clear(clients[one.name])
            p_cold = pipe(head, one, ssh_base, v1)
            p_same = pipe(head, one, ssh_base, v1)
            p_change = pipe(head, one, ssh_base, v2)
            clear(clients[one.name])
            c0 = cpu_busy_s(roots)
            t_cold = thin(v1, [one.name])
            cpu_one = cpu_busy_s(roots) - c0
            t_same = thin(v1, [one.name])
            t_change = thin(v2, [one.name])
            clear(clients[one.name])  # --via registry, from a node with none of it again
            r_cold = reg(v1, [one.name])
            r_same = reg(v1, [one.name])
            r_change = reg(v2, [one.name])
            rows += [("cold", *p_cold, *t_cold, *r_cold), ("unchanged", *p_same, *t_same, *r_same),
                     ("one-layer change", *p_change, *t_change, *r_change)]
            for t in targets:
                clear(clients[t.name])
            p_par = pipe_parallel(head, targets, ssh_base, v1)
            for t in targets:
                clear(clients[t.name])
            c0 = cpu_busy_s(roots)
            t_par = thin(v1, [t.name for t in targets])
            cpu_par = cpu_busy_s(roots) - c0
            for t in targets:
                clear(clients[t.name])
            r_par = reg(v1, [t.name for t in targets])
            rows.append((f"cold, {len(targets)} targets in parallel", *p_par, *t_par, *r_par))
            runs = [(t_cold[1], t_par[1])]
            for _ in range(args.repeat - 1):  # the machine is shared: one against N, interleaved, N times
                secs = []
                for names in ([one.name], [t.name for t in targets]):
                    for t in targets:
                        clear(clients[t.name])
                    secs.append(thin(v1, names)[1])
                runs.append((secs[0], secs[1]))
            floor_one, floor_par = load_floor(head, targets, clients, v1, d)
        report(rows, size, changed_layer, len(targets), (cpu_one, cpu_par), (floor_one, floor_par))
        ones, pars = sorted(r[0] for r in runs), sorted(r[1] for r in runs)
        med = ones[len(ones) // 2], pars[len(pars) // 2]
        print(f"  over {len(runs)} interleaved runs: one target {med[0]:.2f}s (median; {ones[0]:.2f}–{ones[-1]:.2f}), "
              f"{len(targets)} targets {med[1]:.2f}s ({pars[0]:.2f}–{pars[-1]:.2f}): {med[1] / med[0]:.2f}× the time "
              f"of one (goal ≤ 1.2×): {'PASS' if med[1] / med[0] <= 1.2 else 'FAIL'}")
        for c in clients.values():
            c.close()
    finally:
        subprocess.run([sys.executable, str(RIG_PY), "down", "--purge"], capture_output=True, env=env, timeout=600)
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
