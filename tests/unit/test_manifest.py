"""sha256 manifest: streamed, cached by (path, size, mtime_ns) so an unchanged drafter is hashed once."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sparkserve.errors import BadInput
from sparkserve.models import manifest as mf
from sparkserve.models.files import BadFile
from sparkserve.models.manifest import FileEntry, manifest


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPARKSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _old(p: Path) -> None:
    """Age a file past the racy window (a freshly written file is hashed but not cached)."""
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - 10 * 10**9))


def _tree(root: Path) -> Path:
    (root / "sub dir").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}')
    (root / "sub dir" / "w.bin").write_bytes(os.urandom(3 * mf.CHUNK + 17))  # several chunks
    for p in root.rglob("*"):
        if p.is_file():
            _old(p)
    return root


def test_entries_and_digest_formula(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    m = manifest(root)
    data = (root / "sub dir" / "w.bin").read_bytes()
    assert m.files["sub dir/w.bin"] == FileEntry(hashlib.sha256(data).hexdigest(), len(data))
    assert m.files["config.json"].size == 8
    lines = sorted(f"{rel}\t{e.sha256}\t{e.size}" for rel, e in m.files.items())
    assert m.digest == hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()
    assert m.total_bytes == len(data) + 8


def test_second_run_hashes_nothing_and_a_changed_file_is_hashed_again(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    first = manifest(root)
    assert first.hashed_bytes == first.total_bytes
    second = manifest(root)
    assert second.hashed_bytes == 0 and second.digest == first.digest
    (root / "config.json").write_text('{"a": 2}')  # same size, new mtime
    _old(root / "config.json")
    third = manifest(root)
    assert third.hashed_bytes == 8 and third.digest != first.digest
    assert third.differing(first) == ["config.json"]


def test_a_file_modified_just_now_is_not_cached(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (root / "x").write_text("fresh")
    manifest(root)
    assert manifest(root).hashed_bytes == 5


def test_symlinked_files_are_followed_like_an_hf_snapshot(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_text("weights")
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors").symlink_to(blobs / "abc")
    m = manifest(snap)
    assert m.files["model.safetensors"] == FileEntry(hashlib.sha256(b"weights").hexdigest(), 7)


def test_an_unwritable_cache_is_skipped_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("SPARKSERVE_CACHE_DIR", str(blocker / "cache"))
    root = _tree(tmp_path / "d")
    assert manifest(root).hashed_bytes == manifest(root).hashed_bytes > 0


def test_differing_and_extra(tmp_path: Path) -> None:
    a = mf.Manifest("a", {"x": FileEntry("1", 1), "y": FileEntry("2", 2)})
    b = mf.Manifest("b", {"x": FileEntry("1", 1), "y": FileEntry("3", 2), "z": FileEntry("4", 4)})
    assert a.differing(b) == ["y"] and a.extra_in(b) == ["z"] and b.differing(a) == ["y", "z"]
    assert a.to_json()["files"]["x"] == {"sha256": "1", "size": 1}


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        manifest(tmp_path / "nope")


# --- hostile inputs (issue 15 item 9) ----------------------------------------------------------------------

@pytest.mark.timeout(10)
def test_a_fifo_is_left_out_and_never_opened(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d")
    os.mkfifo(root / "pipe")
    assert "pipe" not in manifest(root).files
    with pytest.raises(BadFile, match="is a FIFO, not a regular file"):
        mf.sha256_file(root / "pipe")


@pytest.mark.timeout(10)
def test_a_file_that_became_a_fifo_after_the_walk_is_bad_input_not_a_hang(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "d")
    walked = list(mf.iter_files(root))

    def swapped(r: Path):  # the walk saw a file; by the time it is hashed it is a FIFO
        for rel, p in walked:
            if rel == "config.json":
                p.unlink()
                os.mkfifo(p)
            yield rel, p

    monkeypatch.setattr(mf, "iter_files", swapped)
    with pytest.raises(BadInput) as e:
        manifest(root, use_cache=False)
    assert (e.value.where, e.value.what) == (str(root / "config.json"), "is a FIFO, not a regular file")
