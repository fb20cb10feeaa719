"""Issue 34 item 6 on the real engine: vLLM's own router (``vllm-router`` 0.1.17, carried in the bundle) in front of
two replicas of the tiny model side by side on one GPU, a kill -9 of one replica's EngineCore under load.

    .venv/bin/python tests/real/real_scenario.py --engine emulator --work /tmp/rt-dry --out /tmp/rt-dry/out \\
        --parts router

No main stack (``OWN_STACK``): the part boots its own. The replicas are the scenario's config (``runtime: process``,
GMU 0.3, KV 512 MiB each) on two loopback addresses of the one machine — node ``gpu-a`` 127.0.0.1, node ``gpu-b``
127.0.0.2, both ``local: true``, ``serve.host`` the first head's address (each replica binds its own head's), one
API port.

1. ``router-fleet-up``: ``replicas: 2`` and a ``router:`` section, one `sparkserve up`. sparkserve's node model is
   one stack per machine: the head lock is one directory per machine (/tmp/sparkserve.deploy.lock) held for a
   whole `up`, so of two replicas whose `up`s run at once on one host the second is LEFT OUT ("another sparkserve
   run holds /tmp/sparkserve.deploy.lock"); and each node lists every rank under the one ``process.run_dir``, so a
   replica booted there later would "replace" (stop) the other one's ranks. The step records what `up` said and
   ``status --json``.
   Since session 7 `validate` refuses this config before any node (exit 2: "replicas 1 and 2 both run on this
   machine"), so the step records that refusal and the part goes the split way (step 2, "anything else").
2. The nearest honest way, when `up` serves 1 of 2 (``router-alone-up``, ``router-add-alone``): the replica that
   won the lock and the router stay as the fleet's `up` left them; the one left out comes up as a stack of its own
   (``replicas: 1``, its node, its own ``process.run_dir``) and is added to the router with sparkserve's
   ``RouterAPI.add_worker`` (what `up` does for a replica booted again, and the rolling swap); it is the one
   killed. Anything else (``router-split-up``): the
   fleet is downed, both replicas come up as stacks of their own one after the other, and the router is started
   by sparkserve's own code (``plan.replicas.router_argv`` with the fleet's router settings,
   ``nodes.router.start_router``).
3. ``router-kill``: 3 streaming + 3 non-streaming clients through the router; after 10 s, kill -9 of one replica's
   ``VLLM::EngineCore`` (the one on its own; replica 2 when both came from the fleet; the emulator: its one
   process); the router's ``/workers`` polled every 0.5 s; 60 s on.
   Figures: requests sent, failed non-streaming, cut streams (HTTP 200 without ``[DONE]``), 5xx, other errors, the
   time until the killed replica is out of rotation (unhealthy or gone in ``/workers``) and the last failure.
4. ``router-down``: the fleet's `sparkserve down` (the router, then its replicas), each own stack's `down`, a
   fallback's router stopped: no process of the part left (a zombie does not count: it is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from real_scenario import _after, _last, _title  # noqa: E402 - the scenario's helpers, as part_dialect does

OWN_STACK = True  # real_scenario.py: no main boot before these steps
API_PORT = 18100
HOSTS = ("127.0.0.1", "127.0.0.2")
WARM_S = 10.0
AFTER_KILL_S = 60.0
PER_KIND = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Router:
    def __init__(self, s: Any) -> None:
        self.s = s
        self.fleet = s.work / "sparkserve-fleet.yaml"
        self.split: list[Path] = []  # the fallback's per-replica configs, when used
        self.router_port = _free_port()
        self.url = f"http://127.0.0.1:{self.router_port}"
        self.replica_urls = [f"http://{h}:{API_PORT}" for h in HOSTS]
        self.mode: str | None = None  # "fleet", "fleet+replicaN" or "split": what serves when the load starts
        self.victim_index = 2  # the replica whose EngineCore is killed (the one on its own, when one is)

    # -- configs -----------------------------------------------------------------------------------------------

    def base(self) -> dict[str, Any]:
        import yaml

        self.s.write_config()  # the scenario's one-node config, then changed into the fleet's
        data = yaml.safe_load(self.s.cfg.read_text())
        data["serve"]["port"] = API_PORT
        data["serve"]["env"].pop("VLLM_HOST_IP", None)  # each rank's own fabric_ip (sparkserve sets it)
        # the second address needs its own RoCE GID on the fake loopback CX-7 (a fabric_ip must resolve)
        port = Path(data["fabric"]["sysfs_root"]) / "class/infiniband/loopback0/ports/1"
        (port / "gids/1").write_text("0000:0000:0000:0000:0000:ffff:7f00:0002\n")
        (port / "gid_attrs/types/1").write_text("RoCE v2\n")
        (port / "gid_attrs/ndevs/1").write_text("lo\n")
        return data

    def write_fleet(self) -> None:
        import yaml

        data = self.base()
        data["replicas"] = 2
        data["nodes"] = [{"name": f"gpu-{c}", "host": h, "fabric_ip": h, "local": True, "gpus": 1}
                         for c, h in zip("ab", HOSTS, strict=True)]
        data["serve"]["host"] = HOSTS[0]  # the first head's address: each replica binds its own head's
        data["router"] = {"port": self.router_port, "metrics_port": _free_port(), "executable": self.router_exe()}
        data["process"]["run_dir"] = str(self.s.work / "run-fleet")
        self.fleet.write_text(yaml.safe_dump(data, sort_keys=False))
        self.s.say("router-config", f"{self.fleet}: replicas 2 on one host (gpu-a {HOSTS[0]}, gpu-b {HOSTS[1]}, "
                   f"API port {API_PORT} each), router {self.url} ({data['router']['executable']})")

    def write_split(self) -> None:
        import yaml

        fleet = yaml.safe_load(self.fleet.read_text())
        for i, node in enumerate(fleet["nodes"], 1):
            data = {k: v for k, v in fleet.items() if k not in ("replicas", "router")}
            data["nodes"] = [node]
            data["serve"] = {**fleet["serve"], "host": node["host"]}
            data["process"] = {**fleet["process"], "run_dir": str(self.s.work / f"run-replica{i}")}
            path = self.s.work / f"sparkserve-replica{i}.yaml"
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            self.split.append(path)

    def router_exe(self) -> str:
        if self.s.real:  # pip --target wrote the wheel's console script into the carried site
            return str(Path(self.s.args.site) / "bin" / "vllm-router")
        return str(Path(sys.executable).parent / "vllm-router")

    # -- steps -------------------------------------------------------------------------------------------------

    def fleet_up(self) -> None:
        s = self.s
        self.write_fleet()
        p, took = s.sparkserve("router-fleet-up", "up", "-c", str(self.fleet), timeout=560)
        text = p.stdout + p.stderr
        serving = next((ln.strip() for ln in text.splitlines() if "serving " in ln and " replicas" in ln), "")
        left = [ln.strip() for ln in p.stdout.splitlines() if "LEFT OUT" in ln]
        st = self.status(self.fleet, "router-fleet-status")
        n = st.get("serving")
        s.say("router-fleet-up", f"{took:.1f}s rc={p.returncode}: {serving or _last(text)}"
              + (f"; {' | '.join(left)[:400]}" if left else "") + f"; status: {n} of {st.get('of')} serving in "
              "the router", ok=n == 2, wall_s=round(took, 1), rc=p.returncode, left_out=left, status=st)
        if n == 2:
            self.mode = "fleet"
            return
        inside = self.workers_urls()
        if n == 1 and len(inside) == 1 and inside[0] in self.replica_urls:
            self.add_left_out(2 if inside[0] == self.replica_urls[0] else 1)  # whichever lost the lock race
            if self.mode:
                return
        self.down("router-down-before-split")  # what the fleet left running; then the fallback: both on their own
        self.split_up()

    def add_left_out(self, i: int) -> None:
        """The other replica and the router serve from the fleet's `up`; replica ``i`` as a stack of its own (its
        own run dir: the fleet's would have "replaced" the other's ranks), then added to the fleet's router with
        sparkserve's RouterAPI.add_worker (what `up` and the rolling swap do). It is the one killed later."""
        from sparkserve.nodes.router import RouterAPI

        s = self.s
        self.write_split()
        self.victim_index = i
        p, took = s.sparkserve("router-alone-up", "up", "-c", str(self.split[i - 1]), timeout=400)
        ok = p.returncode == 0
        s.say("router-alone-up", f"replica {i} on its own: {took:.1f}s rc={p.returncode}: "
              f"{_after(p.stdout + p.stderr, 'serving tiny at') or _last(p.stderr)}", ok=ok, wall_s=round(took, 1))
        if not ok:
            return
        t = time.monotonic()
        try:
            RouterAPI(self.url).add_worker(self.replica_urls[i - 1])
            healthy = self.wait_healthy(30)
            why = ""
        except Exception as e:  # noqa: BLE001 — said; the fallback follows
            healthy, why = 0, f"{type(e).__name__}: {e}"
        self.mode = f"fleet+replica{i}" if healthy == 2 else None
        s.say("router-add-alone", f"POST /add_worker {self.replica_urls[i - 1]}: {healthy} of 2 workers healthy in "
              f"{time.monotonic() - t:.1f}s {why}", ok=healthy == 2)

    def split_up(self) -> None:
        s = self.s
        self.split = []
        self.write_split()
        walls = []
        for i, cfg in enumerate(self.split, 1):
            p, took = s.sparkserve(f"router-split-up{i}", "up", "-c", str(cfg), timeout=400)
            walls.append(round(took, 1))
            s.say(f"router-split-up{i}", f"{took:.1f}s rc={p.returncode}: "
                  f"{_after(p.stdout + p.stderr, 'serving tiny at') or _last(p.stderr)}", ok=p.returncode == 0,
                  wall_s=round(took, 1))
            if p.returncode != 0:
                return
        from sparkserve.config import load_config
        from sparkserve.nodes.router import start_router
        from sparkserve.plan.replicas import router_argv, router_url

        cfg = load_config(self.fleet)
        argv = router_argv(cfg, self.replica_urls)
        t = time.monotonic()
        os.environ["SSROUTER_STATE"] = str(self.router_state())
        rp = start_router(argv, port=cfg.router.port, url=router_url(cfg))
        healthy = self.wait_healthy(30)
        (s.results / "router-argv.json").write_text(json.dumps(argv, indent=1))
        self.mode = "split" if healthy == 2 else None
        s.say("router-split-router", f"vllm-router pid {rp.pid} in {time.monotonic() - t:.1f}s, {healthy} of 2 "
              f"workers healthy; argv {' '.join(argv[1:])[:300]}", ok=healthy == 2, argv=argv, log=str(rp.log))

    def router_state(self) -> Path:
        return self.s.work / "state" / "sparkserve" / "router"  # XDG_STATE_HOME of the scenario's sparkserve runs

    def workers_urls(self) -> list[str]:
        return [str(w.get("url")) for w in self.workers()]

    def wait_healthy(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline:
            n = sum(1 for w in self.workers() if w.get("is_healthy"))
            if n == 2:
                break
            time.sleep(0.5)
        return n

    def workers(self) -> list[dict[str, Any]]:
        import httpx

        try:
            d = httpx.get(self.url + "/workers", timeout=3, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            return []
        return list(d.get("workers", d) if isinstance(d, dict) else d)

    def kill(self) -> None:
        s = self.s
        if self.mode is None:
            s.say("router-kill", "not run: two replicas never served behind the router", ok=False)
            return
        victim = self.victim()
        if victim is None:
            s.say("router-kill", "no EngineCore of replica 2 found", ok=False)
            return
        load = _Load(self.url, s.real)
        poll: list[tuple[float, list[dict[str, Any]]]] = []
        stop = threading.Event()

        def poller() -> None:
            while not stop.is_set():
                poll.append((time.monotonic(), self.workers()))
                stop.wait(0.5)

        pt = threading.Thread(target=poller, daemon=True)
        with load:
            pt.start()
            time.sleep(WARM_S)
            before = load.snapshot()
            pid, title = victim
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            s.say("router-kill-sent", f"kill -9 {pid} ({title[:40]}) of replica {self.victim_index} after "
                  f"{WARM_S:.0f}s of load: {before['sent']} sent, {before['failed']} failed so far")
            time.sleep(AFTER_KILL_S)
        stop.set()
        pt.join(5)
        killed = self.replica_urls[self.victim_index - 1]
        out_at = next((t - t_kill for t, ws in poll if t > t_kill and not any(
            str(w.get("url")) == killed and w.get("is_healthy") for w in ws)), None)
        back = [t - t_kill for t, ws in poll if t > t_kill + (out_at or 0) + 1 and any(
            str(w.get("url")) == killed and w.get("is_healthy") for w in ws)]
        r = load.report(t_kill)
        (s.results / "router-kill.json").write_text(json.dumps(
            {"mode": self.mode, "victim": victim, "report": r, "out_of_rotation_s": out_at,
             "workers_poll": [(round(t - t_kill, 2), ws) for t, ws in poll[::2]]}, indent=1, default=str))
        st = r["stream"]
        pl = r["plain"]
        ok = pl["failed"] == 0 and st["http_5xx"] == 0 and out_at is not None and not back
        s.say("router-kill", f"{self.mode}: {r['sent']} requests ({pl['sent']} non-streaming, {st['sent']} streaming)"
              f"; non-streaming failed {pl['failed']} ({pl['why']}); streams cut {st['cut']}, streams failed "
              f"otherwise {st['failed'] - st['cut']} ({st['why']}); 5xx {pl['http_5xx'] + st['http_5xx']} "
              f"({r['codes']}); killed replica out of rotation after "
              f"{'never' if out_at is None else f'{out_at:.1f}s'}; last failure "
              f"{r['last_failure_s'] if r['last_failure_s'] is not None else '-'}s after the kill"
              + (f"; healthy again at {back[0]:.1f}s" if back else ""), ok=ok, report=r, out_of_rotation_s=out_at)

    def victim(self) -> tuple[int, str] | None:
        import psutil

        i = self.victim_index
        run = self.s.work / ("run-fleet" if self.mode == "fleet" else f"run-replica{i}")  # its own otherwise
        mans = [json.loads(p.read_text()) for p in sorted(run.glob("*/rank*.json"))]
        if self.mode == "fleet":  # both replicas' ranks share the run dir: the victim's binds its own address
            mans = [m for m in mans if HOSTS[i - 1] in json.dumps(m)]
        for m in mans:
            with contextlib.suppress(psutil.Error):
                rank = psutil.Process(m["pid"])
                if not self.s.real:
                    return rank.pid, _title(rank)
                cores = [c for c in rank.children(recursive=True) if "EngineCore" in _title(c)]
                if cores:
                    return cores[0].pid, _title(cores[0])
        return None

    def status(self, cfg: Path, step: str) -> dict[str, Any]:
        p, _ = self.s.sparkserve(step, "status", "-c", str(cfg), "--json", timeout=120)
        try:
            return dict(json.loads(p.stdout))
        except json.JSONDecodeError:
            return {"rc": p.returncode, "stderr": p.stderr[-300:]}

    def down(self, step: str = "router-down") -> None:
        """Everything this part started: the fleet's `down` (router, then its replicas), each own stack's `down`,
        a router started by the fallback; then no process of this part may be left."""
        s = self.s
        if not self.fleet.exists():
            return
        t = time.monotonic()
        rcs: dict[str, int] = {}
        if self.mode is not None and self.mode.startswith("fleet"):
            st = self.status(self.fleet, "router-status-after")
            s.say("router-status-after", f"status: {st.get('serving')} of {st.get('of')} serving; router workers "
                  f"{[(w.get('url'), w.get('healthy')) for w in (st.get('router') or {}).get('workers', [])]}",
                  status=st)
        p, _ = s.sparkserve("router-fleet-down", "down", "-c", str(self.fleet), timeout=300)
        rcs["fleet"] = p.returncode
        from sparkserve.nodes.router import stop_router

        os.environ["SSROUTER_STATE"] = str(self.router_state())
        if stop_router(self.router_port) is not None:  # the fleet's down stops it; a fallback's router is stopped here
            rcs["router stopped here"] = 0
        for i, cfg in enumerate(self.split, 1):
            p, _ = s.sparkserve(f"router-down{i}", "down", "-c", str(cfg), timeout=300)
            rcs[f"replica{i}"] = p.returncode
        time.sleep(1)
        left = _ours_alive(s.work) + [f"{pid} listening on {self.router_port}" for pid in _listening(self.router_port)]
        for cfg in (self.fleet, *self.split):
            with contextlib.suppress(OSError):
                (s.results / cfg.name).write_bytes(cfg.read_bytes())
        for log in self.router_state().glob("*.log"):
            with contextlib.suppress(OSError):
                (s.results / f"router-{log.name}").write_bytes(log.read_bytes()[-200_000:])
        s.say(step, f"{time.monotonic() - t:.1f}s rc={rcs}, processes left: {len(left)} {left[:5]}",
              ok=not any(rcs.values()) and not left)
        self.mode = None
        self.split = []


class _Load:
    """PER_KIND streaming and PER_KIND non-streaming clients through the router until stopped; each request's
    outcome (kind, start and end on the monotonic clock, None or why it failed, the HTTP code) kept."""

    def __init__(self, url: str, real: bool) -> None:
        self.url = url
        self.tokens = 300 if real else 250
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.rows: list[tuple[str, float, float, str | None, int | None]] = []
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True)
                        for k in ("stream", "plain") for _ in range(PER_KIND)]

    def __enter__(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)

    def _one(self, c: Any, kind: str, i: int) -> tuple[str | None, int | None]:
        import httpx

        body = {"model": "tiny", "max_tokens": self.tokens, "min_tokens": self.tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"{kind} request {i}: tell a story."}],
                "stream": kind == "stream"}
        try:
            if kind == "stream":
                text, status = "", None
                try:
                    with c.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                        status = r.status_code
                        for chunk in r.iter_text():
                            text += chunk
                except httpx.HTTPError as e:
                    if status == 200:  # the 200 and some body came, then the connection broke: a cut stream
                        return f"cut: {type(e).__name__} after {text.count('data: ')} events", 200
                    raise
                if r.status_code != 200:
                    return f"HTTP {r.status_code} {text[:80]}", r.status_code
                if '"error"' in text:  # vLLM 0.25.1 ends a stream whose EngineCore died with an error event AND
                    # [DONE] (session 7: counting [DONE] alone missed both cut streams)
                    return f"cut: error event {text[text.find(chr(34) + 'error'):][:80]}", 200
                return (None if "data: [DONE]" in text else "cut: no [DONE]"), 200
            r = c.post(self.url + "/v1/chat/completions", json=body)
            ok = r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
            return (None if ok else f"HTTP {r.status_code} {r.text[:80]}"), r.status_code
        except (httpx.HTTPError, ValueError, KeyError) as e:
            return f"{type(e).__name__}: {str(e)[:80]}", None

    def _run(self, kind: str) -> None:
        import httpx

        i = 0
        with httpx.Client(trust_env=False, timeout=90) as c:
            while not self.stop.is_set():
                t = time.monotonic()
                why, code = self._one(c, kind, i)
                with self.lock:
                    self.rows.append((kind, t, time.monotonic(), why, code))
                i += 1

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"sent": len(self.rows), "failed": sum(1 for r in self.rows if r[3])}

    def report(self, t_kill: float) -> dict[str, Any]:
        out: dict[str, Any] = {"sent": len(self.rows), "codes": {}}
        fails = [r for r in self.rows if r[3]]
        for kind in ("plain", "stream"):
            rows = [r for r in self.rows if r[0] == kind]
            bad = [r for r in rows if r[3]]
            why: dict[str, int] = {}
            for r in bad:
                key = str(r[3]).split(":")[0] if not str(r[3]).startswith("HTTP") else str(r[3])[:8]
                why[key] = why.get(key, 0) + 1
            out[kind] = {"sent": len(rows), "ok": len(rows) - len(bad), "failed": len(bad),
                         "cut": sum(1 for r in bad if str(r[3]).startswith("cut")),
                         "http_5xx": sum(1 for r in rows if (r[4] or 0) >= 500), "why": why,
                         "before_kill": sum(1 for r in rows if r[2] < t_kill),
                         "in_flight_at_kill": sum(1 for r in rows if r[1] <= t_kill <= r[2]),
                         "failures": [(kind, round(r[1] - t_kill, 2), round(r[2] - t_kill, 2), r[3], r[4])
                                      for r in bad]}
        for r in self.rows:
            if r[4] is not None:
                out["codes"][str(r[4])] = out["codes"].get(str(r[4]), 0) + 1
        out["last_failure_s"] = round(max(r[2] for r in fails) - t_kill, 1) if fails else None
        return out


