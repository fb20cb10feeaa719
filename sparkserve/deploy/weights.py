"""`sparkserve weights pull|ship|verify`: the model fetched once, on the head, and shipped over the fabric.

    pulled = pull(head, "org/name", "main", python="python3", token=tok)     # pinned to its commit
    reports = ship(head, {"spark-b": (node_b, "192.168.100.11")}, pulled.repo_dir)
    verify(head, targets, root)   # content hashes computed where the bytes are, compared

* pull runs ``huggingface_hub.snapshot_download`` on the head (its cache, its token — sent on stdin —, and
  ``HF_ENDPOINT``), at the commit the revision resolves to, so every node gets the same snapshot; it resumes
  what a previous pull left (huggingface_hub keeps ``.incomplete`` blobs).
* ship moves the bytes head → each other node directly over the **fabric IPs** (the programs run in the nodes'
  fabric, :data:`sparkserve.nodes.hostsetup.NETNS_WRAP`), never through this machine: what the target lacks,
  and for a partial file only its missing tail (resume), in ``streams`` parallel TCP streams (``sendfile``).
* verify: each node hashes its own copy (the drafter sync's manifest program,
  :func:`sparkserve.deploy.sync.remote_manifest`: sha256 per file, cached by size, mtime and inode) and the
  manifests are compared here. The target manifest `up` compares (names, sizes, safetensors headers) would not
  see a corrupted tensor byte; this does.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkserve.deploy import weights_node
from sparkserve.deploy.sync import remote_manifest
from sparkserve.errors import BadInput
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.hostsetup import NETNS_WRAP

Progress = Callable[[str, int, int], None]  # (what, bytes done, bytes in all): called about once a second
DEFAULT_STREAMS = 4


def _source(fn_name: str) -> str:
    main = (f"\nimport json as _j, sys as _s\ntry:\n    _out = {fn_name}(_j.loads(_s.argv[1]))\n"
            "except Exception as _e:\n    print(_j.dumps({'error': f'{type(_e).__name__}: {_e}'}))\n    _s.exit(1)\n"
            "print(_j.dumps(_out))\n")
    return inspect.getsource(weights_node) + main


def _argv(fn_name: str, args: dict, *, python: str = "python3", fabric: bool = False) -> list[str]:  # type: ignore[type-arg]
    argv = [python, "-c", _source(fn_name), json.dumps(args)]
    return ["sh", "-c", NETNS_WRAP, "sparkserve-weights", *argv] if fabric else argv


def _answer(node: Node, step: str, res) -> dict:  # type: ignore[no-untyped-def, type-arg]
    out: dict = {}  # type: ignore[type-arg]
    lines = res.stdout.strip().splitlines()
    if lines:
        try:
            out = json.loads(lines[-1])
        except ValueError:
            out = {}
    if not res.ok or "error" in out:
        why = out.get("error") or (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise NodeError(node.name, step, why, last_lines=res.tail())
    return out


def _run(node: Node, fn_name: str, args: dict, *, step: str, fabric: bool = False,  # type: ignore[type-arg]
         timeout: float = 120.0) -> dict:  # type: ignore[type-arg]
    res = node.run(_argv(fn_name, args, fabric=fabric), timeout=timeout, check=False, step=step)
    return _answer(node, step, res)


def _poll(node: Node, path: str) -> dict | None:  # type: ignore[type-arg]
    try:
        return json.loads(node.read_text(path))
    except (NodeError, ValueError, OSError):
        return None


#: Stops the process a pid file names only while that pid is still it: the file holds ``PID START`` (the start
#: time in clock ticks, /proc/PID/stat field 22) and the pid's current start time must match; a finished
#: program's pid may belong to any other process by now. A fixed script, its values as positional arguments.
_STOP_IF_SAME = ('[ -r "$1" ] && read -r pid start < "$1" || exit 0; '
                 'now=$(sed "s/.*) //" /proc/"$pid"/stat 2>/dev/null | cut -d" " -f20); '
                 '[ -n "$start" ] && [ "$now" = "$start" ] && kill "$pid"; exit 0')


def _kill(node: Node, workdir: str) -> None:
    """Stop the node programs by the pids they wrote, each only while it is still that program (best effort)."""
    for name in ("pid", "recv.pid"):
        with contextlib.suppress(NodeError, OSError):
            node.run(["sh", "-c", _STOP_IF_SAME, "sparkserve-stop", f"{workdir}/{name}"], timeout=15, check=False,
                     step="weights: stop")


@dataclass
class Pulled:
    repo: str
    revision: str  # the commit it was pinned to
    path: str  # the snapshot directory on the head (model.target / drafter.path)
    repo_dir: str  # the cache's models--org--name directory: what ship copies
    bytes: int
    seconds: float = 0.0


def pull(head: Node, repo: str, revision: str | None, *, python: str = "python3", token: str | None = None,
         endpoint: str | None = None, hub_cache: str | None = None, progress: Progress | None = None,
         timeout: float = 24 * 3600.0) -> Pulled:
    """Download ``repo`` at ``revision`` into the head's HF cache (resumes a partial pull)."""
    workdir = f"/tmp/sparkserve-pull-{secrets.token_hex(6)}"
    args = {"repo": repo, "revision": revision, "endpoint": endpoint, "hub_cache": hub_cache, "workdir": workdir}
    t0 = time.monotonic()
    proc = head.start(_argv("node_pull", args, python=python), timeout=timeout, step="weights: pull")
    proc.write(((token or "") + "\n").encode())  # the token on stdin: never argv, never a log
    proc.close_stdin()
    result: dict = {}  # type: ignore[type-arg]

    def wait() -> None:
        result["res"] = proc.wait(check=False)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(1.0)
            p = _poll(head, f"{workdir}/progress")
            if p and progress is not None:
                progress(repo, int(p["done"]), int(p["total"]))
    except BaseException:  # stopped here: stopped there too (what it fetched stays in the cache for a resume)
        _kill(head, workdir)
        raise
    finally:
        head.run(["rm", "-rf", workdir], timeout=30, check=False, step="weights: pull")
    out = _answer(head, "weights: pull", result["res"])
    if progress is not None:
        progress(repo, int(out["bytes"]), int(out["bytes"]))
    return Pulled(out["repo"], out["revision"], out["path"], out["repo_dir"], int(out["bytes"]),
                  time.monotonic() - t0)


