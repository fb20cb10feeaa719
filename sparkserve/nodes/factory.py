"""Config → connected Nodes.

    with open_nodes(cfg) as nodes:         # {name: Node} in config order, connected in parallel
        head = nodes[cfg.head.name]

A node with ``local: true`` becomes a :class:`LocalNode`; every other node an :class:`SSHNode`. Connecting
fails with the first unreachable node's one-line error (others attached as details), after closing the
ones that did connect.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sparkserve.nodes.base import Node
from sparkserve.nodes.local import LocalNode
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.ssh import SSHNode

if TYPE_CHECKING:
    from sparkserve.config import Config, NodeConfig, SSHConfig


def make_node(node: NodeConfig, ssh: SSHConfig) -> Node:
    """An unconnected Node for one config entry."""
    if node.local:
        return LocalNode(node.name)
    return SSHNode(node, ssh)


def connect_nodes(cfg: Config, *, names: list[str] | None = None) -> dict[str, Node]:
    """Every configured node (or just ``names``), connected in parallel, in config order."""
    wanted = [n for n in cfg.nodes if names is None or n.name in names]
    nodes = {n.name: make_node(n, cfg.ssh) for n in wanted}

    def _connect(name: str) -> None:
        node = nodes[name]
        if isinstance(node, SSHNode):
            node.connect()

    try:
        on_all(list(nodes), _connect)
    except BaseException:
        close_nodes(nodes)
        raise
    return nodes


def close_nodes(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        with contextlib.suppress(Exception):
            node.close()


@contextlib.contextmanager
def open_nodes(cfg: Config, *, names: list[str] | None = None) -> Iterator[dict[str, Node]]:
    nodes = connect_nodes(cfg, names=names)
    try:
        yield nodes
    finally:
        close_nodes(nodes)