def _listening(port: int) -> list[int]:
    import psutil

    pids = set()
    with contextlib.suppress(psutil.Error):
        for c in psutil.net_connections("tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                pids.add(c.pid)
    return sorted(pids)


def _ours_alive(work: Path) -> list[str]:
    """Processes this part started still alive: anything titled VLLM:: or vllm::router, anything whose command line
    names the work dir (the emulator's ranks, the router's log path) — this script itself excepted."""
    import psutil

    left = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] == os.getpid() or "real_scenario.py" in cmd or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue  # a zombie is gone (only its exit status waits; a container's pid 1 may never reap it)
        name = p.info["name"] or ""
        if name.startswith(("VLLM::", "vllm::")) or cmd.startswith(("VLLM::", "vllm::")) or "vllm-router" in cmd \
                or str(work) in cmd:
            left.append(f"{p.info['pid']} {cmd[:80]}")
    return left


def steps(s: Any) -> list[tuple[str, Callable[[], None], int]]:
    h = _Router(s)
    s.part_down = h.down  # real_scenario.py's finally: this part's own down instead of the main stack's
    # fleet_up: the fleet's `up`, then (1 of 2) the left-out replica on its own, or (else) the split fallback
    return [("router-fleet-up", h.fleet_up, 380), ("router-kill", h.kill, 80)]