@dataclass
class ShipReport:
    node: str
    sent_bytes: int = 0  # bytes that crossed the fabric
    skipped_bytes: int = 0  # already there (whole files, and the parts a resume did not send again)
    files: int = 0
    seconds: float = 0.0
    verified: bool = False
    mismatched: list[str] = field(default_factory=list)  # files whose content differs after the ship
    repaired: list[str] = field(default_factory=list)

    @property
    def gb_per_s(self) -> float:
        return self.sent_bytes / self.seconds / 1e9 if self.seconds else 0.0


def _what_to_send(src: dict, dst: dict) -> tuple[list[list], int, int]:  # type: ignore[type-arg]
    """[[rel, size, offset]] for the files the target lacks (a part: from its size), bytes to send, bytes kept."""
    todo, send, kept = [], 0, 0
    for rel, size in sorted(src["files"].items()):
        if dst["files"].get(rel) == size:
            kept += size
            continue
        part = dst["parts"].get(rel, 0)
        offset = part if 0 < part <= size else 0
        todo.append([rel, size, offset])
        send += size - offset
        kept += offset
    return todo, send, kept


def ship_one(head: Node, name: str, target: Node, ip: str, root: str, *, streams: int = DEFAULT_STREAMS,
             bwlimit: float = 0, progress: Progress | None = None, only: list[str] | None = None) -> ShipReport:
    """Make ``root`` on ``target`` hold the head's files (what is missing, partial tails), over ``ip``."""
    src = _run(head, "node_inventory", {"root": root}, step="weights: inventory")
    if not src["exists"]:
        raise BadInput(root, f"not on {head.name}: `sparkserve weights pull` first")
    dst = _run(target, "node_inventory", {"root": root}, step="weights: inventory")
    if only is not None:
        dst = {**dst, "files": {k: v for k, v in dst["files"].items() if k not in only}}
    todo, send, kept = _what_to_send(src, dst)
    rep = ShipReport(name, skipped_bytes=kept, files=len(todo))
    if send > dst["free"]:
        raise NodeError(target.name, "weights: ship", f"{send / 1e9:.1f} GB to send, {dst['free'] / 1e9:.1f} GB free "
                        f"at {root}")
    token = secrets.token_hex(16)
    work = f"/tmp/sparkserve-ship-{token[:12]}"
    n = max(1, min(streams, len(todo))) if todo else 0
    if not todo and src["links"] == dst["links"]:
        return rep
    t0 = time.monotonic()
    recv = target.start(_argv("node_recv", {"root": root, "workdir": work, "ip": ip, "streams": n,
                                            "dirs": src["dirs"], "links": src["links"]}, fabric=True),
                        timeout=24 * 3600.0, step="weights: receive")
    recv.write(token.encode() + b"\n")
    recv.close_stdin()
    sender = None
    try:
        if n:
            port = None
            deadline = time.monotonic() + 30
            while port is None and time.monotonic() < deadline:
                try:
                    port = int(target.read_text(f"{work}/port").strip())
                except (NodeError, ValueError, OSError):
                    time.sleep(0.1)
            if port is None:
                raise NodeError(target.name, "weights: receive", f"no listener on {ip} after 30 s")
            sender = head.start(_argv("node_send", {"root": root, "workdir": work, "ip": ip, "port": port,
                                                    "files": todo, "streams": n, "total": send,
                                                    "bwlimit": bwlimit}, fabric=True),
                                timeout=24 * 3600.0, step="weights: send")
            sender.write(token.encode() + b"\n")
            sender.close_stdin()
            box: dict = {}  # type: ignore[type-arg]
            t = threading.Thread(target=lambda: box.setdefault("res", sender.wait(check=False)), daemon=True)
            t.start()
            while t.is_alive():
                t.join(1.0)
                p = _poll(head, f"{work}/progress")
                if p and progress is not None:
                    progress(name, int(p["sent"]), send)
            sent = _answer(head, "weights: send", box["res"])
            if progress is not None:
                progress(name, int(sent["sent"]), send)
            rep.sent_bytes = int(sent["sent"])
            if sent["errors"]:
                raise NodeError(head.name, "weights: send", "; ".join(sent["errors"][:3]))
        got = _answer(target, "weights: receive", recv.wait(check=False))
        if got["errors"]:
            raise NodeError(target.name, "weights: receive", "; ".join(got["errors"][:3]))
    except BaseException:
        _kill(head, work)
        _kill(target, work)
        raise
    finally:
        for node in (head, target):
            node.run(["rm", "-rf", work], timeout=30, check=False, step="weights: clean up")
    rep.seconds = time.monotonic() - t0
    return rep


