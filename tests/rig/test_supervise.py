"""`sparkserve supervise` against each serving-time fault of the engine emulator, on a real two-node stack
(two ``local: true`` nodes, ``runtime: process``: tests/rig/supervise_stack.py): detection within the bound,
a complete incident directory, the alert delivered, recovery through `up`, the give-up budget, and nothing
left behind. Each fault starts at a known time through the emulator's control file (``SSEMU_CONTROL``).

These tests use no sshd/dockerd node of the rig (only its tiny model fixtures), so they are not marked
``rig`` and do not wait for the rig's lock; their addresses are 127.0.0.110+, nobody else's.

Short intervals come from the config (interval 1 s, canary deadline 3 s, stall 3 s): the bound each test
checks is the config's own (interval + canary deadline + the round's overhead), the same rule that gives
≤ 15 s at the default 5 s / 10 s (bench/bench_supervise.py measures it).
"""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from supervise_stack import LocalStack, healthy_meminfo

OVERHEAD_S = 3.0  # a round's own work plus the incident's first write, on a loaded 2-core machine


class Hook:
    """A local webhook (apprise's json:// posts here): every alert the supervisor sends."""

    def __init__(self) -> None:
        got: list[dict] = []

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                got.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        self.got = got
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def titles(self) -> list[str]:
        return [str(g.get("title", "")) for g in self.got]


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()


def make_stack(tmp_path: Path, hook: Hook, nodes: int = 2, **supervise: object) -> LocalStack:
    control = tmp_path / "control"
    return LocalStack.make(tmp_path, nodes=nodes, env={"SSEMU_CONTROL": str(control)},
                           supervise={"alert_urls": [hook.url], **supervise})


@pytest.fixture
def stack(tmp_path: Path, hook: Hook) -> Iterator[LocalStack]:
    st = make_stack(tmp_path, hook)
    try:
        st.cli("up")
        yield st
    finally:
        st.close()
    assert st.rank_pids() == [], "a rank process outlived the test"


def fault(st: LocalStack, text: str) -> float:
    (st.work / "control").write_text(text + "\n")
    return time.monotonic()


def lift(st: LocalStack) -> None:
    (st.work / "control").unlink(missing_ok=True)


def bound(st: LocalStack) -> float:
    s = st.data["supervise"]
    return s["interval_s"] + s["canary_deadline_s"] + OVERHEAD_S


def assert_complete(inc: Path, *, checks: set[str], nodes: tuple[str, ...] = ("n0", "n1")) -> dict:
    """incident.json with the verdict; /metrics; every node's memory; every rank's log and a py-spy stack."""
    summary = json.loads((inc / "incident.json").read_text())
    assert {v["check"] for v in summary["verdict"]} & checks, summary["verdict"]
    assert (inc / "metrics.txt").exists() and "vllm:" in (inc / "metrics.txt").read_text()
    for n in nodes:
        assert "MemFree:" in (inc / f"{n}.memory.txt").read_text()
    logs = sorted(p.name for p in inc.glob("*.log"))
    assert len(logs) >= 1, f"no rank log in {inc}"
    stacks = [p.read_text() for p in inc.glob("*.pyspy.txt")]
    assert any("Thread " in s and "vllm_emulator.py" in s for s in stacks), \
        f"no py-spy stack of the engine in {inc}: {[s[:200] for s in stacks]}"
    return summary


def journal_events(st: LocalStack) -> list[tuple[str, dict]]:
    with sqlite3.connect(st.state / "sparkserve" / "journal.sqlite") as c:
        return [(k, json.loads(j)) for k, j in c.execute("SELECT kind, event_json FROM supervise_events ORDER BY id")]


