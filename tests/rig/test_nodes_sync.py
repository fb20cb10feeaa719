"""Drafter sync onto rig nodes: full copy, the unchanged case (0 bytes), one file changed, a file deleted
or added on the node, SFTP fallback, verification, and a path with shell metacharacters."""

from __future__ import annotations

import os
import time
from pathlib import Path

import _nodes_rig
import pytest

from sparkserve.deploy import sync as sync_mod
from sparkserve.deploy.sync import _cache_file, remote_manifest, sync_all, sync_dir
from sparkserve.models.manifest import manifest
from sparkserve.nodes import Node, NodeError, SSHNode

pytestmark = pytest.mark.rig
globals().update(_nodes_rig.FIXTURES)  # rig_cfg, rig_nodes, node_a, node_b, node_scratch


@pytest.fixture()
def drafter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small synthetic drafter: weights, mask, config, a nested file, a symlinked blob (HF style)."""
    monkeypatch.setenv("SPARKSERVE_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "drafter"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(3_000_000))
    (d / "mask_embedding.pt").write_bytes(os.urandom(200_000))
    (d / "config.json").write_text('{"architectures": ["DFlash2DraftModel"]}\n')
    (d / "sub" / "tokenizer.json").write_text("{}\n")
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_bytes(b"blob content\n")
    (d / "generation_config.json").symlink_to(blob)
    old = time.time() - 60  # outside the "racy" window so both caches keep the hashes
    for p in d.rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.utime(p, (old, old))
    os.utime(blob, (old, old))
    return d


def _remote_files(node: Node, path: str) -> dict[str, tuple[str, int]]:
    return {r: (e.sha256, e.size) for r, e in remote_manifest(node, path).manifest.files.items()}


def _local_files(path: Path) -> dict[str, tuple[str, int]]:
    return {r: (e.sha256, e.size) for r, e in manifest(path).files.items()}


def test_full_copy_then_unchanged_costs_no_bytes(drafter: Path, node_b: SSHNode, node_scratch: str) -> None:
    dst = f"{node_scratch}/drafter"
    first = sync_dir(node_b, drafter, dst)
    assert first.method == "rsync" and first.verified
    assert sorted(first.files_copied) == sorted(_local_files(drafter))
    assert first.bytes_copied == sum(s for _, s in _local_files(drafter).values())
    assert _remote_files(node_b, dst) == _local_files(drafter)
    # symlinks arrive as file content (a dangling link on the node would break the mount)
    assert node_b.run(["test", "-L", f"{dst}/generation_config.json"], check=False).exit_code == 1

    again = sync_dir(node_b, drafter, dst)
    assert (again.method, again.files_copied, again.bytes_copied, again.deleted) == ("none", [], 0, [])
    assert again.remote_hashed_bytes == 0  # the node's cache answered: no file content was read
    assert again.verified and not again.changed
    assert again.seconds < 1.0
    assert "nothing copied" in again.summary()


def test_one_changed_file_is_the_only_one_copied(drafter: Path, node_b: SSHNode, node_scratch: str) -> None:
    dst = f"{node_scratch}/drafter"
    sync_dir(node_b, drafter, dst)
    (drafter / "config.json").write_text('{"architectures": ["DFlash2DraftModel"], "block_size": 16}\n')
    r = sync_dir(node_b, drafter, dst)
    assert r.files_copied == ["config.json"] and r.verified
    assert r.wire_bytes is not None and r.wire_bytes < 100_000
    assert _remote_files(node_b, dst) == _local_files(drafter)


def test_a_file_deleted_or_added_on_the_node_is_restored_or_removed(
    drafter: Path, node_b: SSHNode, node_scratch: str
) -> None:
    dst = f"{node_scratch}/drafter"
    sync_dir(node_b, drafter, dst)
    node_b.run(["rm", f"{dst}/mask_embedding.pt"])
    node_b.write_bytes(f"{dst}/stale/old-model.safetensors", b"stale")
    r = sync_dir(node_b, drafter, dst)
    assert r.files_copied == ["mask_embedding.pt"]
    assert r.deleted == ["stale/old-model.safetensors"]
    assert _remote_files(node_b, dst) == _local_files(drafter)
    assert node_b.run(["test", "-e", f"{dst}/stale"], check=False).exit_code == 1  # emptied dir pruned


def test_corrupted_bytes_on_the_node_are_found_and_replaced(
    drafter: Path, node_b: SSHNode, node_scratch: str
) -> None:
    dst = f"{node_scratch}/drafter"
    sync_dir(node_b, drafter, dst)
    # same size, new mtime: a bit flip the cache must not hide
    node_b.run(["sh", "-c", 'printf X | dd of="$1" bs=1 seek=1000 conv=notrunc status=none', "sh",
                f"{dst}/model.safetensors"])
    r = sync_dir(node_b, drafter, dst)
    assert r.files_copied == ["model.safetensors"] and r.verified


def test_sftp_fallback_copies_and_verifies(drafter: Path, node_b: SSHNode, node_scratch: str) -> None:
    dst = f"{node_scratch}/drafter-sftp"
    r = sync_dir(node_b, drafter, dst, method="sftp")
    assert r.method == "sftp" and r.verified and r.wire_bytes is None
    assert _remote_files(node_b, dst) == _local_files(drafter)
    assert sync_dir(node_b, drafter, dst, method="sftp").bytes_copied == 0


def test_verification_failure_names_the_node_and_file(
    drafter: Path, node_b: SSHNode, node_scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def bad_copy(node: Node, local_dir: Path, remote_dir: str, rels: list[str], total: int = 0) -> None:
        for rel in rels:
            node.write_bytes(f"{remote_dir}/{rel}", b"not the drafter")

    monkeypatch.setattr(sync_mod, "_sftp_copy", bad_copy)
    with pytest.raises(NodeError, match=rf"^{node_b.name}: sync: after copying, 5 file\(s\) still differ"):
        sync_dir(node_b, drafter, f"{node_scratch}/drafter", method="sftp")


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_drafter_path_with_shell_metacharacters_is_a_path(
    drafter: Path, node_b: SSHNode, node_scratch: str, method: str
) -> None:
    pwned = Path("/tmp/pwned")
    pwned.unlink(missing_ok=True)
    node_b.run(["rm", "-f", str(pwned)])
    dst = f"{node_scratch}/m/x; touch {pwned}"
    r = sync_dir(node_b, drafter, dst, method=method)  # type: ignore[arg-type]
    assert r.verified and r.method == method
    assert _remote_files(node_b, dst) == _local_files(drafter)
    assert not pwned.exists()
    assert node_b.run(["test", "-e", str(pwned)], check=False).exit_code == 1


def test_sync_all_reaches_every_node_and_paths_are_node_local(
    drafter: Path, rig_nodes: dict[str, Node], node_a: SSHNode, node_b: SSHNode, node_scratch: str
) -> None:
    dst = f"{node_scratch}/drafter"
    reports = sync_all([node_b], drafter, dst)
    assert reports[node_b.name].verified
    # node-a has its own /srv/spark: node-b's copy is not there, so syncing node-a copies everything
    reports = sync_all(list(rig_nodes.values()), drafter, dst)
    assert reports[node_b.name].bytes_copied == 0
    assert reports[node_a.name].bytes_copied > 0
    assert all(r.verified for r in reports.values())


def test_one_nodes_cached_hashes_never_answer_for_another_nodes_bytes(
    drafter: Path, node_a: SSHNode, node_b: SSHNode, node_scratch: str
) -> None:
    # nodes that share one home directory (an NFS home, as on many clusters) share one manifest cache file
    # per path, while their copies are different files: size and mtime alone would let node-a vouch for
    # node-b. The rig gives each node its own HOME, so the shared home is made here: node-a's cache file
    # is copied over node-b's after node-a refreshed it.
    dst = f"{node_scratch}/drafter"
    sync_all([node_a, node_b], drafter, dst)
    target = f"{dst}/model.safetensors"
    node_b.run(["sh", "-c", 'cp -p "$1" "$1.orig" && printf X | dd of="$1" bs=1 seek=10 conv=notrunc status=none '
                '&& touch -r "$1.orig" "$1" && rm "$1.orig"', "sh", target])  # same size, same mtime
    remote_manifest(node_a, dst)  # node-a refreshes the (shared) cache with its own, correct, copy
    cache = _cache_file(dst).removeprefix("~/")
    shared = node_a.run(["sh", "-c", 'cat "$HOME/$1"', "sh", cache]).stdout.encode()
    node_b.run(["sh", "-c", 'mkdir -p "$(dirname "$HOME/$1")" && cat > "$HOME/$1"', "sh", cache], stdin=shared)
    r = sync_dir(node_b, drafter, dst)
    assert r.files_copied == ["model.safetensors"] and r.verified
