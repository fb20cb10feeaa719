#!/usr/bin/env python3
"""`sparkserve supervise`'s figures, each printed beside its anchor, on the engine emulator.

    .venv/bin/python bench/bench_supervise.py [--work DIR] [--trials 3] [--load-s 20]

The stack: two ``local: true`` nodes, ``runtime: process``, each rank the emulator as a host process
(tests/rig/supervise_stack.py, the rig tests' stack). Figures:

1. **time to detect a wedge at default settings** (interval 5 s, canary deadline 10 s, stall 15 s): the
   emulator's ``wedge@after=0`` is written to its control file at T0; the figure is T0 → the incident on the
   supervisor's status. Anchor: never detected by sparkserve; 63 s by a hand-run `gates` (issue 22, real
   vLLM 0.25.1, H200). Goal ≤ 30 s.
2. **restart-to-serving vs a warm `up`**: the supervisor's own restart (graceful `down` + the normal `up`
   with gates, in its process: "recovered: serving again after a restart of X s") against the wall time of
   `sparkserve up` on the same stack with nothing running (the CLI's own start included). Goal ≤ 1.1×.
   Printed split: the stop and the up parts.
3. **supervisor cost on c16 throughput**: 16 streams of 256-token completions for ``--load-s`` seconds, with
   and without a supervisor at default settings, alternated ``--trials`` times. Goal ≤ 1 %.
4. **supervisor RSS** (VmRSS and peak VmHWM of the `supervise` process after its rounds). Goal ≤ 100 MiB.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rig"))

from supervise_stack import LocalStack  # noqa: E402

DEFAULTS = {"interval_s": 5, "canary_deadline_s": 10, "stall_s": 15, "acceptance_window_s": 30,
            "acceptance_min_drafts": 50, "backoff_s": 0.0, "backoff_max_s": 0.0, "max_restarts": 10}


def rss_mib(pid: int) -> tuple[float, float]:
    vals = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln)
    return int(vals["VmRSS"].split()[0]) / 1024, int(vals["VmHWM"].split()[0]) / 1024


def c16(st: LocalStack, seconds: float) -> float:
    """Tokens/s of 16 streams of 256-token completions for ``seconds``."""
    stop, counts = threading.Event(), [0] * 16

    def one(i: int) -> None:
        while not stop.is_set():
            try:
                counts[i] += int(st.complete(max_tokens=256, timeout=30)["usage"]["completion_tokens"])
            except OSError:
                time.sleep(0.1)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(16)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(40)
    return sum(counts) / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--load-s", type=float, default=20.0)
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-supervise-"))
    shutil.rmtree(work, ignore_errors=True)
    control = work / "control"
    st = LocalStack.make(work, nodes=2, env={"SSEMU_CONTROL": str(control)},
                         supervise={**DEFAULTS, "recover": True})
    rows: list[tuple[str, str, str, str]] = []
    try:
        # -- warm `up` (nothing running, image/engine/drafter already in place), first run not counted
        ups = []
        for i in range(a.trials + 1):
            st.cli("down")
            t0 = time.monotonic()
            st.cli("up")
            if i:
                ups.append(time.monotonic() - t0)
        warm_up = statistics.median(ups)

        # -- detection at default settings, and the supervisor's restarts
        sup = st.supervise()
        detect: list[float] = []
        for _ in range(a.trials):
            sup.wait_status(lambda s: s["phase"] == "watching" and s["gates"]["progress"]["ok"] is True, 120,
                            "a passing round")
            before = sup.status()
            n, r = len(before["incidents"]), before["recoveries"]
            control.write_text("wedge@after=0\n")
            t0 = time.monotonic()
            sup.wait_status(lambda s, n=n: len(s["incidents"]) > n, 90, "the wedge's incident")
            detect.append(time.monotonic() - t0)
            control.unlink()
            # recovered — or, when another local stack held the machine's deploy lock (the restart then waits and
            # is not counted), healthy again without a restart once the lifted wedge lets the canary through
            sup.wait_status(lambda s, r=r: s["recoveries"] > r or (s["phase"] == "watching" and
                                                                    s["gates"]["progress"]["ok"] is True),
                            180, "recovery")
        took = [float(x) for x in re.findall(r"recovered: serving again after a restart of ([\d.]+)s", sup.text())]
        restarts = took[-a.trials:]
        stops = [float(x) for x in re.findall(r"\(stop ([\d.]+)s, up", sup.text())][-a.trials:]
        rss, hwm = rss_mib(sup.proc.pid)

        # -- c16 throughput with and without the supervisor (alternated)
        with_sup, without = [], []
        for i in range(a.trials):
            if i:
                sup = st.supervise()
            with_sup.append(c16(st, a.load_s))
            sup.stop()
            without.append(c16(st, a.load_s))
        cost = 1 - statistics.median(with_sup) / statistics.median(without)
        spread = (max(without) - min(without)) / statistics.median(without)
    finally:
        st.close()

    med_detect = statistics.median(detect)
    med_restart = statistics.median(restarts) if restarts else float("nan")
    trials = ", ".join(f"{x:.1f}" for x in detect)
    rows.append(("time to detect a wedge (default 5 s / 10 s)", f"{med_detect:.1f} s (trials {trials})",
                 "never; 63 s by hand", f"{63 / med_detect:.1f}x faster than by hand; goal <= 30 s: "
                 f"{'met' if med_detect <= 30 else 'MISSED'}"))
    rows.append(("restart-to-serving vs a warm `up`", f"{med_restart:.1f} s vs {warm_up:.1f} s",
                 "warm `up` (CLI wall)", f"{med_restart / warm_up:.2f}x; goal <= 1.1x: "
                 f"{'met' if med_restart / warm_up <= 1.1 else 'MISSED'}"
                 + (f" (stop part {statistics.median(stops):.1f} s)" if stops else "")))
    rows.append(("supervisor cost on c16 throughput", f"{cost * 100:+.2f} % ({statistics.median(with_sup):.0f} vs "
                 f"{statistics.median(without):.0f} tok/s)", "no supervisor",
                 f"goal <= 1 %: {'met' if cost <= 0.01 else 'MISSED'}; run-to-run spread without it "
                 f"{spread * 100:.1f} %"))
    rows.append(("supervisor RSS", f"{rss:.1f} MiB (peak {hwm:.1f} MiB)", "100 MiB",
                 f"goal <= 100 MiB: {'met' if hwm <= 100 else 'MISSED'}"))
    print(f"bench_supervise: 2 local process nodes (emulator), {a.trials} trials, c16 {a.load_s:g} s each")
    w = max(len(r[0]) for r in rows)
    for name, fig, anchor, verdict in rows:
        print(f"  {name:<{w}}  {fig}  | anchor: {anchor}  | {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
