#!/usr/bin/env python3
"""`weights ship` against plain `rsync -a`, over the same fabric link and the same bytes, side by side in one run.

    .venv/bin/python bench/bench_weights_ship.py [--mb 1024] [--rounds 3] [--streams 4]

Brings up a two-node bare rig of its own (own SSRIG_DIR under /var/tmp, 127.0.0.60-61, port 2240: issue 40's
addresses; the session's rig is untouched) with the rig's fabric (veth ports named as a Spark's ConnectX-7
netdevs, in network namespaces of the rig's own), runs `sparkserve setup --apply` on it, writes ``--mb`` MB of
random "shards" (four files) on the head, then in alternating order, each from an empty target:

* ship: :func:`sparkserve.deploy.weights.ship_one` (head → node over the fabric IP, ``--streams`` TCP streams,
  sendfile → splice), timed from the call to its return (programs started, bytes moved, renamed in place);
* rsync: ``rsync -a`` on the head, in its fabric namespace, to an rsync daemon on the node's fabric IP (the
  plain protocol, no ssh cipher: the faster of rsync's two ways, so the stricter anchor), timed around the
  command.

Goal: ship ≥ 0.9× rsync's throughput (the medians). Then resume: one shard removed on the node and another cut
to half of a part file (as a stopped ship leaves it): ship must send exactly the missing bytes. The content check
(sha256 on each node, compared) is timed on its own: rsync -a has none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RIG_PY = REPO / "tests" / "rig" / "rig.py"
sys.path.insert(0, str(REPO))
IP_BASE, PORT = 60, 2240


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="ssrig40b-", dir="/var/tmp"))
    env = {**os.environ, "SSRIG_DIR": str(d), "SSRIG_IP_BASE": str(IP_BASE), "SSRIG_SSH_PORT": str(PORT),
           "SSRIG_CACHE": os.environ.get("SSRIG_CACHE", "/var/lib/sparkserve-rig/cache")}
    work = Path(tempfile.mkdtemp(prefix="bench-ship-"))
    try:
        subprocess.run([sys.executable, str(RIG_PY), "up", "--nodes", "2", "--bare"], env=env, check=True,
                       capture_output=True)
        hosts = [f"127.0.0.{IP_BASE + i}:{PORT}" for i in range(2)]
        cli = [sys.executable, "-m", "sparkserve"]
        cenv = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run([*cli, "setup", *hosts, "--ssh-config", str(d / "ssh" / "config"), "--known-hosts",
                        str(d / "ssh" / "known_hosts"), "--fabric-range", "10.60.0.0/16", "--apply", "--yes"],
                       cwd=work, env=cenv, check=True, capture_output=True)
        return bench(d, work, a)
    finally:
        subprocess.run([*[sys.executable, "-m", "sparkserve"], "setup", "-c", "sparkserve.yaml", "--undo"], cwd=work,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True)
        subprocess.run([sys.executable, str(RIG_PY), "down", "--purge"], env=env, capture_output=True)
        subprocess.run(["rm", "-rf", str(d), str(work)], check=False)


def bench(d: Path, work: Path, a: argparse.Namespace) -> int:
    from sparkserve.config import load_config
    from sparkserve.deploy.weights import ship_one, verify
    from sparkserve.nodes.factory import open_nodes

    na, nb = (d / "nodes" / f"node-{x}" for x in "ab")
    ns_b = int((nb / "ns.pid").read_text())
    ns_a = int((na / "ns.pid").read_text())
    payload = na / "srv" / "bench" / "payload"
    payload.mkdir(parents=True)
    shard = a.mb * 2**20 // 4
    for i in range(4):
        with open(payload / f"model-0000{i + 1}-of-00004.safetensors", "wb") as f:
            left = shard
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
    total = 4 * shard
    (nb / "srv" / "bench").mkdir(parents=True, exist_ok=True)
    (nb / "srv" / "bench" / "rsyncd.conf").write_text(
        "pid file = /srv/spark/bench/rsyncd.pid\nuse chroot = no\n[bench]\npath = /srv/spark/bench\n"
        "read only = no\nuid = root\ngid = root\n")
    in_b = ["nsenter", f"--mount=/proc/{ns_b}/ns/mnt", "--", "ip", "netns", "exec", "ssfabric"]
    in_a = ["nsenter", f"--mount=/proc/{ns_a}/ns/mnt", "--", "ip", "netns", "exec", "ssfabric"]
    cfg = load_config(work / "sparkserve.yaml")
    ip_b = cfg.nodes[1].fabric_ip
    subprocess.run([*in_b, "rsync", "--daemon", f"--address={ip_b}", "--port=8730",
                    "--config=/srv/spark/bench/rsyncd.conf"], check=True)
    ship_s: list[float] = []
    rsync_s: list[float] = []
    try:
        with open_nodes(cfg) as nodes:
            head, node = nodes[cfg.nodes[0].name], nodes[cfg.nodes[1].name]
            for r in range(a.rounds):
                order = ("ship", "rsync") if r % 2 == 0 else ("rsync", "ship")
                for kind in order:
                    dest = "payload" if kind == "ship" else "rsync-copy"  # each from an empty target
                    subprocess.run(["rm", "-rf", str(nb / "srv" / "bench" / dest)], check=True)
                    if kind == "ship":
                        t = time.monotonic()
                        rep = ship_one(head, "b", node, ip_b, "/srv/spark/bench/payload", streams=a.streams)
                        ship_s.append(time.monotonic() - t)
                        assert rep.sent_bytes == total, rep
                    else:
                        t = time.monotonic()
                        subprocess.run([*in_a, "rsync", "-a", "/srv/spark/bench/payload/",
                                        f"rsync://{ip_b}:8730/bench/rsync-copy/"], check=True)
                        rsync_s.append(time.monotonic() - t)
            subprocess.run(["rm", "-rf", str(nb / "srv" / "bench" / "rsync-copy")], check=True)
            t = time.monotonic()
            bad = verify(head, {"b": node}, "/srv/spark/bench/payload")
            verify_s = time.monotonic() - t
            assert bad == {"b": []}, bad
            # resume: one shard gone, another cut to half of a part file (what a stopped ship leaves)
            got = nb / "srv" / "bench" / "payload"
            (got / "model-00001-of-00004.safetensors").unlink()
            half = got / "model-00002-of-00004.safetensors"
            half.rename(half.with_name(half.name + ".sparkserve-part"))
            os.truncate(half.with_name(half.name + ".sparkserve-part"), shard // 2)
            missing = shard + (shard - shard // 2)
            rep = ship_one(head, "b", node, ip_b, "/srv/spark/bench/payload", streams=a.streams)
            resumed = rep.sent_bytes
            assert verify(head, {"b": node}, "/srv/spark/bench/payload") == {"b": []}
    finally:
        pid = nb / "srv" / "bench" / "rsyncd.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], check=False)
    ms, mr = statistics.median(ship_s), statistics.median(rsync_s)
    gs, gr = total / ms / 1e9, total / mr / 1e9
    print(f"payload {total / 1e9:.2f} GB in 4 files, {a.rounds} rounds each, alternating; rig fabric "
          f"(veth through the rig's switch namespace, MTU 9000); {os.cpu_count()} CPUs")
    print(f"weights ship ({a.streams} streams): median {ms:.2f} s = {gs:.2f} GB/s  (all: "
          f"{', '.join(f'{x:.2f}' for x in ship_s)} s)")
    print(f"rsync -a (daemon):       median {mr:.2f} s = {gr:.2f} GB/s  (all: "
          f"{', '.join(f'{x:.2f}' for x in rsync_s)} s)")
    ratio = gs / gr
    print(f"ratio ship/rsync throughput: {ratio:.2f}x (goal >= 0.9x): {'PASS' if ratio >= 0.9 else 'FAIL'}")
    print(f"resume: sent {resumed / 1e6:.1f} MB for {missing / 1e6:.1f} MB missing (goal: exactly the missing "
          f"bytes): {'PASS' if resumed == missing else 'FAIL'}")
    print(f"content check (sha256 on each node, compared; rsync -a has none): {verify_s:.2f} s")
    return 0 if ratio >= 0.9 and resumed == missing else 1


if __name__ == "__main__":
    sys.exit(main())
