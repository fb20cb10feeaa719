"""The two programs drafter sync runs ON the node, and how they are sent there.

Each is a stdlib-only function whose *source* travels (``inspect.getsource``) to the node's ``python3``,
with the small ``_node_*`` helpers they share prepended (:func:`_node_prelude`) and the arguments embedded
as JSON data — never through a shell:

* :func:`remote_program` → :func:`_remote_main`: optionally delete files, then the sha256 manifest of a
  directory, answered from a per-node cache file keyed by (relpath, size, mtime_ns, inode, device) so the
  unchanged case reads no file content;
* :func:`verify_program` → :func:`_verify_main`: runs WHILE the copy runs and hashes each file as soon as
  it has been renamed into place, so verification overlaps the transfer.

Everything in a ``_node_*`` / ``_*_main`` function runs on the node: imports stay inside, names stay
self-contained. The controller side is :mod:`sparkserve.deploy.sync`.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable

# -- helpers shared by both programs (run on the node) ----------------------------------------------------


def _node_path(root: str, rel: str) -> str:
    """On the node: ``root/rel``, refusing absolute paths and ``.``/``..``/empty parts."""
    import os

    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"refusing path {rel!r}")
    return os.path.join(root, *parts)


def _node_delete(root: str, rels: list[str]) -> list[str]:
    """On the node: delete ``rels`` under ``root`` and the directories they leave empty."""
    import contextlib
    import os

    deleted = []
    for rel in rels:
        p = _node_path(root, rel)
        with contextlib.suppress(FileNotFoundError):  # already gone (a racing run deleted it): nothing to do
            os.unlink(p)
            deleted.append(rel)
        d = os.path.dirname(p)
        while d != root and d.startswith(root + os.sep):
            try:
                os.rmdir(d)  # only succeeds when empty
            except OSError:
                break
            d = os.path.dirname(d)
    return deleted


def _node_sha256(path: str) -> tuple[str, int]:
    """On the node: (sha256 hex, bytes read) of one file, in 4 MiB reads."""
    import hashlib

    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(4 << 20)
            if not b:
                return h.hexdigest(), n
            h.update(b)
            n += len(b)


def _node_read_cache(cache_file: str) -> dict:  # type: ignore[type-arg]
    """On the node: the manifest cache {rel: [size, mtime_ns, sha256, ino, dev]}; empty if unreadable."""
    import json

    if not cache_file:
        return {}
    try:
        with open(cache_file) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _node_write_cache(cache_file: str, entries: dict) -> None:  # type: ignore[type-arg]
    """On the node: replace the manifest cache file atomically; a cache that cannot be written is skipped."""
    import json
    import os

    try:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        tmp = f"{cache_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, cache_file)
    except OSError:
        return


def _node_sweep_temps(root: str, rels: list[str]) -> list[str]:
    """On the node: delete the temp files a stopped copy of ``rels`` left (rsync's ``.NAME.XXXXXX``, the
    SFTP and local puts' ``.NAME.sparkserve-tmp``), never anything else; the names removed."""
    import os
    import re

    removed = []
    for rel in rels:
        p = _node_path(root, rel)
        d, base = os.path.dirname(p), os.path.basename(p)
        temp = re.compile(r"\." + re.escape(base) + r"\.([A-Za-z0-9]{6}|sparkserve-tmp)")
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if temp.fullmatch(name):
                try:
                    os.unlink(os.path.join(d, name))
                    removed.append(os.path.relpath(os.path.join(d, name), root))
                except OSError:
                    continue  # already gone (the writer cleaned up after itself)
    return removed


@functools.cache
def _node_prelude() -> str:
    helpers = (_node_path, _node_delete, _node_sha256, _node_read_cache, _node_write_cache, _node_sweep_temps)
    return "\n".join(inspect.getsource(f) for f in helpers) + "\n"


@functools.cache
def _source(fn: Callable[..., object]) -> str:
    """A node program's source, read (tokenized) once per process, not once per node and call."""
    return inspect.getsource(fn)


# -- the manifest program -----------------------------------------------------------------------------------


def _remote_main(args: dict) -> dict:  # type: ignore[type-arg]
    """On the node: optionally delete files, then the sha256 manifest of ``root`` (cached).

    args: root, cache (path or ""), delete (relpaths), rehash (relpaths hashed even if cached),
    create (make ``root`` if missing, so a copy can follow without another round trip), cached_only (hash
    nothing: a file the cache cannot answer for is listed in ``uncached`` instead).
    Returns {exists, files: {rel: [sha256, size]}, idents: {rel: [ino, dev, mtime_ns, size]}, hashed_bytes,
    rsync, deleted, uncached}.
    """
    import os
    import shutil
    import time

    root = args["root"]
    deleted = _node_delete(root, args.get("delete", []))

    if args.get("create"):
        os.makedirs(root, exist_ok=True)
    out = {"exists": os.path.isdir(root), "files": {}, "idents": {}, "hashed_bytes": 0,
           "rsync": shutil.which("rsync") is not None, "deleted": deleted, "uncached": []}
    if not out["exists"]:
        return out
    cache_file = os.path.expanduser(args.get("cache") or "")
    cache = _node_read_cache(cache_file)
    rehash = set(args.get("rehash", []))
    todo = []
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            if not os.path.isfile(p):
                continue
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            st = os.stat(p)
            out["idents"][rel] = [st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size]
            hit = cache.get(rel)
            # keyed by inode and device too: two rig "nodes" share one home (and one cache file) while
            # their copies of a directory are different files with the same size and mtime
            if rel not in rehash and hit and hit[:2] == [st.st_size, st.st_mtime_ns] \
                    and hit[3:5] == [st.st_ino, st.st_dev]:
                entries[rel] = [hit[2], st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
            else:
                todo.append((rel, p, st))

    if todo and args.get("cached_only"):
        out["uncached"] = [rel for rel, _, _ in todo]
        out["files"] = {rel: [e[0], e[1]] for rel, e in entries.items()}
        return out

    def digest(item):  # type: ignore[no-untyped-def]
        rel, p, st = item
        return (rel, *_node_sha256(p), st)

    from concurrent.futures import ThreadPoolExecutor  # only when there is something to hash

    workers = max(1, min(8, os.cpu_count() or 1, len(todo)))
    with ThreadPoolExecutor(workers) as pool:
        for rel, sha, n, st in pool.map(digest, todo):
            entries[rel] = [sha, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
            out["hashed_bytes"] += n
    out["files"] = {rel: [e[0], e[1]] for rel, e in entries.items()}
    if cache_file and (todo or set(cache) - set(entries)):
        racy = time.time_ns() - 2 * 10**9
        new = {rel: [e[1], e[2], e[0], e[3], e[4]] for rel, e in entries.items() if e[2] < racy}
        _node_write_cache(cache_file, new)
    return out


def manifest_source() -> str:
    """The manifest program's functions without a call: the pre-flight probe runs ``_remote_main`` in its own
    interpreter too (deploy.probe), so a node answers its checks and its drafter manifest in one start."""
    return _node_prelude() + _source(_remote_main)


def remote_program(args: dict[str, object]) -> str:
    """The exact program sent on stdin to ``python3 -``: the function source plus its arguments as data."""
    call = f"_remote_main(json.loads({json.dumps(args)!r}))"
    tail = f"\nimport json, sys\nsys.stdout.write(json.dumps({call}))\n"
    return manifest_source() + tail


# -- the verifier -------------------------------------------------------------------------------------------


def _verify_main(args: dict) -> dict:  # type: ignore[type-arg]
    """On the node, WHILE the copy runs: delete ``delete``, then hash each file in ``files`` as soon as it
    has been replaced (its identity differs from ``before``: rsync, SFTP and local puts all write a temp
    file and rename it into place), and once more everything still pending after stdin says ``done``.
    EOF on stdin without ``done`` aborts, deleting the temp files of the copies still pending. Updates the
    node's manifest cache with what it verified.

    args: root, cache, files {rel: [size, sha256]}, before {rel: [ino, dev, mtime_ns, size]}, delete.
    Returns {files: {rel: [sha256, size]}, deleted, hashed_bytes, aborted, swept (on abort)}.
    """
    import os
    import sys
    import threading
    import time

    root = args["root"]

    def ident(p: str) -> list[int] | None:
        try:
            st = os.stat(p)
        except OSError:
            return None
        return [st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size]

    deleted = _node_delete(root, args.get("delete", []))
    control = {"state": "copying"}

    def listen() -> None:
        data = sys.stdin.buffer.read()  # returns at EOF
        control["state"] = "done" if b"done" in data else "aborted"  # one assignment: no torn read

    threading.Thread(target=listen, daemon=True).start()
    want, before = args["files"], args.get("before", {})
    pending = sorted(want)
    found = {}
    hashed = 0
    while pending:
        state = control["state"]
        if state == "aborted":  # the copy was stopped: no half-written file stays (its writer may be ending)
            swept = _node_sweep_temps(root, pending)
            time.sleep(0.5)
            swept += _node_sweep_temps(root, pending)
            return {"files": found, "deleted": deleted, "hashed_bytes": hashed, "aborted": True, "swept": swept}
        finished = state == "done"
        progressed = False
        for rel in list(pending):
            p = _node_path(root, rel)
            cur = ident(p)
            replaced = cur is not None and cur != before.get(rel) and cur[3] == want[rel][0]
            if not (replaced or finished):
                continue
            if cur is None:  # the copy finished and the file is not there
                pending.remove(rel)
                continue
            digest, n = _node_sha256(p)
            hashed += n
            if not finished and ident(p) != cur:
                continue  # replaced again while hashing: look at it once more
            found[rel] = [digest, cur[3], cur[2], cur[0], cur[1]]
            pending.remove(rel)
            progressed = True
        if pending and not progressed:
            time.sleep(0.05)
    cache_file = os.path.expanduser(args.get("cache") or "")
    if cache_file:
        cache = _node_read_cache(cache_file)
        racy = time.time_ns() - 2 * 10**9
        for rel in deleted:
            cache.pop(rel, None)
        for rel, (digest, size, mtime_ns, ino, dev) in found.items():
            if digest == want[rel][1] and mtime_ns < racy:
                cache[rel] = [size, mtime_ns, digest, ino, dev]
            else:
                cache.pop(rel, None)
        _node_write_cache(cache_file, cache)
    files = {rel: [e[0], e[1]] for rel, e in found.items()}
    return {"files": files, "deleted": deleted, "hashed_bytes": hashed, "aborted": False}


def verify_program(args: dict[str, object]) -> str:
    """The program run as ``python3 -c`` (its stdin carries the ``done`` signal)."""
    call = f"_verify_main(json.loads({json.dumps(args)!r}))"
    # os._exit: the stdin listener thread may still be blocked in read(); a normal interpreter shutdown
    # would abort on its buffer lock
    return _node_prelude() + _source(_verify_main) + (
        "\nimport json, os, sys\n"
        f"try:\n    out = json.dumps({call})\n"
        "except Exception as e:\n    sys.stderr.write(f'{type(e).__name__}: {e}\\n')\n    sys.stderr.flush()\n"
        "    os._exit(1)\n"
        "sys.stdout.write(out)\nsys.stdout.flush()\nos._exit(0)\n")
