"""Fabric detection: fake sysfs trees (tests/fixtures/sysfs, written by build.py) → per-node NCCL env.

The trees are read by the production node probe (sparkserve.deploy.probe) run on a LocalNode, exactly as
`up` and `doctor` read a node's /sys."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkserve.config import FabricConfig
from sparkserve.deploy.probe import PROBE_PROGRAM, probe_node
from sparkserve.nodes import LocalNode
from sparkserve.plan.fabric import (
    FabricError,
    addr_range,
    compare_nodes,
    fabric_env_records,
    nccl_gid_pick,
    resolve,
    twin_key,
)
from sparkserve.plan.fabric_sysfs import Gid, Port, parse_sysfs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
IP = {"spark-a": "192.168.200.1", "spark-b": "192.168.200.2", "spark-c": "192.168.200.3"}


def read_tree(root: Path) -> dict[str, str]:
    """What the node probe reads under a sysfs root."""
    return dict(_read_tree(str(root)))


@functools.cache
def _read_tree(root: str) -> tuple[tuple[str, str], ...]:
    files = probe_node(LocalNode("fixture"), sysfs=root).sysfs
    assert files is not None
    return tuple(files.items())


def facts(tree: str, ip: str = "192.168.200.1", **fabric: object):
    return resolve(parse_sysfs(read_tree(FIX / tree)), FabricConfig(**fabric), ip, node=tree)


def test_fixtures_are_what_build_py_writes(tmp_path: Path) -> None:
    sys.path.insert(0, str(FIX))
    try:
        import build  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(FIX))
    for name, tree in build.FIXTURES.items():
        build.write_tree(tmp_path / name, tree)
        stale = f"{name}: rerun tests/fixtures/sysfs/build.py"
        assert read_tree(tmp_path / name) == read_tree(FIX / name), stale


def test_two_twins_with_gids_are_dual_rail_with_the_gid_index_left_unset() -> None:
    f = facts("spark-a")
    assert f.env() == {
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "UCX_NET_DEVICES": "enp1s0f1np1",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_IB_ADDR_FAMILY": "AF_INET",
        "NCCL_IB_ADDR_RANGE": "192.168.200.0/23",  # both twins' subnets: NCCL drops GIDs outside the range
    }
    rec = f.fabric_env()
    assert (rec.rule, rec.unset, rec.env) == ("dual-rail", ("NCCL_IB_GID_INDEX",), f.env())
    assert f.hca_gids == {"rocep1s0f1": 3, "roceP2p1s0f1": 3} and not f.warnings


def test_one_hca_gets_its_gid_index_detected_per_node() -> None:
    f = facts("one-hca")
    assert f.hcas == ("rocep1s0f1",) and f.gid_index == 5
    env = f.env()
    assert env["NCCL_IB_HCA"] == "rocep1s0f1" and env["NCCL_IB_GID_INDEX"] == "5"
    assert not {"NCCL_IB_ADDR_RANGE", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_ADDR_FAMILY"} & set(env)
    rec = f.fabric_env()
    assert (rec.rule, rec.unset) == ("single-hca", ())


def test_a_twin_without_its_own_roce_v2_ipv4_gid_is_left_out_with_the_fix() -> None:
    f = facts("twin-no-gid")
    assert f.hcas == ("rocep1s0f1",)
    assert f.env()["NCCL_IB_GID_INDEX"] == "3" and f.fabric_env().rule == "single-hca"
    [w] = [w for w in f.warnings if "roceP2p1s0f1" in w]
    assert "ACTIVE but has no RoCE v2 IPv4 GID" in w and "fix: give enP2p1s0f1np1 its own address" in w


def test_the_twins_gid_at_index_5_is_left_to_nccl_per_hca() -> None:
    f = facts("twin-gid-5")
    assert f.hcas == ("rocep1s0f1", "roceP2p1s0f1")
    assert "NCCL_IB_GID_INDEX" not in f.env()  # one global 3 would put the twin on a link-local/v1 entry
    assert f.hca_gids == {"rocep1s0f1": 3, "roceP2p1s0f1": 5}  # what NCCL's own walk picks on each
    assert f.hca_ips == {"rocep1s0f1": "192.168.200.1", "roceP2p1s0f1": "192.168.201.1"}
    assert not f.warnings


def test_a_pinned_gid_index_with_twins_must_hold_on_every_hca() -> None:
    with pytest.raises(FabricError, match=r"roceP2p1s0f1 has no RoCE v2 IPv4 GID at 3 — fix: set fabric.gid_index"):
        facts("twin-gid-5", gid_index=3)
    f = facts("spark-a", gid_index=3)  # it holds on both: the user's choice is kept
    assert f.env()["NCCL_IB_GID_INDEX"] == "3" and "NCCL_IB_ADDR_RANGE" not in f.env()


@pytest.mark.parametrize(("tree", "gid"), [("spark-a", 3), ("spark-b", 5), ("spark-c", 7)])
def test_gid_index_is_resolved_per_node_from_the_roce_v2_ipv4_entry(tree: str, gid: int) -> None:
    f = facts(tree, IP[tree])
    assert f.gid_index == gid
    assert f.hca_gids == {"rocep1s0f1": gid, "roceP2p1s0f1": gid}
    assert not f.warnings


def test_nccl_gid_pick_follows_ncclUpdateGidIndex() -> None:
    ll = "fe80:0000:0000:0000:5e25:73ff:fe00:0001"
    v4 = "0000:0000:0000:0000:0000:ffff:c0a8:c801"  # ::ffff:192.168.200.1
    other = "0000:0000:0000:0000:0000:ffff:0a00:0001"  # ::ffff:10.0.0.1
    port = Port(1, "ACTIVE", "LinkUp", "Ethernet", (
        Gid(0, ll, "IB/RoCE v1", "e"), Gid(1, ll, "RoCE v2", "e"), Gid(2, other, "IB/RoCE v1", "e"),
        Gid(3, other, "RoCE v2", "e"), Gid(4, v4, "IB/RoCE v1", "e"), Gid(5, v4, "RoCE v2", "e")))
    assert nccl_gid_pick(port, None) == 3  # no range: the first v2 IPv4 entry wins
    assert nccl_gid_pick(port, "192.168.200.0/23") == 5  # the range keeps only the fabric's
    assert nccl_gid_pick(port, "172.16.0.0/24") == 0  # nothing in range: NCCL stays on 0 (init then fails)
    assert nccl_gid_pick(port, None, roce_version=1) == 2


def test_addr_range_is_the_smallest_network_holding_every_hca_never_narrower_than_24() -> None:
    assert addr_range(["192.168.100.10", "192.168.101.10"]) == "192.168.100.0/23"
    assert addr_range(["10.0.0.5", "10.0.0.9"]) == "10.0.0.0/24"
    assert addr_range(["127.0.0.2", "127.1.0.12"]) == "127.0.0.0/15"


def test_no_value_is_ever_empty() -> None:
    for tree, ip in IP.items():
        assert all(v != "" for v in facts(tree, ip).env().values())


def test_the_twin_ip_selects_the_twin_as_interface() -> None:
    f = facts("spark-a", "192.168.201.1")
    assert f.interface == "enP2p1s0f1np1"
    assert f.hcas == ("roceP2p1s0f1", "rocep1s0f1")


def test_records_for_every_node() -> None:
    recs = fabric_env_records({t: facts(t, IP.get(t, "192.168.200.1")) for t in ("spark-b", "one-hca")})
    assert recs["spark-b"].rule == "dual-rail" and recs["spark-b"].node == "spark-b"
    assert recs["one-hca"].env["NCCL_IB_GID_INDEX"] == "5"


def test_twin_port_down_leaves_it_out_with_a_warning() -> None:
    f = facts("twin-down")
    assert f.hcas == ("rocep1s0f1",)
    assert any("roceP2p1s0f1" in w and "DOWN" in w for w in f.warnings)


def test_link_down_is_an_error_naming_the_interface() -> None:
    with pytest.raises(FabricError, match=r"enp1s0f1np1 is down \(operstate down\)"):
        facts("link-down")


def test_roce_v1_only_entry_is_not_used() -> None:
    with pytest.raises(FabricError, match="no RoCE v2 GID entry for fabric_ip 192.168.200.1"):
        facts("v1-only")


def test_wrong_fabric_ip_lists_what_was_found() -> None:
    with pytest.raises(FabricError, match=r"10\.9\.9\.9.*found: .*192\.168\.200\.1 \(enp1s0f1np1, GID 3\)"):
        facts("spark-a", "10.9.9.9")


def test_no_rdma_devices_is_an_error() -> None:
    with pytest.raises(FabricError, match="no RDMA devices under /sys/class/infiniband"):
        facts("no-rdma")


def test_small_mtu_is_a_warning_with_the_value_and_its_fix() -> None:
    f = facts("mtu-1500")
    assert f.mtu == 1500
    [w, _twin] = [w for w in f.warnings if "MTU is 1500" in w]
    assert w.startswith("enp1s0f1np1 MTU is 1500") and "`sudo ip link set enp1s0f1np1 mtu 9000`" in w


def test_nodes_compared_side_by_side_mtu_rate_and_hca_set() -> None:
    a, b = facts("spark-a"), facts("spark-b", IP["spark-b"])
    assert compare_nodes({"a": a, "b": b}) == []
    assert compare_nodes({"a": a}) == []
    got = {m.what: m for m in compare_nodes({"a": a, "m": facts("mtu-1500"), "one": facts("one-hca"),
                                              "slow": facts("twin-slow", "192.168.200.2")})}
    assert got["MTU"].values == {"a": "9000", "m": "1500", "one": "9000", "slow": "9000"}
    assert got["HCA set"].values["one"] == "rocep1s0f1"
    assert got["link rate"].values["slow"] == "100 Gb/sec (2X HDR),200 Gb/sec (4X HDR)"
    assert "MTU differs between nodes: a 9000, m 1500" in got["MTU"].message() and "fix:" in got["MTU"].message()


def test_explicit_values_are_used_and_checked() -> None:
    f = facts("spark-b", IP["spark-b"], interface="enp1s0f1np1", hca="rocep1s0f1", gid_index=5)
    assert (f.interface, f.hcas, f.gid_index) == ("enp1s0f1np1", ("rocep1s0f1",), 5)
    with pytest.raises(FabricError, match="fabric.interface eth9 does not exist"):
        facts("spark-a", interface="eth9")
    with pytest.raises(FabricError, match="fabric.hca mlx5_9 does not exist"):
        facts("spark-a", hca="mlx5_9")
    assert any("is set but" in w for w in facts("spark-b", IP["spark-b"], hca="rocep1s0f1", gid_index=3).warnings)
    with pytest.raises(FabricError, match="applies to every HCA"):  # twins: it would break NCCL init
        facts("spark-b", IP["spark-b"], gid_index=3)


def test_explicit_interface_must_carry_the_fabric_ip() -> None:
    with pytest.raises(FabricError, match="on enP2p1s0f1np1"):
        facts("spark-a", "192.168.200.1", interface="enP2p1s0f1np1")


def test_unused_gid_entries_are_skipped_and_link_local_never_chosen() -> None:
    s = parse_sysfs(read_tree(FIX / "spark-a"))
    gids = s.hcas["rocep1s0f1"].ports[1].gids
    assert {g.index for g in gids} == {0, 1, 2, 3}
    assert gids[0].gid.startswith("fe80") and gids[0].ipv4 is None
    assert gids[3].ipv4 == "192.168.200.1" and gids[3].type == "RoCE v2"


def test_twin_key_pairs_pcie_twins() -> None:
    assert twin_key("roceP2p1s0f1") == twin_key("rocep1s0f1")
    assert twin_key("enP2p1s0f1np1") == twin_key("enp1s0f1np1")
    assert twin_key("rocep1s0f0") != twin_key("rocep1s0f1")


def test_probe_program_runs_standalone_as_sent_to_a_node() -> None:
    question = {"paths": [str(FIX)], "disk": [], "ports": [], "sysfs": str(FIX / "spark-b"), "mkdirs": []}
    out = subprocess.run([sys.executable, "-c", PROBE_PROGRAM], input=json.dumps(question).encode(),
                         capture_output=True, check=True, env={})
    reply = json.loads(out.stdout)
    assert reply["paths"] == {str(FIX): True} and "MemTotal:" in reply["meminfo"]
    assert reply["sysfs"] == read_tree(FIX / "spark-b")


def test_every_node_question_and_the_fabric_are_one_remote_command() -> None:
    node = LocalNode("spark-b")
    calls: list[list[str]] = []
    real = node.run

    def counting(argv: list[str], **kw: object):
        calls.append(argv)
        return real(argv, **kw)  # type: ignore[arg-type]

    node.run = counting  # type: ignore[method-assign]
    facts = probe_node(node, paths=[str(FIX)], disk=[str(FIX)], sysfs=FIX / "spark-b")
    assert [c[:2] for c in calls] == [["python3", "-c"]]
    assert facts.paths[str(FIX)] and facts.disk[str(FIX)] > 0
    f = resolve(parse_sysfs(facts.sysfs or {}), FabricConfig(sysfs_root=FIX / "spark-b"), IP["spark-b"])
    assert f.gid_index == 5 and f.rates["rocep1s0f1"] == "200 Gb/sec (4X HDR)"
    nothing = probe_node(node, sysfs=FIX / "no-rdma").sysfs or {}
    with pytest.raises(FabricError, match=r"^no RDMA devices under .*/no-rdma/class/infiniband"):
        resolve(parse_sysfs(nothing), FabricConfig(sysfs_root=FIX / "no-rdma"), IP["spark-b"],
                sysfs_root=str(FIX / "no-rdma"))


def _doctor_fabric(tmp_path: Path, tree: str) -> list:
    """`doctor`'s checks of one node (the head of a two-node config) whose sysfs is the fixture ``tree``."""
    from _fixtures import config_file

    from sparkserve.config import load_config
    from sparkserve.deploy.doctor import check_node

    cfg = load_config(config_file(tmp_path / "c.yaml", {"runtime": "process",
                                                         "fabric": {"sysfs_root": str(FIX / tree)}}))
    checks = check_node(cfg, cfg.nodes[0], LocalNode(cfg.nodes[0].name), 0, None, check_ports=False)
    return [c for c in checks if c.name == "fabric"]


