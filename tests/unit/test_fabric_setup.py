"""`sparkserve setup`'s fabric plan (plan/fabric_setup.py), pure: the Spark sysfs fixture trees (tests/fixtures/sysfs,
read by the one reader `doctor` and `up` use) plus each port's addresses and the peers that answered on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.nodes.hostsetup import NodeChanges, setup_targets, ssh_fix
from sparkserve.plan.fabric_node import node_read_sysfs
from sparkserve.plan.fabric_setup import netplan_yaml, node_facts, plan_fabric, port_order, sysctl_text

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
TWINS = ("enp1s0f1np1", "enP2p1s0f1np1")


def mac(node: int, port: str) -> str:
    return f"4c:bb:47:00:{node:02x}:{TWINS.index(port) + 1 if port in TWINS else 9:02x}"


def raw(node: int, tree: str, *, n_nodes: int = 2, ipv4: dict[str, list[str]] | None = None,
        mgmt: str = "10.0.0.5/24", cabled: tuple[str, ...] = TWINS) -> dict:
    files = node_read_sysfs(str(FIX / tree))
    for port in TWINS:  # the fixture trees have no MACs; carrier as cabled says
        files[f"class/net/{port}/carrier"] = "1" if port in cabled else "0"
        files[f"class/net/{port}/address"] = mac(node, port)
    ports = {p: {"ipv4": (ipv4 or {}).get(p, []), "ipv6_ll": [f"fe80::{node}"], "mtu": 1500} for p in TWINS}
    ports["enP7s7"] = {"ipv4": [mgmt], "ipv6_ll": [], "mtu": 1500}
    peers = {p: [mac(k, p) for k in range(n_nodes) if k != node] for p in TWINS if p in cabled}
    return {"sysfs": files, "ports": ports, "peers": peers, "groups": ["ubuntu"], "uid": 1000, "user": "ubuntu",
            "swappiness": "60"}


def facts(n_nodes: int = 2, **kw):
    trees = ["spark-a", "spark-b", "spark-c", "spark-a"]
    return [node_facts(f"spark-{'abcd'[i]}", f"h{i}", raw(i, trees[i], n_nodes=n_nodes, **kw.get(str(i), {})))
            for i in range(n_nodes)]


def test_two_cabled_sparks_get_one_subnet_per_twin_mtu_9000_and_the_config_values():
    nodes = facts()
    assert set(nodes[0].ports) == {"enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP2p1s0f0np0"}  # not enP7s7
    assert nodes[0].ports["enp1s0f1np1"].rdma == "rocep1s0f1"
    assert nodes[0].ports["enp1s0f1np1"].gids, "the RDMA device's GIDs come from the same sysfs reader"
    plan = plan_fabric(nodes)
    assert not plan.errors and not plan.conflicts
    assert ("spark-a", "enp1s0f1np1", "spark-b", "enp1s0f1np1") in plan.links
    got = {(c.node, c.port): c.address for c in plan.changes}
    assert got == {("spark-a", "enp1s0f1np1"): "192.168.100.10/24", ("spark-b", "enp1s0f1np1"): "192.168.100.11/24",
                   ("spark-a", "enP2p1s0f1np1"): "192.168.101.10/24",
                   ("spark-b", "enP2p1s0f1np1"): "192.168.101.11/24"}
    assert plan.interface == "enp1s0f1np1" and plan.hca == "rocep1s0f1,roceP2p1s0f1"
    assert plan.fabric_ip == {"spark-a": "192.168.100.10", "spark-b": "192.168.100.11"}
    text = netplan_yaml(plan.for_node("spark-a"))
    assert "mtu: 9000" in text and "addresses: [192.168.101.10/24]" in text and "enP2p1s0f1np1:" in text


def test_a_subnet_in_use_on_another_interface_is_skipped():
    plan = plan_fabric(facts(**{"1": {"mgmt": "192.168.100.7/24"}}))
    assert {c.address for c in plan.changes if c.node == "spark-a"} == {"192.168.101.10/24", "192.168.102.10/24"}


def test_addresses_already_set_differently_are_a_diff_and_a_correct_setup_is_kept():
    differ = plan_fabric(facts(**{"0": {"ipv4": {"enp1s0f1np1": ["10.9.9.1/16"]}}}))
    assert differ.conflicts == ["spark-a enp1s0f1np1: - 10.9.9.1/16  + 192.168.100.10/24"]
    c = next(c for c in differ.changes if c.node == "spark-a" and c.port == "enp1s0f1np1")
    assert c.remove == ["10.9.9.1/16"]
    same = {"ipv4": {"enp1s0f1np1": ["192.168.103.1/24"], "enP2p1s0f1np1": ["192.168.102.1/24"]}}
    other = {"ipv4": {"enp1s0f1np1": ["192.168.103.2/24"], "enP2p1s0f1np1": ["192.168.102.2/24"]}}
    kept = plan_fabric(facts(**{"0": same, "1": other}))
    assert not kept.conflicts
    assert all(c.address_present and not c.remove for c in kept.changes)
    assert kept.fabric_ip == {"spark-a": "192.168.103.1", "spark-b": "192.168.103.2"}


def test_a_port_without_link_names_the_cable_and_no_cabled_port_is_an_error():
    plan = plan_fabric(facts(**{"0": {"cabled": ("enp1s0f1np1",)}}))
    hints = [h for n, p, h in plan.unlinked if n == "spark-a" and p == "enP2p1s0f1np1"]
    assert hints == ["no link on enP2p1s0f1np1: check the cable in QSFP port 1 (the PCIe twin of enp1s0f1np1)"]
    assert {c.port for c in plan.changes} == {"enp1s0f1np1"}  # the twin is not cabled on every node
    none = plan_fabric(facts(**{"0": {"cabled": ()}, "1": {"cabled": ()}}))
    assert none.errors and "no ConnectX-7 port is cabled on every node" in none.errors[0]
    assert not none.changes


def test_four_nodes_through_a_switch_and_a_range_too_small():
    plan = plan_fabric(facts(4), address_range="10.60.0.0/16")
    assert sorted(c.address for c in plan.changes if c.port == "enp1s0f1np1") == [
        "10.60.0.10/24", "10.60.0.11/24", "10.60.0.12/24", "10.60.0.13/24"]
    assert len([x for x in plan.links if x[0] == "spark-a"]) == 6  # three peers on each twin
    assert plan_fabric(facts(), address_range="10.60.0.0/25").errors


def test_port_order_sysctl_and_changes_listed():
    assert sorted(["enP2p1s0f0np0", "enp1s0f0np0", "enP2p1s0f1np1", "enp1s0f1np1"], key=port_order) == [
        "enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP2p1s0f0np0"]
    assert sysctl_text("1") == "" and "vm.swappiness = 1" in sysctl_text("60")
    plan = plan_fabric(facts())
    lines = NodeChanges("spark-a", plan.for_node("spark-a"), "x", sysctl_text("60"), "ubuntu").lines()
    assert "enp1s0f1np1: add 192.168.100.10/24" in lines and any("docker group" in x for x in lines)
    assert not any("MTU" in x for x in lines)  # the fixture's ports are at 9000 already
    assert any(x.startswith("write /etc/sysctl.d/60-sparkserve.conf") for x in lines)


def test_setup_targets_and_ssh_fixes():
    a, b = setup_targets(["spark-a.lan", "ubuntu@10.0.0.2:2200"])
    assert (a.host, a.port, b.user, b.host, b.port) == ("spark-a.lan", 22, "ubuntu", "10.0.0.2", 2200)
    with pytest.raises(BadInput):
        setup_targets(["h:x"])
    assert ssh_fix("h", "u", 22, "Authentication failed.") == "ssh-copy-id u@h"
    assert ssh_fix("h", "u", 2200, "host key for h is not in known_hosts").startswith("ssh -p 2200 u@h true")
