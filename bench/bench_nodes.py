"""Node-layer figures on the rig: SSH connect, one exec, docker SDK latency over the one-pool SSH adapter,
image ship (docker save → load over SSH), and drafter sync vs ``rsync -a`` over the same SSH.

    .venv/bin/python bench/bench_nodes.py                       # rig.yaml of scripts/rig, 200 MB drafter
    .venv/bin/python bench/bench_nodes.py --size-mb 2048 --reps 2

Prints figures; asserts nothing. The anchor for sync is ``rsync -a`` of the same directory into an empty
directory on the same node, with the same key and known_hosts (what an operator would type). sparkserve's
time includes its remote manifest before and the remote re-hash (verification) after the copy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sparkserve.config import load_config
from sparkserve.deploy.sync import sync_dir
from sparkserve.image.ship import image_id, ship_image
from sparkserve.models.manifest import manifest
from sparkserve.nodes import SSHNode


def median_ms(fn, n: int = 10) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    ts = []
    for _ in range(n):
        t = time.monotonic()
        fn()
        ts.append(time.monotonic() - t)
    return ts[0] * 1000, statistics.median(ts) * 1000


def make_drafter(root: Path, size_mb: int) -> Path:
    d = root / f"drafter-{size_mb}"
    if d.exists():
        return d
    d.mkdir(parents=True)
    shards = max(1, size_mb // 512)
    per = size_mb // shards
    block = os.urandom(2**20)
    for i in range(shards):
        with (d / f"model-{i + 1:05d}-of-{shards:05d}.safetensors").open("wb") as f:
            for k in range(per):
                f.write(block[k % 997:] + block[:k % 997])  # distinct blocks, cheap to make
    (d / "mask_embedding.pt").write_bytes(os.urandom(1_000_000))
    (d / "config.json").write_text('{"architectures": ["DFlash2DraftModel"]}\n')
    old = time.time() - 60
    for p in d.iterdir():
        os.utime(p, (old, old))
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=Path("/var/lib/sparkserve-rig/rig.yaml"))
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--node-root", default="/srv/spark")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sparkserve-bench-nodes")
    ap.add_argument("--ship", action="store_true", help="also ship the configured image to the second node")
    a = ap.parse_args()
    os.environ.setdefault("SPARKSERVE_CACHE_DIR", str(a.work / "cache"))
    cfg = load_config(a.config)
    nc = cfg.nodes[1]

    conn = []
    for _ in range(5):
        n = SSHNode(nc, cfg.ssh)
        n.connect()
        conn.append(n.connect_seconds or 0.0)
        n.close()
    print(f"ssh connect (paramiko, key auth): median {statistics.median(conn) * 1000:.0f} ms")
    node = SSHNode(nc, cfg.ssh).connect()
    first, med = median_ms(lambda: node.run(["true"]))
    print(f"run(['true']): first {first:.0f} ms, median {med:.0f} ms")
    t = time.monotonic()
    d = node.docker()
    print(f"docker client (one dial-stdio channel + /version): {(time.monotonic() - t) * 1000:.0f} ms")
    for name, fn in [("version", d.version), ("containers.list", lambda: d.containers.list(all=True)),
                     ("images.get", lambda: d.images.get(cfg.image.ref)), ("info", d.info)]:
        first, med = median_ms(fn, 20)
        print(f"docker {name:<16} first {first:.1f} ms, median {med:.1f} ms")

    if a.ship:
        src = SSHNode(cfg.nodes[0], cfg.ssh).connect()
        tag = f"{cfg.image.ref.rsplit(':', 1)[0]}:bench-ship"
        src.docker().images.get(cfg.image.ref).tag(tag)
        try:
            if image_id(node, tag):
                node.docker().images.remove(tag)
            r = ship_image(src, node, tag)
            print(f"ship {tag}: {r.bytes / 1e6:.0f} MB in {r.seconds:.2f}s = {r.mb_per_s:.0f} MB/s")
        finally:
            for n in (src, node):
                n.docker().images.remove(tag)
            src.close()

    drafter = make_drafter(a.work, a.size_mb)
    total = sum(p.stat().st_size for p in drafter.iterdir())
    m = manifest(drafter)
    rem = node.rsync_remote()
    base = f"{a.node_root}/sparkserve-bench"
    def settle() -> None:  # the previous copy's dirty pages must not slow the next one down
        node.run(["sync"], timeout=300)
        time.sleep(1)

    def anchor_copy() -> float:
        anchor = f"{base}/anchor"
        node.run(["rm", "-rf", anchor], timeout=300)
        node.run(["mkdir", "-p", anchor])
        settle()
        t = time.monotonic()
        subprocess.run(["rsync", "-a", "-e", rem.rsh, f"{drafter}/", f"{rem.target}:{anchor}/"], check=True)
        return time.monotonic() - t

    def ours(method: str) -> float:
        node.run(["rm", "-rf", f"{base}/{method}"], timeout=300)
        settle()
        r = sync_dir(node, drafter, f"{base}/{method}", method=method, local_manifest=m)  # type: ignore[arg-type]
        assert r.verified and r.bytes_copied == total
        return r.seconds

    for method in ("rsync", "sftp"):
        ratios = []
        for rep in range(a.reps):  # alternate who goes first
            if rep % 2:
                to, ta = ours(method), anchor_copy()
            else:
                ta, to = anchor_copy(), ours(method)
            ratios.append(ta / to)
            print(f"{method}: {total / 1e6:.0f} MB in {to:.2f}s ({total / 1e6 / to:.0f} MB/s, verified)"
                  f" | rsync -a {ta:.2f}s ({total / 1e6 / ta:.0f} MB/s) | throughput ratio {ta / to:.2f}")
        print(f"{method}: median ratio vs rsync -a {statistics.median(ratios):.2f}")
    ts = []
    for _ in range(5):
        t = time.monotonic()
        r = sync_dir(node, drafter, f"{base}/rsync")  # local manifest from the cache, like `up` does
        ts.append(time.monotonic() - t)
        assert r.bytes_copied == 0 and r.remote_hashed_bytes == 0
    print(f"unchanged {total / 1e6:.0f} MB drafter: median {statistics.median(ts) * 1000:.0f} ms, 0 bytes copied,"
          " 0 bytes hashed on the node")
    node.run(["rm", "-rf", base], timeout=300)
    node.close()


if __name__ == "__main__":
    main()
