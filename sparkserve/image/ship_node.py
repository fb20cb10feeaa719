"""The two programs `image ship` runs ON the nodes (standard library only; the source travels as
``python3 -c``, the arguments as one JSON argv item — never through a shell):

* ``send`` on the source node: listens on its fabric IP, runs ``docker save`` once and streams the save tar
  to every target that connects with its token, leaving out each layer that target already holds (its
  ChainIDs, read by the controller from the target's image inventory). The save is read once and fanned out:
  each target has its own writer thread and bounded queue, so one slow target does not stall the others'
  sockets, and a block is one bytes object shared by every queue. A layer is known before its bytes arrive —
  by its digest name (OCI saves) or, in a legacy save (docker <= 24 names layers by v1 ID), from the v1 ID its
  ``json`` member hashes to (:func:`_v1_diff`); only where that fails is a layer hashed while read and, for
  targets whose need depends on it, spooled once under ``workdir`` and fanned out from there. Writes
  ``workdir/port`` when it listens and ``workdir/progress`` (JSON: bytes per target) twice a second; prints a
  JSON summary (bytes sent and layer bytes left out, per target).
* ``recv`` on each target: connects to the source, sends its token and hands the socket to ``docker load`` as
  its stdin (no copy through Python); prints a JSON summary (docker load's exit code and last lines).

So image bytes go source node → target node directly (the fabric), never through the control machine.
"""

from __future__ import annotations

import inspect
import json

from sparkserve.nodes.base import Node, NodeError


