"""The node-side half of ``runtime: process``: one stdlib-only program, shipped by source, run as
``python3 -c PROGRAM`` on the node (over its SSH, or locally) with its question as JSON on stdin.

    reply = run_remote(node, {"verb": "look", "root": "~/.local/state/sparkserve/run", "ids": [...]})

Verbs (each answers one JSON object on stdout):

* ``start`` — resolve the executable (a name on the node's PATH, a path, or a venv dir → ``<dir>/bin/vllm``),
  open the rank's log (truncated: one log per boot), fork a supervisor that calls ``setsid()`` (its own
  session and process group, so the engine outlives the SSH session) and forks the engine with the given
  argv and env (plus :data:`MARKER_ENV`, which every process of the rank inherits), then write the manifest
  beside the log and answer it. The supervisor ignores SIGINT/SIGTERM/SIGHUP, relays the engine's output
  into the log, noting when each chunk arrived (``rank<R>.stamps``: per-line times, as docker has), and
  writes the engine's exit status (``rank<R>.exit``). An exec failure is answered as an error; nothing
  stays behind.
* ``look`` — for each id: the manifest, whether the engine lives (pid alive, not a zombie, the same start
  time from ``/proc/<pid>/stat``, the same boot id: a reused pid is not ours), its exit status, and (with
  ``offsets``) the log and stamps bytes from the offsets given, base64. An engine that has exited while its
  supervisor still relays its last output is waited for (bounded) until the exit status is written: a stopped
  rank's log then holds the lines that say why it stopped, as a stopped container's does.
* ``list`` — every manifest under the root, as ``look`` answers it.
* ``stop`` — SIGINT, then SIGTERM, then SIGKILL (each after ``timeout_s``) to the rank's processes: its
  process group when the recorded supervisor still is the group's leader, and every process carrying the
  rank's marker. Nothing else is ever signalled. Then it waits, bounded (``gone_s``, default ``timeout_s``), until
  every process of the rank is gone: those it saw, and every process of the rank's session started since its
  supervisor — an exiting process (a GPU process releasing its memory takes seconds) reads an empty environ, so
  the marker no longer finds it. Answers the signals sent, the processes it waited for (pid, name, seconds) and
  any pid left.
* ``remove`` — delete a stopped rank's manifest, exit status and log (refused while it runs).
* ``parity`` — the running engine's argv (``/proc/<pid>/cmdline``) and a sha256 per value of the env
  sparkserve set (``/proc/<pid>/environ``; the login env and names in ``skip`` left out): values never
  leave the node.
* ``identity`` — the executable's path, the sha256 of its bytes and of its ``--version`` output. The output is
  cached in ``<root>/.engine-identity.json``, keyed by the executable's bytes and the size + mtime of every
  ``vllm-*.dist-info/RECORD`` it may import (its venv; the dirs a launcher script names): a pip install changes
  RECORD, so a new vLLM is asked again. No RECORD found: ``--version`` every time.
* ``python`` — run ``program`` (its source, in the question) with ``args`` under the interpreter the executable
  runs: a venv dir's ``bin/python3``; the script's own ``#!`` line when it names a python
  (``#!/usr/bin/env python3`` looked up on PATH; pip's ``'''exec' "<python>" …`` trampoline for long paths);
  ``env`` added to the node's environment; an argv, never a shell. A launcher that is not a Python script
  (``#!/bin/sh``, a binary) is answered ``{"error": …}``: which python it ends in is not known. Answers the
  interpreter, exit status, stdout and the last lines of stderr.

The manifest (``rank<R>.json``) holds id, fingerprint, rank, role, node, name, labels, pid, pgid, process
start time (clock ticks since boot, and as UTC), argv, the **names** of the env sparkserve set (never values:
the API key travels in env), log path and boot id. The engine also inherits the node's login environment.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from sparkserve.nodes.base import Node, NodeError

MARKER_ENV = "SPARKSERVE_RANK_ID"  # every process of a rank inherits it: how `stop` knows its own


def _node_main(q: dict[str, Any]) -> dict[str, Any]:  # noqa: C901 - one program, shipped whole
    """On the node: answer one question (see the module docstring)."""
    import base64
    import contextlib
    import glob
    import hashlib
    import os
    import shutil
    import signal
    import subprocess
    import time

    marker = q.get("marker", "SPARKSERVE_RANK_ID")

    def boot_id() -> str:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()

    def stat(pid: int) -> tuple[str, int, int, int] | None:
        """(state, pgrp, session, start time in ticks) of a pid, or None when there is none."""
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read().decode(errors="replace")
        except OSError:
            return None
        rest = data[data.rindex(")") + 2:].split()
        return rest[0], int(rest[2]), int(rest[3]), int(rest[19])

    def lives(pid: int, start: int) -> bool:
        st = stat(pid)
        return st is not None and st[0] not in "ZX" and st[3] == start

    def utc(ticks: int) -> str:
        with open("/proc/stat") as f:
            btime = next(int(x.split()[1]) for x in f if x.startswith("btime "))
        t = btime + ticks / os.sysconf("SC_CLK_TCK")
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"

    def write_json(path: str, obj: dict[str, Any]) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f)
        os.replace(tmp, path)

    def read_json(path: str) -> dict[str, Any] | None:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    root = os.path.expanduser(q["root"])

    def base_of(rank_id: str) -> str:
        dep, _, rank = rank_id.rpartition("-r")
        if not dep or not rank.isdigit() or "/" in dep or dep.startswith("."):
            raise ValueError(f"not a rank id: {rank_id!r}")
        return os.path.join(root, dep, f"rank{rank}")

    def running(m: dict[str, Any]) -> bool:
        return m.get("boot_id") == boot_id() and lives(int(m["pid"]), int(m["start_time"]))

    def members(m: dict[str, Any]) -> list[int]:
        """The rank's processes still alive: every pid carrying its marker (and its verified leader)."""
        want = f"{marker}={m['id']}".encode()
        out = []
        if m.get("boot_id") != boot_id():
            return out
        for pid, start in ((m["pgid"], m.get("leader_start_time", -1)), (m["pid"], m["start_time"])):
            if lives(int(pid), int(start)):  # by stat: a dying process's environ reads empty
                out.append(int(pid))
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid() or int(d) in out:
                continue
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            st = stat(int(d))
            if want in env and st is not None and st[0] not in "ZX":
                out.append(int(d))
        return sorted(out)

    def session(m: dict[str, Any]) -> dict[int, int]:
        """The rank's session: every live process whose session is the supervisor's and that started no earlier
        than the supervisor (a reused session id cannot pass), pid -> start time. Waited for, never signalled."""
        sid, lead = int(m.get("pgid", -1)), int(m.get("leader_start_time", -1))
        if sid <= 0 or lead < 0 or m.get("boot_id") != boot_id():
            return {}
        out = {}
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                st = stat(int(d))
                if st is not None and st[0] not in "ZX" and st[2] == sid and st[3] >= lead:
                    out[int(d)] = st[3]
        return out

    def wait_gone(m: dict[str, Any], seen: dict[int, int], bound: float) -> list[dict[str, Any]]:
        """Until every process in ``seen`` (and any of the rank's session) is gone, at most ``bound`` seconds:
        each one still there when the wait began, with its name and how long it took (None: still there)."""
        t0 = time.monotonic()
        seen = {**seen, **session(m)}
        out: dict[int, dict[str, Any]] = {}
        while True:
            alive = {p: t for p, t in {**seen, **session(m)}.items() if lives(p, t)}
            now = time.monotonic() - t0
            for p in alive:
                if p not in out:
                    try:
                        with open(f"/proc/{p}/comm") as f:
                            name = f.read().strip()
                    except OSError:
                        name = "?"
                    out[p] = {"pid": p, "name": name, "seconds": None}
            for p, w in out.items():
                if p not in alive and w["seconds"] is None:
                    w["seconds"] = round(now, 2)
            if not alive or now >= bound:
                return list(out.values())
            seen.update(alive)
            time.sleep(0.05)

    def relay(eng: int, out: int, log: int, stamps: int, exit_path: str) -> None:
        """The supervisor's loop: the engine's output into its log, with when each chunk arrived (the
        ``.stamps`` file: ``<log bytes so far> <unix time>`` per chunk); its exit status when it exits."""
        import select

        written, code, told = 0, None, False
        grace = 0.0  # once the engine is reaped: its children may hold the pipe; the exit waits that long at most

        def reaped(block: bool) -> int | None:
            pid, status = os.waitpid(eng, 0 if block else os.WNOHANG)
            if pid == 0:
                return None
            c = os.waitstatus_to_exitcode(status)
            return c if c >= 0 else 128 - c  # as a shell (and docker) reports it: 128 + N for a death by signal N

        while True:
            ready, _, _ = select.select([out], [], [], 0.5 if code is None or told else 0.05)
            if ready:
                chunk = os.read(out, 1 << 16)
                if not chunk:  # every writer (the engine and its children) closed it
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(log, view):]
                written += len(chunk)
                os.write(stamps, f"{written} {time.time():.6f}\n".encode())
            if code is None:
                code = reaped(False)
                grace = time.monotonic() + 2.0
            elif not told and time.monotonic() >= grace:
                # a child of the engine still holds the pipe 2 s after the engine exited: the exit is said now
                # (with everything written so far); what the orphans write later still reaches the log
                write_json(exit_path, {"exit_code": code, "at": time.time()})
                told = True
        if code is None:
            code = reaped(True)
        # written only once the last byte is in the log: `stop` and `look` wait for it, so a log read after the
        # engine exited holds its last words (the line that says why it died)
        if not told:
            write_json(exit_path, {"exit_code": code, "at": time.time()})

    def look(rank_id: str, offsets: list[int] | None) -> dict[str, Any]:
        base = base_of(rank_id)
        m = read_json(base + ".json")
        if m is None:
            return {"id": rank_id, "manifest": None}
        alive, ended = running(m), read_json(base + ".exit")
        settle = time.monotonic() + 4.0
        while not alive and ended is None and time.monotonic() < settle and m.get("boot_id") == boot_id() and \
                lives(int(m["pgid"]), int(m.get("leader_start_time", -1))):
            # the engine exited, its supervisor is still relaying its last output (the traceback that says why):
            # the rank has stopped once that is in the log and the exit status written (at most ~2 s later)
            time.sleep(0.02)
            ended = read_json(base + ".exit")
        out: dict[str, Any] = {"id": rank_id, "manifest": m, "running": alive, "exit": ended}
        if offsets is not None:  # [log offset, stamps offset]: what the caller has read of each
            for key, suffix, at in (("log", ".log", offsets[0]), ("stamps", ".stamps", offsets[1])):
                try:
                    with open(base + suffix, "rb") as f:
                        f.seek(at)
                        data = f.read(q.get("max_bytes", 64 << 20))
                except OSError:
                    data = b""
                out[key] = base64.b64encode(data).decode()
        return out

    verb = q["verb"]
    now = time.time()
    if verb == "look":
        offsets = q.get("offsets") or {}
        return {"now": now, "ranks": [look(i, offsets.get(i)) for i in q["ids"]]}
    if verb == "list":
        ids = []
        for path in sorted(glob.glob(os.path.join(root, "*", "rank*.json"))):
            dep, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)
            if name[4:-5].isdigit():
                ids.append(f"{dep}-r{name[4:-5]}")
        return {"now": now, "ranks": [r for r in (look(i, None) for i in ids) if r["manifest"] is not None]}
    if verb == "identity":
        exe = os.path.expanduser(q["exe"])
        if os.path.isdir(exe):
            exe = os.path.join(exe, "bin", "vllm")
        elif "/" not in exe:
            exe = shutil.which(exe) or ""
        if not exe or not os.access(exe, os.X_OK) or os.path.isdir(exe):
            return {"error": f"{q['exe']}: no such executable on this node"}
        with open(exe, "rb") as f:
            body = f.read()
        digest = hashlib.sha256(body).hexdigest()
        # `--version` imports vLLM (~20 s on a GPU machine): its answer is kept beside the run dir, keyed by the
        # executable's bytes and the size and mtime of every vllm dist-info RECORD it may import (its venv, the
        # dirs a launcher script names); none found: no key, `--version` every time
        dirs = {os.path.dirname(os.path.dirname(os.path.realpath(exe)))}
        if len(body) < 65536 and b"\0" not in body:
            for tok in body.decode(errors="replace").replace("=", " ").replace(":", " ").replace("'", " ").replace(
                    '"', " ").replace("!", " ").split():
                if tok.startswith("/") and os.path.exists(tok):
                    dirs |= {tok if os.path.isdir(tok) else os.path.dirname(tok),
                             os.path.dirname(os.path.dirname(os.path.realpath(tok)))}
        records = sorted({r for d in dirs for pat in ("vllm-*.dist-info/RECORD",
                                                      "lib/python3*/site-packages/vllm-*.dist-info/RECORD")
                          for r in glob.glob(os.path.join(d, pat))})
        key = None
        if records:
            stats = [(r, os.stat(r).st_size, os.stat(r).st_mtime_ns) for r in records]
            key = hashlib.sha256(json.dumps([digest, os.path.realpath(exe), stats]).encode()).hexdigest()
        cache_path = os.path.join(root, ".engine-identity.json")
        cache = (read_json(cache_path) or {}) if key else {}
        v = cache.get(key) if key else None
        cached = v is not None
        if v is None:
            try:
                ver = subprocess.run([exe, "--version"], capture_output=True, timeout=q.get("timeout_s", 120),
                                     stdin=subprocess.DEVNULL)
                version = ver.stdout.decode(errors="replace").strip().splitlines()[-1:] if ver.returncode == 0 else []
            except (OSError, subprocess.TimeoutExpired):
                version = []
            v = version[0] if version else ""
            if key and v:
                with contextlib.suppress(OSError):
                    os.makedirs(root, mode=0o700, exist_ok=True)
                    tmp = f"{cache_path}.{os.getpid()}"
                    with open(tmp, "w") as f:
                        json.dump({key: v, **dict(list(cache.items())[-7:])}, f)
                    os.replace(tmp, cache_path)
        both = hashlib.sha256(f"{digest}\0{v}".encode()).hexdigest()
        return {"path": os.path.realpath(exe), "sha256": digest, "version": v, "id": f"sha256:{both}",
                "cached": cached, "records": records}
    if verb == "python":
        exe = os.path.expanduser(q["exe"])
        interp = ""
        if os.path.isdir(exe):
            exe, interp = os.path.join(exe, "bin", "vllm"), os.path.join(exe, "bin", "python3")
        elif "/" not in exe:
            exe = shutil.which(exe) or ""
        if not interp:
            if not exe or not os.path.isfile(exe):
                return {"error": f"{q['exe']}: no such executable on this node"}
            with open(exe, "rb") as f:
                head = f.read(1024).decode(errors="replace").splitlines() + ["", ""]
            words = head[0][2:].split() if head[0].startswith("#!") else []
            if words[:1] and os.path.basename(words[0]) == "env" and len(words) > 1:
                words = [shutil.which(words[-1]) or ""]
            if words[:1] and words[0] in ("/bin/sh", "/usr/bin/sh") and head[1].startswith("'''exec' "):
                words = head[1].split('"')[1:2]  # pip's trampoline: '''exec' "<python>" "$0" "$@"
            if words[:1] and os.path.basename(words[0]).startswith("python"):
                interp = words[0]
        if not interp or not os.access(interp, os.X_OK):
            return {"error": f"{q['exe']} is not a Python console script (its #! line: {head[0][:80]!r}): which "
                    "interpreter it runs is not known" if not interp else f"{interp}: not executable"}
        try:
            p = subprocess.run([interp, "-c", q["program"], *q.get("args", [])], capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=q.get("timeout_s", 120),
                               env={**os.environ, **q.get("env", {})})
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"{interp}: {e}"}
        return {"interpreter": interp, "rc": p.returncode, "stdout": p.stdout.decode(errors="replace"),
                "stderr": p.stderr.decode(errors="replace").strip().splitlines()[-10:]}
    if verb == "start":
        base = base_of(q["id"])
        old = read_json(base + ".json")
        if old is not None and running(old):
            return {"error": "clash", "pid": old["pid"]}
        exe = os.path.expanduser(q["exe"])
        if os.path.isdir(exe):
            exe = os.path.join(exe, "bin", "vllm")
        elif "/" not in exe:
            exe = shutil.which(exe, path=q["env"].get("PATH", os.environ.get("PATH"))) or ""
        if not exe or not os.access(exe, os.X_OK) or os.path.isdir(exe):
            return {"error": f"{q['exe']}: no such executable on this node (serve.vllm)"}
        os.makedirs(os.path.dirname(base), mode=0o700, exist_ok=True)
        for suffix in (".exit", ".json", ".stamps"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(base + suffix)
        log = os.open(base + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        env = {**os.environ, **q["env"], marker: q["id"]}
        argv = [exe, *q["argv"]]
        m = {"id": q["id"], "fingerprint": q["fingerprint"], "rank": q["rank"], "role": q["role"],
             "node": q["node"], "name": q["name"], "labels": q.get("labels", {}), "pid": -1, "pgid": -1,
             "start_time": -1, "leader_start_time": -1, "started_at": "", "argv": argv,
             "env_names": sorted(q["env"]), "log": base + ".log", "boot_id": boot_id(), "exe": exe}
        # before anything forks: a start cut short (the starter interrupted) still leaves a manifest naming the
        # rank, so `stop` finds its processes by their marker
        write_json(base + ".json", m)
        info_r, info_w = os.pipe()
        err_r, err_w = os.pipe()  # close-on-exec: EOF with no data = the engine exec'd
        sup = os.fork()
        if sup == 0:  # the supervisor: its own session, the engine's parent
            try:
                os.close(info_r)
                os.close(err_r)
                os.setsid()
                null = os.open("/dev/null", os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                out_r, out_w = os.pipe()
                eng = os.fork()
                if eng == 0:
                    try:
                        os.close(out_r)
                        os.dup2(out_w, 1)
                        os.dup2(out_w, 2)
                        os.close(out_w)
                        os.execve(exe, argv, env)
                    except BaseException as e:  # noqa: BLE001 - reported to the starter, then gone
                        os.write(err_w, f"{type(e).__name__}: {e}".encode())
                    os._exit(127)
                os.close(out_w)
                os.close(err_w)
                st = stat(eng)
                os.write(info_w, json.dumps({"pid": eng, "start": st[3] if st else -1,
                                             "leader": (stat(os.getpid()) or ("", 0, 0, -1))[3]}).encode())
                os.close(info_w)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_IGN)
                relay(eng, out_r, log, os.open(base + ".stamps", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                      base + ".exit")
            finally:
                os._exit(0)
        os.close(info_w)
        os.close(err_w)
        os.close(log)
        with os.fdopen(info_r, "rb") as f:
            info = json.loads(f.read() or b"{}")
        with os.fdopen(err_r, "rb") as f:
            failed = f.read().decode(errors="replace")
        if failed or not info:
            for suffix in (".exit", ".log", ".stamps", ".json"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(base + suffix)
            return {"error": f"cannot run {exe}: {failed or 'the supervisor did not start'}"}
        m.update({"pid": info["pid"], "pgid": sup, "start_time": info["start"], "leader_start_time": info["leader"],
                  "started_at": utc(info["start"]) if info["start"] >= 0 else ""})
        write_json(base + ".json", m)
        return {"manifest": m}
    if verb == "stop":
        m = read_json(base_of(q["id"]) + ".json")
        if m is None:
            return {"signals": [], "left": [], "waited": []}
        sent = []
        timeout = float(q["timeout_s"])
        seen: dict[int, int] = dict(session(m))  # pid -> start time: every process of the rank met on the way
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            pids = members(m)
            seen.update((p, st[3]) for p in pids if (st := stat(p)) is not None)
            if not pids:
                break
            sent.append(sig.name)
            leader = int(m["pgid"])
            grouped = leader in pids
            if grouped:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(leader, sig)
            for pid in pids:  # each process once: a second SIGINT is a second Ctrl-C (vLLM then quits hard)
                st = stat(pid)
                if st is not None and not (grouped and st[1] == leader):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            deadline = time.monotonic() + (timeout if sig != signal.SIGKILL else 10.0)
            while time.monotonic() < deadline and members(m):
                time.sleep(0.05)
        waited = wait_gone(m, seen, float(q.get("gone_s", timeout)))
        base = base_of(q["id"])
        drained = time.monotonic() + 5.0  # the supervisor relays what the engine wrote last, then says so
        while sent and read_json(base + ".exit") is None and time.monotonic() < drained and not members(m):
            if not lives(int(m["pgid"]), int(m.get("leader_start_time", -1))) and "SIGKILL" in sent:
                break
            time.sleep(0.02)
        if "SIGKILL" in sent and read_json(base + ".exit") is None and not running(m):
            # the supervisor died with the group: the exit status it would have written
            write_json(base + ".exit", {"exit_code": 128 + signal.SIGKILL, "at": time.time()})
        left = sorted(set(members(m)) | {w["pid"] for w in waited if w["seconds"] is None})
        return {"signals": sent, "left": left, "waited": [w for w in waited if w["seconds"] is not None]}
    if verb == "remove":
        base = base_of(q["id"])
        m = read_json(base + ".json")
        if m is not None and (running(m) or [p for p in members(m) if p != int(m["pgid"])]):
            return {"error": "running"}
        for suffix in (".json", ".exit", ".log", ".stamps"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(base + suffix)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(base))
        return {"removed": m is not None}
    if verb == "parity":
        m = read_json(base_of(q["id"]) + ".json")
        if m is None or not running(m):
            return {"error": "not running"}
        pid = int(m["pid"])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [kv.partition(b"=") for kv in f.read().split(b"\0") if kv]
        keep = set(m.get("env_names") or []) - set(q.get("skip", []))  # what sparkserve set, not the login env
        env = {k.decode(errors="replace"): hashlib.sha256(v).hexdigest()[:16] for k, _, v in pairs
               if k.decode(errors="replace") in keep}
        return {"argv": argv, "env": env}
    return {"error": f"unknown verb {verb!r}"}


PROGRAM = (
    "from __future__ import annotations\n\n" + inspect.getsource(_node_main)
    + "\nimport json, sys\nprint(json.dumps(_node_main(json.loads(sys.stdin.read()))))\n"
)


def run_remote(node: Node, question: dict[str, Any], *, step: str, timeout: float = 60.0) -> dict[str, Any]:
    """Ask the node program one question; NodeError naming the node and step when it cannot answer."""
    res = node.run(["python3", "-c", PROGRAM], stdin=json.dumps(question).encode(), step=step, timeout=timeout,
                   check=False)
    if res.exit_code == 127 and not res.stdout:
        raise NodeError(node.name, step, "python3 not found on the node (runtime: process needs it)",
                        argv=res.argv[:2], last_lines=res.tail())
    if not res.ok:
        why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise NodeError(node.name, step, f"the node's process helper failed: {why}", argv=res.argv[:2],
                        last_lines=res.tail())
    try:
        out = json.loads(res.stdout)
    except ValueError:
        raise NodeError(node.name, step, "the node's process helper printed something that is not JSON",
                        last_lines=res.tail()) from None
    if not isinstance(out, dict):
        raise NodeError(node.name, step, "the node's process helper answered no object")
    return out
