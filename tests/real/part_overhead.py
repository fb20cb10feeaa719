"""sparkserve's own cost over the engine's boot (issue 43 item 6), on the real engine's machine.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/oh-dry --out /tmp/oh-dry/out \\
        --parts overhead

``OWN_STACK``: no main boot. The config is the scenario's; `sparkserve render --json` gives the rank's exact
argv and environment. Then, alternated, as many pairs as the call's deadline allows (at least one):

1. ``bare``: that argv started straight (`vllm serve …`, the same env, no sparkserve): seconds until the first
   completion is answered (a 1-token `/v1/completions`, polled every 0.05 s; 0.25 s until session 43), then
   SIGTERM to its process group;
2. ``sparkserve``: `sparkserve up --no-gates --timings`: wall seconds until it returns (the head answered: `up`
   returns once the API serves the model), then `down`. Its `--timings` spans are kept per pair: the wait for the
   head against everything else `up` does (interpreter, config, connect, pre-flight, memory check, start, parity,
   journal; a settle window, which `up --no-gates` no longer sits in since session 46).

The ratio is median(sparkserve) / median(bare): sparkserve's pre-flight, lock, launch and wait over the engine's own
boot, the gates aside (the scenario times `gates` on its own). The issue's goal is <= 1.05x; the figure is reported,
not asserted (a step fails only when a boot does not answer). Pairs: as many as the call's ``--deadline`` allows,
at most ``REAL_OVERHEAD_PAIRS`` (default 6; 3 without a deadline).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

OWN_STACK = True
GOAL = 1.05


class _Overhead:
    def __init__(self, s: Any) -> None:
        self.s = s
        self.bare: list[float] = []
        self.ss: list[float] = []
        self.pre: list[float] = []
        self.rest: list[float] = []  # `up`'s wall minus its wait for the head: sparkserve's own seconds

    def _spec(self) -> tuple[list[str], dict[str, str]]:
        """The head rank's argv (``command[0]`` is the `serve.vllm` executable the process runtime runs) and env."""
        p, _ = self.s.sparkserve("overhead-render", "render", "-c", str(self.s.cfg), "--json", timeout=120)
        d = json.loads(p.stdout)
        spec = next(x for x in d["specs"] if x["role"] == "head")
        return [d["vllm"], *map(str, spec["command"][1:])], {str(k): str(v) for k, v in spec["env"].items()}

    def _answers(self, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> float | None:
        import httpx
        from real_scenario import MODEL, PORT  # noqa: PLC0415  (tests/real is on sys.path for parts)

        t0 = time.monotonic()
        body = {"model": MODEL, "prompt": "ka lo", "max_tokens": 1}
        while time.monotonic() - t0 < timeout:
            if proc is not None and proc.poll() is not None:
                return None
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body, timeout=5)
                if r.status_code == 200:
                    return time.monotonic() - t0
            time.sleep(0.05)
        return None

    def bare_boot(self, i: int, argv: list[str], env: dict[str, str]) -> bool:
        log = (self.s.results / f"overhead-bare-{i}.log").open("w")
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**self.s.env, **env},
                                start_new_session=True, cwd=self.s.work)
        took = self._answers(480, proc)
        took = None if took is None else time.monotonic() - t0
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._gone()
        if took is None:
            self.s.say(f"overhead-bare-{i}", f"rc={proc.returncode}: no answer", ok=False)
            return False
        self.bare.append(took)
        self.s.say(f"overhead-bare-{i}", f"bare `vllm serve` to its first answer: {took:.1f}s", wall_s=round(took, 1))
        return True

    def ss_boot(self, i: int) -> bool:
        p, took = self.s.sparkserve(f"overhead-up-{i}", "up", "-c", str(self.s.cfg), "--no-gates", "--timings",
                                    timeout=560)
        answered = self._answers(30) is not None
        pre = _span(p.stdout + p.stderr, "preflight")
        spans = _spans(p.stdout + p.stderr)
        wait = spans.get("boot: wait for the head")
        self.s.sparkserve(f"overhead-down-{i}", "down", "-c", str(self.s.cfg), timeout=300)
        self._gone()
        if p.returncode != 0 or not answered:
            self.s.say(f"overhead-up-{i}", f"rc={p.returncode}, answers: {answered}", ok=False)
            return False
        self.ss.append(took)
        if pre is not None:
            self.pre.append(pre)
        rest = None if wait is None else round(took - wait, 2)
        if rest is not None:
            self.rest.append(rest)
        self.s.say(f"overhead-up-{i}", f"`sparkserve up --no-gates` until the head answers: {took:.1f}s "
                   f"(pre-flight {pre}s, wait for the head {wait}s, all else {rest}s, settle "
                   f"{spans.get('settle', 0)}s)", wall_s=round(took, 1), preflight_s=pre, wait_s=wait, rest_s=rest,
                   spans=spans)
        return True

    def _gone(self) -> None:
        """Wait (<= 60 s) until no VLLM:: process is left, so the next boot finds the GPU as the first did."""
        import psutil

        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            if not [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("VLLM")]:
                return
            time.sleep(0.5)

    def run(self) -> None:
        self.s.write_config()
        argv, env = self._spec()
        deadline = self.s.args.deadline
        cap = int(os.environ.get("REAL_OVERHEAD_PAIRS") or (6 if deadline else 3))
        i = 0
        while i < cap:
            need = 2 * max([*self.bare, *self.ss, 150.0 if self.s.real else 10.0]) + 60
            if i and deadline and time.time() + need > deadline:
                break
            if not (self.bare_boot(i, argv, env) and self.ss_boot(i)):
                break
            i += 1
        if not self.bare or not self.ss:
            self.s.say("overhead", "no complete pair", ok=False)
            return
        b, u = statistics.median(self.bare), statistics.median(self.ss)
        self.s.say("overhead", f"{len(self.ss)} pair(s): bare {', '.join(f'{x:.1f}' for x in self.bare)} s; sparkserve "
                   f"up {', '.join(f'{x:.1f}' for x in self.ss)} s; ratio {u / b:.3f}x (goal <= {GOAL}x), pre-flight "
                   f"{', '.join(f'{x:.1f}' for x in self.pre)} s; up's own (wall minus its wait for the head) "
                   f"{', '.join(f'{x:.2f}' for x in self.rest)} s", bare_s=self.bare, up_s=self.ss,
                   ratio=round(u / b, 3), preflight_s=self.pre, own_s=self.rest)


def _span(text: str, name: str) -> float | None:
    import re

    m = re.search(r"^\s+\+\s*[\d.]+s\s+([\d.]+)s\s+" + re.escape(name) + r"$", text, re.M)
    return float(m.group(1)) if m else None


def _spans(text: str) -> dict[str, float]:
    """Every span of `up --timings`' report (``  +  0.12s    0.15s  preflight``), by name (a repeated name: the sum)."""
    import re

    out: dict[str, float] = {}
    for m in re.finditer(r"^\s+\+\s*[\d.]+s\s+([\d.]+)s\s+(.+?)\s*$", text, re.M):
        out[m.group(2)] = round(out.get(m.group(2), 0.0) + float(m.group(1)), 3)
    return out


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    h = _Overhead(s)
    return [("overhead", h.run, 300)]
