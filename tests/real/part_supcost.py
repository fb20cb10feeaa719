"""The supervisor's cost on the real engine (issue 31 item 6): c16 output tok/s with and without a supervisor at
its default settings, interleaved A B A B … (A: no supervisor watching, B: one watching), and the supervisor's
RSS and CPU while it watches.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/cost-dry --out /tmp/cost-dry/out \\
        --parts supcost

One supervisor process runs throughout (default settings; its own port and incidents dir, and ``recover: false``
so that a false alarm under load could not restart the stack mid-measurement — it changes nothing a healthy
round does). For an A trial it is stopped with SIGSTOP (it does nothing: no canary, no scrape, no node
program); for a B trial it is resumed with SIGCONT and the trial starts once it has completed a round. A trial:
48 completions of 256 tokens (``ignore_eos``) from 16 concurrent clients; tok/s = completion tokens / wall.
One warm-up trial first (not counted), then 5 to ``PAIRS`` pairs
(as many as the call's deadline leaves room for). Figures: per-pair ratio B/A, its median and
spread (min–max), the means' ratio; the supervisor's RSS and its CPU seconds per wall second during B trials.

Device time: ~12 s a trial on a tiny model: ~150 s.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from part_supervise import _free_port, _Supervised

PAIRS = 6  # at most; at least MIN_PAIRS, as many as the call's deadline leaves room for
MIN_PAIRS = 5
CONC, REQUESTS, MAX_TOKENS = 16, 48, 256


class _Cost:
    def __init__(self, s: Any) -> None:
        self.s = s
        self.sup = _Supervised(s)

    def config(self) -> Path:
        import yaml

        data = yaml.safe_load(self.s.cfg.read_text())
        port = _free_port()
        data["supervise"] = {"listen": f"127.0.0.1:{port}", "incidents_dir": str(self.s.work / "incidents-cost"),
                             "recover": False}
        self.sup.url = f"http://127.0.0.1:{port}"
        path = self.s.work / "sparkserve-cost.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def trial(self) -> tuple[float, int, float]:
        port = self.sup.port()
        body = json.dumps({"model": "tiny", "prompt": "Tell a long story about the sea.", "max_tokens": MAX_TOKENS,
                           "min_tokens": MAX_TOKENS, "ignore_eos": True}).encode()
        left = list(range(REQUESTS))
        lock = threading.Lock()
        tokens = [0]
        errors = [0]

        def worker() -> None:
            while True:
                with lock:
                    if not left:
                        return
                    left.pop()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        n = int(json.loads(r.read())["usage"]["completion_tokens"])
                    with lock:
                        tokens[0] += n
                except (OSError, ValueError, KeyError):
                    with lock:
                        errors[0] += 1

        t0 = time.monotonic()
        ts = [threading.Thread(target=worker) for _ in range(CONC)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.monotonic() - t0
        return tokens[0] / wall, errors[0], wall

    def run(self) -> None:
        import psutil

        s, h = self.s, self.sup
        h.n = 80
        h.start(self.config())
        if h.wait(lambda x: x["rounds"] >= 1, 120) is None:
            s.say("supcost", f"the supervisor made no round; it said: {h.log()[-400:]}", ok=False)
            return
        assert h.proc is not None
        proc = psutil.Process(h.proc.pid)
        _, _, w = self.trial()  # warm-up, and how long a trial takes
        room = (self.s.args.deadline - time.time() - 45) if self.s.args.deadline else 1e9
        pairs = max(MIN_PAIRS, min(PAIRS, int(room / (2 * w + 8))))
        a: list[float] = []
        b: list[float] = []
        errs = 0
        cpu_s = wall_b = 0.0
        rss = 0
        rounds_b = 0
        for _ in range(pairs):
            os.kill(h.proc.pid, signal.SIGSTOP)
            time.sleep(0.5)
            tps, e, _ = self.trial()
            a.append(tps)
            errs += e
            os.kill(h.proc.pid, signal.SIGCONT)
            r0 = h.status()["rounds"]
            h.wait(lambda x, r0=r0: x["rounds"] > r0, 30)  # it is watching again
            c0, r1 = sum(proc.cpu_times()[:2]), h.status()["rounds"]
            tps, e, wall = self.trial()
            c1, r2 = sum(proc.cpu_times()[:2]), h.status()["rounds"]
            b.append(tps)
            errs += e
            cpu_s += c1 - c0
            wall_b += wall
            rounds_b += r2 - r1
            rss = max(rss, proc.memory_info().rss)
        st = h.status()
        h.proc.send_signal(signal.SIGTERM)
        code = h.proc.wait(30)
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        med = statistics.median(ratios)
        spread = (min(ratios), max(ratios))
        cv_a = statistics.stdev(a) / statistics.mean(a)
        mean_ratio = statistics.mean(b) / statistics.mean(a)
        effect = 1 - med
        verdict = ("the spread between pairs is larger than the effect" if spread[1] - spread[0] > abs(effect) else
                   "the effect is larger than the spread between pairs")
        s.say("supcost", f"c{CONC} x {REQUESTS} x {MAX_TOKENS} tok, {pairs} pairs A (no supervisor) B (supervisor): "
              f"A {', '.join(f'{x:.0f}' for x in a)} tok/s; B {', '.join(f'{x:.0f}' for x in b)} tok/s; B/A median "
              f"{med:.4f} (min {spread[0]:.4f}, max {spread[1]:.4f}), means' ratio {mean_ratio:.4f}, A's CV "
              f"{cv_a:.3f}: {verdict}; supervisor: RSS {rss / 2**20:.0f} MiB, CPU {cpu_s / wall_b * 100:.1f} % of "
              f"one core during B ({rounds_b} rounds in {wall_b:.0f}s); gates at the end "
              f"{json.dumps({k: v['ok'] for k, v in st['gates'].items()})}; errors {errs}; exit {code}",
              ok=errs == 0 and code == 0, a=a, b=b, ratios=ratios, median_ratio=med, spread=spread,
              mean_ratio=mean_ratio, rss_mib=round(rss / 2**20, 1), cpu_pct=round(cpu_s / wall_b * 100, 2),
              rounds_b=rounds_b)


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    h = _Cost(s)
    return [("supcost", h.run, 200)]
