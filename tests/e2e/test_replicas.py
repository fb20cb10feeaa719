"""`replicas: 2` on four rig nodes behind the real vllm-router 0.1.17: `up` serves through the router and its gate
reached both replicas, `status --json` names the router and both workers, kill -9 of one replica's head under
load leaves the endpoint answering (failed requests counted, streaming and non-streaming apart), `down` stops the
router first and leaves nothing on the four nodes.

A separate four-node rig (its own SSRIG_DIR, addresses 127.0.0.40-43, port 2225, node root /srv/spark-e4) is
brought up once per session for the replicas modules (conftest's ``rig4``) and removed at its end; the session's
two-node rig is not touched (as test_three_nodes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from e2e_support import E2E
from replicas_support import E4_ROOT, Load, fleet_config, interrupt_at, routers_on

pytestmark = pytest.mark.rig



def _config(e: E2E, **over: object) -> Path:
    return fleet_config(e, 2, **over)


def test_two_replicas_up_status_kill_one_head_under_load_down(e4) -> None:
    assert [n.host for n in e4.rig.nodes] == ["127.0.0.40", "127.0.0.41", "127.0.0.42", "127.0.0.43"]
    cfg = _config(e4)
    doc = e4.json("render", cfg=cfg)
    assert [r["nodes"] for r in doc["replicas"]] == [["node-a", "node-b"], ["node-c", "node-d"]]

    p = e4.cli("up", cfg=cfg, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "serving 2 of 2 replicas" in p.stdout and "router gate" in p.stdout, p.stdout
    for n, rank in (("node-a", "0"), ("node-b", "1"), ("node-c", "0"), ("node-d", "1")):
        (c,) = e4.managed(n)
        assert c.status == "running" and c.labels["io.sparkserve.rank"] == rank

    st = e4.json("status", cfg=cfg)
    assert st["ok"] is True and st["serving"] == 2 and st["of"] == 2
    router = st["router"]
    assert router["url"].startswith("http://127.0.0.1:") and router["running"] and router["policy"] == "round_robin"
    assert sorted(w["replica"] for w in router["workers"]) == [1, 2]
    assert [r["api_url"].rsplit(":", 1)[0] for r in st["replicas"]] == ["http://127.0.0.40", "http://127.0.0.42"]
    assert all(r["gates"] == "passed" and r["in_router"] for r in st["replicas"])
    pid = router["pid"]

    # kill -9 of replica 2's head engine while requests flow through the router
    model = e4.load(cfg).model.served_name
    with Load(router["url"], model) as load:
        time.sleep(4)
        before = dict(load.done)
        e4.kill_rank("node-c")
        time.sleep(12)
    after_kill = {k: load.done[k] - before[k] for k in before}
    print(f"\nkill -9 of replica 2's head under load: {json.dumps(load.done)} requests, failed: "
          f"non-streaming {len(load.failed['plain'])}, streaming {len(load.failed['stream'])} "
          f"({load.failed['stream'][:3]}); after the kill {json.dumps(after_kill)} more completed")
    assert load.failed["plain"] == [], load.failed  # the router re-sends a non-streamed request elsewhere
    # a stream in flight on the dying head is cut (HTTP 200, then the chunked body ends early or without [DONE]):
    # at most one per streaming client
    cut = ("cut: no [DONE]", "RemoteProtocolError: peer closed connection without sending complete message body")
    assert all(x.startswith(cut) for x in load.failed["stream"]) and len(load.failed["stream"]) <= 3, load.failed
    assert min(after_kill.values()) >= 5  # the endpoint kept answering
    st = e4.json("status", cfg=cfg, code=1)  # replica 2 is down: not ok
    assert [r["serving"] for r in st["replicas"]] == [True, False] and st["router"]["running"]

    # `up` again brings replica 2 back (replica 1 untouched, the router kept) while requests keep flowing
    ids = {k: v for k, v in e4.running_ids().items() if k in ("node-a", "node-b")}
    with Load(router["url"], model) as load:
        t0 = time.monotonic()
        again = e4.json("up", cfg=cfg, timeout=600)
        took = time.monotonic() - t0
    print(f"replica 2 serves again {took:.1f}s after `up` started; meanwhile {json.dumps(load.done)} requests, "
          f"failed {load.failed}")
    assert [r["status"] for r in again["replicas"]] == ["unchanged", "replaced"] and again["exit_code"] == 0
    assert again["router"]["pid"] == pid and again["router_gate"]["ok"]
    assert {k: v for k, v in e4.running_ids().items() if k in ("node-a", "node-b")} == ids
    assert load.failed == {"stream": [], "plain": []}

    p = e4.cli("down", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert f"router pid {pid} stopped" in p.stdout
    assert e4.leftovers() == {}
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    with pytest.raises(httpx.HTTPError):
        httpx.get(router["url"] + "/liveness", timeout=2)


NODE_ROOT = E4_ROOT  # what this module's rig nodes see as their root (SSRIG_NODE_ROOT above)
E2E_DIR = f"{NODE_ROOT}/e2e"


def _host(e: E2E, node: str, node_path: str | Path) -> Path:
    """This machine's path of a path as the four-node rig's node sees it."""
    return Path(e.rig.node(node).srv_dir) / Path(node_path).relative_to(NODE_ROOT)


def _mounts(e: E2E) -> dict[str, str]:
    out = {}
    for n in e.rig.nodes:
        (c,) = [c for c in e.managed(n.name) if c.status == "running"]
        (src,) = [m["Source"] for m in c.attrs["Mounts"] if m["Source"].startswith(E2E_DIR)]
        out[n.name] = src
    return out


@pytest.fixture
def fleet(e4):
    """Two replicas up whose drafter is a private copy at /srv/spark/e2e/drafter on every node."""
    for n in e4.rig.nodes:
        shutil.rmtree(_host(e4, n.name, E2E_DIR), ignore_errors=True)
        shutil.copytree(_host(e4, n.name, e4.rig.models["drafter"]), _host(e4, n.name, f"{E2E_DIR}/drafter"))
    cfg = _config(e4, drafter={"path": f"{E2E_DIR}/drafter"})
    p = e4.cli("up", cfg=cfg, timeout=600)
    assert p.returncode == 0, p.stderr
    yield cfg
    p = e4.cli("down", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert e4.leftovers() == {}
    for n in e4.rig.nodes:
        shutil.rmtree(_host(e4, n.name, E2E_DIR), ignore_errors=True)


def _drafter(e: E2E, tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(_host(e, "node-a", e.rig.models["drafter"]), d)
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01  # new weights, same shape: a different digest
    w.write_bytes(bytes(data))
    return d


def test_rolling_swap_under_continuous_requests_drops_none(e4, fleet, tmp_path) -> None:
    st = e4.json("status", cfg=fleet)
    url, model = st["router"]["url"], e4.load(fleet).model.served_name
    new = _drafter(e4, tmp_path, "dflash2-next")
    with Load(url, model) as load:
        time.sleep(2)
        p = e4.cli("swap-drafter", str(new), cfg=fleet, timeout=600)
        time.sleep(2)
    print(f"\nrolling swap under load: {json.dumps(load.done)} requests through the router, failed: non-streaming "
          f"{len(load.failed['plain'])}, streaming {len(load.failed['stream'])}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "swapped on all 2 replicas" in p.stdout
    err = p.stderr
    # one at a time: replica 1 is back in the router before replica 2 leaves it
    assert err.index("replica 1: back in the router") < err.index("replica 2: out of the router"), err
    assert load.failed == {"stream": [], "plain": []}
    assert min(load.done.values()) >= 5
    mounts = _mounts(e4)
    assert len(set(mounts.values())) == 1 and next(iter(mounts.values())).startswith(f"{E2E_DIR}/dflash2-next-")
    st = e4.json("status", cfg=fleet)
    assert st["ok"] is True and st["serving"] == 2


def test_a_replica_that_fails_its_swap_rolls_back_and_stops_the_rollout(e4, fleet, tmp_path) -> None:
    st = e4.json("status", cfg=fleet)
    url, model = st["router"]["url"], e4.load(fleet).model.served_name
    broken = _drafter(e4, tmp_path, "dflash2-broken")
    (broken / "ssemu-faults").write_text("crash_boot@rank=1\n")  # the emulator reads faults from the drafter dir
    mounts = _mounts(e4)
    with Load(url, model) as load:
        time.sleep(2)
        p = e4.cli("swap-drafter", str(broken), cfg=fleet, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "rolling swap stopped at replica 1" in p.stdout and "rolled back" in p.stdout, p.stdout
    assert "replica 2: out of the router" not in p.stderr  # the rollout stopped there
    assert _mounts(e4) == mounts  # replica 1 back on its drafter, replica 2 never touched
    assert load.failed == {"stream": [], "plain": []}
    st = e4.json("status", cfg=fleet)
    assert st["ok"] is True and st["serving"] == 2


def test_a_replica_that_fails_is_left_out_named_and_the_endpoint_serves(e4, tmp_path) -> None:
    """Replica 2's pair holds a drafter whose emulator crashes rank 1 at boot (its own copy on node-c and node-d):
    replica 2 fails and is torn down, replica 1 serves alone through the router, `up` says 1 of 2 and exits with
    replica 2's failure's code (3: a boot failure)."""
    for n in e4.rig.nodes:
        shutil.rmtree(_host(e4, n.name, E2E_DIR), ignore_errors=True)
        d = _host(e4, n.name, f"{E2E_DIR}/drafter")
        shutil.copytree(_host(e4, n.name, e4.rig.models["drafter"]), d)
        if n.name in ("node-c", "node-d"):
            (d / "ssemu-faults").write_text("crash_boot@rank=1\n")
    try:
        cfg = _config(e4, drafter={"path": f"{E2E_DIR}/drafter"})
        p = e4.cli("up", cfg=cfg, timeout=600)
        assert p.returncode == 3, p.stdout + p.stderr
        assert "serving 1 of 2 replicas" in p.stdout and "replica 2 (node-c, node-d) " in p.stdout
        assert "LEFT OUT" in p.stdout and "node-d" in p.stdout
        assert not e4.managed("node-c") and not e4.managed("node-d")  # torn down by its own `up`
        st = e4.json("status", cfg=cfg, code=1)
        assert [w["replica"] for w in st["router"]["workers"]] == [1] and st["serving"] == 1
        p = e4.cli("down", cfg=cfg)
        assert p.returncode == 0, p.stderr
        assert e4.leftovers() == {}
    finally:
        for n in e4.rig.nodes:
            shutil.rmtree(_host(e4, n.name, E2E_DIR), ignore_errors=True)


@pytest.mark.parametrize(("phase", "env", "marker"), [
    ("boot", {"SSEMU_BOOT_SECONDS": "60"}, "replica 2: waiting for the head to serve"),
    ("router", {}, "router: starting vllm-router"),
])
def test_up_interrupted_leaves_nothing_on_any_node_and_no_router(e4, phase: str, env: dict, marker: str) -> None:
    cfg = _config(e4, serve={"env": env})
    port = e4.load(cfg).router.port
    p = interrupt_at(e4, cfg, marker, signal.SIGTERM)
    e4.assert_explained(p, code=3, node=None, step="interrupted (SIGTERM)")
    assert e4.leftovers() == {} and routers_on(port) == []


def test_up_again_keeps_the_replicas_and_the_router_and_restarts_a_dead_router(e4) -> None:
    cfg = _config(e4)
    first = e4.json("up", cfg=cfg, timeout=600)
    ids = e4.running_ids()
    # doctor, one replica at a time: each head's ports are its own running replica's, not a FAIL
    d = e4.json("doctor", cfg=cfg)
    assert d["ok"] is True, d
    ports = [c for c in d["checks"] if c["name"].startswith("port ")]
    assert {"node-a", "node-c"} <= {c["node"] for c in ports} and all(c["status"] == "ok" for c in ports), ports
    assert {c["node"] for c in d["checks"]} >= {"node-a", "node-b", "node-c", "node-d"}
    again = e4.json("up", cfg=cfg, timeout=600)
    assert [r["status"] for r in again["replicas"]] == ["unchanged", "unchanged"] and e4.running_ids() == ids
    assert again["router"]["pid"] == first["router"]["pid"]  # the same router, kept
    os.kill(first["router"]["pid"], signal.SIGKILL)  # the router dies: the replicas are untouched
    third = e4.json("up", cfg=cfg, timeout=600)
    assert third["router"]["pid"] != first["router"]["pid"] and third["serving"] == 2 and e4.running_ids() == ids
    assert third["router_gate"]["ok"] and routers_on(e4.load(cfg).router.port) == [third["router"]["pid"]]
    assert e4.json("down", cfg=cfg)["router"]["pid"] == third["router"]["pid"]
    assert e4.leftovers() == {} and routers_on(e4.load(cfg).router.port) == []