def _content_root(root: str, inv: dict) -> str:  # type: ignore[type-arg]
    # an HF cache repo: the bytes are the blobs (the snapshot's links point at them; compared as links)
    return f"{root.rstrip('/')}/blobs" if "blobs" in inv.get("dirs", []) else root


def verify(head: Node, targets: dict[str, Node], root: str, *, rehash: bool = False) -> dict[str, list[str]]:
    """{node: files whose content differs from the head's (missing ones and differing links included)}.
    ``rehash``: hash every file again (each node's cache trusts a file whose size, mtime and inode are the
    same: a byte changed behind a restored mtime is only seen this way)."""
    from sparkserve.nodes.parallel import on_all

    inv = _run(head, "node_inventory", {"root": root}, step="weights: inventory")
    croot = _content_root(root, inv)
    nodes = {head.name: head, **targets}
    invs = on_all(list(nodes), lambda n: _run(nodes[n], "node_inventory", {"root": root},
                                              step="weights: inventory"))
    sub = croot[len(root.rstrip("/")) + 1:] + "/" if croot != root else ""

    def again(n: str) -> list[str] | None:
        return [r[len(sub):] for r in invs[n]["files"] if r.startswith(sub)] if rehash else None

    mans = on_all(list(nodes), lambda n: remote_manifest(nodes[n], croot, rehash=again(n),
                                                         step="weights: content hashes"))
    ref = mans[head.name].manifest.files
    out: dict[str, list[str]] = {}
    for name in targets:
        have = mans[name].manifest.files
        bad = sorted(rel for rel in set(ref) | set(have) if ref.get(rel) != have.get(rel)
                     and not rel.endswith(weights_node.PART))  # a part is a stopped ship's, not content
        bad = [sub + b for b in bad]
        bad += sorted(rel for rel in set(invs[head.name]["links"]) | set(invs[name]["links"])
                      if invs[head.name]["links"].get(rel) != invs[name]["links"].get(rel))
        out[name] = bad
    return out


def ship(head: Node, targets: dict[str, tuple[Node, str]], root: str, *, streams: int = DEFAULT_STREAMS,
         bwlimit: float = 0, progress: Progress | None = None, repair: bool = True) -> dict[str, ShipReport]:
    """Ship to every target (one after another: they share the head's link), then verify by content; files
    whose content differs are sent again once (``repair``) and verified again."""
    reports = {name: ship_one(head, name, node, ip, root, streams=streams, bwlimit=bwlimit, progress=progress)
               for name, (node, ip) in targets.items()}
    bad = verify(head, {n: node for n, (node, _) in targets.items()}, root)
    for name, files in bad.items():
        if files and repair:
            node, ip = targets[name]
            again = ship_one(head, name, node, ip, root, streams=streams, bwlimit=bwlimit, progress=progress,
                             only=files)
            reports[name].sent_bytes += again.sent_bytes
            reports[name].repaired = files
    if repair and any(bad.values()):
        bad = verify(head, {n: node for n, (node, _) in targets.items()}, root)
    for name, files in bad.items():
        reports[name].mismatched = files
        reports[name].verified = not files
    return reports


def write_model_paths(path, target: str, drafter: str | None) -> None:  # type: ignore[no-untyped-def]
    """Set ``model.target`` (and ``drafter.path``) in the config file, the rest of it (comments too) kept."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    data = yaml.load(path.read_text())
    data["model"]["target"] = target
    if drafter is not None:
        data["drafter"]["path"] = drafter
    buf = io.StringIO()
    yaml.dump(data, buf)
    tmp = path.with_name(path.name + ".sparkserve-tmp")
    tmp.write_text(buf.getvalue())
    tmp.replace(path)
