"""Stage 5 — nodes: the ways to reach a node, and docker on it. Everything above holds ``Node`` objects
and never imports paramiko or asks which kind it has.

* ``base`` — the ``Node`` protocol, ``CommandResult``, ``NodeError``, ``RsyncRemote``;
* ``ssh`` (``SSHNode``) on ``ssh_connect`` (host-key policy, one-line connect errors) and ``ssh_process``
  (one exec channel); ``local`` (``LocalNode``: this machine, no SSH); ``factory`` — config → connected
  nodes (``open_nodes``); ``parallel`` — one step on every node, every failure collected;
* ``docker_client`` — the docker SDK over the node's own SSH connection; ``engine`` — containers
  (run a ``ContainerSpec``'s SDK rendering, list, stop, logs, exec, parity facts); ``hostfacts`` — a GB10
  host's memory, GPU and kernel facts (+ ``hostfacts_node``: its node-side programs); ``hf_models`` — the
  target in every node's HF cache; ``router`` — the ``vllm-router`` process on this machine. The image's
  identity and shipping are the ``image`` stage.

May import: every lower stage (``measure``, ``observe``, ``plan``, ``models``, ground) — in practice only
``plan`` (the ContainerSpec it runs) and the ground modules. Never ``image``, ``deploy`` or the CLI: what to run, and
when, is decided above.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkserve.nodes.base import CommandResult, Node, NodeError, RsyncRemote
    from sparkserve.nodes.factory import close_nodes, connect_nodes, make_node, open_nodes
    from sparkserve.nodes.local import LocalNode
    from sparkserve.nodes.ssh import SSHNode

# re-exported lazily: importing one nodes module (the CLI imports few) must not import paramiko/docker
_WHERE = {"CommandResult": "base", "Node": "base", "NodeError": "base", "RsyncRemote": "base",
          "close_nodes": "factory", "connect_nodes": "factory", "make_node": "factory", "open_nodes": "factory",
          "LocalNode": "local", "SSHNode": "ssh"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'sparkserve.nodes' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sparkserve.nodes.{_WHERE[name]}"), name)


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