def test_doctor_prints_every_fabric_warning_with_its_fix(tmp_path: Path) -> None:
    ok, *warns = _doctor_fabric(tmp_path, "mtu-1500")
    assert ok.status == "ok" and ok.detail.startswith("dual-rail: ") and "NCCL_IB_ADDR_RANGE=" in ok.detail
    assert [w.status for w in warns] == ["warn", "warn"]  # both twins' netdevs at MTU 1500
    assert "enp1s0f1np1 MTU is 1500" in warns[0].detail and "sudo ip link set enp1s0f1np1 mtu 9000" in warns[0].detail
    ok, *warns = _doctor_fabric(tmp_path, "twin-no-gid")
    assert ok.detail.startswith("single-hca: ") and "NCCL_IB_GID_INDEX=3" in ok.detail
    assert len(warns) == 1 and "fix: give enP2p1s0f1np1 its own address" in warns[0].detail
    assert [c.status for c in _doctor_fabric(tmp_path, "spark-a")] == ["ok"]


def test_doctor_compares_the_nodes_fabrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_all sets every node's fabric side by side; a node on another layout is a `fabric parity` warning."""
    from _fixtures import config_file

    from sparkserve.config import load_config
    from sparkserve.deploy import doctor

    cfg = load_config(config_file(tmp_path / "c.yaml", {"runtime": "process",
                                                         "fabric": {"sysfs_root": str(FIX / "spark-a")}}))
    nodes = {n.name: LocalNode(n.name) for n in cfg.nodes}
    same = doctor.check_all(cfg, nodes, check_ports=False)
    assert not [c for c in same if c.name == "fabric parity"]
    real_probe = doctor.probe_node

    def per_node_sysfs(node, **kw):  # spark-b's node reads the single-HCA tree
        if node.name == "spark-b":
            kw["sysfs"] = str(FIX / "one-hca")
        return real_probe(node, **kw)

    monkeypatch.setattr(doctor, "probe_node", per_node_sysfs)
    cfg.nodes[1].fabric_ip = "192.168.200.1"  # the one-hca tree's address
    [parity] = [c for c in doctor.check_all(cfg, nodes, check_ports=False) if c.name == "fabric parity"]
    assert parity.status == "warn" and parity.node == "all"
    assert parity.detail.startswith("HCA set differs between nodes: "
                                    "spark-a rocep1s0f1,roceP2p1s0f1, spark-b rocep1s0f1")


