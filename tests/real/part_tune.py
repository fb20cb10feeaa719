"""`sparkserve tune K` on the real engine (issue 42 item 4): the tiny models, a small budget, its table.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/tune-dry --out /tmp/tune-dry/out \\
        --parts tune

``OWN_STACK``: no main boot (tune boots every candidate itself, gated, and brings back what served before: here
nothing). The config is the scenario's (K = 7, the tiny DFlash drafter's block 8 − 1). Then, one command:

    sparkserve tune K -c CFG --values 3 --cells c1,c16 --size c1=16x1x128 --size c16=64x16x128 --rounds 2 \\
        --max-boots 4 --max-minutes 7 --protocol forced --seed 46

— K = 7 (the current value, the baseline) against K = 3, ABBA over 2 rounds: 4 boots (a warm boot ~60 s on one
H100 with its gates; the first K = 3 boot may compile its graphs cold, ~2.5 min), two cells each; forced protocol,
so TPOT is read from the stream too. ``REAL_TUNE_VALUES`` / ``REAL_TUNE_ARGS`` (extra words, split on spaces)
change the candidates and the budget. Printed: the tuner's table per cell (AL, E2E p50, tok/s, TPOT p50, each
with its 95 % interval, the tok/s delta against K = 7, acceptance per position), its advice in words, why it
stopped if it did; saved: the console (``results/tune.out``) and `ab report ID --json` (``results/tune-report.json``).

The tiny drafter is random: acceptance length is ~1.0 for every K on real vLLM, so what a shorter K can win is the
drafting cost alone; the advice is whatever the intervals support ("inside noise" included). The step fails only
when the tuner does not finish (exit code) or prints no table.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

OWN_STACK = True
CELLS = ("--cells", "c1,c16", "--size", "c1=16x1x128", "--size", "c16=64x16x128")
BUDGET = ("--rounds", "2", "--max-boots", "4", "--max-minutes", "7")


class _Tune:
    def __init__(self, s: Any) -> None:
        self.s = s

    def run(self) -> None:
        s = self.s
        s.write_config()
        values = os.environ.get("REAL_TUNE_VALUES") or "3"
        extra = (os.environ.get("REAL_TUNE_ARGS") or "").split()
        p, took = s.sparkserve("tune", "tune", "K", "-c", str(s.cfg), "--values", values, *CELLS, *BUDGET,
                               "--protocol", "forced", "--seed", "46", *extra, timeout=520)
        out = p.stdout + ("\n--- stderr\n" + p.stderr if p.stderr.strip() else "")
        (s.results / "tune.out").write_text(out)
        m = re.search(r"sparkserve ab report (\d+)", p.stdout)
        tables = p.stdout.count("tune speculative.num_speculative_tokens")
        advice = [ln.strip() for ln in p.stdout.splitlines()
                  if re.match(r"\s*(K=\d+ for |At \S+ the difference|Stopped early|note: )", ln)]
        if m:
            r, _ = s.sparkserve("tune-report", "ab", "report", m.group(1), "--json", timeout=120)
            if r.returncode == 0:
                (s.results / "tune-report.json").write_text(r.stdout)
        boots = len(re.findall(r"^.*\bboot(?:ing)? \d+/\d+", p.stderr, re.M))
        for line in p.stdout.splitlines():  # the table itself, line by line, into the scenario log
            if line.strip():
                s.log.write(f"    {line}\n")
        s.say("tune", f"{took:.0f}s rc={p.returncode}, campaign {m.group(1) if m else '?'}, {tables} table(s); "
              + (" | ".join(advice) if advice else _tail(p.stderr)), ok=p.returncode == 0 and tables > 0,
              wall_s=round(took, 1), campaign=int(m.group(1)) if m else None, advice=advice, boots_seen=boots,
              table=p.stdout)


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return json.dumps(lines[-3:])[:400]


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return [("tune", _Tune(s).run, 500 if s.real else 400)]  # a device call: the run ends by REAL_CALL_START + 585 s
