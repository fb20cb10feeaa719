"""Fixtures of the end-to-end tests (helpers in e2e_support.py): the rig held exclusively per module, a
private sparkserve state dir, and no container of ours before or after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import E2E


@pytest.fixture(scope="session")
def e2e_state(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sparkserve-state")


@pytest.fixture(scope="module")
def rig_exclusive(rig):
    """The whole module runs with the rig to itself."""
    import rig as riglib

    with riglib.exclusive_use():
        yield rig


@pytest.fixture(scope="module")
def _module_state(e2e_state):
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(e2e_state)  # the Python API (journal) sees what the CLI sees
    yield e2e_state
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old


@pytest.fixture
def e2e(request, rig_exclusive, rig_docker, _module_state, tmp_path) -> Iterator[E2E]:
    """One test's view of the rig; every container (and rank process) we started is gone before and after
    it. Parametrised indirectly (``@BOTH_RUNTIMES``), its param is the runtime; otherwise docker."""
    h = E2E(rig_exclusive, rig_docker, _module_state, tmp_path, runtime=getattr(request, "param", "docker"))
    h.clean()
    yield h
    h.clean()


@pytest.fixture(scope="session")
def rig4(rig):
    """Four rig nodes of their own (127.0.0.40-43, port 2225, node root /srv/spark-e4): two replicas. One boot for
    the session (issue 39: each of the three replicas modules brought up and purged its own, ~1 min each): the
    first test that asks brings it up, the session's end takes it down with --purge. ``e4`` cleans every
    container and router before and after each test, and a test that changes a node's files restores them."""
    import rig as riglib
    from replicas_support import E4_ROOT, own_rig

    rigs = own_rig(rig, nodes=4, ip_base=40, ssh_port=2225, root=E4_ROOT)
    with riglib.exclusive_use():  # as a module-scoped rig_exclusive held it before: `up` reads the shared cache
        handle = next(rigs)
    yield handle
    with riglib.exclusive_use():
        next(rigs, None)  # down --purge (own_rig asserts it worked)


@pytest.fixture
def e4(rig4, _module_state, tmp_path) -> Iterator[E2E]:
    """An E2E handle on :func:`rig4`, cleaned before and after; routers a test left running are stopped."""
    from replicas_support import stop_routers

    handle, clients = rig4
    h = E2E(handle, clients, _module_state, tmp_path)
    h.clean()
    yield h
    stop_routers(h)
    h.clean()

