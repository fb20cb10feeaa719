"""Day 2 on the real engine (issue 31): a SIGSTOPped EngineCore under a supervisor at its default settings —
the incident holds the Python stack (no ``supervise.pyspy`` set: sparkserve finds the py-spy installed beside
itself), `status` exits non-zero naming the failing check, and a manual `gates` names the wedge.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/fx-dry --out /tmp/fx-dry/out \\
        --parts forensics

After the scenario's boot and gates, a supervisor with the default settings except its port, its incidents dir
and ``recover: false`` (the stack stays frozen for `status` and `gates` to see):

1. ``forensics-sigstop``: SIGSTOP of the EngineCore (no request streaming); the incident's py-spy files must hold
   ``Thread`` lines for the EngineCore's pid;
2. ``forensics-status``: `sparkserve status --json` must exit non-zero and its ``supervisor.failing`` name a check;
3. ``forensics-gates``: `sparkserve gates --json` on the frozen engine: smoke fails with "no progress for N s"
   within 20 s of wall;
4. ``forensics-cont``: SIGCONT, SIGTERM to the supervisor (exit 0).

Device time: ~15 s to the first round, ~15 s to detect, the incident ~5 s, status ~5 s, gates ~20 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from part_supervise import _Supervised

GATES_BOUND_S = 20.0


class _Fx:
    def __init__(self, s: Any) -> None:
        self.s = s
        self.sup = _Supervised(s)
        self.core: tuple[int, str] | None = None
        self.cfg: Path | None = None

    def config(self) -> Path:
        import yaml

        data = yaml.safe_load(self.s.cfg.read_text())
        from part_supervise import _free_port

        port = _free_port()
        # the defaults, but its own port and incidents dir, and no restart: the frozen stack is what is looked at
        data["supervise"] = {"listen": f"127.0.0.1:{port}", "incidents_dir": str(self.s.work / "incidents-fx"),
                             "recover": False}
        self.sup.url = f"http://127.0.0.1:{port}"
        path = self.s.work / "sparkserve-fx.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def sigstop(self) -> None:
        s, h = self.s, self.sup
        self.cfg = self.config()
        h.n = 90
        h.start(self.cfg)
        st = h.wait(lambda x: x["rounds"] >= 1 and x["gates"]["progress"]["ok"] is True, 120)
        if st is None:
            s.say("forensics-sigstop", f"no passing round; supervise said: {h.log()[-400:]}", ok=False)
            return
        self.core = h.engine_core()
        if self.core is None:
            s.say("forensics-sigstop", "no EngineCore process found", ok=False)
            return
        t0 = time.monotonic()
        os.kill(self.core[0], signal.SIGSTOP)
        st = h.wait(lambda x: len(x["incidents"]) > 0, 90)
        took = time.monotonic() - t0
        if st is None:
            s.say("forensics-sigstop", f"not detected in 90 s; supervise said: {h.log()[-600:]}", ok=False)
            return
        inc = Path(st["incidents"][-1]["dir"])
        files = sorted(inc.glob("*.pyspy.txt"))
        mine = [p for p in files if f".{self.core[0]}.pyspy.txt" in p.name]
        text = mine[0].read_text(errors="replace") if mine else ""
        threads = [ln for ln in text.splitlines() if ln.startswith("Thread ")]
        ok = bool(threads)
        first = next((ln.strip() for ln in text.splitlines()[1:] if ln.strip().startswith(("Thread", "Process"))), "")
        s.say("forensics-sigstop", f"SIGSTOP of {self.core[0]} ({self.core[1][:40]}) detected in {took:.1f}s; incident "
              f"{inc.name}: {len(files)} py-spy file(s), the EngineCore's holds {len(threads)} thread(s) "
              f"({first[:80]}); summary pyspy_ok {st['incidents'][-1].get('pyspy_ok')}", ok=ok, detect_s=round(took, 1),
              incident=str(inc), engine_core_dump=text[:4000])
        import shutil

        shutil.copytree(inc, s.results / "incident-sigstop", dirs_exist_ok=True)

    def status(self) -> None:
        if self.cfg is None or self.core is None:
            self.s.say("forensics-status", "not run: no frozen EngineCore under a supervisor", ok=False)
            return
        p, took = self.s.run("forensics-status", [sys.executable, "-m", "sparkserve", "status", "-c", str(self.cfg),
                                                  "--json"], timeout=60)
        try:
            sup = json.loads(p.stdout).get("supervisor") or {}
        except json.JSONDecodeError:
            sup = {}
        failing = [f["check"] for f in sup.get("failing") or []]
        ok = p.returncode != 0 and bool(failing) and sup.get("running") is True
        last = (sup.get("last_incident") or {}).get("dir")
        self.s.say("forensics-status", f"rc={p.returncode} in {took:.1f}s; supervisor phase {sup.get('phase')}, "
                   f"failing: {', '.join(failing) or 'none'}; last incident {last}",
                   ok=ok, supervisor=sup)

    def gates(self) -> None:
        if self.cfg is None or self.core is None:
            self.s.say("forensics-gates", "not run: no frozen EngineCore", ok=False)
            return
        p, took = self.s.run("forensics-gates", [sys.executable, "-m", "sparkserve", "gates", "-c", str(self.cfg),
                                                 "--json"], timeout=120)
        try:
            d = json.loads(p.stdout)
            smoke = next(g for g in d["gates"] if g["name"] == "smoke")
        except (json.JSONDecodeError, StopIteration, KeyError):
            self.s.say("forensics-gates", f"rc={p.returncode}, no smoke verdict: {p.stderr.strip()[-300:]}", ok=False)
            return
        reason = smoke.get("reason", "")
        ok = p.returncode != 0 and not smoke["ok"] and "no progress for" in reason and took <= GATES_BOUND_S
        self.s.say("forensics-gates", f"rc={p.returncode} in {took:.1f}s; smoke: {reason[:200]}", ok=ok,
                   wall_s=round(took, 1))

    def cont(self) -> None:
        if self.core is not None:
            os.kill(self.core[0], signal.SIGCONT)
        h = self.sup
        code = None
        if h.proc is not None:
            h.proc.send_signal(signal.SIGTERM)
            try:
                code = h.proc.wait(30)
            except subprocess.TimeoutExpired:
                h.proc.kill()
        self.s.say("forensics-cont", f"SIGCONT; supervisor exit {code}", ok=code == 0)


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    h = _Fx(s)
    return [("forensics-sigstop", h.sigstop, 100), ("forensics-status", h.status, 30),
            ("forensics-gates", h.gates, 40), ("forensics-cont", h.cont, 30)]
