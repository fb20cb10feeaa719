"""Flake hunt: run a rig suite several times in a row and say which tests ever failed.

    .venv/bin/python bench/bench_rig_flake.py                     # tests/rig, 5 runs (scripts/rig up first)
    .venv/bin/python bench/bench_rig_flake.py --runs 3 tests/rig/test_faults.py tests/e2e/test_swap.py

A test that fails one run in ten is a failing test: one clean pass proves little, so this runs the suite
``--runs`` times, each in a fresh pytest process, and prints per run the counts and the failing test ids,
then every test that failed in any run with how often. Exit 1 when any run failed. Prints figures; the
anchor is the suite itself (N of N clean runs).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped)")


def one_run(paths: list[str]) -> tuple[float, dict[str, int], list[str]]:
    """Seconds, outcome counts and the ids of failed tests of one pytest run over ``paths``."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *paths],
                         cwd=REPO, capture_output=True, text=True).stdout
    counts: dict[str, int] = collections.Counter()
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    for n, kind in SUMMARY.findall(tail):
        counts["error" if kind.startswith("error") else kind] += int(n)
    failed = [ln.split(" ", 2)[1] for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return time.monotonic() - t0, dict(counts), failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", default=["tests/rig"])
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    ever: collections.Counter[str] = collections.Counter()
    clean = 0
    for i in range(1, a.runs + 1):
        secs, counts, failed = one_run(a.paths)
        ok = not failed and counts.get("failed", 0) == 0 and counts.get("error", 0) == 0 and counts.get("passed")
        clean += bool(ok)
        shown = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        print(f"run {i}/{a.runs}: {shown or 'no summary line'} in {secs:.0f}s" + ("" if ok else " — NOT CLEAN"))
        for t in failed:
            print(f"    {t}")
            ever[t] += 1
    print(f"clean runs: {clean}/{a.runs} of {' '.join(a.paths)}")
    for t, n in ever.most_common():
        print(f"  failed {n}/{a.runs}: {t}")
    return 0 if clean == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
