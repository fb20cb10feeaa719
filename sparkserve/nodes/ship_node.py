"""The two programs `image ship` runs ON the nodes (standard library only; the source travels as
``python3 -c``, the arguments as one JSON argv item — never through a shell):

* ``send`` on the source node: listens on its fabric IP, runs ``docker save`` once and streams the save tar
  to every target that connects with its token, leaving out each layer that target already holds (its
  ChainIDs, read by the controller from the target's image inventory). Layer members are spooled once
  to a temp file under ``workdir`` while hashed (docker <= 24 names legacy layers by v1 ID, so the diff_id
  is known only after reading), then sent to the targets that lack them. Writes ``workdir/port`` when it
  listens and ``workdir/progress`` (JSON: bytes per target) twice a second; prints a JSON summary.
* ``recv`` on each target: connects to the source, sends its token, pipes the stream into ``docker load``
  and prints a JSON summary (bytes, docker load's exit code and last lines).

So image bytes go source node → target node directly (the fabric), never through the control machine.
"""

from __future__ import annotations

import inspect
import json


def _send_main(args: dict) -> int:
    import contextlib
    import hashlib
    import json
    import os
    import socket
    import subprocess
    import tarfile
    import tempfile
    import threading
    import time

    # the tar end is two zero blocks; tarfile would pad the stream to 10 KiB records on top (bytes on the
    # wire for nothing: a one-layer change of a few KB would cost 10 KB more)
    tarfile.RECORDSIZE = tarfile.BLOCKSIZE
    workdir = args["workdir"]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "pid"), "w") as f:  # the controller stops this process by it on Ctrl-C
        f.write(str(os.getpid()))
    layers = args["layers"]  # the source image's diff_ids, in order
    chains: list[str] = []
    for d in layers:
        chains.append(d if not chains else "sha256:" + hashlib.sha256(f"{chains[-1]} {d}".encode()).hexdigest())
    targets = {t["token"]: t for t in args["targets"]}
    drop: dict[str, set[str]] = {}
    for t in args["targets"]:
        have = set(t["have_chains"])
        positions: dict[str, list[bool]] = {}
        for d, c in zip(layers, chains, strict=True):
            positions.setdefault(d, []).append(c in have)
        drop[t["name"]] = {d for d, present in positions.items() if all(present)}

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((args["bind"], 0))
    srv.listen(len(targets))
    srv.settimeout(args.get("accept_timeout", 120))
    tmp = os.path.join(workdir, "port.tmp")
    with open(tmp, "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.replace(tmp, os.path.join(workdir, "port"))

    conns: dict[str, socket.socket] = {}
    while len(conns) < len(targets):
        conn, _ = srv.accept()
        conn.settimeout(args.get("io_timeout", 600))
        token = b""
        while not token.endswith(b"\n") and len(token) < 200:
            chunk = conn.recv(1)
            if not chunk:
                break
            token += chunk
        t = targets.get(token.strip().decode(errors="replace"))
        if t is None or t["name"] in conns:
            conn.close()
            continue
        conns[t["name"]] = conn
    srv.close()

    sent = {name: 0 for name in conns}
    skipped = {name: 0 for name in conns}

    class Counted:
        def __init__(self, name: str, sock: socket.socket) -> None:
            self.name, self.sock = name, sock

        def write(self, b: bytes) -> int:
            self.sock.sendall(b)
            sent[self.name] += len(b)
            return len(b)

    writers = {name: tarfile.open(fileobj=Counted(name, s), mode="w|", format=tarfile.PAX_FORMAT)  # noqa: SIM115
               for name, s in conns.items()}
    done = threading.Event()

    def progress() -> None:
        while not done.wait(0.5):
            p = os.path.join(workdir, "progress.tmp")
            with open(p, "w") as f:
                json.dump({"sent": sent, "skipped": skipped}, f)
            os.replace(p, os.path.join(workdir, "progress"))

    threading.Thread(target=progress, daemon=True).start()
    save = subprocess.Popen([args["docker"], "save", args["ref"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    layer_set = set(layers)
    unseen = set(layers)
    try:
        assert save.stdout is not None
        with tarfile.open(fileobj=save.stdout, mode="r|") as src:
            for m in src:
                if not m.isfile():
                    for w in writers.values():
                        w.addfile(m)
                    continue
                f = src.extractfile(m)
                assert f is not None
                base = m.name.rsplit("/", 1)[-1]
                is_layer = m.name.endswith("/layer.tar") or (
                    m.name.startswith("blobs/sha256/") and "sha256:" + base in layer_set)
                if not is_layer and m.size <= 1 << 20:  # manifest, config, json, VERSION
                    data = f.read()
                    for w in writers.values():
                        w.addfile(m, _bytes_io(data))
                    continue
                if not is_layer:  # a blob that is no layer diff (a compressed layer of the containerd store)
                    for w in writers.values():
                        _header(w, m)
                    for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023 (f is this member's)
                        for w in writers.values():
                            w.fileobj.write(block)
                    for w in writers.values():
                        _end(w, m.size)
                    continue
                known = "sha256:" + base if m.name.startswith("blobs/sha256/") else None  # OCI: named by digest
                # a target that lacks every layer not seen yet needs this one whatever it is: stream it now;
                # the rest wait for the hash (legacy saves name layers by v1 ID) and get the spool
                if known is not None:
                    sure = [n for n in writers if known not in drop[n]]
                else:
                    sure = [n for n in writers if not drop[n] & unseen]
                later = [n for n in writers if n not in sure]
                spool = tempfile.NamedTemporaryFile(dir=workdir) if later and known is None else None  # noqa: SIM115
                try:
                    for n in sure:
                        _header(writers[n], m)
                    h = hashlib.sha256()
                    for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023 (f is this member's)
                        if known is None:
                            h.update(block)
                        for n in sure:
                            writers[n].fileobj.write(block)
                        if spool is not None:
                            spool.write(block)
                    for n in sure:
                        _end(writers[n], m.size)
                    diff = known or "sha256:" + h.hexdigest()
                    unseen.discard(diff)
                    if spool is not None:
                        spool.flush()
                    sends = []
                    for n in later:
                        if diff in drop[n]:
                            skipped[n] += m.size
                        else:
                            sends.append(threading.Thread(target=_send_spool, args=(writers[n], m, spool.name)))
                    for t in sends:
                        t.start()
                    for t in sends:
                        t.join()
                finally:
                    if spool is not None:
                        spool.close()
        for w in writers.values():
            w.close()
    finally:
        for s in conns.values():
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_WR)
        rc = save.wait()
        done.set()
    err = save.stderr.read().decode(errors="replace").strip().splitlines()[-5:] if save.stderr else []
    # wait until every target has read to the end (it closes its side after docker load has finished)
    for s in conns.values():
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
        s.close()
    time.sleep(0)
    print(json.dumps({"save_rc": rc, "save_err": err, "sent": sent, "skipped": skipped}))
    return 0 if rc == 0 else 1


def _header(w, m) -> None:
    """Write member ``m``'s tar header into stream-mode TarFile ``w`` (its data follows, then :func:`_end`)."""
    buf = m.tobuf(w.format, w.encoding, w.errors)
    w.fileobj.write(buf)
    w.offset += len(buf)


def _end(w, size: int) -> None:
    import tarfile

    pad = -size % tarfile.BLOCKSIZE
    if pad:
        w.fileobj.write(b"\0" * pad)
    w.offset += size + pad


def _send_spool(w, m, path: str) -> None:
    with open(path, "rb") as f:
        w.addfile(m, f)


def _bytes_io(data: bytes):
    import io

    return io.BytesIO(data)


def _recv_main(args: dict) -> int:
    import contextlib
    import json
    import socket
    import subprocess

    sock = socket.create_connection((args["host"], args["port"]), timeout=args.get("io_timeout", 600))
    sock.sendall(args["token"].encode() + b"\n")
    load = subprocess.Popen([args["docker"], "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert load.stdin is not None and load.stdout is not None
    got = 0
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
            load.stdin.write(chunk)
    except BrokenPipeError:
        pass
    finally:
        with contextlib.suppress(BrokenPipeError):
            load.stdin.close()
    out = load.stdout.read().decode(errors="replace").strip().splitlines()[-5:]
    rc = load.wait()
    sock.close()
    print(json.dumps({"bytes": got, "load_rc": rc, "load_out": out}))
    return rc


def send_program(args: dict) -> list[str]:
    """The argv that runs ``send`` on the source node."""
    return _program(_send_main, args)


def recv_program(args: dict) -> list[str]:
    """The argv that runs ``recv`` on a target node."""
    return _program(_recv_main, args)


def _program(main, args: dict) -> list[str]:
    src = "\n\n".join(inspect.getsource(f) for f in (_header, _end, _send_spool, _bytes_io, main))
    src += f"\n\nimport json, sys\nsys.exit({main.__name__}(json.loads(sys.argv[1])))\n"
    return ["python3", "-c", src, json.dumps(args)]
