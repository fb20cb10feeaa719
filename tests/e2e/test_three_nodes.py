"""TP=3 across three nodes: nothing in `up / status / gates / down` assumes two.

A separate three-node rig (scripts/rig with its own SSRIG_DIR, addresses 127.0.0.30-32, port 2224, node
root /srv/spark-e3) is brought up for this module and removed after it; the session's two-node rig is not
touched. It shares only the cache (base rootfs tarball, model fixtures) with it.
"""

from __future__ import annotations

import ipaddress

import pytest
from e2e_support import E2E
from replicas_support import own_rig

pytestmark = pytest.mark.rig

@pytest.fixture(scope="module")
def rig3(rig_exclusive, _module_state):
    yield from own_rig(rig_exclusive, nodes=3, ip_base=30, ssh_port=2224, root="/srv/spark-e3")


@pytest.fixture
def e3(rig3, _module_state, tmp_path):
    handle, clients = rig3
    h = E2E(handle, clients, _module_state, tmp_path)
    h.clean()
    yield h
    h.clean()


def test_tp3_up_status_gates_down(e3) -> None:
    assert [n.host for n in e3.rig.nodes] == ["127.0.0.30", "127.0.0.31", "127.0.0.32"]
    cfg = e3.config()
    assert e3.load(cfg).serve.tensor_parallel_size == 3
    p = e3.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert "all gates passed" in p.stdout and "starting 2 follower(s): node-b, node-c" in p.stderr

    gids = {}
    for n in e3.rig.nodes:
        (c,) = e3.managed(n.name)
        assert c.status == "running" and c.labels["io.sparkserve.rank"] == str(n.index)
        argv = c.attrs["Config"]["Cmd"]
        assert argv[argv.index("--nnodes") + 1] == "3" and argv[argv.index("--node-rank") + 1] == str(n.index)
        env = dict(kv.split("=", 1) for kv in c.attrs["Config"]["Env"])
        # both twins carry their own RoCE v2 IPv4 GID (at 3, 5, 7): the dual-rail rule leaves the index to NCCL
        gids[n.name] = (env.get("NCCL_IB_GID_INDEX"), env["NCCL_IB_ROCE_VERSION_NUM"], env["NCCL_IB_ADDR_FAMILY"])
        assert ipaddress.ip_address(n.fabric_ip) in ipaddress.ip_network(env["NCCL_IB_ADDR_RANGE"])
    assert set(gids.values()) == {(None, "2", "AF_INET")}  # issue 26: no global GID index with two HCAs

    st = e3.json("status", cfg=cfg)
    assert st["ok"] is True and sorted(st["nodes"]) == ["node-a", "node-b", "node-c"]
    report = e3.json("gates", cfg=cfg, timeout=120)
    assert report["ok"] is True
    mask = next(g for g in report["gates"] if g["name"] == "mask")
    assert {e["node"] for e in mask["evidence"]} == {"node-a", "node-b", "node-c"}  # every rank

    p = e3.cli("down", cfg=cfg)
    assert p.returncode == 0 and "removed 3 container(s)" in p.stdout
    assert e3.leftovers() == {}


def test_tp3_crash_on_rank_2_names_the_third_node(e3) -> None:
    cfg = e3.config({"serve": {"env": {"SSEMU_FAULTS": "crash_boot@rank=2"}}})
    p = e3.cli("up", cfg=cfg)
    e3.assert_explained(p, code=3, node="node-c", step="boot", says=("rank 2",))
    assert e3.leftovers() == {}
