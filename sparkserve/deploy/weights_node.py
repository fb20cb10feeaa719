"""The programs `sparkserve weights` runs ON the nodes (standard library only, except :func:`node_pull`, which
imports ``huggingface_hub`` on the head; shipped by source as ``python3 -c`` with one JSON argv item):

* :func:`node_pull` (head): each file fetched into the head's HF cache as huggingface_hub names it (its URL,
  metadata and headers), resumable, an LFS file checked against its sha256; then ``snapshot_download`` at the
  commit the revision resolved to makes the snapshot; the token read from stdin (never argv), ``HF_ENDPOINT``
  honoured; ``workdir/progress`` twice a second.
* :func:`node_inventory` (every node): what a directory holds — whole files (size), partial files
  (``<name>.sparkserve-part``, their size: where a resumed ship starts), symlinks (their targets).
* :func:`node_recv` (each target, in its fabric namespace): listens on its fabric IP, takes ``streams``
  connections that present the token (both ends read it from stdin), writes each file's bytes from the offset
  it is told into its part file, renames it into place when whole; creates the directories and symlinks first.
* :func:`node_send` (the head, in its fabric namespace): ``streams`` connections to the target, files from one
  queue, each sent with ``sendfile`` from its offset (``bwlimit`` bytes/s in all, 0: none);
  ``workdir/progress`` twice a second.

Content hashes come from :mod:`sparkserve.deploy.sync_remote`'s manifest program (the drafter sync's, cached per
file by size, mtime and inode), run on each node where the bytes are.
"""

from __future__ import annotations

PART = ".sparkserve-part"


def _pid_line() -> str:
    """``PID START``: the pid and its start time in clock ticks (``/proc/PID/stat`` field 22), so the controller
    stops this process by it only while the pid is still this process, never one that reused the pid."""
    import os

    with open(f"/proc/{os.getpid()}/stat") as f:
        start = f.read().rsplit(") ", 1)[1].split()[19]
    return f"{os.getpid()} {start}\n"


def _progress_writer(workdir: str, get):  # type: ignore[no-untyped-def]
    """A thread writing ``workdir/progress`` (JSON from ``get()``) twice a second until the returned event is set."""
    import json
    import os
    import threading

    done = threading.Event()

    def loop() -> None:
        while True:
            tmp = os.path.join(workdir, "progress.tmp")
            with open(tmp, "w") as f:
                json.dump(get(), f)
            os.replace(tmp, os.path.join(workdir, "progress"))
            if done.wait(0.5):
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return done, t


