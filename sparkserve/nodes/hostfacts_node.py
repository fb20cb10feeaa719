"""The host facts' node side: the programs that run on a node, stdlib only and self-contained, shipped by source
(:data:`NODE_SOURCE` inside the one node probe, deploy/probe.py; :data:`KERNEL_PROGRAM` on its own by
:func:`sparkserve.nodes.hostfacts.kernel_faults`). What their answers mean is :mod:`sparkserve.nodes.hostfacts`.

    _node_drop(root)      # sync, drop the page cache and compact through ``sudo -n`` (never a shell)
    _node_host(q)         # memory (after the drop), GPU memory, host settings, the sudo rule
    _node_kernel(q)       # the kernel's NVRM/Xid lines since a unix time

Every path is under ``host.proc_root`` (``/proc``) or ``fabric.sysfs_root`` so the rig can hand each node fake
sources.
"""

from __future__ import annotations

import inspect


def _node_drop(root: str) -> str:
    """On the node: ``sync``, then drop the page cache and compact through ``sudo -n`` (never a shell): "" when
    done, else why not."""
    import os
    import subprocess

    os.sync()
    for name, value in (("drop_caches", b"3"), ("compact_memory", b"1")):
        path = os.path.join(root, "sys", "vm", name)
        try:
            r = subprocess.run(["sudo", "-n", "/usr/bin/tee", path], input=value, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=300)
        except FileNotFoundError:
            return "sudo is not installed on the node"
        except subprocess.TimeoutExpired:
            return f"writing {path} took over 300 s"
        if r.returncode != 0:
            err = r.stderr.decode("utf-8", "replace").strip().splitlines()
            return f"sudo -n {'/usr/bin/tee'} {path}: " + (err[-1] if err else f"exit {r.returncode}")
    return ""


