"""`sparkserve image ship --via registry` for real on the rig: a temporary registry (Debian's
``docker-registry``) on the head, each follower pulling through the head's token relay on the fabric, only
the layers it lacks; then ``image verify``; and nothing left behind (no registry process, no storage
directory, no temporary tag on any node) after a success, a failed pull and a Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import rig as riglib
import yaml

from sparkserve.config import load_config
from sparkserve.nodes.base import NodeError
from sparkserve.nodes.factory import open_nodes

pytestmark = pytest.mark.rig

REPO = Path(__file__).resolve().parents[2]
SPARKSERVE = str(REPO / ".venv" / "bin" / "sparkserve")
NAME = "sparkserve-rigtest/registry"
CHANGE = 1_000_000  # bytes of the layer v2 changes


def _forget(client: docker.DockerClient) -> None:
    for img in client.images.list():
        for t in img.tags:
            if t.startswith(NAME) or "sparkserve-ship/" in t:
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(t, force=True)


@pytest.fixture(scope="module")
def images(rig, rig_docker) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """On the head: v1 = 20 MB + 1 MB layers, v2 = the same 20 MB layer + another 1 MB layer, big = 150 MB."""
    head = rig_docker[rig.head.name]
    _forget(head)
    riglib.build_image(head, f"{NAME}:base", None, {"big": os.urandom(20_000_000)})
    riglib.build_image(head, f"{NAME}:v1", f"{NAME}:base", {"stamp": os.urandom(CHANGE)})
    riglib.build_image(head, f"{NAME}:v2", f"{NAME}:base", {"stamp": os.urandom(CHANGE)})
    riglib.build_image(head, f"{NAME}:big", None, {"blob": os.urandom(150_000_000)})
    yield {"v1": f"{NAME}:v1", "v2": f"{NAME}:v2", "big": f"{NAME}:big"}
    for client in rig_docker.values():
        _forget(client)


@pytest.fixture
def followers_clean(rig, rig_docker, images) -> None:  # type: ignore[no-untyped-def]
    for n in rig.nodes[1:]:
        _forget(rig_docker[n.name])


def _cfg(rig, tmp_path: Path, ref: str) -> Path:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(Path(rig.rig_yaml).read_text())
    data["image"]["ref"] = ref
    p = tmp_path / f"cfg-{ref.rsplit(':', 1)[-1]}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARKSERVE, *args], capture_output=True, text=True, timeout=timeout)


def _registry_pids() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                if b"sparkserve-registry-" in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
    return out


def assert_nothing_left(rig, rig_docker) -> None:  # type: ignore[no-untyped-def]
    """No registry (or node program) running, no storage directory on the head, no temporary tag anywhere."""
    deadline = time.monotonic() + 10
    while _registry_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _registry_pids() == []
    tmp = Path(rig.head.tmp_dir)
    assert [p.name for p in tmp.iterdir() if p.name.startswith("sparkserve-registry-")] == []
    for name, client in rig_docker.items():
        tags = [t for img in client.images.list() for t in img.tags + (img.attrs.get("RepoDigests") or [])]
        assert [t for t in tags if "sparkserve-ship/" in t] == [], name


def test_registry_ship_pulls_only_missing_layers_then_verify_agrees(rig, rig_docker, images, followers_clean,
                                                                    tmp_path: Path) -> None:
    b = rig.nodes[1].name
    cfg1, cfg2 = _cfg(rig, tmp_path, images["v1"]), _cfg(rig, tmp_path, images["v2"])
    res = cli("image", "ship", "-c", str(cfg1), "--via", "registry", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    cold = json.loads(res.stdout)["shipped"][b]
    assert cold["how"] == "registry" and 21e6 < cold["bytes"] < 21e6 * 1.05
    assert_nothing_left(rig, rig_docker)
    res = cli("image", "verify", "-c", str(cfg1), "--no-facts", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["ok"], res.stdout[-2000:]

    res = cli("image", "ship", "-c", str(cfg1), "--via", "registry", "--json")  # unchanged: nothing moves
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["shipped"][b]["bytes"] == 0

    res = cli("image", "ship", "-c", str(cfg2), "--via", "registry", "--json")  # one layer changed
    assert res.returncode == 0, res.stderr[-2000:]
    change = json.loads(res.stdout)["shipped"][b]
    assert change["how"] == "registry" and CHANGE * 0.99 < change["bytes"] <= CHANGE * 1.1, change
    res = cli("image", "verify", "-c", str(cfg2), "--no-facts")
    assert res.returncode == 0 and "same image on every node" in res.stdout, res.stdout
    assert_nothing_left(rig, rig_docker)


def test_a_failed_pull_leaves_nothing_behind(rig, rig_docker, images, followers_clean, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import sparkserve.image.registry as registry

    real = registry.pull_program
    monkeypatch.setattr(registry, "pull_program", lambda args: real({**args, "token": "not-the-token"}))
    cfg = load_config(_cfg(rig, tmp_path, images["v1"]))
    with open_nodes(cfg) as nodes, pytest.raises(NodeError) as err:
        registry.ship_via_registry(nodes[rig.head.name], [nodes[n.name] for n in rig.nodes[1:]], images["v1"],
                                   source_ip=rig.head.fabric_ip)
    assert err.value.node_name == rig.nodes[1].name and "docker pull" in str(err.value)
    assert_nothing_left(rig, rig_docker)
    with pytest.raises(docker.errors.ImageNotFound):
        rig_docker[rig.nodes[1].name].images.get(images["v1"])


def test_ctrl_c_during_the_push_leaves_nothing_behind(rig, rig_docker, images, followers_clean,
                                                      tmp_path: Path) -> None:
    cfg = _cfg(rig, tmp_path, images["big"])
    proc = subprocess.Popen([SPARKSERVE, "image", "ship", "-c", str(cfg), "--via", "registry"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tmp = Path(rig.head.tmp_dir)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith("sparkserve-registry-") and (p / "config.yml").exists()
                  for p in tmp.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None, "the registry never started"
        time.sleep(0.05)
    time.sleep(0.5)  # the push is under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "interrupted (SIGINT)" in errors[0], err
    assert "Traceback" not in err
    assert_nothing_left(rig, rig_docker)
    with pytest.raises(docker.errors.ImageNotFound):
        rig_docker[rig.nodes[1].name].images.get(images["big"])


def test_without_a_registry_program_it_says_how_to_get_one(rig, images, followers_clean, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import sparkserve.image.registry as registry

    monkeypatch.setattr(registry, "REGISTRY_PROGRAMS", ("no-such-registry-program",))
    cfg = load_config(_cfg(rig, tmp_path, images["v1"]))
    with open_nodes(cfg) as nodes, pytest.raises(NodeError) as err:
        registry.ship_via_registry(nodes[rig.head.name], [nodes[n.name] for n in rig.nodes[1:]], images["v1"],
                                   source_ip=rig.head.fabric_ip)
    assert err.value.node_name == rig.head.name and "apt install docker-registry" in str(err.value)


def test_via_must_be_stream_or_registry(rig, tmp_path: Path) -> None:
    res = cli("image", "ship", "-c", str(rig.rig_yaml), "--via", "carrier-pigeon")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: --via: 'carrier-pigeon' is not one of stream, registry"]
