"""Fabric detection on the rig nodes' own fake sysfs (node-local /srv/spark/sys, GID index 3, 5, …), through
the path `up` and `doctor` use: the node checks' one probe round trip (sparkserve.deploy.doctor/probe)."""

from __future__ import annotations

import _nodes_rig
import pytest

from sparkserve.config import Config
from sparkserve.deploy.doctor import Check, check_all, check_node
from sparkserve.nodes import Node, SSHNode
from sparkserve.plan.build import build_plan
from sparkserve.plan.fabric import FabricFacts, fabric_envs

pytestmark = pytest.mark.rig
globals().update(_nodes_rig.FIXTURES)  # rig_info, rig_cfg, rig_nodes, node_b


def _fabric_check(checks: list[Check], node: str) -> Check:
    [c] = [c for c in checks if c.node == node and c.name == "fabric"]
    return c


def _detect_all(cfg: Config, nodes: dict[str, Node]) -> tuple[list[Check], dict[str, FabricFacts]]:
    facts: dict[str, FabricFacts] = {}
    checks = check_all(cfg, nodes, None, check_ports=False, fabric_out=facts)  # as `up` calls it
    return checks, facts


def test_each_node_gets_its_own_gid_index_and_both_twins(
    rig_info: dict, rig_cfg: Config, rig_nodes: dict[str, Node]
) -> None:
    checks, facts = _detect_all(rig_cfg, rig_nodes)
    assert sorted(facts) == sorted(n.name for n in rig_cfg.nodes)
    for n in rig_info["nodes"]:
        f = facts[n["name"]]
        assert _fabric_check(checks, n["name"]).status == "ok"
        assert f.gid_index == n["gid_index"], n["name"]
        assert f.interface == "enp1s0f1np1"
        assert f.hcas == ("rocep1s0f1", "roceP2p1s0f1")
        assert f.link_up and f.mtu == 9000 and not f.warnings
        assert all(v for v in f.env().values())
        assert f.hca_gids == {"rocep1s0f1": n["gid_index"], "roceP2p1s0f1": n["gid_index"]}  # NCCL's own pick
    assert len({f.gid_index for f in facts.values()}) == len(facts)  # never one literal for every rank


def test_the_plan_carries_each_nodes_detected_env(rig_cfg: Config, rig_nodes: dict[str, Node]) -> None:
    _, facts = _detect_all(rig_cfg, rig_nodes)
    plan = build_plan(rig_cfg, fabric_env=fabric_envs(facts))
    for spec in plan.specs:
        # two twins with their own GIDs: the dual-rail rule (issue 26) — no global GID index, NCCL picks per HCA
        assert "NCCL_IB_GID_INDEX" not in spec.env
        assert spec.env["NCCL_IB_ADDR_RANGE"] == facts[spec.node].addr_range
        assert (spec.env["NCCL_IB_ROCE_VERSION_NUM"], spec.env["NCCL_IB_ADDR_FAMILY"]) == ("2", "AF_INET")
        assert spec.env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert spec.env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"


def test_every_node_check_and_the_fabric_are_one_remote_command(
    rig_cfg: Config, node_b: SSHNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    real = node_b.run

    def counting(argv: list[str], **kw: object):
        calls.append(argv)
        return real(argv, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(node_b, "run", counting)
    facts: dict[str, FabricFacts] = {}
    check_node(rig_cfg, rig_cfg.nodes[1], node_b, 1, None, check_ports=False, fabric_out=facts)
    assert [c[:2] for c in calls] == [["python3", "-c"]]  # docker goes over its own pooled channel
    assert facts[node_b.name].gid_index > 0


def test_nothing_usable_is_a_failed_check_naming_the_node(
    rig_info: dict, rig_cfg: Config, node_b: SSHNode
) -> None:
    nowhere = f"{rig_info['node_root']}/no-such-sys"
    cfg = rig_cfg.model_copy(update={"fabric": rig_cfg.fabric.model_copy(update={"sysfs_root": nowhere})})
    checks = check_node(cfg, cfg.nodes[1], node_b, 1, None, check_ports=False)
    c = _fabric_check(checks, node_b.name)
    assert (c.status, c.detail) == ("fail", f"no RDMA devices under {nowhere}/class/infiniband "
                                            "(CX-7 driver loaded? fabric.sysfs_root right?)")


def test_a_fabric_ip_not_on_the_node_lists_what_is(rig_cfg: Config, node_b: SSHNode) -> None:
    other = rig_cfg.nodes[1].model_copy(update={"fabric_ip": "10.9.9.9"})
    c = _fabric_check(check_node(rig_cfg, other, node_b, 1, None, check_ports=False), node_b.name)
    assert c.status == "fail"
    assert c.detail.startswith("no RoCE v2 GID entry for fabric_ip 10.9.9.9") and "enp1s0f1np1" in c.detail
