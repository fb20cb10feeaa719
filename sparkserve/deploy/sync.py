"""Drafter sync: make a directory on a node hold exactly the bytes of a local directory.

    report = sync_dir(node, Path("/models/dflash2"), "/models/dflash2")
    report.bytes_copied   # 0 when the node already has identical bytes
    reports = sync_all(nodes, local_dir, remote_dir)          # every node in parallel, one local manifest

Steps (two remote commands when something changed, one when nothing did):

1. Local sha256 manifest (:func:`sparkserve.models.manifest.manifest`, cached by path/size/mtime).
2. Remote manifest computed ON the node by a small stdlib ``python3 -`` program with a per-node cache
   file keyed by (relpath, size, mtime_ns, inode) — the unchanged case reads no file content and sends
   no file bytes. Both node-side programs live in :mod:`sparkserve.deploy.sync_remote`.
3. Copy only the files that differ or are missing: ``rsync`` over OpenSSH with the node's own key and
   known_hosts (``StrictHostKeyChecking=yes``) when both ends have rsync, else SFTP (pipelined 255 KiB
   writes).
   Paths travel as data (rsync ``--protect-args``, SFTP, JSON) — never through a shell.
   While the copy runs, a second small program on the node (the verifier) deletes files the
   source does not have and re-hashes every copied file as soon as it has been renamed into place, so
   verification overlaps the transfer; after the copy it hashes whatever is left.
4. The node's resulting manifest must equal the local one, file by file.

An interrupt (Ctrl-C, SIGTERM, SIGHUP: :mod:`sparkserve.interrupts`) stops a copy within
``STOP_POLL_S``: rsync and its ssh are ended, and the verifier, told to abort, deletes the temp files the
copy left on the node; files already renamed into place are whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkserve import interrupts
from sparkserve.deploy.sync_remote import remote_program, verify_program
from sparkserve.models.manifest import FileEntry, Manifest, manifest
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.parallel import on_all

Method = Literal["auto", "rsync", "sftp"]
STOP_POLL_S = 0.2  # how often a running copy looks at the stop flag (an interrupt stops it within this)
MIN_RATE = 20e6  # bytes/s assumed when sizing the copy timeout
REMOTE_CACHE = "~/.cache/sparkserve/manifests"


ProgressFn = Callable[[str, int, int], None]  # (node, bytes done, bytes to copy)
_listeners: list[ProgressFn] = []
_PROGRESS2 = re.compile(rb"^\s*([\d,.]+)\s+\d+%")


@contextlib.contextmanager
def progress_to(fn: ProgressFn) -> Iterator[None]:
    """While in this block, every drafter copy reports its bytes to ``fn`` (node, done, total) — from the
    copy threads; the commands layer draws bars from it. ``up`` and ``swap-drafter`` need no argument."""
    _listeners.append(fn)
    try:
        yield
    finally:
        _listeners.remove(fn)


def _progress(node: str, done: int, total: int) -> None:
    for fn in list(_listeners):
        with contextlib.suppress(Exception):  # a display must never fail a copy
            fn(node, done, total)


def _cache_file(remote_dir: str) -> str:
    key = hashlib.sha256(remote_dir.encode()).hexdigest()[:24]
    return f"{REMOTE_CACHE}/{key}.json"


@dataclass
class RemoteState:
    """What the manifest program found on the node (and what it deleted first)."""

    exists: bool
    manifest: Manifest
    rsync: bool
    deleted: list[str]
    idents: dict[str, list[int]] = field(default_factory=dict)  # rel → [ino, dev, mtime_ns, size]
    uncached: list[str] = field(default_factory=list)  # cached_only: files the cache could not answer for


def manifest_args(remote_dir: str, *, rehash: list[str] | None = None, delete: list[str] | None = None,
                  create: bool = False, cached_only: bool = False) -> dict[str, object]:
    """The manifest program's arguments (see :func:`remote_manifest`); the node's cache file is keyed by the
    directory ("~" in its path is expanded by the node's python, not a shell)."""
    return {"root": remote_dir, "cache": _cache_file(remote_dir), "rehash": rehash or [], "delete": delete or [],
            "create": create, "cached_only": cached_only}


def state_from(remote_dir: str, data: dict[str, Any]) -> RemoteState:
    """The manifest program's JSON answer for ``remote_dir`` as a RemoteState (KeyError, ValueError,
    TypeError or AttributeError when it is malformed)."""
    files = {rel: FileEntry(sha, int(size)) for rel, (sha, size) in data["files"].items()}
    m = Manifest(root=remote_dir, files=files, hashed_bytes=int(data["hashed_bytes"]))
    return RemoteState(bool(data["exists"]), m, bool(data["rsync"]), list(data["deleted"]),
                       dict(data.get("idents", {})), list(data.get("uncached", [])))


def remote_manifest(
    node: Node,
    remote_dir: str,
    *,
    rehash: list[str] | None = None,
    delete: list[str] | None = None,
    create: bool = False,
    cached_only: bool = False,
    timeout: float = 3600.0,
    step: str = "sync",
) -> RemoteState:
    """Run the remote program once: delete ``delete``, then the manifest of ``remote_dir`` on ``node``.
    ``cached_only``: read no file's content; what the node's cache cannot answer for is ``uncached``."""
    args = manifest_args(remote_dir, rehash=rehash, delete=delete, create=create, cached_only=cached_only)
    program = remote_program(args)
    res = node.run(["python3", "-"], stdin=program.encode(), timeout=timeout, step=step, check=False)
    if res.exit_code == 127:
        raise NodeError(node.name, step, "python3 not found on the node (the drafter check needs it)",
                        argv=res.argv, last_lines=res.tail())
    if not res.ok:
        why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise NodeError(node.name, step, f"manifest of {remote_dir} failed: {why}", argv=res.argv,
                        last_lines=res.tail())
    try:
        data = json.loads(res.stdout)
    except ValueError:
        raise NodeError(node.name, step, "the manifest program printed something that is not JSON",
                        last_lines=res.tail()) from None
    return state_from(remote_dir, data)


# -- copying ------------------------------------------------------------------------------------------------


@dataclass
class SyncReport:
    """What one node's sync did: how (method), what it copied and removed, and that it verified."""

    node: str
    method: str  # "none" (already identical), "rsync", "sftp", "copy" (LocalNode), "same-dir"
    files_copied: list[str] = field(default_factory=list)
    bytes_copied: int = 0  # file bytes written on the node
    wire_bytes: int | None = None  # rsync's "Total bytes sent" (None for SFTP)
    deleted: list[str] = field(default_factory=list)
    seconds: float = 0.0
    remote_hashed_bytes: int = 0
    verified: bool = False
    digest: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.files_copied or self.deleted)

    def summary(self) -> str:
        if not self.changed:
            return f"{self.node}: drafter identical ({self.digest[:12]}), nothing copied"
        mb = self.bytes_copied / 1e6
        removed = f", {len(self.deleted)} removed" if self.deleted else ""
        return (f"{self.node}: {len(self.files_copied)} file(s), {mb:.1f} MB via {self.method}{removed} "
                f"in {self.seconds:.1f}s, verified")


