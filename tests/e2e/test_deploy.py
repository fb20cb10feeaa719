"""`sparkserve up / status / down` on the two-node rig: from a config to serving on every node, and back
to nothing; re-`up` of the same stack is a no-op, a changed config replaces it."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from e2e_support import BOTH_RUNTIMES

pytestmark = pytest.mark.rig


def serves(api_url: str, model: str) -> bool:
    r = httpx.get(f"{api_url}/v1/models", timeout=5)
    return r.status_code == 200 and model in [m["id"] for m in r.json()["data"]]


@BOTH_RUNTIMES
def test_up_serves_on_both_nodes_then_down_leaves_nothing(e2e) -> None:
    cfg = e2e.config()
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert "started: tiny serving at http://127.0.0.2:" in p.stdout and "all gates passed" in p.stdout

    for n in e2e.rig.nodes:  # one running, labelled container (or rank process) per node, rank by config order
        mine = e2e.managed(n.name)
        assert [c.status for c in mine] == ["running"], (n.name, mine)
        assert mine[0].labels["io.sparkserve.rank"] == str(n.index)
    c = e2e.load(cfg)
    api = f"http://{c.serve.host}:{c.serve.port}"
    assert serves(api, "tiny")

    logs = e2e.cli("logs", "--node", "node-b", cfg=cfg)
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert lines and all(ln.startswith("node-b | ") for ln in lines)
    assert any("headless multiproc executor" in ln for ln in lines)
    both = e2e.cli("logs", cfg=cfg).stdout
    assert "node-a | " in both and "Application startup complete." in both

    st = e2e.json("status", cfg=cfg)
    assert st["ok"] is True and st["api"]["serving"] is True
    assert {k: [x["status"] for x in v] for k, v in st["nodes"].items()} == {"node-a": ["running"],
                                                                             "node-b": ["running"]}
    assert len(st["deployments"]) == 1
    # above the seam: the same on both (forced: the rig's target has no chat template for the card protocol)
    bench = e2e.json("bench", "--protocol", "forced", "--cell", "smoke", cfg=cfg, timeout=120)
    assert bench["requests_ok"] == bench["prompts"] and bench["stream_errors"] == 0 and bench["acceptance_length"]

    p = e2e.cli("down", cfg=cfg)
    assert p.returncode == 0, p.stderr
    what = "container(s)" if e2e.runtime == "docker" else "engine process group(s)"
    assert f"down: removed 2 {what}" in p.stdout
    assert e2e.leftovers() == {}
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{api}/v1/models", timeout=2)

    st = e2e.cli("status", "--json", cfg=cfg)  # nothing runs: status says so, exit 1
    assert st.returncode == 1 and '"ok": false' in st.stdout
    p = e2e.cli("down", cfg=cfg)
    assert p.returncode == 0 and "nothing was running" in p.stdout


def test_reup_is_a_noop_and_a_changed_config_replaces_the_stack(e2e) -> None:
    cfg = e2e.config()
    first = e2e.json("up", "--no-gates", cfg=cfg)
    assert first["status"] == "started"
    ids = e2e.running_ids()
    assert set(ids) == {"node-a", "node-b"}

    again = e2e.cli("up", cfg=cfg)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already up: "), again.stdout
    assert "already up" in again.stderr and "nothing to do" in again.stderr
    assert e2e.running_ids() == ids  # the very same containers
    again_json = e2e.json("up", "--no-gates", cfg=cfg)
    assert again_json["status"] == "unchanged" and again_json["fingerprint"] == first["fingerprint"]

    changed = e2e.derive(cfg, {"serve": {"max_num_seqs": 8}})
    rep = e2e.json("up", "--no-gates", cfg=changed)
    assert rep["status"] == "replaced" and rep["fingerprint"] != first["fingerprint"]
    new_ids = e2e.running_ids()
    assert set(new_ids) == {"node-a", "node-b"} and not set(new_ids.values()) & set(ids.values())
    for n in e2e.rig.nodes:  # the old containers are gone, not just stopped
        assert len(e2e.ours(n.name)) == 1
    head = e2e.managed("node-a")[0]
    argv = head.attrs["Config"]["Cmd"]
    assert argv[argv.index("--max-num-seqs") + 1] == "8"

    assert e2e.cli("down", cfg=changed).returncode == 0
    assert e2e.leftovers() == {}


def test_a_second_operator_is_locked_out_while_up_runs(e2e) -> None:
    cfg = e2e.config({"serve": {"env": {"SSEMU_BOOT_SECONDS": "6"}}})
    proc = e2e.popen("up", "--no-gates", cfg=cfg)
    try:
        t0 = time.monotonic()
        while "node-b" not in e2e.running_ids():  # the follower runs: `up` holds the lock on the head
            assert proc.poll() is None and time.monotonic() - t0 < 60, proc.communicate()
            time.sleep(0.1)
        p = e2e.cli("down", cfg=cfg)
        e2e.assert_explained(p, code=3, node="node-a", step="lock",
                             says=("another sparkserve run holds /tmp/sparkserve.deploy.lock", "(up)", "--break-lock"))
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    assert proc.returncode == 0, err  # the refused `down` did not disturb the `up` in progress
    assert len(e2e.running_ids()) == 2
    assert e2e.cli("down", cfg=cfg).returncode == 0
    assert e2e.leftovers() == {}


def test_a_stale_lock_is_named_and_broken_on_request(e2e) -> None:
    cfg = e2e.config()
    lock = e2e.rig.head.host_path("/tmp/sparkserve.deploy.lock")  # node-a's private /tmp, seen from the host
    lock.mkdir()
    try:
        (lock / "owner").write_text(json.dumps({"user": "ops", "host": "laptop", "pid": 4242, "since": 0,
                                                "what": "up"}))
        p = e2e.cli("up", cfg=cfg)
        e2e.assert_explained(p, code=3, node="node-a", step="lock", says=("ops@laptop pid 4242", "(up)"))
        assert e2e.leftovers() == {}
        p = e2e.cli("up", "--no-gates", "--break-lock", cfg=cfg)
        assert p.returncode == 0, p.stderr
        assert not lock.exists()  # released after the run
    finally:
        shutil.rmtree(lock, ignore_errors=True)
    assert e2e.cli("down", cfg=cfg).returncode == 0


def test_a_lock_left_by_a_killed_run_on_this_machine_is_taken_over(e2e) -> None:
    cfg = e2e.config()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    lock = e2e.rig.head.host_path("/tmp/sparkserve.deploy.lock")  # node-a's private /tmp
    lock.mkdir()
    try:
        (lock / "owner").write_text(json.dumps({"user": "root", "host": socket.gethostname(), "pid": dead.pid,
                                                "since": time.time(), "what": "up"}))
        p = e2e.cli("up", "--no-gates", cfg=cfg)
        assert p.returncode == 0, p.stderr
        assert f"was left by a run on this machine that is gone (pid {dead.pid})" in p.stderr
    finally:
        shutil.rmtree(lock, ignore_errors=True)
    assert e2e.cli("down", cfg=cfg).returncode == 0
