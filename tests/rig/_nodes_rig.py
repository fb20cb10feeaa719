"""Fixtures for the node-layer rig tests (test_nodes_*.py), on top of tests/conftest.py's ``rig``.

``rig`` brings the rig up (or FAILS the test, never skips). A test module takes these with
``globals().update(_nodes_rig.FIXTURES)`` (pytest finds fixtures among module globals; importing them by
name trips ruff's F811).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkserve.config import Config, load_config
from sparkserve.nodes import Node, SSHNode, close_nodes, connect_nodes


@pytest.fixture(scope="session")
def rig_info(rig) -> dict:  # type: ignore[no-untyped-def]
    info = rig.info
    if len(info.get("nodes", [])) < 2:
        pytest.fail("the rig needs at least two nodes (scripts/rig up --nodes 2)", pytrace=False)
    return info


@pytest.fixture(scope="session")
def rig_cfg(rig_info: dict) -> Config:
    return load_config(Path(rig_info["rig_yaml"]))


@pytest.fixture(scope="session")
def rig_nodes(rig_cfg: Config) -> Iterator[dict[str, Node]]:
    nodes = connect_nodes(rig_cfg)
    yield nodes
    close_nodes(nodes)


@pytest.fixture()
def node_a(rig_nodes: dict[str, Node], rig_cfg: Config) -> SSHNode:
    n = rig_nodes[rig_cfg.nodes[0].name]
    assert isinstance(n, SSHNode)
    return n


@pytest.fixture()
def node_b(rig_nodes: dict[str, Node], rig_cfg: Config) -> SSHNode:
    n = rig_nodes[rig_cfg.nodes[1].name]
    assert isinstance(n, SSHNode)
    return n


@pytest.fixture()
def node_scratch(rig_info: dict, rig_nodes: dict[str, Node]) -> Iterator[str]:
    """A fresh directory under the node root (node-local on the rig); removed on every node after."""
    parent = f"{rig_info['node_root']}/node-tests"
    path = f"{parent}/{uuid.uuid4().hex[:10]}"
    yield path
    for n in rig_nodes.values():
        n.run(["rm", "-rf", "--", path], check=False, timeout=60)
        n.run(["rmdir", "--ignore-fail-on-non-empty", "--", parent], check=False, timeout=60)


FIXTURES = {f.__name__: f for f in (rig_info, rig_cfg, rig_nodes, node_a, node_b, node_scratch)}
