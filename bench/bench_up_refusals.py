#!/usr/bin/env python3
"""How long `sparkserve up` takes to refuse a run it cannot do, before and after issue 45, side by side (the rig).

    .venv/bin/python bench/bench_up_refusals.py [--before REF] [--runs 3] [--drafter-mb 1024]

Issue 45: on a real engine, `up` with the API port already taken spent 28.8 s identifying the engine and syncing
the drafter before it said "port … already in use". The goal: a taken port, a missing drafter, or a GPU already
full refused in under 2 s on a cold machine.

Three refusals, each timed as the operator waits for it (`sparkserve up` as a subprocess: interpreter start,
config, SSH connect, the pre-flight, the error line), with the code before (``--before``, default: the commit
before the first ``issue 45:`` commit, exported with `git archive`) and with this checkout:

* port      — the head's API port taken by a listener that is not sparkserve's;
* gpu-full  — node-b's (fake) MemAvailable 9 GiB of 119.7 GiB: another process holds the memory;
* port, slow identity — the same taken port with ``runtime: process`` and an engine whose cold identity takes
  ``--identity-s`` seconds (the rig's emulator launcher behind a ``--version`` that sleeps: on the real engine the
  identity of vLLM 0.25.1 cost most of the 28.8 s; the identity cache is deleted before every run);
* drafter   — drafter.path on the head only (validate reads it there), missing on node-b, and no copy on this
  machine to sync from.

The port and gpu-full runs use a ``drafter.source`` of ``--drafter-mb`` MiB (the rig's drafter plus a filler
file): the code before synced it to every node before it judged the port or the memory; the synced copy is
deleted after every run. "Cold": every run is a fresh process with a fresh state dir (no journal, no image facts);
the rig's nodes keep their images. Each figure is the median of ``--runs``; every run must refuse (exit ≠ 0) with
the expected words, or the script fails. Holds the rig's test lock.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rig"))

import rig as riglib  # noqa: E402

GOAL_S = 2.0
SYNCED = "/srv/spark/bench-refusals-drafter"
HEAD_ONLY = "/srv/spark/bench-head-only-drafter"
SLOW_VLLM = "/srv/spark/bench-slow-engine/bin/vllm"
SLOW_RUN = "/srv/spark/bench-slow-run"


def before_ref() -> str:
    """The commit before the first `issue 45:` commit on this branch."""
    out = subprocess.run(["git", "-C", str(REPO), "log", "--reverse", "--format=%H", "--grep=^issue 45:"],
                         capture_output=True, text=True, check=True).stdout.split()
    if not out:
        raise SystemExit("no `issue 45:` commit in this checkout's history: pass --before REF")
    return out[0] + "^"


def export(ref: str, dest: Path) -> Path:
    """``ref``'s sparkserve package under ``dest`` (git archive)."""
    dest.mkdir(parents=True, exist_ok=True)
    tar = dest / "src.tar"
    with tar.open("wb") as f:
        subprocess.run(["git", "-C", str(REPO), "archive", ref, "sparkserve"], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=None, help="the code before (a git ref; default: before issue 45)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--drafter-mb", type=int, default=1024, help="size of drafter.source for port/gpu-full")
    ap.add_argument("--identity-s", type=float, default=20.0, help="the slow engine's cold identity (seconds)")
    a = ap.parse_args()

    info = riglib.load_info()
    nodes = riglib.nodes_from_info(info)
    head, follower = nodes[0], nodes[1]
    tmp = Path(tempfile.mkdtemp(prefix="bench-refusals-"))
    ref = a.before or before_ref()
    old = export(ref, tmp / "before")
    data = yaml.safe_load(Path(info["rig_yaml"]).read_text())
    source = tmp / "drafter"
    shutil.copytree(head.host_path(data["drafter"]["path"]), source)
    with (source / "filler.bin").open("wb") as f:  # real bytes (not a hole): hashing and copying read them all
        block = os.urandom(1 << 20)
        for _ in range(a.drafter_mb):
            f.write(block)

    synced = {**data, "drafter": {**data["drafter"], "path": SYNCED, "source": str(source)}}
    missing = {**data, "drafter": {**data["drafter"], "path": HEAD_ONLY}}
    for n in nodes:  # the slow engine: the emulator launcher behind a --version that takes --identity-s
        riglib.install_process_engine(n)
        slow = n.host_path(SLOW_VLLM)
        slow.parent.mkdir(parents=True, exist_ok=True)
        slow.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then sleep {a.identity_s}; fi\n'
                        f'exec {riglib.PROCESS_VLLM} "$@"\n')
        slow.chmod(0o755)
    slow_cfg = {**data, "runtime": "process", "serve": {**data["serve"], "vllm": SLOW_VLLM},
                "process": {"run_dir": SLOW_RUN}}
    shutil.rmtree(head.host_path(HEAD_ONLY), ignore_errors=True)
    shutil.copytree(head.host_path(data["drafter"]["path"]), head.host_path(HEAD_ONLY))
    cfgs = {}
    for name, body in (("synced", synced), ("missing", missing), ("slow", slow_cfg)):
        cfgs[name] = tmp / f"{name}.yaml"
        cfgs[name].write_text(yaml.safe_dump(body, sort_keys=False))
    port = int(data["serve"]["port"])

    def run(code: Path | None, cfg: Path, says: str) -> tuple[float, float]:
        state = Path(tempfile.mkdtemp(prefix="state-", dir=tmp))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
        env["XDG_STATE_HOME"] = str(state)
        env["PYTHONPATH"] = str(code or REPO)
        t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([sys.executable, "-m", "sparkserve", "up", "-c", str(cfg)], env=env, cwd=code or REPO,
                           capture_output=True, text=True, timeout=900)
        took, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        for n in nodes:  # the next run is cold again: nothing synced
            shutil.rmtree(n.host_path(SYNCED), ignore_errors=True)
        if p.returncode == 0 or says not in p.stderr:
            print(p.stdout + p.stderr, file=sys.stderr)
            raise SystemExit(f"expected a refusal saying {says!r} (exit {p.returncode})")
        return took, cpu

    def taken_port(code: Path | None) -> tuple[float, float]:
        with socket.socket() as s:
            s.bind((head.host, port))
            s.listen()
            return run(code, cfgs["synced"], "already in use")

    def slow_identity(code: Path | None) -> tuple[float, float]:
        for n in nodes:  # cold: the node's engine identity cache is gone
            for f in n.host_path(SLOW_RUN).glob(".engine-identity*"):
                f.unlink()
        with socket.socket() as s:
            s.bind((head.host, port))
            s.listen()
            return run(code, cfgs["slow"], "already in use")

    def gpu_full(code: Path | None) -> tuple[float, float]:
        meminfo = follower.host_path("/srv/spark/proc") / "meminfo"
        meminfo.write_text(riglib.fake_meminfo(free_gib=8, available_gib=9))
        try:
            return run(code, cfgs["synced"], "below gpu_memory_utilization")
        finally:
            riglib.write_fake_proc(follower)

    def no_drafter(code: Path | None) -> tuple[float, float]:
        return run(code, cfgs["missing"], HEAD_ONLY)

    rows = []
    load = os.getloadavg()[0]
    with riglib.exclusive_use():
        for name, fn in (("port taken", taken_port), ("port, slow identity", slow_identity),
                         ("GPU already full", gpu_full),
                         ("drafter missing on node-b", no_drafter)):
            before = [fn(old) for _ in range(a.runs)]
            after = [fn(None) for _ in range(a.runs)]
            med = [statistics.median(x[i] for x in runs) for runs in (before, after) for i in (0, 1)]
            rows.append((name, *med))
            print(f"{name}: before {', '.join(f'{w:.2f}' for w, _ in before)} s; after "
                  f"{', '.join(f'{w:.2f}' for w, _ in after)} s", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(head.host_path(HEAD_ONLY), ignore_errors=True)
    for n in nodes:
        shutil.rmtree(n.host_path(SLOW_VLLM).parent.parent, ignore_errors=True)
        shutil.rmtree(n.host_path(SLOW_RUN), ignore_errors=True)
    print()
    print(f"`sparkserve up` refusals on the rig ({len(nodes)} nodes, docker runtime but for the slow identity's "
          f"process runtime, drafter.source {a.drafter_mb} MiB, cold identity {a.identity_s:g} s), median of "
          f"{a.runs} cold runs; before = {ref}; this machine's load average {load:.1f} on {os.cpu_count()} CPUs "
          "(wall includes waiting for a CPU; CPU = the process's user+sys)")
    print(f"{'refusal':<28}{'before wall':>12}{'after wall':>11}{'before/after':>14}{'after/2 s':>11}"
          f"{'before CPU':>12}{'after CPU':>11}")
    for name, bw, bc, aw, ac in rows:
        print(f"{name:<28}{bw:>11.2f}s{aw:>10.2f}s{bw / aw:>13.1f}x{aw / GOAL_S:>10.2f}x{bc:>11.2f}s{ac:>10.2f}s")
    return 0 if all(aw < GOAL_S for _, _, _, aw, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