def test_wedge_with_health_200_is_detected_forensics_first_then_recovered_and_sigterm_leaves_it_serving(
        stack: LocalStack, hook: Hook) -> None:
    st = stack
    sup = st.supervise()
    sup.wait_status(lambda s: s["gates"]["progress"]["ok"] is True, 15, "a passing canary")
    t0 = fault(st, "wedge@after=0")
    s = sup.wait_status(lambda s: s["incidents"], 30, "the wedge's incident")
    took = time.monotonic() - t0
    assert took <= bound(st), f"wedge detected after {took:.1f}s (bound {bound(st):.1f}s)"
    assert st.api_get("/health") == 200  # /health still says fine: it lies while the engine is wedged
    lift(st)
    summary = assert_complete(Path(s["incidents"][0]["dir"]), checks={"progress", "wedge"})
    assert "canary" in json.dumps(summary["verdict"])
    s = sup.wait_status(lambda s: s["recoveries"] >= 1 and s["phase"] == "watching", 60, "recovery")
    assert s["restarts"] == 1
    s = sup.wait_status(lambda s: s["gates"]["progress"]["ok"] is True and s["gates"]["ranks"]["ok"] is True,
                        15, "the restarted stack's canary")
    assert st.complete()["usage"]["completion_tokens"] == 8
    kinds = [k for k, _ in journal_events(st)]
    assert "incident" in kinds and "recovered" in kinds
    assert any("incident" in t for t in hook.titles()) and any("recovered" in t for t in hook.titles())

    pids = st.rank_pids()
    assert sup.stop(signal.SIGTERM) == 0
    assert "stopped watching" in sup.text() and "Traceback" not in sup.text()
    time.sleep(1.0)
    assert sorted(st.rank_pids()) == sorted(pids)  # the stack is left exactly as it was
    assert st.complete()["usage"]["completion_tokens"] == 8


def test_follower_faults_in_turn_crash_nccl_at_request_k_memory_leak_each_named_and_recovered(
        stack: LocalStack) -> None:
    st = stack
    sup = st.supervise()

    # a rank crash while serving (the follower's worker dies, exit -9)
    t0 = fault(st, "worker_death@rank=1,after=0")
    s = sup.wait_status(lambda s: len(s["incidents"]) >= 1, 30, "the crash's incident")
    assert time.monotonic() - t0 <= bound(st)
    lift(st)
    v = {x["check"]: x for x in s["incidents"][-1]["verdict"]}
    assert "ranks" in v and v["ranks"]["node"] == "n1", v
    inc = Path(s["incidents"][-1]["dir"])
    assert "died unexpectedly" in "".join(p.read_text() for p in inc.glob("n1.*.log"))
    assert_complete(inc, checks={"ranks"})
    sup.wait_status(lambda s: s["recoveries"] >= 1 and s["gates"]["ranks"]["ok"] is True, 60, "recovery 1")

    # the NCCL watchdog at request K on the follower
    done = int(sum(float(x.split()[-1]) for x in st_metrics(st) if x.startswith("vllm:request_success_total")))
    k = done + 3  # a few more canaries pass, then one hangs in its collective and the watchdog fires
    t0 = fault(st, f"nccl_timeout@rank=1,request={k}")
    s = sup.wait_status(lambda s: len(s["incidents"]) >= 2, 40, "the NCCL incident")
    lift(st)
    assert time.monotonic() - t0 <= 3 * st.data["supervise"]["interval_s"] + bound(st) + 2.0
    inc = Path(s["incidents"][-1]["dir"])
    assert "Watchdog caught collective operation timeout" in "".join(p.read_text() for p in inc.glob("n1.*.log"))
    assert_complete(inc, checks={"faults", "ranks", "progress"})
    sup.wait_status(lambda s: s["recoveries"] >= 2 and s["gates"]["ranks"]["ok"] is True, 60, "recovery 2")

    # a memory leak on n1: from 6 GiB at 1 GiB/s, the 4 GiB MemFree floor breaks about 2 s in
    t0 = fault(st, f"mem_leak@rank=1,path={st.work / 'n1.meminfo'},start_gib=6,mib_s=1024")
    s = sup.wait_status(lambda s: len(s["incidents"]) >= 3, 30, "the memory incident")
    lift(st)
    assert time.monotonic() - t0 <= 3.0 + bound(st)
    v = {x["check"]: x for x in s["incidents"][-1]["verdict"]}
    assert v["memory"]["node"] == "n1" and "below the floor" in v["memory"]["summary"]
    inc = Path(s["incidents"][-1]["dir"])
    free_kb = int(next(ln for ln in (inc / "n1.memory.txt").read_text().splitlines()
                       if ln.startswith("MemFree")).split()[1])
    assert free_kb * 1024 < 4 * 2**30
    time.sleep(1.2)  # the lifted leak stops writing within a second; then the node's memory is back
    (st.work / "n1.meminfo").write_text(healthy_meminfo())
    assert_complete(inc, checks={"memory"})
    sup.wait_status(lambda s: s["recoveries"] >= 3 and s["gates"]["memory"]["ok"] is True, 60, "recovery 3")
    assert [k for k, _ in journal_events(st)].count("recovered") == 3


