"""A target model in the Hugging Face cache layout (blobs + a snapshot of relative symlinks) on every rig
node: `up` mounts its repo directory so the links resolve inside the container, and a node whose blobs are
missing is refused up front, naming it and the command that would fetch the files."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

pytestmark = pytest.mark.rig

HF_DIR = "/srv/spark/e2e-hf"
SHA = "89abcdef0123456789abcdef0123456789abcdef"
SNAP = f"{HF_DIR}/hub/models--rig--tiny-target/snapshots/{SHA}"


NODE_HUB = "/srv/spark/home/.cache/huggingface/hub"  # the rig's sshd sets HOME=/srv/spark/home on each node
REPO_DIR = "models--rig--tiny-target"


def _layout(e2e, hub: str) -> None:
    """The rig's target as the hub cache keeps it, under ``hub`` on every node."""
    for n in e2e.rig.nodes:
        src = e2e.node_path(n.name, e2e.rig.models["target"])
        repo = e2e.node_path(n.name, f"{hub}/{REPO_DIR}")
        shutil.rmtree(repo, ignore_errors=True)
        (repo / "blobs").mkdir(parents=True)
        (repo / "snapshots" / SHA).mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(SHA)
        for f in sorted(src.iterdir()):
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            shutil.copyfile(f, repo / "blobs" / digest)
            os.symlink(f"../../blobs/{digest}", repo / "snapshots" / SHA / f.name)


@pytest.fixture
def hub_on_nodes(e2e):
    _layout(e2e, f"{HF_DIR}/hub")
    yield
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, HF_DIR), ignore_errors=True)


@pytest.fixture
def home_hub(e2e):
    _layout(e2e, NODE_HUB)
    yield
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, f"{NODE_HUB}/{REPO_DIR}"), ignore_errors=True)


def test_a_repo_id_resolves_to_the_same_snapshot_on_every_node_and_boots(e2e, home_hub) -> None:
    cfg = e2e.config({"model": {"target": "rig/tiny-target@main"}})
    p = e2e.cli("up", "--no-gates", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert f"model: rig/tiny-target@main is {NODE_HUB}/{REPO_DIR}/snapshots/{SHA} on every node" in p.stderr
    p = e2e.cli("validate", "--parser", "list", cfg=cfg)  # the same resolution, the head's files
    assert p.returncode == 0 and f"[on node-a (head): {NODE_HUB}/{REPO_DIR}/snapshots/{SHA}]" in p.stdout, p.stderr
    e2e.cli("down", cfg=cfg)
    p = e2e.cli("up", "--no-gates", cfg=e2e.config({"model": {"target": "rig/tiny-target@v9"}}))
    e2e.assert_explained(p, code=2, node=None, says=("revision 'v9' is not in", "on node-a",
                                                     "hf download rig/tiny-target --revision v9"))


def test_a_hub_cache_snapshot_boots_and_a_node_missing_its_blobs_is_named(e2e, hub_on_nodes) -> None:
    cfg = e2e.config({"model": {"target": SNAP}})
    last = e2e.rig.nodes[-1].name
    blobs = e2e.node_path(last, f"{HF_DIR}/hub/models--rig--tiny-target/blobs")
    kept = blobs.with_name("blobs-away")
    blobs.rename(kept)
    try:
        p = e2e.cli("up", cfg=cfg)
        e2e.assert_explained(p, code=2, node=None, says=(f"on {last}", "dangling links",
                                                         "sparkserve does not download models",
                                                         "hf download rig/tiny-target --revision"))
        assert e2e.leftovers() == {}
    finally:
        kept.rename(blobs)
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    for n in e2e.rig.nodes:
        (c,) = [c for c in e2e.managed(n.name) if c.status == "running"]
        mounts = {m["Destination"]: m["Source"] for m in c.attrs["Mounts"]}
        assert mounts["/models/target"] == f"{HF_DIR}/hub/models--rig--tiny-target"
    e2e.cli("down", cfg=cfg)
