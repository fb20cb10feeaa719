"""The one node-side program of a supervise round: memory facts, new kernel log lines, and — for an
incident — the pids of every rank and a ``py-spy dump`` of each. One ``python3`` start per node per round.

    facts = host_facts(node, cfg, cursor=prev.cursor)            # every round
    facts.mem, facts.kernel_lines, facts.cursor
    facts = host_facts(node, cfg, ranks={"r0": {"marker": "SPARKSERVE_RANK_ID=abc-r0"}}, dump=True)
    facts.pids["r0"], facts.dumps["1234"]                        # forensics

Sources (``supervise.meminfo_path`` / ``supervise.kmsg_path``, ``{node}`` = the node's name): /proc/meminfo
and /dev/kmsg by default. A plain file given as the kernel log is read as text from where the last round
stopped. The first read of a kernel log sets the cursor and reports nothing: lines from before supervision
belong to an earlier story.

The boot-time side is ``nodes/hostfacts.py`` (MemFree, buddyinfo, drop_caches, the NVRM/Xid lines since a boot,
every path under ``host.proc_root``). The two node programs still read meminfo and the kernel log separately:
this one streams the kernel log with a cursor from round to round, hostfacts reads it once since a time, and
the sources are configured apart (``supervise.meminfo_path`` / ``supervise.kmsg_path`` here). Folding them into
one reader is open work; the supervisor asks only :func:`host_facts` (every round) and :func:`read_memory`,
which are where to swap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sparkserve.nodes.base import Node, NodeError
from sparkserve.operate.checks import MemFacts, parse_meminfo

# Runs on the node with the question as JSON on stdin; answers JSON on stdout. Standard library only.
PROGRAM = r'''
import json, os, shutil, stat, subprocess, sys, threading
q = json.load(sys.stdin)
out = {"meminfo": None, "kmsg": None, "pids": {}, "dumps": {}}
try:
    with open(q["meminfo"]) as f:
        out["meminfo"] = f.read()
except OSError as e:
    out["meminfo_error"] = f"{q['meminfo']}: {e.strerror or e}"

def read_kmsg(path, cursor):
    st = os.stat(path)
    if stat.S_ISCHR(st.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        recs, last = [], cursor
        try:
            while True:
                try:
                    raw = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == 32:  # EPIPE: records overwritten while reading; go on
                        continue
                    raise
                head, _, msg = raw.decode(errors="replace").partition(";")
                parts = head.split(",")
                seq = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
                if cursor is not None and seq > cursor:
                    recs.append(msg.split("\n", 1)[0])
                last = seq if last is None else max(last, seq)
        finally:
            os.close(fd)
        return recs, last
    size = st.st_size
    if cursor is None:
        return [], size
    if size < cursor:
        cursor = 0
    with open(path, "rb") as f:
        f.seek(cursor)
        data = f.read(4 << 20)
    return data.decode(errors="replace").splitlines(), cursor + len(data)

if q.get("kmsg"):
    try:
        lines, cur = read_kmsg(q["kmsg"], q.get("cursor"))
        out["kmsg"], out["cursor"] = lines[-500:], cur
    except (OSError, ValueError) as e:
        out["kmsg_error"] = f"{q['kmsg']}: {getattr(e, 'strerror', None) or e}"

def children():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids

def marked(marker):
    want = marker.encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(d))
        except OSError:
            continue
    return sorted(found)

kids = None
def tree(roots):
    global kids
    kids = kids if kids is not None else children()
    todo, seen = list(roots), set()
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += kids.get(p, [])
    return sorted(seen)

for rid, how in (q.get("ranks") or {}).items():
    if how.get("marker"):
        # the marked processes and their descendants: a process that retitles itself (vLLM's EngineCore,
        # setproctitle) overwrites the environ block /proc/<pid>/environ reads, so its marker is gone
        out["pids"][rid] = tree(marked(how["marker"]))
    elif how.get("root_pid"):
        out["pids"][rid] = tree([int(how["root_pid"])])

def pyspy():
    for c in q.get("pyspy") or []:
        found = shutil.which(os.path.expanduser(c))
        if found:
            return found
    return None

if q.get("dump"):
    exe = pyspy()
    out["pyspy"] = exe
    pids = sorted({p for ps in out["pids"].values() for p in ps})
    def is_python(p):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode(errors="replace")
            return "python" in os.path.basename(os.readlink(f"/proc/{p}/exe")) or "python" in argv0 or "vllm" in argv0
        except OSError:
            return False
    def dump(p):
        if exe is None:
            out["dumps"][str(p)] = "py-spy not found on this node (pip install py-spy; supervise.pyspy names it)"
            return
        argv = [exe, "dump", "--nonblocking", "--pid", str(p)]
        try:
            # --nonblocking reads a running interpreter's memory as it changes: a read can tear ("Failed to get
            # stack traces … Bad address", seen on the rig), so a failed dump is tried again, the last time
            # blocking (py-spy pauses the process for the milliseconds of the read)
            for attempt in range(3):
                run = argv if attempt < 2 else [a for a in argv if a != "--nonblocking"]
                r = subprocess.run(run, capture_output=True, text=True, timeout=q.get("dump_timeout_s", 20))
                if r.returncode == 0 or not os.path.exists(f"/proc/{p}"):
                    break
            text = r.stdout + (("\n" + r.stderr) if r.stderr.strip() else "")
            if r.returncode != 0 and os.geteuid() != 0 and shutil.which("sudo"):
                s = subprocess.run(["sudo", "-n", *argv], capture_output=True, text=True,
                                   timeout=q.get("dump_timeout_s", 20))
                if s.returncode == 0:
                    text = s.stdout
            out["dumps"][str(p)] = text
        except subprocess.TimeoutExpired:
            out["dumps"][str(p)] = "py-spy dump timed out"
        except OSError as e:
            out["dumps"][str(p)] = f"py-spy could not run: {e}"
    threads = [threading.Thread(target=dump, args=(p,)) for p in pids if is_python(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
json.dump(out, sys.stdout)
'''


@dataclass
class HostFacts:
    """What one node said this round."""

    node: str
    mem: MemFacts
    meminfo_text: str | None = None
    kernel_lines: list[str] | None = None  # None: the kernel log could not be read
    kernel_error: str | None = None
    cursor: int | None = None
    pids: dict[str, list[int]] = field(default_factory=dict)
    dumps: dict[str, str] = field(default_factory=dict)
    pyspy: str | None = None
    error: str | None = None  # the node did not answer


def source_path(template: str, node: str) -> str:
    return template.replace("{node}", node)


def host_facts(node: Node, *, meminfo: str, kmsg: str | None, cursor: int | None = None,
               ranks: dict[str, dict[str, Any]] | None = None, dump: bool = False,
               pyspy: list[str] | None = None, timeout: float = 60.0) -> HostFacts:
    """Ask ``node`` once. Never raises for a node that does not answer: the facts say why."""
    q = {"meminfo": source_path(meminfo, node.name), "kmsg": source_path(kmsg, node.name) if kmsg else None,
         "cursor": cursor, "ranks": ranks or {}, "dump": dump, "pyspy": pyspy or []}
    try:
        # -I -S: no site, no user paths — the program is stdlib only, and a start without site is ~40 % cheaper
        res = node.run(["python3", "-I", "-S", "-c", PROGRAM], stdin=json.dumps(q).encode(), step="supervise facts",
                       timeout=timeout, check=False)
        if not res.ok:
            why = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
            raise NodeError(node.name, "supervise facts", why)
        a = json.loads(res.stdout)
    except (NodeError, ValueError, OSError) as e:
        return HostFacts(node.name, MemFacts(None, error=str(e)), error=str(e), cursor=cursor)
    mem = parse_meminfo(a["meminfo"]) if a.get("meminfo") else MemFacts(None, error=a.get("meminfo_error"))
    return HostFacts(node.name, mem, a.get("meminfo"), a.get("kmsg"), a.get("kmsg_error"),
                     a.get("cursor", cursor), {k: list(v) for k, v in a.get("pids", {}).items()},
                     dict(a.get("dumps", {})), a.get("pyspy"))


def read_memory(node: Node, meminfo: str) -> MemFacts:
    """A node's memory facts (the seam issue 26's probe will take over)."""
    return host_facts(node, meminfo=meminfo, kmsg=None).mem
