"""Session fixtures over the local rehearsal rig (tests/rig/rig.py). A rig that cannot come up FAILS the test.

    def test_x(rig, rig_docker):            # @pytest.mark.rig
        rig.nodes                           # [NodeInfo(name, host, port, docker_socket, srv_dir, …), …]
        rig.identity_file, rig.known_hosts  # the client key and host keys (paramiko: RejectPolicy works)
        rig.rig_yaml                        # a ready sparkserve config for the rig (load_config works)
        rig.models["drafter"]               # node-local path, identical on every node (/srv/spark/models/…)
        rig.head.host_path(rig.models["drafter"])   # the same directory seen from this machine (node-a's copy)
        rig_docker["node-b"].containers.list()      # docker SDK on node-b's own daemon (unix socket)

``rig`` brings the rig up once per session (idempotent: a warm rig takes < 1 s) and checks that every node
has the emulator image with the same ID. ``rig_clean`` removes sparkserve containers before and after a test;
``pristine_models`` puts the model fixtures back after a test that altered a node's copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

RIG_DIR = Path(__file__).resolve().parent / "rig"
if str(RIG_DIR) not in sys.path:
    sys.path.insert(0, str(RIG_DIR))

from timing_report import (  # noqa: E402,F401 (hooks: --time-report, the modules' order under xdist)
    order_for_xdist,
    pytest_addoption,
    pytest_configure,
    pytest_configure_node,
)

# tests/real drives real vLLM on a GPU machine (scripts/real-engine); CI has none, so it is never collected here
collect_ignore = ["real"]


# The fixtures that use a rig node: a test that asks for one is a rig test even if its module forgot the mark, so
# `scripts/test` runs it with the rig tests (one at a time), never beside them, and `--quick` (-m "not rig")
# leaves it out.
RIG_FIXTURES = frozenset({"rig", "rig_docker", "rig_clean", "pristine_models", "rig_exclusive", "e2e", "rig4", "e4"})


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("rig") is None and RIG_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.rig)
    order_for_xdist(config, items)  # an xdist worker: the longest modules first (tests/timing_report.py)


@pytest.fixture(autouse=True)
def _own_image_facts(tmp_path_factory, monkeypatch):
    """Every test has its own stored image facts (plan/dialects.py; `image verify` writes them), so a facts
    file in this machine's state dir never picks another test's engine dialect."""
    monkeypatch.setenv("SPARKSERVE_IMAGE_FACTS", str(tmp_path_factory.mktemp("facts") / "image-facts.json"))


@pytest.fixture(scope="session")
def rig():
    import rig as riglib

    try:
        with riglib.exclusive_use():  # `up` may replace a node's daemons: never under another process's test
            info = riglib.up()
    except riglib.RigError as e:
        pytest.fail(f"the rig cannot come up: {e}", pytrace=False)
    handle = riglib.RigHandle.from_info(info)
    for n in handle.nodes:
        img = riglib.image_inspect(n.docker_socket, handle.image_ref)
        assert img is not None, f"{n.name}: {handle.image_ref} missing"
        assert img["Id"] == handle.image_id, f"{n.name}: {handle.image_ref} has another image ID"
    return handle


@pytest.fixture(autouse=True)
def _rig_exclusive(request):
    """Every test marked ``rig`` has the rig to itself (rig.exclusive_use(): other test processes wait),
    so one test's cleanup never removes the stack another process is testing."""
    if request.node.get_closest_marker("rig") is None:
        yield
        return
    import rig as riglib

    with riglib.exclusive_use():
        yield


@pytest.fixture(scope="session")
def rig_docker(rig):
    import docker

    clients = {n.name: docker.DockerClient(base_url=n.docker_url, version="1.41", timeout=120) for n in rig.nodes}
    yield clients
    for c in clients.values():
        c.close()


def _remove_managed(clients) -> None:
    for c in clients.values():
        for ctr in c.containers.list(all=True, filters={"label": "io.sparkserve.managed=1"}):
            ctr.remove(force=True)


@pytest.fixture
def rig_clean(rig, rig_docker):
    """No sparkserve container on any node before and after the test; the rig is this test's alone
    meanwhile (rig.exclusive_use: other test processes wait, so nobody removes a stack another one is testing)."""
    import rig as riglib

    with riglib.exclusive_use():
        _remove_managed(rig_docker)
        yield rig
        _remove_managed(rig_docker)


@pytest.fixture
def pristine_models(rig):
    yield rig
    rig.reset_models()


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody can write, root included: a read-only bind mount onto itself when running as root
    (root ignores file modes, and CI runs as root), mode 0500 otherwise. A directory that stays writable
    fails the test: it could not check what it claims."""
    import contextlib
    import os
    import subprocess

    d = tmp_path / "read-only"
    d.mkdir()
    mounted = False
    if os.geteuid() == 0:
        for argv in (["mount", "--bind", str(d), str(d)], ["mount", "-o", "remount,bind,ro", str(d), str(d)]):
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode:
                if mounted:
                    subprocess.run(["umount", str(d)], check=False)
                pytest.fail(f"cannot make {d} read-only: {' '.join(argv)}: {r.stderr.strip()}", pytrace=False)
            mounted = True
    else:
        d.chmod(0o500)
    probe = d / ".probe"
    with contextlib.suppress(OSError):
        probe.write_text("x")
        pytest.fail(f"{d} is still writable", pytrace=False)
    try:
        yield d
    finally:
        if mounted:
            subprocess.run(["umount", str(d)], check=True)
        else:
            d.chmod(0o700)
