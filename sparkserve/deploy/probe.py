"""The node-side pre-flight probe: every question `doctor` and `up` ask a node, in ONE round trip.

    facts = probe_node(node, paths=[target], disk=[drafter], ports=[("0.0.0.0", 8000)],
                       sysfs="/sys", mkdirs=rw_mount_dirs)
    facts.paths[target]; facts.disk[drafter]; facts.ports["0.0.0.0:8000"]; facts.meminfo
    resolve(parse_sysfs(facts.sysfs), cfg.fabric, fabric_ip)      # the pure part: sparkserve.plan.fabric

One ``python3 -c`` program (:data:`PROBE_PROGRAM`, stdlib only) answers: which paths exist, free disk
under each path, which ports are free to bind, the writable mount dirs it creates, /proc/meminfo, the sysfs
files fabric detection needs (:func:`sparkserve.plan.fabric_node.node_read_sysfs`, the launcher's own
reader), and — for `up` — the drafter's manifest from the node's cache (the drafter sync's own program,
:mod:`sparkserve.deploy.sync_remote`, run in the same interpreter: one python3 start per node for the whole
pre-flight), the host facts of :mod:`sparkserve.nodes.hostfacts` (after the page-cache drop, for `up`) and
the target's manifest (:mod:`sparkserve.models.target_manifest`). The question travels on stdin as JSON —
paths are data, never shell words.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkserve.deploy.sync_remote import manifest_source
from sparkserve.models.target_manifest import NODE_SOURCE as TARGET_SOURCE
from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.hostfacts_node import NODE_SOURCE as HOST_SOURCE
from sparkserve.plan.fabric_node import node_read_sysfs

# -- run on the node (stdlib only, self-contained; shipped by source) -----------------------------------


def _node_answer(a: dict) -> dict:  # type: ignore[type-arg]
    """On the node: answer the question ``a`` (paths, disk, ports, mkdirs, sysfs) → the JSON reply."""
    import os
    import shutil
    import socket

    out: dict = {"paths": {}, "disk": {}, "ports": {}, "mkdirs": {}}  # type: ignore[type-arg]
    for p in a["paths"]:
        out["paths"][p] = os.path.isdir(p)
    for p in a["disk"]:
        q = p
        while q and not os.path.exists(q):
            q = os.path.dirname(q)
        out["disk"][p] = shutil.disk_usage(q or "/").free
    for host, port in a["ports"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn/TCPStore bind: TIME_WAIT is free
        try:
            s.bind((host, port))
            free = True
        except OSError:
            free = False
        finally:
            s.close()
        out["ports"][f"{host}:{port}"] = free
    for p in a.get("mkdirs", []):
        try:
            os.makedirs(p, exist_ok=True)
            out["mkdirs"][p] = ""
        except OSError as e:
            out["mkdirs"][p] = e.strerror or str(e)
    with open("/proc/meminfo") as f:
        out["meminfo"] = f.read()
    out["sysfs"] = node_read_sysfs(a["sysfs"]) if a.get("sysfs") else None
    if a.get("host") is not None:  # nodes.hostfacts: memory (after the page-cache drop), host settings, GPU memory
        out["host"] = _node_host(a["host"])  # noqa: F821
    if a.get("target"):  # models.target_manifest: the target's index, shards and safetensors headers
        out["target"] = target_manifest(a["target"])  # noqa: F821
    if a.get("manifest") is not None:  # the program then holds deploy.sync_remote's _remote_main too
        try:
            out["manifest"] = _remote_main(a["manifest"])  # noqa: F821
        except Exception as e:  # noqa: BLE001 - answered as the manifest's failure, the checks still stand
            out["manifest"] = {"error": f"{type(e).__name__}: {e}"}
    return out


PROBE_PROGRAM = (
    inspect.getsource(node_read_sysfs) + "\n" + inspect.getsource(_node_answer) + "\n" + HOST_SOURCE + "\n"
    + TARGET_SOURCE + "\nimport json, sys\nprint(json.dumps(_node_answer(json.loads(sys.stdin.read()))))\n"
)


@functools.cache
def _probe_with_manifest() -> str:
    """The probe that also answers the drafter's manifest question (:mod:`sparkserve.deploy.sync_remote`)."""
    return manifest_source() + "\n" + PROBE_PROGRAM


# -- on the controller --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """One node's answers. Keys of ``ports`` are ``host:port``; ``mkdirs`` maps a dir to why it could not
    be made ("" when it was); ``sysfs`` is None when it was not asked for."""

    paths: dict[str, bool]
    disk: dict[str, int]
    ports: dict[str, bool]
    mkdirs: dict[str, str]
    meminfo: str
    sysfs: dict[str, str] | None
    manifest: dict[str, Any] | None = None  # the manifest program's answer, or {"error": …}; None: not asked
    host: dict[str, Any] | None = None  # nodes.hostfacts_node._node_host's answer; None: not asked
    target: dict[str, Any] | None = None  # models.target_manifest's answer; None: not asked


def probe_node(node: Node, *, paths: Sequence[str] = (), disk: Sequence[str] = (),
               ports: Sequence[tuple[str, int]] = (), sysfs: str | Path | None = None,
               mkdirs: Sequence[str] = (), manifest: dict[str, object] | None = None,
               host: dict[str, Any] | None = None, target: str | None = None,
               timeout: float = 30) -> NodeFacts:
    """Ask ``node`` every question at once (one ``python3`` command). NodeError if it cannot answer.
    ``manifest``: the drafter manifest program's arguments (deploy.sync.manifest_args), answered in the same
    run (``NodeFacts.manifest``); ``host``: nodes.hostfacts.host_question (a page-cache drop takes seconds on a
    full node: the timeout grows); ``target``: the target directory whose manifest is taken."""
    question = json.dumps({"paths": list(paths), "disk": list(disk), "ports": [list(p) for p in ports],
                           "sysfs": str(sysfs) if sysfs else None, "mkdirs": list(mkdirs),
                           "manifest": manifest, "host": host, "target": target}).encode()
    if host is not None and host.get("drop"):
        timeout = max(timeout, 330)
    program = PROBE_PROGRAM if manifest is None else _probe_with_manifest()
    res = node.run(["python3", "-c", program], stdin=question, step="preflight", timeout=timeout,
                   check=False)
    if res.exit_code == 127:
        raise NodeError(node.name, "preflight", "python3 not found on the node (the node checks need it)",
                        argv=res.argv[:2], last_lines=res.tail())
    if not res.ok:
        why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        raise NodeError(node.name, "preflight", f"the node probe failed: {why}", argv=res.argv[:2],
                        last_lines=res.tail())
    try:
        data = json.loads(res.stdout)
    except ValueError:
        raise NodeError(node.name, "preflight", "the node probe printed something that is not JSON",
                        last_lines=res.tail()) from None
    sysfs_files = data["sysfs"]
    return NodeFacts(paths=data["paths"], disk=data["disk"], ports=data["ports"], mkdirs=data["mkdirs"],
                     meminfo=data["meminfo"],
                     sysfs=None if sysfs_files is None else {str(k): str(v) for k, v in sysfs_files.items()},
                     manifest=data.get("manifest"), host=data.get("host"), target=data.get("target"))
