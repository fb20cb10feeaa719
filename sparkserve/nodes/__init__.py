"""Stage 5 — nodes: the ways to reach a node, and docker on it. Everything above holds ``Node`` objects
and never imports paramiko or asks which kind it has.

* ``base`` — the ``Node`` protocol, ``CommandResult``, ``NodeError``, ``RsyncRemote``;
* ``ssh`` (``SSHNode``) on ``ssh_connect`` (host-key policy, one-line connect errors) and ``ssh_process``
  (one exec channel); ``local`` (``LocalNode``: this machine, no SSH); ``factory`` — config → connected
  nodes (``open_nodes``); ``parallel`` — one step on every node, every failure collected;
* ``docker_client`` — the docker SDK over the node's own SSH connection; ``engine`` — containers
  (run a ``ContainerSpec``'s SDK rendering, list, stop, logs, exec, parity facts); ``images`` — image
  identity across nodes and ``docker save | docker load`` shipping.

May import: every lower stage (``measure``, ``observe``, ``plan``, ``models``, ground) — in practice only
``plan`` (the ContainerSpec it runs) and the ground modules. Never ``deploy`` or the CLI: what to run, and
when, is decided above.
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
