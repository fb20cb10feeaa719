"""First contact, before and after issue 24: wall time of `validate`, `status`, `gates` and `up` on a stack that
is already up, on the rig, side by side in one run.

    git worktree add /tmp/ss-before 545b30e          # the code before issue 24
    flock /tmp/rig.lock .venv/bin/python bench/bench_first_contact.py --before /tmp/ss-before [--runs 3]

Both versions run with this checkout's venv as `python -m sparkserve` (PYTHONPATH picks the tree), against the
same rig config (rig.yaml + a small smoke cell: the smoke cell's own time is the same for both and is not what
changed), with the same journal. Each version first brings the stack up itself (untimed: a deployment
fingerprint may differ between versions, and "already up" must mean its own stack), then each command runs
`--runs` times; the table shows the median and the ratio after/before. `validate` runs with each version's
default argv judge (before: vLLM's own parser when importable here; after: the committed option list).
The rig's exclusive-use lock is held throughout; the stack is taken down at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RIG_DIR = Path(os.environ.get("SSRIG_DIR", "/var/lib/sparkserve-rig"))
FAST_ENV = {"SSEMU_BOOT_SECONDS": "1.2", "VLLM_RINGBUFFER_WARNING_INTERVAL": "2", "SSEMU_PEER_TIMEOUT_S": "3",
            "SSEMU_NCCL_TIMEOUT_S": "2"}
COMMANDS = {  # name → argv after `sparkserve` (the config is appended)
    "validate": ["validate"],
    "status": ["status"],
    "gates": ["gates"],
    "up (already up)": ["up"],
}


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def config(work: Path) -> Path:
    data = yaml.safe_load((RIG_DIR / "rig.yaml").read_text())
    head = data["nodes"][0]["fabric_ip"]
    data.setdefault("serve", {}).update({"port": free_port(head), "gpu_memory_utilization": 0.1,
                                         "env": {**data["serve"].get("env", {}), **FAST_ENV},
                                         "ready_timeout_s": 120})
    data.setdefault("watchdog", {})["memory_floor_bytes"] = "1GiB"
    data.setdefault("fabric", {})["master_port"] = free_port(head)
    data.setdefault("container", {}).update({"name_prefix": "bench24", "stop_timeout_s": 3})
    data.setdefault("gates", {})["smoke"] = {"prompts": 3, "concurrency": 1, "max_tokens": 32,
                                             "request_timeout_s": 20}
    path = work / "sparkserve.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # the code before knows no `host:` section (host facts for the memory checks, issue 23): its own copy,
    # the same in everything else (the same ports: one stack at a time)
    before = {k: v for k, v in data.items() if k not in ("host", "supervise")}
    (work / "before").mkdir(exist_ok=True)
    (work / "before" / "sparkserve.yaml").write_text(yaml.safe_dump(before, sort_keys=False))
    return path


def run(tree: Path, argv: list[str], cfg: Path, env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sparkserve", *argv, "-c", str(cfg)], capture_output=True, text=True,
                       env={**env, "PYTHONPATH": str(tree)}, cwd=cfg.parent, timeout=900)
    lines = (p.stderr or p.stdout).strip().splitlines()
    return time.perf_counter() - t0, p.returncode, lines[-1] if lines else ""


def measure(name: str, tree: Path, cfg: Path, env: dict[str, str], runs: int) -> dict[str, list[float]]:
    took, rc, last = run(tree, ["up"], cfg, env)
    print(f"# {name}: up (untimed boot) {took:.1f}s exit {rc} {last}", file=sys.stderr)
    if rc != 0:
        raise SystemExit(f"{name}: up failed: {last}")
    out: dict[str, list[float]] = {}
    for label, argv in COMMANDS.items():
        for _ in range(runs):
            took, rc, last = run(tree, argv, cfg, env)
            if rc != 0:
                print(f"# {name}: {label} exit {rc}: {last}", file=sys.stderr)
            out.setdefault(label, []).append(took)
        print(f"# {name}: {label} {[round(x, 2) for x in out[label]]}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="a worktree of the code before (545b30e)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-first-contact-"))
    cfg = config(work)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
    env.update(XDG_STATE_HOME=str(work / "state"), COLUMNS="120", NO_COLOR="1")
    lock = open(RIG_DIR / ".test-lock", "a")  # noqa: SIM115 - held for the whole run
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        before = measure("before", a.before.resolve(), cfg.parent / "before" / cfg.name, env, a.runs)
        with contextlib.suppress(Exception):  # the stack the code before booted: the code after boots its own
            subprocess.run([sys.executable, "-m", "sparkserve", "down", "-c", str(cfg)], capture_output=True,
                           env={**env, "PYTHONPATH": str(REPO)}, timeout=300)
        after = measure("after", REPO, cfg, env, a.runs)
    finally:
        with contextlib.suppress(Exception):
            subprocess.run([sys.executable, "-m", "sparkserve", "down", "-c", str(cfg)], capture_output=True,
                           env={**env, "PYTHONPATH": str(REPO)}, timeout=300)
        lock.close()
    print(f"first contact on the rig (2 nodes, emulator; medians of {a.runs}; smoke cell 3x32 tokens)")
    print(f"{'command':<18} {'before s':>9} {'after s':>9} {'after/before':>13}")
    for label in COMMANDS:
        b, f = statistics.median(before[label]), statistics.median(after[label])
        print(f"{label:<18} {b:>9.2f} {f:>9.2f} {f / b:>12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