def node_pull(args: dict) -> dict:  # type: ignore[type-arg]
    import os
    import sys

    if args.get("endpoint"):
        os.environ["HF_ENDPOINT"] = args["endpoint"]
    if args.get("hub_cache"):
        os.environ["HF_HUB_CACHE"] = os.path.expanduser(args["hub_cache"])
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import huggingface_hub as hf
    except ImportError:
        raise RuntimeError("huggingface_hub is not installed for this python on the head: `python3 -m pip install "
                           "--user huggingface_hub`, or name another python with --python") from None
    from huggingface_hub import constants

    token = sys.stdin.readline().strip() or None
    workdir = args["workdir"]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "pid"), "w") as f:  # the controller stops this process by it on Ctrl-C
        f.write(_pid_line())
    api = hf.HfApi(token=token)
    info = api.model_info(args["repo"], revision=args.get("revision") or None, files_metadata=True, token=token)
    sha = info.sha
    total = sum((s.size or 0) for s in (info.siblings or []))
    repo_dir = os.path.join(constants.HF_HUB_CACHE, "models--" + args["repo"].replace("/", "--"))

    def size(p: str) -> int:
        try:
            return os.stat(p).st_size
        except OSError:  # a blob renamed while counted
            return 0

    def done_bytes() -> dict:  # type: ignore[type-arg]
        n = sum(size(os.path.join(d, name)) for d, _, names in os.walk(os.path.join(repo_dir, "blobs"))
                for name in names)
        return {"done": min(n, total), "total": total}

    def fetch(name: str) -> None:
        """One file into ``blobs/<etag>`` as huggingface_hub names it, resumable: the bytes go to
        ``<etag>.sparkserve-part`` first and a new pull asks only for the rest (``Range``). (huggingface_hub
        itself downloads into a per-process temporary file, so a stopped pull would start over.)"""
        import hashlib
        import urllib.request

        url = hf.hf_hub_url(args["repo"], name, revision=sha)
        meta = hf.get_hf_file_metadata(url, token=token)
        if not meta.etag:
            return  # huggingface_hub's own download below handles it
        blob = os.path.join(repo_dir, "blobs", meta.etag)
        if os.path.exists(blob):
            return
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        part = blob + PART
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if meta.size is not None and have > meta.size:
            os.unlink(part)
            have = 0
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers(token=token)
        if have:
            headers["Range"] = f"bytes={have}-"
        req = urllib.request.Request(meta.location or url, headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r, open(part, "ab" if have and r.status == 206 else "wb") as f:
            while chunk := r.read(1 << 22):
                f.write(chunk)
        if meta.size is not None and os.path.getsize(part) != meta.size:
            raise RuntimeError(f"{name}: {os.path.getsize(part)} bytes, the Hub says {meta.size}")
        if len(meta.etag) == 64:  # an LFS file: its etag is the sha256 of its bytes
            h = hashlib.sha256()
            with open(part, "rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
            if h.hexdigest() != meta.etag:
                os.unlink(part)
                raise RuntimeError(f"{name}: sha256 {h.hexdigest()} is not the Hub's {meta.etag} (removed; pull again)")
        os.replace(part, blob)

    stop, t = _progress_writer(workdir, done_bytes)
    try:
        from concurrent.futures import ThreadPoolExecutor

        names = [s.rfilename for s in (info.siblings or [])]
        with ThreadPoolExecutor(max(1, min(int(args.get("workers") or 8), len(names)))) as pool:
            list(pool.map(fetch, names))
        # every blob is there now: this makes the snapshot's links and refs, as the cache wants them
        path = hf.snapshot_download(args["repo"], revision=sha, token=token,
                                    max_workers=int(args.get("workers") or 8))
    finally:
        stop.set()
        t.join()
    return {"repo": args["repo"], "revision": sha, "path": path, "repo_dir": repo_dir, "bytes": total}


def node_inventory(args: dict) -> dict:  # type: ignore[type-arg]
    import os

    root = os.path.expanduser(args["root"])
    files, parts, links, dirs = {}, {}, {}, []
    for d, dirnames, names in os.walk(root):
        dirnames.sort()
        rel_d = os.path.relpath(d, root)
        if rel_d != ".":
            dirs.append(rel_d)
        for name in list(dirnames) + names:
            p = os.path.join(d, name)
            rel = os.path.normpath(os.path.join(rel_d, name))
            if os.path.islink(p):
                links[rel] = os.readlink(p)
            elif name in names and os.path.isfile(p):
                if rel.endswith(PART):
                    parts[rel[: -len(PART)]] = os.stat(p).st_size
                else:
                    files[rel] = os.stat(p).st_size
    probe = root
    while probe and not os.path.isdir(probe):
        probe = os.path.dirname(probe.rstrip("/"))
    st = os.statvfs(probe or "/")
    return {"root": root, "exists": os.path.isdir(root), "files": files, "parts": parts, "links": links,
            "dirs": sorted(dirs), "free": st.f_bavail * st.f_frsize}


def _safe(root: str, rel: str) -> str:
    import os

    p = os.path.normpath(os.path.join(root, rel))
    if not (p == root or p.startswith(root.rstrip("/") + "/")):
        raise ValueError(f"{rel}: outside {root}")
    return p


def node_recv(args: dict) -> dict:  # type: ignore[type-arg]
    import json
    import os
    import socket
    import sys
    import threading

    token = sys.stdin.readline().strip()  # the connection token on stdin: not in argv, where `ps` shows it
    root = os.path.expanduser(args["root"])
    workdir = args["workdir"]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "recv.pid"), "w") as f:
        f.write(_pid_line())
    for rel in args.get("dirs", []):
        os.makedirs(_safe(root, rel), exist_ok=True)
    os.makedirs(root, exist_ok=True)
    for rel, target in args.get("links", {}).items():
        p = _safe(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if os.path.islink(p) and os.readlink(p) == target:
            continue
        if os.path.lexists(p):
            os.unlink(p)
        os.symlink(target, p)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((args["ip"], 0))
    srv.listen(64)
    srv.settimeout(float(args.get("accept_s", 60)))
    with open(os.path.join(workdir, "port.tmp"), "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.replace(os.path.join(workdir, "port.tmp"), os.path.join(workdir, "port"))
    received = [0]
    done_files: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def exact(conn: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the sender closed the connection")
            buf += chunk
        return buf

    def frame(conn: socket.socket) -> dict:  # type: ignore[type-arg]
        import struct

        (n,) = struct.unpack("!I", exact(conn, 4))
        return json.loads(exact(conn, n))

    def body(conn: socket.socket, fd: int, left: int, rel: str, size: int) -> None:
        # socket → pipe → file with splice (no copy through Python) where the kernel has it, else recv_into
        splice = getattr(os, "splice", None)
        if splice is not None:
            r, w = os.pipe()
            try:
                try:
                    import fcntl

                    fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
                except OSError:
                    pass
                while left > 0:
                    n = splice(conn.fileno(), w, min(left, 1 << 20))
                    if n == 0:
                        raise ConnectionError(f"{rel}: the sender stopped at {size - left} of {size} bytes")
                    m = 0
                    while m < n:
                        m += splice(r, fd, n - m)
                    left -= n
                    with lock:
                        received[0] += n
            finally:
                os.close(r)
                os.close(w)
            return
        buf = memoryview(bytearray(1 << 22))
        while left > 0:
            n = conn.recv_into(buf, min(left, len(buf)))
            if n == 0:
                raise ConnectionError(f"{rel}: the sender stopped at {size - left} of {size} bytes")
            os.write(fd, buf[:n])
            left -= n
            with lock:
                received[0] += n

    def serve(conn: socket.socket) -> None:
        try:
            if frame(conn).get("token") != token:
                return
            while True:
                hdr = frame(conn)
                if hdr.get("end"):
                    return
                rel, size, offset = hdr["rel"], int(hdr["size"]), int(hdr["offset"])
                final = _safe(root, rel)
                part = final + PART
                os.makedirs(os.path.dirname(final), exist_ok=True)
                fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.ftruncate(fd, offset)
                    os.lseek(fd, offset, 0)
                    body(conn, fd, size - offset, rel, size)
                finally:
                    os.close(fd)
                if hdr.get("mtime_ns"):
                    os.utime(part, ns=(int(hdr["mtime_ns"]), int(hdr["mtime_ns"])))
                os.replace(part, final)
                with lock:
                    done_files.append(rel)
        except Exception as e:  # one stream's failure is reported; the parts it wrote stay for a resume
            with lock:
                errors.append(f"{type(e).__name__}: {e}")
        finally:
            conn.close()

    threads = []
    try:
        for _ in range(int(args["streams"])):
            conn, _ = srv.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            t = threading.Thread(target=serve, args=(conn,), daemon=True)
            t.start()
            threads.append(t)
    except OSError as e:
        errors.append(f"accept: {e}")
    finally:
        srv.close()
    for t in threads:
        t.join()
    return {"received": received[0], "files": sorted(done_files), "errors": errors}


def node_send(args: dict) -> dict:  # type: ignore[type-arg]
    import json
    import os
    import queue
    import socket
    import struct
    import sys
    import threading
    import time

    token = sys.stdin.readline().strip()  # as node_recv's
    root = os.path.expanduser(args["root"])
    workdir = args["workdir"]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "pid"), "w") as f:
        f.write(_pid_line())
    todo: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    for rel, size, offset in sorted(args["files"], key=lambda x: -(x[1] - x[2])):
        todo.put((rel, int(size), int(offset)))
    sent = [0]
    lock = threading.Lock()
    errors: list[str] = []
    limit = float(args.get("bwlimit") or 0)
    t0 = time.monotonic()
    stop, pt = _progress_writer(workdir, lambda: {"sent": sent[0], "total": int(args["total"])})

    def pace(n: int) -> None:
        with lock:
            sent[0] += n
            ahead = sent[0] / limit - (time.monotonic() - t0) if limit else 0
        if ahead > 0:
            time.sleep(ahead)

    def stream() -> None:
        try:
            sock = socket.create_connection((args["ip"], int(args["port"])), timeout=60)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            def send_frame(obj: dict) -> None:  # type: ignore[type-arg]
                data = json.dumps(obj).encode()
                sock.sendall(struct.pack("!I", len(data)) + data)

            send_frame({"token": token})
            while True:
                try:
                    rel, size, offset = todo.get_nowait()
                except queue.Empty:
                    break
                p = _safe(root, rel)
                with open(p, "rb") as f:
                    st = os.fstat(f.fileno())
                    if st.st_size != size:
                        raise RuntimeError(f"{rel}: changed while shipping ({st.st_size} bytes, not {size})")
                    send_frame({"rel": rel, "size": size, "offset": offset, "mtime_ns": st.st_mtime_ns})
                    pos = offset
                    step = (1 << 20) if limit else (64 << 20)
                    while pos < size:
                        n = sock.sendfile(f, pos, min(step, size - pos))
                        if n == 0:
                            raise ConnectionError(f"{rel}: the receiver closed the connection")
                        pos += n
                        pace(n)
            send_frame({"end": True})
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1)
            sock.close()
        except Exception as e:
            with lock:
                errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(int(args["streams"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    pt.join()
    return {"sent": sent[0], "seconds": time.monotonic() - t0, "errors": errors}

