"""Ways to reach a node. Orchestration holds ``Node`` objects and never imports paramiko.

Public surface: :class:`Node` (protocol), :class:`CommandResult`, :class:`NodeError`,
:class:`RsyncRemote`, :class:`SSHNode`, :class:`LocalNode`, and the factory
(:func:`make_node`, :func:`connect_nodes`, :func:`open_nodes`, :func:`close_nodes`).
"""

from sparkserve.nodes.base import CommandResult, Node, NodeError, RsyncRemote
from sparkserve.nodes.factory import close_nodes, connect_nodes, make_node, open_nodes
from sparkserve.nodes.local import LocalNode
from sparkserve.nodes.ssh import SSHNode

__all__ = [
    "CommandResult",
    "LocalNode",
    "Node",
    "NodeError",
    "RsyncRemote",
    "SSHNode",
    "close_nodes",
    "connect_nodes",
    "make_node",
    "open_nodes",
]
