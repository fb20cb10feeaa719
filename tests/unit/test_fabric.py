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
from sparkserve.plan.fabric import FabricError, parse_sysfs, resolve, twin_key

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


def test_env_names_interface_both_twins_and_gid_index() -> None:
    env = facts("spark-a").env()
    assert env == {
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "UCX_NET_DEVICES": "enp1s0f1np1",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_GID_INDEX": "3",
    }


@pytest.mark.parametrize(("tree", "gid"), [("spark-a", 3), ("spark-b", 5), ("spark-c", 7)])
def test_gid_index_is_resolved_per_node_from_the_roce_v2_ipv4_entry(tree: str, gid: int) -> None:
    f = facts(tree, IP[tree])
    assert f.gid_index == gid
    assert f.env()["NCCL_IB_GID_INDEX"] == str(gid)
    assert not f.warnings


def test_no_value_is_ever_empty() -> None:
    for tree, ip in IP.items():
        assert all(v != "" for v in facts(tree, ip).env().values())


def test_the_twin_ip_selects_the_twin_as_interface() -> None:
    f = facts("spark-a", "192.168.201.1")
    assert f.interface == "enP2p1s0f1np1"
    assert f.hcas == ("roceP2p1s0f1", "rocep1s0f1")


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


def test_small_mtu_is_a_warning_with_the_value() -> None:
    f = facts("mtu-1500")
    assert f.mtu == 1500
    assert any("MTU is 1500" in w for w in f.warnings)


def test_explicit_values_are_used_and_checked() -> None:
    f = facts("spark-b", IP["spark-b"], interface="enp1s0f1np1", hca="rocep1s0f1", gid_index=5)
    assert (f.interface, f.hcas, f.gid_index) == ("enp1s0f1np1", ("rocep1s0f1",), 5)
    with pytest.raises(FabricError, match="fabric.interface eth9 does not exist"):
        facts("spark-a", interface="eth9")
    with pytest.raises(FabricError, match="fabric.hca mlx5_9 does not exist"):
        facts("spark-a", hca="mlx5_9")
    assert any("is set but" in w for w in facts("spark-b", IP["spark-b"], gid_index=3).warnings)


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
    assert f.gid_index == 5
    nothing = probe_node(node, sysfs=FIX / "no-rdma").sysfs or {}
    with pytest.raises(FabricError, match=r"^no RDMA devices under .*/no-rdma/class/infiniband"):
        resolve(parse_sysfs(nothing), FabricConfig(sysfs_root=FIX / "no-rdma"), IP["spark-b"],
                sysfs_root=str(FIX / "no-rdma"))
