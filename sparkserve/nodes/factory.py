"""Config → connected Nodes.

    with open_nodes(cfg) as nodes:         # {name: Node} in config order, connected in parallel
        head = nodes[cfg.head.name]

    with open_reachable(cfg) as (nodes, unreachable):   # `down` / `status` / `doctor`: every node it can
        ...                                             # reach; unreachable: {name: its connect error}

    with open_nodes(cfg, meanwhile=load) as nodes:      # load() runs in this thread while they connect
        with docker_opening(nodes):                     # each node's docker connection opens meanwhile
            ...

A node with ``local: true`` becomes a :class:`LocalNode`; every other node an :class:`SSHNode`.
:func:`open_nodes` fails with the first unreachable node's one-line error (others attached as details),
after closing the ones that did connect; :func:`open_reachable` keeps the ones that connected, so a
command that must act wherever it can (stop the head while a follower is down) still can.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from sparkserve import interrupts
from sparkserve.errors import BadInput, RemoteFailure, SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.local import LocalNode
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.ssh import SSHNode

if TYPE_CHECKING:
    from sparkserve.config import Config, NodeConfig, SSHConfig

CLOSE_WAIT_S = 10.0  # a node whose close hangs (a dead link) is not waited for longer


def make_node(node: NodeConfig, ssh: SSHConfig) -> Node:
    """An unconnected Node for one config entry."""
    if node.local:
        return LocalNode(node.name)
    return SSHNode(node, ssh)


def check_identity_file(cfg: Config) -> None:
    """BadInput (exit 2, before any node is touched) when the config names an ``ssh.identity_file`` that is not
    a file here: a typo in a key path is bad input, not an unreachable node. Left unset, a missing default
    key is no error (``~/.ssh/config``'s IdentityFile or the agent may log in)."""
    own = cfg.ssh.resolved_identity()
    if own is None or "identity_file" not in cfg.ssh.model_fields_set or all(n.local for n in cfg.nodes):
        return
    if not own.is_file():
        why = "is not a file" if own.exists() else "does not exist"
        raise BadInput("ssh.identity_file", f"{own} {why}; fix the path, or delete the line to log in as `ssh` does "
                       "(~/.ssh/config's IdentityFile, the ssh-agent, OpenSSH's default key files)")


def connect_nodes(cfg: Config, *, names: list[str] | None = None,
                  meanwhile: Callable[[], object] | None = None) -> dict[str, Node]:
    """Every configured node (or just ``names``), connected in parallel, in config order. ``meanwhile``
    runs in the calling thread while they connect (see :func:`sparkserve.nodes.parallel.on_all`)."""
    check_identity_file(cfg)
    wanted = [n for n in cfg.nodes if names is None or n.name in names]
    nodes = {n.name: make_node(n, cfg.ssh) for n in wanted}

    def _connect(name: str) -> None:
        node = nodes[name]
        if isinstance(node, SSHNode):
            node.connect()

    try:
        on_all(list(nodes), _connect, meanwhile=meanwhile)
    except BaseException:
        close_nodes(nodes)
        raise
    return nodes


def close_nodes(nodes: dict[str, Node]) -> None:
    """Close every node at once (each close waits for its SSH transport to stop); never raises, and a
    signal meanwhile is remembered, not raised: this runs in ``finally`` blocks."""
    with interrupts.deferred():
        threads = [threading.Thread(target=_close, args=(n,), daemon=True) for n in nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=CLOSE_WAIT_S)


def _close(node: Node) -> None:
    with contextlib.suppress(Exception):
        node.close()


def as_failure(name: str, e: BaseException) -> SparkserveError:
    """Any failure to reach ``name`` as a typed one-line error (an SSH library's own exception included)."""
    if isinstance(e, SparkserveError):
        return e
    return RemoteFailure(f"{name}: ssh", f"{type(e).__name__}: {e}", node=name, step="ssh")


def connect_reachable(cfg: Config) -> tuple[dict[str, Node], dict[str, SparkserveError]]:
    """Every configured node connected in parallel: those that connected (config order), and the error of
    each one that did not."""
    check_identity_file(cfg)
    nodes = {n.name: make_node(n, cfg.ssh) for n in cfg.nodes}

    def _connect(name: str) -> SparkserveError | None:
        node = nodes[name]
        try:
            if isinstance(node, SSHNode):
                node.connect()
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - every way of not reaching a node is reported the same way
            return as_failure(name, e)
        return None

    try:
        errors = {k: e for k, e in on_all(list(nodes), _connect).items() if e is not None}
    except BaseException:
        close_nodes(nodes)
        raise
    for name in errors:
        with contextlib.suppress(Exception):
            nodes.pop(name).close()
    return nodes, errors


@contextlib.contextmanager
def open_reachable(cfg: Config) -> Iterator[tuple[dict[str, Node], dict[str, SparkserveError]]]:
    """:func:`connect_reachable` as a context: the connected nodes are closed after."""
    nodes, errors = connect_reachable(cfg)
    try:
        yield nodes, errors
    finally:
        close_nodes(nodes)


@contextlib.contextmanager
def open_nodes(cfg: Config, *, names: list[str] | None = None,
               meanwhile: Callable[[], object] | None = None) -> Iterator[dict[str, Node]]:
    """:func:`connect_nodes` as a context: the nodes are closed after."""
    nodes = connect_nodes(cfg, names=names, meanwhile=meanwhile)
    try:
        yield nodes
    finally:
        close_nodes(nodes)


@contextlib.contextmanager
def docker_opening(nodes: dict[str, Node]) -> Iterator[None]:
    """Each node's docker connection opened in the background while the block runs (it asks the daemon its
    version, nothing more): what the block asks docker later finds it open. A node whose docker does not
    answer is left for the block's own docker question to report."""
    if not nodes:
        yield
        return
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        with interrupts.deferred(raise_after=True):  # an interrupt mid-submit must not leave a thread unwatched
            for node in nodes.values():
                pool.submit(_open_docker, node)
        yield


def _open_docker(node: Node) -> None:
    with contextlib.suppress(Exception):
        node.docker()
