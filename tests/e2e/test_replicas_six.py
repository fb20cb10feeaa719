"""`replicas: 3` on six rig nodes behind the real vllm-router 0.1.17: every replica up at once, the router gate
reaches all three, `status --json` lists three workers, requests through the router keep flowing while one replica
is taken out by hand and put back, `down` leaves nothing on the six nodes.

A six-node rig of its own (addresses 127.0.0.50-55, port 2226, node root /srv/spark-e6) is brought up for this
module and removed after it."""

from __future__ import annotations

import json

import pytest
from e2e_support import E2E
from replicas_support import Load, fleet_config, own_rig, stop_routers

from sparkserve.nodes.router import RouterAPI

pytestmark = pytest.mark.rig


@pytest.fixture(scope="module")
def rig6(rig_exclusive, _module_state):
    yield from own_rig(rig_exclusive, nodes=6, ip_base=50, ssh_port=2226, root="/srv/spark-e6")


@pytest.fixture
def e6(rig6, _module_state, tmp_path):
    handle, clients = rig6
    h = E2E(handle, clients, _module_state, tmp_path)
    h.clean()
    yield h
    stop_routers(h)
    h.clean()


def test_three_replicas_up_status_down(e6) -> None:
    cfg = fleet_config(e6, 3)
    up = e6.json("up", cfg=cfg, timeout=600)
    assert [r["nodes"] for r in up["replicas"]] == [["node-a", "node-b"], ["node-c", "node-d"], ["node-e", "node-f"]]
    assert up["serving"] == 3 and up["exit_code"] == 0 and all(r["gates"] == "passed" for r in up["replicas"])
    gate = up["router_gate"]
    assert gate["ok"] and gate["sent"] == 12 and gate["reached"] == {"1": 4, "2": 4, "3": 4}, gate

    st = e6.json("status", cfg=cfg)
    assert st["ok"] is True and st["serving"] == 3
    assert sorted(w["replica"] for w in st["router"]["workers"]) == [1, 2, 3]
    assert [r["api_url"].rsplit(":", 1)[0] for r in st["replicas"]] == [
        "http://127.0.0.50", "http://127.0.0.52", "http://127.0.0.54"]

    api = RouterAPI(st["router"]["url"])
    middle = st["replicas"][1]["api_url"]
    with Load(st["router"]["url"], e6.load(cfg).model.served_name, per_kind=2) as load:
        api.remove_worker(middle)
        st2 = e6.json("status", cfg=cfg, code=1)  # replica 2 serves but is not in the router: not ok
        assert [r["in_router"] for r in st2["replicas"]] == [True, False, True]
        api.add_worker(middle)
    print(f"\nthree replicas, one out and back under load: {json.dumps(load.done)}, failed {load.failed}")
    assert load.failed == {"stream": [], "plain": []} and min(load.done.values()) >= 2

    down = e6.json("down", cfg=cfg)
    assert down["router"]["pid"] == st["router"]["pid"]
    assert sorted(down["removed"]) == ["node-a", "node-b", "node-c", "node-d", "node-e", "node-f"]
    assert e6.leftovers() == {}
