"""Day 2 on the docker runtime (issue 31): a supervisor at its default settings watches the rig's stack, the head
container is frozen (`docker pause`), and

* the incident's py-spy files hold the head's Python stacks (``Thread`` lines) — the emulator image has no
  py-spy and the node has none either: sparkserve's own binary runs in a helper container in the rank's PID
  namespace, and no helper is left behind;
* `sparkserve status` exits non-zero and names the failing check and the incident;
* a manual `sparkserve gates` fails ``smoke`` with "no progress for 15 s" within 20 s.

Only the supervisor's port, its incidents dir and ``recover: false`` (the frozen stack stays for `status` and
`gates` to look at) differ from the defaults; ``supervise.pyspy`` is not set.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from e2e_support import SPARKSERVE, free_port

pytestmark = pytest.mark.rig


def _status(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/status.json", timeout=3) as r:
            return json.loads(r.read())
    except OSError:
        return None


def _wait(url: str, pred, timeout: float, proc: subprocess.Popen) -> dict | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        st = _status(url)
        if st is not None and pred(st):
            return st
        time.sleep(0.5)
    return None


def test_paused_head_incident_holds_python_stacks_status_fails_and_gates_name_the_wedge(e2e, tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    incidents = tmp_path / "incidents"
    cfg = e2e.config({"supervise": {"listen": f"127.0.0.1:{port}", "incidents_dir": str(incidents),
                                    "recover": False}})
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    head = e2e.rig.head.name
    doc = e2e.json("doctor", cfg=cfg)  # every node: forensics will work, and how
    rows = {c["node"]: c for c in doc["checks"] if c["name"] == "forensics"}
    assert set(rows) == {n.name for n in e2e.rig.nodes}
    assert all(r["status"] == "ok" and "helper container" in r["detail"] for r in rows.values()), rows
    ranks = e2e.managed(head)
    assert len(ranks) == 1
    rank = ranks[0]
    log = (tmp_path / "supervise.log").open("w")
    sup = subprocess.Popen([str(SPARKSERVE), "supervise", "-c", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                           text=True, env=e2e.env())
    try:
        assert _wait(url, lambda s: s["rounds"] >= 1 and s["gates"]["progress"]["ok"] is True, 90, sup), \
            (tmp_path / "supervise.log").read_text()[-2000:]
        rank.pause()
        try:
            st = _wait(url, lambda s: len(s["incidents"]) >= 1, 90, sup)
            assert st is not None, (tmp_path / "supervise.log").read_text()[-2000:]
            inc = Path(st["incidents"][-1]["dir"])
            dumps = {f.name: f.read_text() for f in inc.glob("*.pyspy.txt")}
            assert dumps, sorted(x.name for x in inc.iterdir())
            stacks = [name for name, text in dumps.items()
                      if any(ln.startswith("Thread ") for ln in text.splitlines())]
            assert stacks, dumps  # a Python stack, not "py-spy not found"
            assert not any("not found" in t or "helper container failed" in t for t in dumps.values()), dumps
            assert st["incidents"][-1]["pyspy_ok"] is True
            # the helper container is gone; the rank was not touched (still paused, same capabilities)
            left = [c.name for c in e2e.docker[head].containers.list(all=True)
                    if c.name.startswith("sparkserve-pyspy")]
            assert left == []
            rank.reload()
            assert rank.status == "paused" and "SYS_PTRACE" not in (rank.attrs["HostConfig"].get("CapAdd") or [])

            s = e2e.cli("status", "--json", cfg=cfg, timeout=60)
            assert s.returncode != 0, s.stdout
            view = json.loads(s.stdout)["supervisor"]
            assert view["running"] is True and view["failing_now"] is True
            assert "progress" in [f["check"] for f in view["failing"]], view
            assert view["last_incident"]["dir"] == str(inc)
            text = e2e.cli("status", cfg=cfg, timeout=60)
            assert text.returncode != 0 and "FAILING progress" in text.stdout, text.stdout

            t0 = time.monotonic()
            g = e2e.cli("gates", "--json", cfg=cfg, timeout=120)
            took = time.monotonic() - t0
            smoke = next(x for x in json.loads(g.stdout)["gates"] if x["name"] == "smoke")
            assert g.returncode != 0 and not smoke["ok"]
            assert "no progress for 15 s" in smoke["reason"], smoke
            assert took <= 20.0, f"gates took {took:.1f}s on a frozen head"
        finally:
            rank.unpause()
    finally:
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(30)
        except subprocess.TimeoutExpired:
            sup.kill()
        log.close()
