#!/usr/bin/env python3
"""`ab run --design crossed` against the anchor `--design sequential`, side by side in one run, on the rig.

    .venv/bin/python bench/bench_ab_designs.py

Runs tests/e2e/test_replicas_bench.py (four rig nodes as two replicas behind the real vllm-router 0.1.17, two
drafters A and B with different emulator acceptance profiles, 2 rounds of smoke 4×c1×128 + c16 32×c16×128, card
protocol) with ``AB_DESIGNS_OUT`` set, so the test writes each design's wall time and c16 deltas, then prints
them and the ratios crossed / sequential (the anchor is the sequential design: one stack, boots in turn).
Goal (issue 34): the crossed design halves a campaign's cells' time and gives intervals no wider. On the rig
the replicas run at the same speed, so the interval widths show only noise; the cancellation of a slower
replica is a unit test on synthetic waves (tests/unit/test_bench_ab_replicas.py). Holds the rig's test lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def width(d: dict) -> float | None:
    r = d["rel"]
    return None if r["lo"] is None else (r["hi"] - r["lo"]) * 100


def _shown(w: float | None) -> str:
    return f"{w:8.1f}" if w is not None else f"{'n/a':>8s}"


def main() -> int:
    out = Path(tempfile.mkdtemp()) / "designs.json"
    env = {**os.environ, "AB_DESIGNS_OUT": str(out), "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
                        "tests/e2e/test_replicas_bench.py"], cwd=REPO, env=env)
    if p.returncode != 0 or not out.exists():
        print(f"error: tests/e2e/test_replicas_bench.py: failed (exit {p.returncode})", file=sys.stderr)
        return 1
    runs = json.loads(out.read_text())
    print("\ndesign       wall s   boots s   cells s   c16 tok/s B vs A            width pp   AL width pp")
    for design, r in runs.items():
        tok = next(d for d in r["deltas"] if d["metric"] == "output_tok_s")
        al = next(d for d in r["deltas"] if d["metric"] == "acceptance_length")
        boots, cells = r["timings"].get("boots", float("nan")), r["timings"].get("cells", float("nan"))
        print(f"{design:11s} {r['wall_s']:7.1f} {boots:9.1f} {cells:9.1f}   "
              f"{tok['rel']['point'] * 100:+6.1f} % [{tok['rel']['lo'] * 100:+.1f}, {tok['rel']['hi'] * 100:+.1f}]"
              f"   {_shown(width(tok))}   {_shown(width(al))}")
    c, s = runs["crossed"], runs["sequential"]
    print(f"\nratio crossed / sequential: wall {c['wall_s'] / s['wall_s']:.2f}", end="")
    for k in ("boots", "cells"):
        if c["timings"].get(k) and s["timings"].get(k):
            print(f" · {k} {c['timings'][k] / s['timings'][k]:.2f}", end="")
    print(" (goal: cells ≤ 0.5 + noise; intervals no wider)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
