"""Fabric detection on the rig nodes' own fake sysfs (node-local /srv/spark/sys, GID index 3, 5, …)."""

from __future__ import annotations

import _nodes_rig
import pytest

from sparkserve.config import Config
from sparkserve.nodes import Node, NodeError, SSHNode
from sparkserve.plan.build import build_plan
from sparkserve.plan.fabric import detect, detect_all, fabric_envs

pytestmark = pytest.mark.rig
globals().update(_nodes_rig.FIXTURES)  # rig_info, rig_cfg, rig_nodes, node_b


def test_each_node_gets_its_own_gid_index_and_both_twins(
    rig_info: dict, rig_cfg: Config, rig_nodes: dict[str, Node]
) -> None:
    facts = detect_all(rig_nodes, rig_cfg)
    assert list(facts) == [n.name for n in rig_cfg.nodes]
    for n in rig_info["nodes"]:
        f = facts[n["name"]]
        assert f.gid_index == n["gid_index"], n["name"]
        assert f.interface == "enp1s0f1np1"
        assert f.hcas == ("rocep1s0f1", "roceP2p1s0f1")
        assert f.link_up and f.mtu == 9000 and not f.warnings
        assert all(v for v in f.env().values())
    assert len({f.gid_index for f in facts.values()}) == len(facts)  # never one literal for every rank


def test_the_plan_carries_each_nodes_detected_env(rig_cfg: Config, rig_nodes: dict[str, Node]) -> None:
    facts = detect_all(rig_nodes, rig_cfg)
    plan = build_plan(rig_cfg, fabric_env=fabric_envs(facts))
    for spec in plan.specs:
        assert spec.env["NCCL_IB_GID_INDEX"] == str(facts[spec.node].gid_index)
        assert spec.env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert spec.env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"


def test_detection_is_one_remote_command(
    rig_cfg: Config, node_b: SSHNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    real = node_b.run

    def counting(argv: list[str], **kw: object):
        calls.append(argv)
        return real(argv, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(node_b, "run", counting)
    detect(node_b, rig_cfg.fabric, rig_cfg.nodes[1].fabric_ip)
    assert calls == [["python3", "-", str(rig_cfg.fabric.sysfs_root)]]


def test_nothing_usable_is_an_error_naming_the_node(rig_info: dict, rig_cfg: Config, node_b: SSHNode) -> None:
    nowhere = f"{rig_info['node_root']}/no-such-sys"
    fabric = rig_cfg.fabric.model_copy(update={"sysfs_root": nowhere})
    with pytest.raises(NodeError) as ei:
        detect(node_b, fabric, rig_cfg.nodes[1].fabric_ip)
    where = f"{nowhere}/class/infiniband"
    assert ei.value.line() == (f"error: {node_b.name}: fabric: no RDMA devices under {where} "
                               "(CX-7 driver loaded? fabric.sysfs_root right?)")


def test_a_fabric_ip_not_on_the_node_lists_what_is(rig_cfg: Config, node_b: SSHNode) -> None:
    want = rf"^{node_b.name}: fabric: no RoCE v2 GID entry for fabric_ip 10\.9\.9\.9.*found: .*enp1s0f1np1"
    with pytest.raises(NodeError, match=want):
        detect(node_b, rig_cfg.fabric, "10.9.9.9")