def st_metrics(st: LocalStack) -> list[str]:
    import urllib.request

    with urllib.request.urlopen(st.api_url + "/metrics", timeout=5) as r:
        return r.read().decode().splitlines()


def test_acceptance_collapse_against_the_first_window_band(tmp_path: Path, hook: Hook) -> None:
    st = make_stack(tmp_path, hook, nodes=1, acceptance_window_s=2, acceptance_min_drafts=20)
    stop = threading.Event()

    def load() -> None:  # traffic, so each window holds drafts
        while not stop.is_set():
            try:
                st.complete(max_tokens=48)
            except OSError:
                time.sleep(0.2)

    try:
        st.cli("up")
        sup = st.supervise()
        threading.Thread(target=load, daemon=True).start()
        s = sup.wait_status(lambda s: s["band"] is not None, 20, "the band banked from the first window")
        assert s["band"]["source"] == "first window after boot" and s["band"]["acceptance_length"] > 2.0
        t0 = fault(st, "accept_collapse@after_s=0")
        s = sup.wait_status(lambda s: s["incidents"], 30, "the collapse's incident")
        lift(st)
        assert time.monotonic() - t0 <= 2 * 2 + bound(st)
        v = {x["check"]: x for x in s["incidents"][0]["verdict"]}
        assert "acceptance collapsed" in v["acceptance"]["summary"]  # the window that saw it start: below the alarm
        assert_complete(Path(s["incidents"][0]["dir"]), checks={"acceptance"}, nodes=("n0",))
        assert tuple(k for k, _ in journal_events(st))[:1] == ("band", )
        s = sup.wait_status(lambda s: s["recoveries"] >= 1 and s["gates"]["acceptance"]["ok"] is True, 60,
                            "acceptance back in its band")
        assert s["window"]["acceptance_length"] > 2.0
    finally:
        stop.set()
        st.close()
    assert st.rank_pids() == []


def test_give_up_after_the_budget_stops_everything_and_alerts_loudly(tmp_path: Path, hook: Hook) -> None:
    # every boot wedges after a few requests: one restart (the budget), then the give-up
    st = make_stack(tmp_path, hook, nodes=1, max_restarts=1)
    try:
        st.cli("up")
        sup = st.supervise()
        fault(st, "wedge@after=5")  # the gates' 2 warm-up + 2 smoke requests and a canary pass, then it wedges
        code = sup.proc.wait(120)
        text = sup.text()
        assert code == 1, text
        assert "GAVE UP" in text and "error: supervise: gave up after the restart budget" in text
        assert text.count("incident recorded in") == 2 and "restart 1 of 1" in text
        assert st.rank_pids() == []  # nothing left running
        p = st.cli("status", check=False)
        assert p.returncode != 0
        p = st.cli("supervise", check=False)  # a stack that is down is not silently brought back
        assert p.returncode == 1 and "error: supervise: no sparkserve rank runs on any node" in p.stderr, p.stderr
        kinds = [k for k, _ in journal_events(st)]
        assert kinds.count("incident") == 2 and kinds[-1] == "gave_up"
        assert any("GAVE UP" in t for t in hook.titles())
        gave = next(g for g in hook.got if "GAVE UP" in str(g.get("title")))
        assert gave.get("type") == "failure"
    finally:
        st.close()
    assert st.rank_pids() == []