def _send_main(args: dict) -> int:
    import json
    import os
    import subprocess
    import threading

    workdir = args["workdir"]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "pid"), "w") as f:  # the controller stops this process by it on Ctrl-C
        f.write(str(os.getpid()))
    conns = _accept(args)
    skipped = {name: 0 for name in conns}
    # one writer thread per target, each with a bounded queue: every target is fed at its own pace from the
    # one read of the save stream (a block is one bytes object shared by every queue, never copied per target)
    outs = {name: _Out(sock) for name, sock in conns.items()}
    done = threading.Event()

    def progress() -> None:
        while not done.wait(0.5):
            p = os.path.join(workdir, "progress.tmp")
            with open(p, "w") as f:
                json.dump({"sent": {n: o.sent for n, o in outs.items()}, "skipped": skipped}, f)
            os.replace(p, os.path.join(workdir, "progress"))

    threading.Thread(target=progress, daemon=True).start()
    save = subprocess.Popen([args["docker"], "save", args["ref"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert save.stdout is not None
        _fan_out(save.stdout, outs, args["layers"], _drops(args), skipped, workdir)
    finally:
        for o in outs.values():
            o.close()
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
    print(json.dumps({"save_rc": rc, "save_err": err, "sent": {n: o.sent for n, o in outs.items()},
                      "skipped": skipped, "send_errors": {n: o.error for n, o in outs.items() if o.error}}))
    return 0 if rc == 0 else 1


def _drops(args: dict) -> dict[str, set[str]]:
    """Per target, the diff_ids it needs none of: every position of that diff in the image is a ChainID the
    target already holds."""
    import hashlib

    layers = args["layers"]  # the source image's diff_ids, in order
    chains: list[str] = []
    for d in layers:
        chains.append(d if not chains else "sha256:" + hashlib.sha256(f"{chains[-1]} {d}".encode()).hexdigest())
    drop: dict[str, set[str]] = {}
    for t in args["targets"]:
        have = set(t["have_chains"])
        positions: dict[str, list[bool]] = {}
        for d, c in zip(layers, chains, strict=True):
            positions.setdefault(d, []).append(c in have)
        drop[t["name"]] = {d for d, present in positions.items() if all(present)}
    return drop


def read_token(conn) -> str:  # type: ignore[no-untyped-def]
    """The first line a peer sends (its token; at most 200 bytes, read byte by byte so nothing after it is
    consumed). Shared by the ship and the registry relay programs."""
    line = b""
    while not line.endswith(b"\n") and len(line) < 200:
        chunk = conn.recv(1)
        if not chunk:
            break
        line += chunk
    return line.strip().decode(errors="replace")


def _accept(args: dict) -> dict:
    """Listen on the fabric IP (``workdir/port`` says where), take one connection per target by its token."""
    import os
    import socket

    targets = {t["token"]: t for t in args["targets"]}
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((args["bind"], 0))
    srv.listen(len(targets))
    srv.settimeout(args.get("accept_timeout", 120))
    tmp = os.path.join(args["workdir"], "port.tmp")
    with open(tmp, "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.replace(tmp, os.path.join(args["workdir"], "port"))
    conns: dict[str, socket.socket] = {}
    while len(conns) < len(targets):
        conn, _ = srv.accept()
        conn.settimeout(args.get("io_timeout", 600))
        t = targets.get(read_token(conn))
        if t is None or t["name"] in conns:
            conn.close()
            continue
        conns[t["name"]] = conn
    srv.close()
    return conns


def _fan_out(stream, outs: dict, layers: list[str], drop: dict[str, set[str]], skipped: dict[str, int],  # type: ignore[no-untyped-def]
             workdir: str) -> None:
    """Read the ``docker save`` tar once and write to every target the members it needs (its own tar)."""
    import io
    import tarfile

    layer_set = set(layers)
    unseen = set(layers)
    named: dict[str, str] = {}  # legacy layer dir (v1 ID) -> diff_id, from its json member (_v1_diff)
    with tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 20) as src:
        for m in src:
            header = m.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
            if not m.isfile():
                for o in outs.values():
                    o.put(header)
                continue
            f = src.extractfile(m)
            assert f is not None
            folder, _, base = m.name.rpartition("/")
            is_layer = base == "layer.tar" or (folder == "blobs/sha256" and "sha256:" + base in layer_set)
            if not is_layer:  # manifest, config, json, VERSION; a blob that is no layer diff
                if base == "json" and m.size <= 1 << 20:
                    data = f.read()
                    diff = _v1_diff(data, folder, layers)
                    if diff is not None:
                        named[folder] = diff
                    f = io.BytesIO(data)
                _copy(f, header, m.size, list(outs.values()))
                continue
            known = "sha256:" + base if folder == "blobs/sha256" else named.get(folder)  # OCI: named by digest
            # a target that lacks every layer not seen yet needs this one whatever it is: stream it now;
            # the rest wait for the hash (a legacy layer whose v1 ID did not give it away) and get the spool
            if known is not None:
                sure = [n for n in outs if known not in drop[n]]
            else:
                sure = [n for n in outs if not drop[n] & unseen]
            later = [n for n in outs if n not in sure]
            diff = _layer(f, m, header, [outs[n] for n in sure], known, bool(later), workdir,
                          lambda d, later=later: [outs[n] for n in later if d not in drop[n]],
                          hash_it=any(drop.values()))
            unseen.discard(diff)
            for n in outs:
                if n not in sure and diff in drop[n]:
                    skipped[n] += m.size
    for o in outs.values():
        o.put(b"\0" * (2 * tarfile.BLOCKSIZE))  # the end of the archive


def _v1_diff(data: bytes, v1_id: str, layers: list[str]) -> str | None:
    """The diff_id of the legacy (docker <= 24) layer directory ``v1_id``, from its ``json`` member, which
    comes before its ``layer.tar``: docker names the directory ``sha256(`` the member's fields without ``id``,
    plus ``layer_id`` (the layer's ChainID) and ``parent`` (the parent's v1 ID), keys sorted ``)``
    (moby ``image/v1.CreateID``). Trying each ChainID of the image finds the one that gives the directory's
    name, so the layer is known before its bytes arrive: no hashing, no spool (None: none does — another
    docker; then the layer is hashed as it is read)."""
    import hashlib
    import json

    try:
        text = data.decode()
        dec = json.JSONDecoder()
        raw: dict[str, str] = {}
        i = text.index("{") + 1
        while True:
            while text[i] in " \t\r\n,":
                i += 1
            if text[i] == "}":
                break
            key, i = dec.raw_decode(text, i)
            i = text.index(":", i) + 1
            while text[i] in " \t\r\n":
                i += 1
            _, end = dec.raw_decode(text, i)
            raw[key] = text[i:end]
            i = end
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    raw.pop("id", None)
    parent = raw.get("parent")
    if parent is not None and json.loads(parent) and ":" not in json.loads(parent):
        raw["parent"] = json.dumps("sha256:" + json.loads(parent))
    chains: list[str] = []
    for d in layers:
        chains.append(d if not chains else "sha256:" + hashlib.sha256(f"{chains[-1]} {d}".encode()).hexdigest())
    # docker >= 20.10.x sets an intermediate layer's "os" only after naming it: try without it too
    variants = [raw, {k: v for k, v in raw.items() if k != "os"}] if "os" in raw else [raw]
    for diff, chain in zip(layers, chains, strict=True):
        for fields in variants:
            fields = {**fields, "layer_id": json.dumps(chain)}
            doc = "{" + ",".join(f"{json.dumps(k)}:{fields[k]}" for k in sorted(fields)) + "}"
            if hashlib.sha256(doc.encode()).hexdigest() == v1_id:
                return diff
    return None


def _copy(f, header: bytes, size: int, outs: list) -> None:  # type: ignore[no-untyped-def]
    """One member (its header, data, padding) to every ``outs``."""
    for o in outs:
        o.put(header)
    for block in iter(lambda: f.read(1 << 20), b""):
        for o in outs:
            o.put(block)
    for o in outs:
        o.put(b"\0" * (-size % 512))


def _layer(f, m, header: bytes, sure: list, known: str | None, spool_it: bool, workdir: str,  # type: ignore[no-untyped-def]
           needing, *, hash_it: bool = True) -> str:
    """A layer member: streamed to ``sure`` while read (and hashed, when its name is no digest); when others
    wait for the hash, spooled once and then fanned out to those that lack it (``needing(diff)``)."""
    import hashlib
    import tempfile

    spool = tempfile.TemporaryFile(dir=workdir) if spool_it and known is None else None  # noqa: SIM115
    try:
        for o in sure:
            o.put(header)
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            if known is None and hash_it:  # (no target holds any layer: nobody's need hangs on which it is)
                h.update(block)
            for o in sure:
                o.put(block)
            if spool is not None:
                spool.write(block)
        pad = b"\0" * (-m.size % 512)
        for o in sure:
            o.put(pad)
        diff = known or ("sha256:" + h.hexdigest() if hash_it else "")
        if spool is not None:  # read once, fanned out to every target that lacks it
            spool.seek(0)
            _copy(spool, header, m.size, needing(diff))
        return diff
    finally:
        if spool is not None:
            spool.close()


class _Out:
    """One target's socket, fed by its own thread from a bounded queue (``put`` blocks while it is full)."""

    def __init__(self, sock, depth: int = 32) -> None:  # type: ignore[no-untyped-def]
        import queue
        import threading

        self.sock, self.sent, self.error = sock, 0, ""
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, data: bytes) -> None:
        if data and not self.error:
            self.q.put(data)

    def _run(self) -> None:
        import contextlib
        import socket

        while True:
            data = self.q.get()
            if data is None:
                break
            if self.error:
                continue  # drain: the target is gone, the others go on
            try:
                self.sock.sendall(data)
                self.sent += len(data)
            except OSError as e:
                self.error = str(e)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()


def _recv_main(args: dict) -> int:
    import json
    import socket
    import subprocess

    sock = socket.create_connection((args["host"], args["port"]), timeout=args.get("io_timeout", 600))
    sock.sendall(args["token"].encode() + b"\n")
    sock.settimeout(None)  # a blocking socket, handed to `docker load` as its stdin: no copy through here
    load = subprocess.Popen([args["docker"], "load"], stdin=sock.fileno(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert load.stdout is not None
    out = load.stdout.read().decode(errors="replace").strip().splitlines()[-5:]
    rc = load.wait()
    sock.close()
    print(json.dumps({"load_rc": rc, "load_out": out}))
    return rc


def read_progress(node: Node, job: str) -> dict[str, int]:
    """Bytes per target so far, from ``job/progress`` on ``node`` (empty until the first write)."""
    try:
        return dict(json.loads(node.read_text(f"{job}/progress")).get("sent") or {})
    except (NodeError, OSError, ValueError):
        return {}


def last_json(text: str) -> dict | None:
    """The JSON summary a node program printed last (None: it printed none, e.g. it was killed)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except ValueError:
                return None
    return None


def send_program(args: dict) -> list[str]:
    """The argv that runs ``send`` on the source node."""
    return _program(_send_main, args)


def recv_program(args: dict) -> list[str]:
    """The argv that runs ``recv`` on a target node."""
    return _program(_recv_main, args)


def _program(main, args: dict) -> list[str]:
    parts = (_Out, _drops, read_token, _accept, _fan_out, _v1_diff, _copy, _layer, main)
    src = "\n\n".join(inspect.getsource(f) for f in parts)
    src += f"\n\nimport json, sys\nsys.exit({main.__name__}(json.loads(sys.argv[1])))\n"
    return ["python3", "-c", src, json.dumps(args)]
