"""The supervisor's port seen by real clients: Debian's headless ``chromium`` renders the status page and shows a
failing gate in red within one round of a fault; Debian's ``prometheus`` server scrapes the exporter.

One stack (one ``local: true`` node, ``runtime: process``) with ``supervise.recover: false``: a fault stays
on the page, nothing restarts. The fault: the engine wedges (the emulator's ``wedge`` through its control file),
so the next round's canary fails. Both programs are installed by scripts/setup; a missing one fails the test.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from supervise_stack import LocalStack, Supervisor, free_port

RED = "rgb(220, 40, 40)"
GREEN = "rgb(214, 245, 214)"


class Notify:
    """systemd's side of sd_notify: a datagram socket the supervisor is told about in $NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.path = path
        self.got: list[str] = []

    def drain(self) -> list[str]:
        while True:
            try:
                self.got.append(self.sock.recv(4096).decode())
            except OSError:
                return self.got


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> Iterator[tuple[LocalStack, Supervisor, Notify]]:
    work = tmp_path_factory.mktemp("web")
    st = LocalStack.make(work, nodes=1, env={"SSEMU_CONTROL": str(work / "control")},
                         supervise={"recover": False, "interval_s": 1, "canary_deadline_s": 2})
    notify = Notify(work / "notify")
    try:
        st.cli("up")
        sup = st.supervise(env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "1000000"})
        yield st, sup, notify
        notify.drain()  # an undrained socket holds 10 datagrams; sd_notify drops what does not fit, never waits
        assert sup.stop(signal.SIGTERM) == 0
        assert "STOPPING=1" in notify.drain()
    finally:
        notify.sock.close()
        st.close()
    assert st.rank_pids() == []


def need(program: str) -> str:
    path = shutil.which(program)
    assert path, f"{program} is not installed (scripts/setup installs it from Debian)"
    return path


def render(url: str, tmp: Path) -> str:
    """The DOM after chromium rendered the page (its scripts ran, styles applied)."""
    argv = [need("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", f"--user-data-dir={tmp / 'chromium-profile'}",
            "--dump-dom", url]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0 and "<html" in p.stdout, p.stderr[-2000:]
    return p.stdout


def gate_row(dom: str, gate: str) -> str:
    m = re.search(rf"<tr[^>]*id=\"gate-{gate}\"[^>]*>", dom)
    assert m, f"no row for gate {gate} in the rendered page"
    return m.group(0)


def test_chromium_renders_the_status_page_and_shows_a_failing_gate_red_within_one_round(watched, tmp_path) -> None:
    st, sup, notify = watched
    sup.wait_status(lambda s: s["gates"]["progress"]["ok"] is True, 15, "progress passing")
    dom = render(sup.url + "/", tmp_path)
    assert 'data-rendered="1"' in dom  # the page's script ran in the browser
    row = gate_row(dom, "progress")
    assert "gate ok" in row and f'data-shown-color="{GREEN}"' in row, row
    assert 'id="acceptance-chart"' in dom or "no acceptance figures yet" in dom
    assert "tiny" in dom and "Incidents" in dom and 'id="history"' in dom

    rounds = sup.status()["rounds"]
    (st.work / "control").write_text("wedge@after=0\n")  # the engine wedges: /health 200, no token comes back
    s = sup.wait_status(lambda s: s["gates"]["progress"]["ok"] is False, 20, "the progress gate failing")
    assert s["rounds"] <= rounds + 2  # the round in flight when the fault began, then the first full one
    dom = render(sup.url + "/", tmp_path)
    row = gate_row(dom, "progress")
    assert "gate fail" in row and f'data-shown-color="{RED}"' in row, row
    assert "canary generation failed" in dom and f'data-shown-color="{GREEN}"' in gate_row(dom, "ranks")
    (st.work / "control").unlink()
    # the incident (py-spy dumps, logs) is written before the next round: on a loaded machine, seconds
    sup.wait_status(lambda s: s["gates"]["progress"]["ok"] is True, 60, "progress passing again")


def test_sd_notify_ready_after_the_first_round_then_watchdog_pings(watched) -> None:
    st, sup, notify = watched
    time.sleep(1.5)  # the heartbeat beats every half WATCHDOG_USEC (0.5 s here)
    got = notify.drain()
    assert got.count("READY=1") == 1, got
    assert got.count("WATCHDOG=1") >= 2 and any(g.startswith("STATUS=") for g in got), got


def test_a_real_prometheus_scrapes_the_exporter_and_sees_a_kernel_xid(watched, tmp_path) -> None:
    st, sup, notify = watched
    port = free_port()
    target = sup.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: sparkserve\n    static_configs:\n      - targets: ['{target}']\n")
    proc = subprocess.Popen([need("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def query(q: str) -> list[dict]:
        url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(q)}"
        with urllib.request.urlopen(url, timeout=3) as r:
            return json.loads(r.read())["data"]["result"]

    try:
        end, got = time.monotonic() + 45, []
        while time.monotonic() < end:
            try:
                got = query("sparkserve_gate_ok")
                if len(got) == 7:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            time.sleep(0.5)
        gates = {r["metric"]["gate"]: float(r["value"][1]) for r in got}
        assert set(gates) == {"progress", "wedge", "ranks", "faults", "kernel", "memory", "acceptance"}, got
        assert gates["progress"] == 1.0 and gates["ranks"] == 1.0
        up = query('up{job="sparkserve"}')
        assert up and float(up[0]["value"][1]) == 1.0
        mem = query("sparkserve_node_memfree_bytes")
        assert mem and mem[0]["metric"]["node"] == "n0" and float(mem[0]["value"][1]) > 4 * 2**30
        assert query("sparkserve_canary_latency_seconds")

        # an Xid in the node's kernel log (its kmsg source): the kernel gate fails, and Prometheus sees it
        with (st.work / "kmsg" / "n0").open("a") as k:
            k.write("NVRM: Xid (PCI:000f:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n")
        sup.wait_status(lambda s: s["gates"]["kernel"]["ok"] is False, 30, "the kernel gate failing")
        end, kernel = time.monotonic() + 15, None
        while time.monotonic() < end and kernel != 0.0:
            kernel = float(query('sparkserve_gate_ok{gate="kernel"}')[0]["value"][1])
            time.sleep(0.5)
        assert kernel == 0.0
    finally:
        proc.terminate()
        proc.wait(20)
