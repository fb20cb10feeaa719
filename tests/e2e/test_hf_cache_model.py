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


@pytest.fixture
def hub_on_nodes(e2e):
    for n in e2e.rig.nodes:
        root = e2e.node_path(n.name, HF_DIR)
        shutil.rmtree(root, ignore_errors=True)
        src = e2e.node_path(n.name, e2e.rig.models["target"])
        repo = e2e.node_path(n.name, f"{HF_DIR}/hub/models--rig--tiny-target")
        (repo / "blobs").mkdir(parents=True)
        (repo / "snapshots" / SHA).mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(SHA)
        for f in sorted(src.iterdir()):
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            shutil.copyfile(f, repo / "blobs" / digest)
            os.symlink(f"../../blobs/{digest}", repo / "snapshots" / SHA / f.name)
    yield
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, HF_DIR), ignore_errors=True)


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