def _node_host(q: dict) -> dict:  # type: ignore[type-arg]
    """On the node: memory (after the drop when ``q["drop"]``), GPU memory, host settings, the sudo rule."""
    import glob
    import os
    import subprocess

    root, sysfs = q["proc_root"], q.get("sysfs_root") or "/sys"
    out: dict = {}  # type: ignore[type-arg]

    def read(path: str, limit: int = 65536) -> str | None:
        try:
            with open(path, "rb") as f:
                return f.read(limit).decode("utf-8", "replace")
        except OSError:
            return None

    if q.get("drop"):
        out["drop"] = _node_drop(root)
    out["meminfo"] = read(os.path.join(root, "meminfo")) or ""
    out["buddyinfo"] = read(os.path.join(root, "buddyinfo")) or ""
    out["page_size"] = os.sysconf("SC_PAGE_SIZE")
    out["uptime"] = (read(os.path.join(root, "uptime")) or "").split(" ")[0].strip()
    out["osrelease"] = (read(os.path.join(root, "sys", "kernel", "osrelease")) or "").strip()
    out["cmdline"] = (read(os.path.join(root, "cmdline")) or "").strip()
    out["swappiness"] = (read(os.path.join(root, "sys", "vm", "swappiness")) or "").strip()
    driver = read(os.path.join(root, "driver", "nvidia", "version")) or ""
    m = [w for w in driver.split("Kernel Module", 1)[-1].split() if w.replace(".", "").isdigit() and "." in w]
    out["driver"] = (m[0] if m else "") or (read(os.path.join(sysfs, "module", "nvidia", "version")) or "").strip()
    earlyoom = False
    for comm in glob.glob(os.path.join(root, "[0-9]*", "comm")):
        if (read(comm, 64) or "").strip() == "earlyoom":
            earlyoom = True
            break
    out["earlyoom"] = earlyoom
    fw = {}
    for path in sorted(glob.glob(os.path.join(sysfs, "class", "infiniband", "*", "fw_ver"))):
        fw[path.split(os.sep)[-2]] = (read(path, 256) or "").strip()
    out["fw"] = fw
    try:
        st = os.statvfs(q.get("shm") or "/dev/shm")
        out["shm"] = [st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize]
    except OSError:
        out["shm"] = None
    libs = []
    for pat in ("/usr/lib/*/libnccl.so.2*", "/usr/lib64/libnccl.so.2*", "/usr/local/cuda*/lib*/libnccl.so.2*"):
        libs += glob.glob(pat)
    out["nccl_system"] = sorted({os.path.realpath(p) for p in libs})
    pip = []
    for site in q.get("venvs") or []:
        pip += glob.glob(os.path.join(site, "lib", "python3*", "site-packages", "nvidia_nccl_cu*.dist-info"))
    out["nccl_pip"] = sorted(os.path.basename(p)[: -len(".dist-info")] for p in pip)
    gpu = None
    smi = q.get("nvidia_smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, timeout=30)
            gpu = {"rc": r.returncode, "out": r.stdout.decode("utf-8", "replace")[:4096],
                   "err": r.stderr.decode("utf-8", "replace")[-400:]}
        except (OSError, subprocess.TimeoutExpired) as e:
            gpu = {"rc": None, "out": "", "err": str(e)}
    out["gpu"] = gpu
    if q.get("sudo_check"):
        checks = []
        for name in ("drop_caches", "compact_memory"):
            try:
                r = subprocess.run(["sudo", "-n", "-l", "/usr/bin/tee", os.path.join(root, "sys", "vm", name)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)
                checks.append("" if r.returncode == 0 else (r.stderr.decode("utf-8", "replace").strip()
                                                            or "not allowed"))
            except (OSError, subprocess.TimeoutExpired) as e:
                checks.append("sudo is not installed on the node" if isinstance(e, FileNotFoundError) else str(e))
        out["sudo"] = next((c for c in checks if c), "")
    return out


def _node_kernel(q: dict) -> dict:  # type: ignore[type-arg]
    """On the node: the kernel's NVRM/Xid lines logged since unix time ``q["since"]``, from /dev/kmsg (or a file
    in its record format), else ``journalctl -k``, else ``dmesg`` — whichever is readable."""
    import os
    import re as _re
    import stat
    import subprocess
    import time

    pat = _re.compile(r"NVRM|\bXid\b")
    since, root = float(q["since"]), q["proc_root"]
    try:
        with open(os.path.join(root, "uptime")) as f:
            boot = time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        boot = None
    found: list = []  # type: ignore[type-arg]
    why: list = []  # type: ignore[type-arg]

    def keep(t: float | None, text: str) -> None:
        if pat.search(text) and (t is None or t >= since) and len(found) < 200:
            found.append([t, text[:400]])

    def kmsg_record(rec: str) -> None:
        head, _, msg = rec.partition(";")
        parts = head.split(",")
        if len(parts) < 3 or not msg:
            return
        try:
            t = boot + int(parts[2]) / 1e6 if boot is not None else None
        except ValueError:
            return
        keep(t, msg.split("\n", 1)[0])

    sources = [q["source"]] if q["source"] != "auto" else ["/dev/kmsg", "journalctl", "dmesg"]
    for src in sources:
        if src == "journalctl":
            argv = ["journalctl", "-k", "-q", "--no-pager", "-o", "short-unix", f"--since=@{int(since)}"]
        elif src == "dmesg":
            argv = ["dmesg"]
        else:
            try:
                fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                why.append(f"{src}: {e.strerror}")
                continue
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):  # /dev/kmsg: one record per read, EAGAIN at the end
                    while True:
                        try:
                            rec = os.read(fd, 8192)
                        except BlockingIOError:
                            break
                        except BrokenPipeError:  # overwritten while read: go on with the next record
                            continue
                        if not rec:
                            break
                        kmsg_record(rec.decode("utf-8", "replace"))
                else:
                    with os.fdopen(os.dup(fd), "rb") as f:
                        for line in f.read(64 << 20).decode("utf-8", "replace").splitlines():
                            if line and not line.startswith(" "):
                                kmsg_record(line)
            finally:
                os.close(fd)
            return {"source": src, "lines": found}
        try:
            r = subprocess.run(argv, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            why.append(f"{src}: {e}")
            continue
        text = r.stdout.decode("utf-8", "replace")
        if r.returncode != 0 or (src == "journalctl" and not text and r.stderr.strip()):
            why.append(f"{src}: " + (r.stderr.decode("utf-8", "replace").strip().splitlines() or ["failed"])[-1])
            continue
        for line in text.splitlines():
            if src == "journalctl":
                stamp, _, rest = line.partition(" ")
                try:
                    t = float(stamp)
                except ValueError:
                    continue
                keep(t, rest.split(": ", 1)[-1] if "kernel: " in rest else rest)
            else:
                m = _re.match(r"\[\s*(\d+\.\d+)\]\s?(.*)", line)
                if m:
                    keep(boot + float(m.group(1)) if boot is not None else None, m.group(2))
        return {"source": src, "lines": found}
    return {"source": None, "lines": [], "error": "; ".join(why) or "no kernel log source"}


NODE_SOURCE = inspect.getsource(_node_drop) + "\n" + inspect.getsource(_node_host)
KERNEL_PROGRAM = (inspect.getsource(_node_kernel)
                  + "\nimport json, sys\nprint(json.dumps(_node_kernel(json.loads(sys.stdin.read()))))\n")
