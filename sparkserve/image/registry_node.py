"""The two programs `image ship --via registry` runs ON the nodes (standard library only; the source travels
as ``python3 -c``, the arguments as one JSON argv item — never through a shell):

* ``serve`` on the source node: starts a throwaway registry (Debian's ``docker-registry``, distribution
  2.x) on ``127.0.0.1:<free port>`` with its storage under ``workdir``, pushes the image into it under a
  temporary name, untags that name again, and relays the fabric to it: it listens on ``bind`` (its fabric
  IP) and lets a connection through only after the line ``<token>\\n`` of one of the targets, counting the
  bytes each target receives (``workdir/progress``, JSON, twice a second — the same file the stream ship
  writes). It writes ``workdir/ready`` (JSON: relay port, push seconds) when the targets may pull, then
  serves until its stdin ends (the controller is done, or gone) or a signal arrives; then it stops the
  registry, removes every temporary tag and ``workdir``, and prints a JSON summary.
* ``pull`` on each target: listens on ``127.0.0.1:<free port>`` (docker talks plain HTTP to loopback
  registries without configuration) and relays each connection to the source's relay with its token, runs
  ``docker pull`` of the temporary name through it (docker fetches only the layers it does not hold),
  tags the result as the real reference, removes the temporary name, and prints a JSON summary. Its stdin
  ending before it is done (the controller gave up) stops the pull; a signal does too.

So image bytes go source node → target node directly (the fabric), never through the control machine, and
a registry reachable from the fabric only with a target's token.
"""

from __future__ import annotations

import inspect
import json

from sparkserve.image.ship_node import read_token


def _relay(a, b, count) -> None:  # type: ignore[no-untyped-def]
    """Copy socket ``a`` to socket ``b`` until ``a`` ends; ``count(n)`` for every chunk; half-close ``b``."""
    import contextlib
    import socket

    try:
        while True:
            chunk = a.recv(1 << 20)
            if not chunk:
                break
            b.sendall(chunk)
            count(len(chunk))
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)


def _pipe_pair(a, b, count_ab, count_ba) -> None:  # type: ignore[no-untyped-def]
    """Relay both ways between sockets ``a`` and ``b`` (one thread each), then close both."""
    import threading

    t = threading.Thread(target=_relay, args=(b, a, count_ba), daemon=True)
    t.start()
    _relay(a, b, count_ab)
    t.join()
    a.close()
    b.close()


def _on_signals(stop) -> None:  # type: ignore[no-untyped-def]
    """SIGINT, SIGTERM, SIGHUP — and the end of stdin (the controller is done, gave up, or is gone: its SSH
    channel closed) — set ``stop`` and raise SystemExit in the main thread, wherever it is (a ``docker
    push`` in ``subprocess.run`` is killed by it); the caller's ``finally`` cleans up."""
    import os
    import signal
    import threading

    def handler(signum, frame):  # type: ignore[no-untyped-def]
        if stop.is_set():
            return  # a second signal during cleanup: cleanup must finish
        stop.set()
        raise SystemExit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)

    def watch_stdin() -> None:
        while os.read(0, 65536):  # raw reads: a buffered reader's lock would outlive this daemon thread
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_stdin, daemon=True).start()


def _free_port(host: str) -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _write_json(path: str, data: dict) -> None:
    import json
    import os

    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _start_registry(program: str, job: str, held: dict) -> int:
    """Start the registry on a free loopback port with its storage under ``job`` (``held["registry"]``: the
    process, for the caller's cleanup) and wait until it answers; its port. RuntimeError (with the log's
    last lines) when it does not start."""
    import os
    import subprocess
    import time
    import urllib.request

    port = _free_port("127.0.0.1")
    config = {"version": 0.1, "log": {"level": "error", "accesslog": {"disabled": True}},
              "storage": {"filesystem": {"rootdirectory": os.path.join(job, "data")},
                          "maintenance": {"uploadpurging": {"enabled": False}}},
              "http": {"addr": f"127.0.0.1:{port}"}}
    _write_json(os.path.join(job, "config.yml"), config)  # JSON is YAML
    with open(os.path.join(job, "registry.log"), "wb") as log:
        held["registry"] = proc = subprocess.Popen([program, "serve", os.path.join(job, "config.yml")],
                                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
                if r.status == 200:
                    return port
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(os.path.join(job, "registry.log"), errors="replace") as f:
                raise RuntimeError("the registry did not start", *f.read().strip().splitlines()[-5:])
        time.sleep(0.1)


def _accept_each(srv, stop, admit) -> None:  # type: ignore[no-untyped-def]
    """Accept connections on ``srv`` until ``stop`` is set, each handed to ``admit`` in its own thread."""
    import threading

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=admit, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def _token_relay(bind: str, port: int, tokens: dict, sent: dict, stop):  # type: ignore[no-untyped-def]
    """Listen on ``bind`` (the fabric IP) and relay to the registry on ``127.0.0.1:port`` only a connection
    that first sends ``<token>\\n`` of a target, counting the bytes that target receives; the listening socket."""
    import contextlib
    import socket

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, 0))
    srv.listen(64)

    def admit(conn) -> None:  # type: ignore[no-untyped-def]
        conn.settimeout(30)
        token = ""
        with contextlib.suppress(OSError):
            token = read_token(conn)
        name = tokens.get(token)
        if name is None:
            conn.close()
            return
        conn.settimeout(None)
        try:
            up = socket.create_connection(("127.0.0.1", port), timeout=30)
        except OSError:
            conn.close()
            return
        up.settimeout(None)

        def count(n: int) -> None:
            sent[name] += n

        _pipe_pair(up, conn, count, lambda n: None)

    _accept_each(srv, stop, admit)
    return srv


