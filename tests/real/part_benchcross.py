"""sparkserve's bench client beside `vllm bench serve`, crossed, on the real engine (issue 41 item 5).

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/bx-dry --out /tmp/bx-dry/out \\
        --parts benchcross

After the scenario's boot and gates (the tiny models, DFlash K=7; the emulator in the dry run), on that one boot:
`bench/bench_client_vs_vllm.py --url … --model tiny --vllm <the carried vLLM's launcher>` for each cell, both
orders (ours → vLLM's, then vLLM's → ours), ``REAL_BENCHCROSS_ROUNDS`` times (default 1). Each client sends the
same unmeasured warm-up first (concurrency × 2 requests), the same prompts (the built-in set) and the same request
(thinking on, T 1.0, top_p 0.95, forced length, streamed). Printed per row: the ratio ours / vLLM's of acceptance
length (/metrics deltas on both sides), output tok/s, E2E p50, TTFT p50 and TPOT p50 (vLLM's definitions).
The goal is every ratio within 3 % in both orders; the figure is reported (``within_3pct`` per row; per cell the
pooled ratio over all its runs against each client's own run-to-run spread, ``pooled``), not asserted:
the step fails only when a client fails. Cells: ``REAL_BENCHCROSS_CELLS`` (default ``c1=20x1x256,c8=96x8x256``:
the c8 cell is issue 41's 96 × c8 × 256 of the H100 run on 0.25.1). Saved: ``results/benchcross.json``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "bench_client_vs_vllm.py"
CELLS = "c1=20x1x256,c8=96x8x256"
FIGS = (("al", "AL"), ("tok_s", "tok/s"), ("e2e_p50_ms", "E2E p50"), ("ttft_p50_ms", "TTFT p50"),
        ("tpot_p50_ms", "TPOT p50"))


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


class _Cross:
    def __init__(self, s: Any) -> None:
        self.s = s

    def run(self) -> None:
        from real_scenario import MODEL, PORT  # noqa: PLC0415  (tests/real is on sys.path for parts)

        s = self.s
        cells = [c for c in (os.environ.get("REAL_BENCHCROSS_CELLS") or CELLS).split(",") if c]
        rounds = os.environ.get("REAL_BENCHCROSS_ROUNDS") or "1"
        argv = [sys.executable, str(SCRIPT), "--url", f"http://127.0.0.1:{PORT}", "--model", MODEL,
                "--vllm", s.bench_client()[0], "--rounds", rounds, "--json"]
        for c in cells:
            argv += ["--cell", c]
        env = dict(s.env)
        if os.environ.get("SCENARIO_BENCH_PYTHONPATH"):  # the dry run's pandas (the custom dataset needs it)
            env["PYTHONPATH"] = os.pathsep.join(x for x in (os.environ["SCENARIO_BENCH_PYTHONPATH"],
                                                            env.get("PYTHONPATH", "")) if x)
        p, took = s.run("benchcross", argv, timeout=440 if s.real else 560, env=env)
        try:
            d = json.loads(p.stdout)
        except json.JSONDecodeError:
            s.say("benchcross", f"rc={p.returncode}, no JSON: {(p.stderr or p.stdout).strip()[-400:]}", ok=False)
            return
        (s.results / "benchcross.json").write_text(json.dumps(d, indent=1))
        rows = d.get("agreement") or []
        for i, r in enumerate(rows):
            ratio, a, b = r["ratio"], r["ours"], r["vllm"]
            s.say(f"benchcross-{i}", f"{r['cell']}, {r['order']} (round {r['round']}): ours/vLLM "
                  + ", ".join(f"{label} {_fmt(ratio[k])}" for k, label in FIGS)
                  + f" — {'within' if r['within_3pct'] else 'OUTSIDE'} 3 %; ours "
                  + ", ".join(f"{label} {_fmt(a[k], 2)}" for k, label in FIGS)
                  + "; vLLM " + ", ".join(f"{label} {_fmt(b[k], 2)}" for k, label in FIGS),
                  ratio=ratio, ours=a, vllm=b, within_3pct=r["within_3pct"])
        for c in d.get("pooled") or []:  # per cell: the pooled ratio against each client's own run-to-run spread
            figs = c["figures"]
            s.say(f"benchcross-pooled {c['cell']}", f"{c['runs']} runs: pooled ours/vLLM "
                  + ", ".join(f"{label} {_fmt(figs[k]['ratio'])} (floor {_fmt(figs[k]['floor'], 3)})"
                              for k, label in FIGS)
                  + f" — {'agrees within noise' if c['agrees'] else 'DIFFERS beyond noise'}", pooled=c)
        inside = sum(1 for r in rows if r["within_3pct"])
        worst = max((abs(v - 1), r["cell"], r["order"], k) for r in rows for k, v in r["ratio"].items()
                    if v is not None) if rows else None
        s.say("benchcross", f"{took:.0f}s, {len(rows)} rows ({', '.join(cells)}; both orders × {rounds} round(s)): "
              f"{inside} of {len(rows)} with every ratio within 3 %"
              + (f"; the widest: {worst[3]} {worst[0] * 100:.1f} % off ({worst[1]}, {worst[2]})" if worst else ""),
              ok=bool(rows), rows=len(rows), within=inside)


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return [("benchcross", _Cross(s).run, 420 if s.real else 300)]