def _rsync_copy(node: Node, local_dir: Path, remote_dir: str, rels: list[str], timeout: float,
                total: int = 0) -> int | None:
    remote = node.rsync_remote()
    assert remote is not None
    argv = [
        # --ignore-times: every listed file is known to differ; rsync's size+mtime quick check would skip
        # one whose bytes changed under the same size and mtime. No --partial(-dir): an interrupted rsync
        # deletes the file it was writing, so nothing half-copied stays on the node.
        "rsync", "--protect-args", "--ignore-times", "--files-from=-", "--from0", "--copy-links", "--times",
        "--perms", "--stats", "--info=progress2", "-e", remote.rsh,
        f"{local_dir}/", f"{remote.target}:{remote_dir.rstrip('/')}/",
    ]
    listing = b"\0".join(r.encode() for r in rels) + b"\0"
    # its own session: a signal meant for sparkserve reaches rsync (and its ssh) only through _stop_rsync
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    out, err = bytearray(), bytearray()

    def feed() -> None:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.write(listing)
            proc.stdin.close()

    def read_out() -> None:
        assert proc.stdout is not None
        pending = b""
        while chunk := proc.stdout.read1(65536):  # type: ignore[attr-defined]
            out.extend(chunk)
            pending += chunk
            *done, pending = re.split(rb"[\r\n]", pending)
            for line in reversed(done):  # the newest progress2 line of this chunk
                m = _PROGRESS2.match(line)
                if m:
                    _progress(node.name, min(int(re.sub(rb"[,.]", b"", m.group(1))), total or 1 << 62), total)
                    break

    def read_err() -> None:
        assert proc.stderr is not None
        while chunk := proc.stderr.read1(65536):  # type: ignore[attr-defined]
            err.extend(chunk)

    threads = [threading.Thread(target=f, daemon=True) for f in (feed, read_out, read_err)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=STOP_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if interrupts.stopping():
                _stop_rsync(proc)
                raise NodeError(node.name, "sync", f"interrupted: the copy to {remote_dir} was stopped",
                                argv=argv) from None
            if time.monotonic() > deadline:
                _stop_rsync(proc)
                raise NodeError(node.name, "sync", f"rsync to {remote_dir} timed out after {timeout:.0f}s",
                                argv=argv) from None
    for t in threads:
        t.join(timeout=5)
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise NodeError(node.name, "sync", f"rsync to {remote_dir} exited {proc.returncode}", argv=argv,
                        last_lines=lines[-10:])
    m = re.search(rb"Total bytes sent: ([\d,.]+)", bytes(out))
    return int(re.sub(rb"[,.]", b"", m.group(1))) if m else None


def _stop_rsync(proc: subprocess.Popen[bytes]) -> None:
    """End rsync and its ssh (one process group): politely first, so the node's rsync sees the connection
    close and removes its temp file; then for good."""
    for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _sftp_copy(node: Node, local_dir: Path, remote_dir: str, rels: list[str], total: int = 0) -> None:
    done = 0

    def moved(n: int) -> None:
        _progress(node.name, done + n, total)

    for rel in rels:
        if interrupts.stopping():  # each put writes a temp file and renames it: stopping between files is clean
            raise NodeError(node.name, "sync", f"interrupted: the copy to {remote_dir} was stopped")
        node.put(local_dir / rel, f"{remote_dir.rstrip('/')}/{rel}", preserve_mtime=True, on_bytes=moved)
        done += (local_dir / rel).stat().st_size
        _progress(node.name, done, total)


def _has_local_rsync() -> bool:
    return shutil.which("rsync") is not None and shutil.which("ssh") is not None


def _copy_and_verify(
    node: Node, local_dir: Path, remote_dir: str, local: Manifest, state: RemoteState, diff: list[str],
    extra: list[str], method: Method, timeout: float | None, report: SyncReport,
) -> Manifest:
    """Copy ``diff`` while the node's verifier hashes each file as it lands; the node's manifest after."""
    if interrupts.stopping():  # interrupted while the node's manifest was read: copy nothing
        raise NodeError(node.name, "sync", f"interrupted: nothing was copied to {remote_dir}")
    size = sum(local.files[r].size for r in diff)
    use_rsync = node.rsync_remote() is not None and state.rsync and _has_local_rsync()
    if method == "rsync" and not use_rsync:
        raise NodeError(node.name, "sync", "rsync requested but missing on this machine or the node")
    if method == "sftp":
        use_rsync = False
    limit = timeout or max(300.0, size / MIN_RATE)
    args: dict[str, object] = {
        "root": remote_dir, "cache": _cache_file(remote_dir), "delete": extra,
        "files": {r: [local.files[r].size, local.files[r].sha256] for r in diff},
        "before": {r: state.idents[r] for r in diff if r in state.idents},
    }
    verifier = node.start(["python3", "-c", verify_program(args)], timeout=limit + 600, step="sync")
    _progress(node.name, 0, size)
    try:
        if use_rsync:
            report.wire_bytes = _rsync_copy(node, local_dir, remote_dir, diff, limit, size)
            report.method = "rsync"
            _progress(node.name, size, size)
        else:
            _sftp_copy(node, local_dir, remote_dir, diff, size)
            report.method = "sftp" if node.rsync_remote() is not None else "copy"
    except BaseException:
        verifier.close_stdin()  # EOF without "done": the verifier stops
        with contextlib.suppress(NodeError):
            verifier.wait(check=False)
        raise
    with contextlib.suppress(NodeError):  # it may already have verified everything and exited
        verifier.write(b"done\n")
    verifier.close_stdin()
    res = verifier.wait(check=False)
    if not res.ok:
        why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise NodeError(node.name, "sync", f"verifying {remote_dir} failed: {why}", argv=res.argv[:2],
                        last_lines=res.tail())
    data = json.loads(res.stdout)
    if data.get("aborted"):
        raise NodeError(node.name, "sync", f"the verifier on the node stopped before the copy to {remote_dir} "
                        "was confirmed")
    report.files_copied = diff
    report.bytes_copied = size
    report.deleted = list(data["deleted"])
    report.remote_hashed_bytes += int(data["hashed_bytes"])
    files = {r: e for r, e in state.manifest.files.items() if r not in data["deleted"] and r not in diff}
    files.update({r: FileEntry(sha, int(sz)) for r, (sha, sz) in data["files"].items()})
    return Manifest(root=remote_dir, files=files)


def sync_dir(
    node: Node,
    local_dir: Path,
    remote_dir: str,
    *,
    local_manifest: Manifest | None = None,
    method: Method = "auto",
    delete_extra: bool = True,
    timeout: float | None = None,
) -> SyncReport:
    """Make ``remote_dir`` on ``node`` hold exactly ``local_dir``'s files; copy only what differs.

    Raises NodeError (step ``sync``) naming the node on any failure, including a failed verification.
    """
    t0 = time.monotonic()
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise NodeError(node.name, "sync", f"source {local_dir} is not a directory")
    if node.rsync_remote() is None and Path(remote_dir).resolve() == local_dir.resolve():
        m = local_manifest or manifest(local_dir)
        return SyncReport(node.name, "same-dir", verified=True, digest=m.digest,
                          seconds=time.monotonic() - t0)
    local = local_manifest or manifest(local_dir)
    state = remote_manifest(node, remote_dir, create=True)
    diff = local.differing(state.manifest)
    extra = local.extra_in(state.manifest) if delete_extra else []
    report = SyncReport(node.name, "none", remote_hashed_bytes=state.manifest.hashed_bytes,
                        digest=local.digest)
    if not diff and not extra:
        report.verified = True
        report.seconds = time.monotonic() - t0
        return report
    if not diff:  # only files to remove: one call removes them and re-reads the manifest
        after = remote_manifest(node, remote_dir, delete=extra)
        report.deleted = after.deleted
        final = after.manifest
    else:
        final = _copy_and_verify(node, local_dir, remote_dir, local, state, diff, extra, method, timeout, report)
    bad = [r for r in diff if final.files.get(r) != local.files[r]]
    left = [r for r in extra if r in final.files]
    if bad or left:
        what = (f"after copying, {len(bad)} file(s) still differ on the node: {', '.join(bad[:5])}" if bad
                else f"could not remove {', '.join(left[:5])} from {remote_dir}")
        raise NodeError(node.name, "sync", what)
    if delete_extra and final.digest != local.digest:
        raise NodeError(node.name, "sync", f"{remote_dir} still differs from {local_dir} after syncing")
    report.verified = True
    report.seconds = time.monotonic() - t0
    return report


def sync_all(
    nodes: list[Node], local_dir: Path, remote_dir: str, *, method: Method = "auto",
    local_manifest: Manifest | None = None,
) -> dict[str, SyncReport]:
    """:func:`sync_dir` on every node in parallel with one local manifest."""
    local = local_manifest or manifest(local_dir)
    return on_all(nodes, lambda n: sync_dir(n, local_dir, remote_dir, local_manifest=local, method=method),
                  name=lambda n: n.name)