def _serve_main(args: dict) -> int:
    import os
    import shutil
    import subprocess
    import threading
    import time

    job, docker = args["workdir"], args["docker"]
    stop = threading.Event()
    _on_signals(stop)
    os.makedirs(job, exist_ok=True)
    _write_json(os.path.join(job, "pid.json"), {"pid": os.getpid()})
    sent = {t["name"]: 0 for t in args["targets"]}
    summary: dict = {"ok": False, "sent": sent}
    held: dict = {}
    srv = temp = None
    try:
        try:
            port = _start_registry(args["registry"], job, held)
        except RuntimeError as e:
            summary["error"] = list(e.args)
            return 1
        srv = _token_relay(args["bind"], port, {t["token"]: t["name"] for t in args["targets"]}, sent, stop)

        def progress() -> None:
            while not stop.wait(0.5):
                _write_json(os.path.join(job, "progress"), {"sent": sent})

        threading.Thread(target=progress, daemon=True).start()
        temp = f"127.0.0.1:{port}/{args['repo']}:{args['tag']}"
        t0 = time.monotonic()
        res = subprocess.run([docker, "tag", args["ref"], temp], capture_output=True, text=True)
        if res.returncode == 0:
            res = subprocess.run([docker, "push", temp], capture_output=True, text=True)
        summary["push_seconds"] = round(time.monotonic() - t0, 3)
        if res.returncode != 0:
            summary["error"] = ["docker push into the temporary registry failed",
                                *(res.stderr or res.stdout).strip().splitlines()[-5:]]
            return 1
        subprocess.run([docker, "rmi", temp], capture_output=True)  # the image keeps its own tags
        temp = None
        _write_json(os.path.join(job, "ready"), {"port": srv.getsockname()[1],
                                                  "push_seconds": summary["push_seconds"]})
        summary["ok"] = True
        try:
            while True:  # until the controller is done (or gone): stdin's end is a SIGTERM (_on_signals)
                time.sleep(3600)
        except SystemExit:
            return 0
    finally:
        stop.set()
        if srv is not None:
            srv.close()
        if temp is not None:
            subprocess.run([docker, "rmi", temp], capture_output=True)
        registry = held.get("registry")
        if registry is not None and registry.poll() is None:
            registry.terminate()
            try:
                registry.wait(10)
            except subprocess.TimeoutExpired:
                registry.kill()
                registry.wait()
        shutil.rmtree(job, ignore_errors=True)
        print(json.dumps(summary), flush=True)


def _pull_main(args: dict) -> int:
    import contextlib
    import socket
    import subprocess
    import threading

    stop = threading.Event()
    _on_signals(stop)
    docker = args["docker"]
    got = [0]
    lock = threading.Lock()
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]

    def count(n: int) -> None:
        with lock:
            got[0] += n

    def admit(conn) -> None:  # type: ignore[no-untyped-def]
        try:
            up = socket.create_connection((args["host"], args["port"]), timeout=30)
            up.sendall(args["token"].encode() + b"\n")
        except OSError:
            conn.close()
            return
        up.settimeout(None)
        _pipe_pair(up, conn, count, lambda n: None)

    _accept_each(srv, stop, admit)
    temp = f"127.0.0.1:{port}/{args['repo']}:{args['tag']}"
    summary: dict = {"ok": False}
    pull = None

    try:
        pull = subprocess.Popen([docker, "pull", temp], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        out, _ = pull.communicate()
        summary["pull_rc"] = pull.returncode
        summary["pull_out"] = out.strip().splitlines()[-5:]
        if pull.returncode == 0:
            res = subprocess.run([docker, "tag", temp, args["ref"]], capture_output=True, text=True)
            summary["tag_rc"] = res.returncode
            summary["ok"] = res.returncode == 0
        return 0 if summary["ok"] else 1
    finally:
        stop.set()
        if pull is not None and pull.poll() is None:
            pull.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                pull.wait(30)
        srv.close()
        subprocess.run([docker, "rmi", temp], capture_output=True)  # the temporary name (and its digest)
        summary["bytes"] = got[0]
        print(json.dumps(summary), flush=True)


def serve_program(args: dict) -> list[str]:
    """The argv that runs ``serve`` on the source node."""
    return _program(_serve_main, args)


def pull_program(args: dict) -> list[str]:
    """The argv that runs ``pull`` on a target node."""
    return _program(_pull_main, args)


def _program(main, args: dict) -> list[str]:  # type: ignore[no-untyped-def]
    helpers = (read_token, _relay, _pipe_pair, _on_signals, _free_port, _write_json, _start_registry, _accept_each,
               _token_relay, main)
    src = "import json\n\n" + "\n\n".join(inspect.getsource(f) for f in helpers)
    # os._exit: the relay threads are daemons blocked in socket calls; nothing is left to flush but stdout
    src += (f"\n\nimport os, sys\nrc = {main.__name__}(json.loads(sys.argv[1]))\nsys.stdout.flush()\n"
            "os._exit(rc)\n")
    return ["python3", "-c", src, json.dumps(args)]
