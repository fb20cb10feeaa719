"""Forensics before any action: one directory per incident, written before anything is stopped.

    inc = open_incident(cfg, nodes, verdicts, scrape=last_scrape, api_url=url, fingerprint=fp)
    inc.path        # <state>/supervise/incidents/20261201T231502Z-progress/
    inc.complete    # verdict, /metrics, memory of every node, each rank's last log lines and py-spy dump

What the directory holds:

* ``incident.json`` — the verdict that triggered it (every check of that round), the deployment, the files;
* ``metrics.txt`` — ``/metrics`` as scraped now (or the last good scrape, said so, when it does not answer);
* ``<node>.memory.txt`` — the node's meminfo; ``<node>.kernel.txt`` — the kernel lines seen this run;
* ``<node>.<rank>.log`` — the rank's last log lines; ``<node>.<rank>.<pid>.pyspy.txt`` — ``py-spy dump`` of
  each of the rank's Python processes: docker — from a helper container in the rank's PID namespace, with
  sparkserve's own py-spy binary (operate/pyspy.py; pids as the rank's namespace numbers them); process — by
  the node program, with the py-spy it finds (``supervise.pyspy``, serve.vllm's venv, sparkserve's own).

It is journalled (``supervise_events``, kind ``incident``) with the same JSON.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platformdirs import user_state_dir

from sparkserve.config import Config
from sparkserve.journal import record
from sparkserve.nodes.base import Node
from sparkserve.nodes.engine import ManagedContainer
from sparkserve.nodes.parallel import on_all
from sparkserve.nodes.process_remote import MARKER_ENV
from sparkserve.nodes.runtime import engine_for
from sparkserve.operate.checks import Verdict
from sparkserve.operate.nodefacts import host_facts
from sparkserve.operate.pyspy import container_dumps, pyspy_candidates, ship_pyspy

LOG_LINES = 300


@dataclass
class Incident:
    path: Path
    summary: dict[str, Any]
    files: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        s = self.summary
        return bool(s.get("verdict")) and s.get("metrics") is not None and bool(s.get("memory")) and \
            bool(s.get("logs")) and bool(s.get("pyspy"))


def incidents_root(cfg: Config) -> Path:
    if cfg.supervise.incidents_dir:
        return Path(cfg.supervise.incidents_dir).expanduser()
    return Path(user_state_dir("sparkserve")) / "supervise" / "incidents"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]


def rank_selectors(cfg: Config, node: Node, ranks: list[ManagedContainer]) -> dict[str, dict[str, Any]]:
    """How the node program finds each rank's processes: its marker (process), its container's pid (docker)."""
    out: dict[str, dict[str, Any]] = {}
    for r in ranks:
        if cfg.runtime == "process":
            out[r.name] = {"marker": f"{MARKER_ENV}={r.id}"}
        else:
            try:
                pid = int(node.docker().containers.get(r.id).attrs["State"]["Pid"] or 0)
            except Exception:  # noqa: BLE001 - a container that is gone has no pid to dump
                pid = 0
            if pid:
                out[r.name] = {"root_pid": pid}
    return out


def open_incident(cfg: Config, nodes: dict[str, Node], verdicts: list[Verdict], *, ranks: dict[str, list[
        ManagedContainer]], metrics_text: str | None, metrics_note: str, kernel_seen: dict[str, list[str]],
        fingerprint: str | None, say: Any = None, about: dict[str, Any] | None = None) -> Incident:
    """Write the incident directory (every node in parallel) and journal it. Never stops anything. ``about``:
    more keys for ``incident.json`` (a fleet's ``replica`` and its ``note``)."""
    bad = [v for v in verdicts if v.ok is False]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    root = incidents_root(cfg)
    path = root / f"{stamp}-{'-'.join(sorted({v.check for v in bad})) or 'manual'}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{stamp}-{n}-{'-'.join(sorted({v.check for v in bad}))}"
    path.mkdir(parents=True, mode=0o700)
    files: list[str] = []

    def write(name: str, text: str) -> None:
        (path / name).write_text(text)
        files.append(name)

    if metrics_text is not None:
        write("metrics.txt", metrics_text)

    def collect(node: Node) -> dict[str, Any]:
        mine = ranks.get(node.name, [])
        eng = engine_for(node, cfg)
        logs: dict[str, list[str]] = {}
        for r in mine:
            try:
                logs[r.name] = eng.log_tail(r.id, LOG_LINES)
            except Exception as e:  # noqa: BLE001 - forensics take what they can get
                logs[r.name] = [f"(log not readable: {type(e).__name__}: {e})"]
        if cfg.runtime == "docker":
            facts = host_facts(node, meminfo=cfg.supervise.meminfo_path, kmsg=None, timeout=90.0)
            return {"logs": logs, "facts": facts, "docker": container_dumps(cfg, node, mine)}
        ship_pyspy(cfg, node)
        facts = host_facts(node, meminfo=cfg.supervise.meminfo_path, kmsg=None,
                           ranks=rank_selectors(cfg, node, mine), dump=True,
                           pyspy=pyspy_candidates(cfg, node), timeout=90.0)
        return {"logs": logs, "facts": facts}

    got = on_all(list(nodes.values()), collect, name=lambda x: x.name)
    memory: dict[str, Any] = {}
    logs_index: dict[str, str] = {}
    pyspy_index: dict[str, str] = {}
    pyspy_ok = False
    for node_name, g in got.items():
        f = g["facts"]
        write(f"{_safe(node_name)}.memory.txt", f.meminfo_text or f"(not readable: {f.mem.error or f.error})\n")
        memory[node_name] = {"memfree": f.mem.free, "memavailable": f.mem.available, "memtotal": f.mem.total,
                             "error": f.mem.error}
        if kernel_seen.get(node_name):
            write(f"{_safe(node_name)}.kernel.txt", "\n".join(kernel_seen[node_name]) + "\n")
        for rank, lines in g["logs"].items():
            name = f"{_safe(node_name)}.{_safe(rank)}.log"
            write(name, "\n".join(lines) + "\n")
            logs_index[f"{node_name}/{rank}"] = name
        for rank, texts in g.get("docker", {}).items():
            for pid, text in texts.items():
                name = f"{_safe(node_name)}.{_safe(rank)}.{_safe(pid)}.pyspy.txt"
                write(name, text)
                pyspy_index[f"{node_name}/{rank}/{pid}"] = name
                pyspy_ok = pyspy_ok or "Thread " in text
        for rank, pids in f.pids.items():
            if not pids:  # a rank whose processes are all gone (a kill -9): say so where its stacks would be
                name = f"{_safe(node_name)}.{_safe(rank)}.pyspy.txt"
                write(name, "(no live process of this rank to dump: every one of its processes had exited)\n")
                pyspy_index[f"{node_name}/{rank}"] = name
            for pid in pids:
                text = f.dumps.get(str(pid))
                if text is None:
                    continue
                name = f"{_safe(node_name)}.{_safe(rank)}.{pid}.pyspy.txt"
                write(name, text)
                pyspy_index[f"{node_name}/{rank}/{pid}"] = name
                pyspy_ok = pyspy_ok or "Thread " in text or "Process " in text
    summary = {
        "time": stamp, "fingerprint": fingerprint, "config_nodes": [x.name for x in cfg.nodes],
        "verdict": [v.to_json() for v in bad], "round": [v.to_json() for v in verdicts],
        "metrics": "metrics.txt" if metrics_text is not None else None, "metrics_note": metrics_note,
        "memory": memory, "logs": logs_index, "pyspy": pyspy_index, "pyspy_ok": pyspy_ok, "dir": str(path),
        **(about or {}),
    }
    write("incident.json", json.dumps(summary, indent=2, default=str) + "\n")
    record("supervise_event", fingerprint=fingerprint, event="incident", event_json=json.dumps(summary, default=str))
    return Incident(path, summary, files)
