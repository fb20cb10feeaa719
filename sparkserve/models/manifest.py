"""sha256 manifest of every file in a directory, streamed and cached so a 6 GB drafter is hashed once.

The cache (SQLite in the user cache dir, or ``$SPARKSERVE_CACHE_DIR``) maps a file's resolved path, size
and mtime_ns to its sha256; a file whose size or mtime changed is hashed again (files modified in the
last two seconds are never cached). A cache that cannot be
opened or written is skipped, never fatal.

Manifest digest = sha256 over the sorted lines ``relpath\\tsha256\\tsize\\n`` (relpath with ``/``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from sparkserve.errors import BadInput
from sparkserve.models.files import BadFile, open_regular

CHUNK = 4 * 2**20
CACHE_ENV = "SPARKSERVE_CACHE_DIR"
# A file modified this recently may change again within the same mtime tick ("racy" in git's words):
# hash it, but do not cache the result.
RACY_NS = 2 * 10**9

Progress = Callable[[str, int, int], None]  # (relpath, bytes hashed so far in this file, file size)


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int


@dataclass
class Manifest:
    root: str
    files: dict[str, FileEntry] = field(default_factory=dict)
    hashed_bytes: int = 0  # bytes actually read this time (0 when everything came from the cache)

    def lines(self) -> list[str]:
        return [f"{rel}\t{e.sha256}\t{e.size}" for rel, e in sorted(self.files.items())]

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for line in self.lines():
            h.update(line.encode() + b"\n")
        return h.hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    def differing(self, other: Manifest) -> list[str]:
        """Relative paths whose content differs from ``other`` or that ``other`` lacks (sorted)."""
        return sorted(rel for rel, e in self.files.items() if other.files.get(rel) != e)

    def extra_in(self, other: Manifest) -> list[str]:
        """Relative paths ``other`` has and this manifest does not."""
        return sorted(set(other.files) - set(self.files))

    def to_json(self) -> dict[str, object]:
        return {
            "root": self.root,
            "digest": self.digest,
            "total_bytes": self.total_bytes,
            "files": {rel: {"sha256": e.sha256, "size": e.size} for rel, e in sorted(self.files.items())},
        }


def cache_path() -> Path:
    base = os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("sparkserve")
    return Path(base) / "sha256-cache.sqlite"


class _Cache:
    def __init__(self, path: Path) -> None:
        self.db: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path), timeout=10)
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS sha256 (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
                "sha256 TEXT)"
            )
        except (OSError, sqlite3.Error):
            self.db = None

    def get(self, path: str, size: int, mtime_ns: int) -> str | None:
        if self.db is None:
            return None
        try:
            row = self.db.execute(
                "SELECT sha256 FROM sha256 WHERE path=? AND size=? AND mtime_ns=?", (path, size, mtime_ns)
            ).fetchone()
        except sqlite3.Error:
            return None
        return row[0] if row else None

    def put(self, path: str, size: int, mtime_ns: int, digest: str) -> None:
        if self.db is None:
            return
        # a cache that cannot be written only costs a re-hash next time: never a failed manifest
        with contextlib.suppress(sqlite3.Error), self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO sha256 (path, size, mtime_ns, sha256) VALUES (?,?,?,?)",
                (path, size, mtime_ns, digest),
            )

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


def sha256_file(path: Path, *, rel: str = "", progress: Progress | None = None) -> tuple[str, int]:
    """Stream a regular file through sha256; returns (hex digest, bytes read). BadFile for anything else."""
    h = hashlib.sha256()
    done = 0
    with open_regular(path) as f:  # a file swapped for a FIFO since the walk must not block the hash
        size = os.fstat(f.fileno()).st_size
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(rel, done, size)
    return h.hexdigest(), done


def iter_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relpath, path) of every regular file under root, following symlinks to files (HF snapshots).
    FIFOs, devices and sockets are not files of a model: they are left out, never opened."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_file():
                yield p.relative_to(root).as_posix(), p


def manifest(root: Path | str, *, use_cache: bool = True, progress: Progress | None = None) -> Manifest:
    """sha256 of every file under ``root`` (a directory). Unchanged files come from the cache.

    This reads every byte of a file not cached yet (26 s for 6 GB): callers validate the drafter's cheap
    facts (inspect_drafter / plan.validate) first."""
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(str(root))
    cache = _Cache(cache_path()) if use_cache else None
    out = Manifest(root=str(root))
    try:
        for rel, p in iter_files(root):
            st = p.stat()
            key = str(p.resolve())
            digest = cache.get(key, st.st_size, st.st_mtime_ns) if cache else None
            if digest is None:
                try:
                    digest, n = sha256_file(p, rel=rel, progress=progress)
                except BadFile as e:  # replaced since the walk (by a FIFO, say): the tree is not a model
                    raise BadInput(str(p), str(e)) from None
                out.hashed_bytes += n
                if cache and time.time_ns() - st.st_mtime_ns > RACY_NS:
                    cache.put(key, st.st_size, st.st_mtime_ns, digest)
            out.files[rel] = FileEntry(digest, st.st_size)
    finally:
        if cache:
            cache.close()
    return out