def test_a_gid_nccl_would_pick_over_the_hcas_own_entry_is_a_warning() -> None:
    """An address of another netdev (a VLAN on the twin) inside the range, before the twin's own entry: NCCL's walk
    takes it; doctor says so."""
    from sparkserve.plan.fabric_sysfs import Hca, NetDev, SysfsFacts

    def v4(ip: str) -> str:
        a, b, c, d = (int(x) for x in ip.split("."))
        return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"

    main = Port(1, "ACTIVE", "LinkUp", "Ethernet", (Gid(3, v4("192.168.200.1"), "RoCE v2", "enp1s0f1np1"),))
    twin = Port(1, "ACTIVE", "LinkUp", "Ethernet", (Gid(3, v4("192.168.201.7"), "RoCE v2", "enP2p1s0f1np1.10"),
                                                    Gid(5, v4("192.168.201.1"), "RoCE v2", "enP2p1s0f1np1")))
    facts = SysfsFacts(
        {n: NetDev(n, "up", 9000, True) for n in ("enp1s0f1np1", "enP2p1s0f1np1", "enP2p1s0f1np1.10")},
        {"rocep1s0f1": Hca("rocep1s0f1", ("enp1s0f1np1",), {1: main}),
         "roceP2p1s0f1": Hca("roceP2p1s0f1", ("enP2p1s0f1np1",), {1: twin})})
    f = resolve(facts, FabricConfig(), "192.168.200.1")
    assert f.hcas == ("rocep1s0f1", "roceP2p1s0f1") and f.hca_ips["roceP2p1s0f1"] == "192.168.201.1"
    assert f.hca_gids == {"rocep1s0f1": 3, "roceP2p1s0f1": 3}
    [w] = f.warnings
    assert w.startswith("NCCL will pick GID 3 on roceP2p1s0f1, not its 192.168.201.1 entry 5") and "fix:" in w
