"""`up` when already up, before and after issue 31 (engine identity cached by vLLM's RECORD, `up --timings`),
on the real engine's machine: ``runtime: process``, vLLM 0.25.1 from the carried site.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/pre-dry --out /tmp/pre-dry/out \\
        --parts preflight                      # DAY2_BASE=<a copy of the code before> for the "before" runs

After the scenario's boot and gates:

1. ``preflight-before``: `sparkserve up` three times with the code before (``$DAY2_BASE`` on PYTHONPATH instead
   of this checkout; skipped when unset): each finds the stack already up; wall seconds, median of 3;
2. ``preflight-after``: `sparkserve up --timings` once to fill the engine identity cache, then three times:
   wall seconds, median of 3, and the pre-flight's own span (``--timings``) — the issue's bound is 5 s for both.

Device time: before ~3 x 35 s, after ~4 x 5 s.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable
from typing import Any

BOUND_S = 5.0


class _Pre:
    def __init__(self, s: Any) -> None:
        self.s = s

    def _up(self, step: str, env: dict[str, str], *extra: str) -> tuple[int, float, str]:
        import sys

        p, took = self.s.run(step, [sys.executable, "-m", "sparkserve", "up", "-c", str(self.s.cfg), *extra],
                             timeout=120, env=env)
        return p.returncode, took, p.stdout + p.stderr

    def before(self) -> None:
        base = os.environ.get("DAY2_BASE")
        if not base:
            self.s.say("preflight-before", "skipped: DAY2_BASE (the code before) is not set", ok=True)
            return
        site = self.s.args.site or ""
        env = {**self.s.env, "PYTHONPATH": os.pathsep.join(x for x in (base, site) if x)}
        runs = [self._up(f"preflight-before-{i}", env) for i in range(3)]
        walls = [t for _, t, _ in runs]
        ok = all(rc == 0 and "already up" in out for rc, _, out in runs)
        self.s.say("preflight-before", f"`up` when already up, code before: {', '.join(f'{t:.1f}' for t in walls)} s; "
                   f"median {statistics.median(walls):.1f} s", ok=ok, walls=walls,
                   median_s=round(statistics.median(walls), 2))

    def after(self) -> None:
        first = self._up("preflight-after-cold", self.s.env, "--timings")
        runs = [self._up(f"preflight-after-{i}", self.s.env, "--timings") for i in range(3)]
        walls = [t for _, t, _ in runs]
        pre = [_span(out, "preflight") for _, _, out in runs]
        ident = [_span(out, "preflight: engine identity") for _, _, out in runs]
        med, med_pre = statistics.median(walls), statistics.median([p for p in pre if p is not None] or [99.0])
        ok = all(rc == 0 and "already up" in out for rc, _, out in [first, *runs]) and med <= BOUND_S \
            and med_pre <= BOUND_S
        timings = "\n".join(ln for ln in runs[-1][2].splitlines() if ln.startswith(("timings:", "  +")))
        self.s.say("preflight-after", f"`up` when already up, after: cold (identity cache filled) {first[1]:.1f} s; "
                   f"then {', '.join(f'{t:.1f}' for t in walls)} s, median {med:.1f} s; pre-flight span "
                   f"{', '.join(f'{p:.2f}' if p is not None else '?' for p in pre)} s (median {med_pre:.2f}); engine "
                   f"identity {', '.join(f'{p:.2f}' if p is not None else '?' for p in ident)} s", ok=ok,
                   cold_s=round(first[1], 2), walls=walls, median_s=round(med, 2), preflight_s=pre,
                   identity_s=ident, timings=timings)


def _span(text: str, name: str) -> float | None:
    m = re.search(r"^\s+\+\s*[\d.]+s\s+([\d.]+)s\s+" + re.escape(name) + r"$", text, re.M)
    return float(m.group(1)) if m else None


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    h = _Pre(s)
    return [("preflight-before", h.before, 150), ("preflight-after", h.after, 90)]
