"""Models from the Hugging Face cache, on a real hub layout (blobs + snapshots of relative symlinks + refs):
repo ids and snapshot paths resolve to the real directory, the container mount keeps the links resolvable,
every node must hold the same revision, and a missing model says which command would fetch it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _fixtures import config_file, write_target

from sparkserve.config import load_config
from sparkserve.errors import BadInput
from sparkserve.models.hf_cache import mount_for, parse_repo_id, resolve_local, snapshot_of
from sparkserve.nodes.hf_models import resolve_target
from sparkserve.nodes.local import LocalNode
from sparkserve.plan.build import build_plan
from sparkserve.plan.mounts import TARGET_MOUNT

SHA = "0123456789abcdef0123456789abcdef01234567"


def hub_layout(hub: Path, src: Path, org: str = "zai-org", name: str = "GLM-tiny", sha: str = SHA) -> Path:
    """``src``'s files as the hub cache stores them: blobs by content, a snapshot of ../../blobs links, refs."""
    import hashlib

    repo = hub / f"models--{org}--{name}"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        (repo / "blobs" / digest).write_bytes(f.read_bytes())
        os.symlink(f"../../blobs/{digest}", snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    return snap


@pytest.fixture()
def hub(tmp_path: Path) -> tuple[Path, Path]:
    target = write_target(tmp_path / "src-target")
    h = tmp_path / "hub"
    return h, hub_layout(h, target)


def test_repo_ids_and_snapshot_paths_are_recognised() -> None:
    assert str(parse_repo_id("zai-org/GLM-tiny@main")) == "zai-org/GLM-tiny@main"
    assert parse_repo_id("zai-org/GLM-tiny").rev == "main"
    assert parse_repo_id("/models/x") is None and parse_repo_id("a/b/c") is None
    s = snapshot_of(f"/h/hub/models--zai-org--GLM-tiny/snapshots/{SHA}/")
    assert s is not None and (s.repo_dir, s.repo_id, s.revision) == ("/h/hub/models--zai-org--GLM-tiny",
                                                                     "zai-org/GLM-tiny", SHA)
    assert snapshot_of("/models/GLM") is None


def test_a_repo_id_resolves_to_its_snapshot_through_refs_or_a_sha(hub: tuple[Path, Path]) -> None:
    h, snap = hub
    assert resolve_local(parse_repo_id("zai-org/GLM-tiny"), h) == snap
    assert resolve_local(parse_repo_id(f"zai-org/GLM-tiny@{SHA}"), h) == snap
    with pytest.raises(BadInput) as e:
        resolve_local(parse_repo_id("zai-org/GLM-other@v2"), h)
    assert e.value.where == "model.target"
    assert "sparkserve does not download models: run `hf download zai-org/GLM-other --revision v2` on this " \
           "machine" in e.value.what


def test_the_mount_keeps_every_link_of_the_snapshot_inside_what_is_mounted(hub: tuple[Path, Path]) -> None:
    _, snap = hub
    source, inside = mount_for(str(snap), TARGET_MOUNT)
    assert source == str(snap.parent.parent) and inside == f"{TARGET_MOUNT}/snapshots/{SHA}"
    for link in snap.iterdir():
        real = Path(os.path.realpath(link))
        assert real.is_file() and Path(source) in real.parents  # resolves within the mounted repo dir
        # the same relative link, read from the container's side of the mount, lands inside the mount
        seen = os.path.normpath(os.path.join(inside, os.readlink(link)))
        assert seen.startswith(TARGET_MOUNT + "/blobs/")
    assert mount_for("/models/plain", TARGET_MOUNT) == ("/models/plain", TARGET_MOUNT)


def test_the_plan_mounts_the_repo_dir_and_serves_the_snapshot_inside_it(hub: tuple[Path, Path], tmp_path) -> None:
    _, snap = hub
    plan = build_plan(load_config(config_file(tmp_path / "c.yaml", {"model": {"target": str(snap)}})))
    spec = plan.specs[0]
    (m,) = [m for m in spec.mounts if m.target == TARGET_MOUNT]
    assert m.source == str(snap.parent.parent) and m.read_only
    assert spec.command[2] == f"{TARGET_MOUNT}/snapshots/{SHA}"


def _cfg(tmp_path: Path, target: str):
    return load_config(config_file(tmp_path / "c.yaml", {"model": {"target": target}}))


def test_resolve_target_asks_every_node_and_names_the_one_that_lacks_it(
        hub: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h, snap = hub
    monkeypatch.setenv("HF_HUB_CACHE", str(h))
    nodes = {"spark-a": LocalNode("spark-a"), "spark-b": LocalNode("spark-b")}
    got = resolve_target(_cfg(tmp_path, "zai-org/GLM-tiny@main"), nodes)
    assert str(got.model.target) == str(snap)
    plain = _cfg(tmp_path, "/models/x")
    assert resolve_target(plain, nodes) is plain  # nothing to ask
    with pytest.raises(BadInput) as e:
        resolve_target(_cfg(tmp_path, "zai-org/GLM-missing"), nodes)
    assert e.value.line().startswith("error: model.target: zai-org/GLM-missing is not in the Hugging Face cache on "
                                     "spark-a")
    assert "run `hf download zai-org/GLM-missing` on spark-a (as ubuntu)" in e.value.what


def test_a_snapshot_whose_blobs_are_missing_is_refused_before_it_becomes_a_gate_error(
        hub: tuple[Path, Path], tmp_path: Path) -> None:
    _, snap = hub
    for blob in (snap.parent.parent / "blobs").iterdir():
        blob.unlink()
    with pytest.raises(BadInput) as e:
        resolve_target(_cfg(tmp_path, str(snap)), {"spark-a": LocalNode("spark-a"), "spark-b": LocalNode("spark-b")})
    assert "has dangling links (config.json" in e.value.what and "hf download zai-org/GLM-tiny" in e.value.what
