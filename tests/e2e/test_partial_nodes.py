"""`down`, `status` and `doctor` when one node cannot be reached: they act on every node they can reach,
name the ones they could not, and exit 3 (`--json` is still one JSON document, naming the unreachable
nodes). A node is made unreachable for real — its sshd or its dockerd stopped — and restored after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rig as riglib
from e2e_support import kill_pid

pytestmark = pytest.mark.rig


def _stop_sshd(e2e, name: str) -> None:
    n = e2e.rig.node(name)
    pid = riglib.read_pid(Path(n.dir) / "ssh" / "sshd.pid")
    assert pid and riglib.pid_alive(pid)
    kill_pid(pid)
    assert not riglib.port_open(n.host, n.port)


def _restore(e2e, name: str) -> None:
    n = e2e.rig.node(name)
    riglib.start_node(n)
    assert riglib.port_open(n.host, n.port) and riglib.docker_ping(n.docker_socket)


def test_down_and_status_with_the_follower_sshd_stopped(e2e) -> None:
    cfg = e2e.config()
    assert e2e.cli("up", "--no-gates", cfg=cfg).returncode == 0
    assert len(e2e.running_ids()) == 2
    _stop_sshd(e2e, "node-b")
    try:
        st = e2e.cli("status", "--json", cfg=cfg)
        assert st.returncode == 3, st.stderr
        doc = json.loads(st.stdout)  # one JSON document, the unreachable node in it
        assert list(doc["unreachable"]) == ["node-b"] and "127.0.0.3" in doc["unreachable"]["node-b"]
        assert [c["status"] for c in doc["nodes"]["node-a"]] == ["running"] and doc["ok"] is False

        p = e2e.cli("status", cfg=cfg)
        e2e.assert_explained(p, code=3, node="node-b", step="ssh")
        assert "node-a" in p.stdout and "running" in p.stdout  # the reachable node is still shown

        p = e2e.cli("down", cfg=cfg)
        e2e.assert_explained(p, code=3, node="node-b", step="ssh", says=("not stopped",))
        assert "removed 1 container(s)" in p.stdout
        assert not e2e.ours("node-a"), "the head was left serving"
        assert [c.status for c in e2e.ours("node-b")] == ["running"]  # unreachable: untouched

        doc = json.loads(e2e.cli("down", "--json", cfg=cfg).stdout)
        assert doc["removed"] == {} and list(doc["unreachable"]) == ["node-b"]
    finally:
        _restore(e2e, "node-b")
    assert e2e.cli("down", cfg=cfg).returncode == 0
    assert e2e.leftovers() == {}


def test_down_and_doctor_with_the_follower_dockerd_stopped(e2e) -> None:
    cfg = e2e.config()
    assert e2e.cli("up", "--no-gates", cfg=cfg).returncode == 0
    n = e2e.rig.node("node-b")
    riglib.stop_pid(riglib.read_pid(Path(n.dir) / "dockerd.pid"), "node-b dockerd (e2e)")
    try:
        assert not riglib.docker_ping(n.docker_socket)
        p = e2e.cli("down", cfg=cfg)
        e2e.assert_explained(p, code=3, node="node-b", step="docker")
        assert not e2e.ours("node-a")

        doc = e2e.json("doctor", cfg=cfg, code=3)
        by = {(c["node"], c["name"]): c["status"] for c in doc["checks"]}
        assert by[("node-b", "docker")] == "fail"
        assert by[("node-a", "docker")] == "ok" and ("node-a", "memory") in by  # the head was checked
    finally:
        _restore(e2e, "node-b")
    assert e2e.cli("down", cfg=cfg).returncode == 0
    assert e2e.leftovers() == {}


def test_doctor_with_the_follower_sshd_stopped(e2e) -> None:
    _stop_sshd(e2e, "node-b")
    try:
        p = e2e.cli("doctor", "--json", cfg=e2e.config())
        assert p.returncode == 3, p.stderr
        doc = json.loads(p.stdout)
        by = {(c["node"], c["name"]): c for c in doc["checks"]}
        assert by[("node-b", "ssh")]["status"] == "fail" and "127.0.0.3" in by[("node-b", "ssh")]["detail"]
        assert by[("node-a", "docker")]["status"] == "ok" and ("node-a", "fabric") in by
    finally:
        _restore(e2e, "node-b")
