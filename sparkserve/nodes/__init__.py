"""Ways to reach a node. Orchestration holds ``Node`` objects and never imports paramiko."""

from sparkserve.nodes.base import CommandResult, Node, NodeError

__all__ = ["CommandResult", "Node", "NodeError"]
