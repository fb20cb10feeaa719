"""py-spy where the ranks are, on every runtime, with nothing installed by hand (the incident's stacks).

    exe = local_pyspy()                                  # the py-spy installed beside sparkserve (a dependency)
    dumps = dump_in_container(node, rank_id, binary)     # docker: {pid: "Thread 12 (idle): ..."}
    ok, why = forensics_ready(cfg, node)                 # `doctor`: will an incident hold stacks on this node?

**docker runtime** — the card's image has no py-spy, and the SSH user on a node is in the docker group, not
root (a host-side py-spy could not read a root-owned container process without sudo). So sparkserve starts a
short-lived *helper container* beside the rank: the rank's own image (present on the node; its ``python3``
lists the processes), the rank's PID namespace (``--pid container:<rank>``), ``CAP_SYS_PTRACE`` on the helper
only, no network; sparkserve's own py-spy binary is copied into it through the docker API before it starts
(``put_archive``: no file is left on the node) and runs ``py-spy dump --nonblocking`` on every Python process
of the rank (a torn read — the interpreter changed under it — is tried again, the third time blocking). The
rank's container is unchanged (no capability added to it: no card difference), and it works on
a paused or SIGSTOPped rank, where ``docker exec`` is refused (``--nonblocking`` reads the memory without
stopping the process). The binary is the one in the py-spy wheel sparkserve depends on (a static build on
manylinux x86_64 and aarch64); a node of another architecture than this machine takes one from
:func:`arch_cache_dir` (``sparkserve doctor`` says how to fill it).

**process runtime** — the node program looks for ``supervise.pyspy``, next to ``serve.vllm``'s venv, and, on a
``local: true`` node, the py-spy installed beside sparkserve itself; a remote node of this machine's
architecture gets sparkserve's binary copied under the run dir.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from platformdirs import user_cache_dir

from sparkserve.nodes.base import Node, NodeError
from sparkserve.nodes.engine import ManagedContainer

IN_CONTAINER = "/.sparkserve-py-spy"
HELPER_TIMEOUT_S = 60.0

# Runs in the helper container (the rank's image's python3, the rank's PID namespace): every Python process
# of the rank, dumped side by side. Standard library only.
HELPER = r'''
import json, os, subprocess, sys, threading
me = os.getpid()
out = {}
def is_python(p):
    try:
        with open(f"/proc/{p}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        exe = os.path.basename(os.readlink(f"/proc/{p}/exe"))
        return "python" in exe or "python" in argv0 or "vllm" in argv0 or argv0.startswith("VLLM")
    except OSError:
        return False
def dump(p):
    try:
        for attempt in range(3):  # a torn nonblocking read is tried again, the last time blocking (nodefacts)
            argv = [sys.argv[1], "dump", *(["--nonblocking"] if attempt < 2 else []), "--pid", str(p)]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=float(sys.argv[2]))
            if r.returncode == 0 or not os.path.exists(f"/proc/{p}"):
                break
        out[str(p)] = r.stdout + (("\n" + r.stderr) if r.stderr.strip() else "")
    except subprocess.TimeoutExpired:
        out[str(p)] = "py-spy dump timed out"
    except OSError as e:
        out[str(p)] = f"py-spy could not run: {e}"
pids = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != me]
ts = [threading.Thread(target=dump, args=(p,)) for p in pids if is_python(p)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps(out))
'''


def local_pyspy() -> Path | None:
    """The py-spy installed with sparkserve: beside this Python, where the py-spy distribution's files say
    (a venv's bin/, a ``pip --target`` dir's bin/), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file():
        return here
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("py-spy")
        for f in dist.files or []:
            if f.name == "py-spy" and "dist-info" not in str(f):
                p = Path(str(dist.locate_file(f))).resolve()
                if p.is_file():
                    return p
        base = Path(str(dist.locate_file(""))).resolve()
        for p in (base / "bin" / "py-spy", base.parent / "bin" / "py-spy"):
            if p.is_file():
                return p
    except (PackageNotFoundError, ImportError, OSError):
        pass
    found = shutil.which("py-spy")
    return Path(found) if found else None


def arch_cache_dir(arch: str) -> Path:
    """Where a py-spy binary for another architecture than this machine's is looked for."""
    return Path(user_cache_dir("sparkserve")) / "py-spy" / arch


def binary_for(arch: str) -> tuple[bytes | None, str]:
    """py-spy's bytes for a node of ``arch`` (``uname -m``), and where they come from (or why there are none)."""
    if arch == platform.machine():
        exe = local_pyspy()
        if exe is None:
            return None, "py-spy is not installed beside sparkserve (pip install py-spy)"
        return exe.read_bytes(), str(exe)
    cached = arch_cache_dir(arch) / "py-spy"
    if cached.is_file():
        return cached.read_bytes(), str(cached)
    return None, (f"no py-spy for {arch} here: put the binary of a manylinux {arch} py-spy wheel at {cached} "
                  f"(pip download --no-deps --only-binary=:all: --platform manylinux2014_{arch} py-spy; "
                  "it is the wheel's py_spy-*.data/scripts/py-spy)")


def node_arch(node: Node) -> str | None:
    res = node.run(["uname", "-m"], step="forensics", timeout=20, check=False)
    return res.stdout.strip() or None if res.ok else None


def _tar_of(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(IN_CONTAINER.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o755, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def dump_in_container(node: Node, rank_id: str, binary: bytes, *, timeout: float = HELPER_TIMEOUT_S,
                      per_pid_s: float = 20.0) -> dict[str, str]:
    """``py-spy dump`` of every Python process of a docker rank, from a helper container in its PID namespace
    (see the module docstring). Keys: the pids as the rank's namespace numbers them. Raises on a docker error;
    the helper is removed in every case."""
    client = node.docker()
    rank = client.containers.get(rank_id)
    helper = client.containers.create(
        rank.attrs["Image"], command=["-I", "-S", "-c", HELPER, IN_CONTAINER, str(per_pid_s)], entrypoint=["python3"],
        name=f"sparkserve-pyspy-{rank.name}-{int(time.time())}", pid_mode=f"container:{rank.id}",
        cap_add=["SYS_PTRACE"], network_mode="none", user="0:0", labels={"sparkserve.role": "forensics"},
        detach=True)
    try:
        helper.put_archive("/", _tar_of(binary))
        helper.start()
        code = helper.wait(timeout=timeout).get("StatusCode")
        out = helper.logs(stdout=True, stderr=False).decode(errors="replace").strip()
        if code != 0 or not out:
            err = helper.logs(stdout=False, stderr=True).decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the py-spy helper container exited {code}: {' | '.join(err) or '(no output)'}")
        got = json.loads(out.splitlines()[-1])
        return {str(k): str(v) for k, v in got.items()}
    finally:
        with contextlib.suppress(Exception):  # a helper already gone is what we want
            helper.remove(force=True)


def pyspy_candidates(cfg: Any, node: Node) -> list[str]:
    """Where py-spy may be on a node (process runtime): ``supervise.pyspy``, next to ``serve.vllm`` (its venv),
    sparkserve's own copy under the run dir (:func:`ship_pyspy`), and — on this machine — the py-spy installed
    beside sparkserve itself."""
    out = [cfg.supervise.pyspy]
    v = cfg.serve.vllm
    if "/" in v:
        base = v.rstrip("/")
        out += [f"{base}/bin/py-spy", f"{os.path.dirname(base)}/py-spy"]
    out.append(f"{cfg.process.run_dir.rstrip('/')}/{SHIPPED}")
    if node.rsync_remote() is None and (mine := local_pyspy()) is not None:
        out.append(str(mine))
    return out


SHIPPED = ".sparkserve/py-spy"


def ship_pyspy(cfg: Any, node: Node) -> str | None:
    """A remote process-runtime node: sparkserve's own py-spy copied under the run dir (same architecture
    only). None when it cannot be; the dump then says py-spy was not found."""
    if node.rsync_remote() is None:
        return None
    arch = node_arch(node)
    data = binary_for(arch)[0] if arch else None
    if data is None:
        return None
    dest = f"{cfg.process.run_dir.rstrip('/')}/{SHIPPED}"
    try:
        node.makedirs(os.path.dirname(dest))
        node.write_bytes(dest, data, mode=0o755)
    except (OSError, NodeError):
        return None
    return dest


def container_dumps(cfg: Any, node: Node, ranks: list[ManagedContainer]) -> dict[str, dict[str, str]]:
    """docker runtime: each rank's stacks from a helper container in its PID namespace (operate/pyspy.py)."""
    arch = node_arch(node)
    data, why = binary_for(arch) if arch else (None, "uname -m did not answer")
    out: dict[str, dict[str, str]] = {}
    for r in ranks:
        if data is None:
            out[r.name] = {"-": f"no py-spy for this node: {why}"}
            continue
        try:
            out[r.name] = dump_in_container(node, r.id, data) or {"-": "(no Python process in the rank)"}
        except Exception as e:  # noqa: BLE001 - forensics take what they can get, and say why not
            out[r.name] = {"-": f"py-spy helper container failed: {type(e).__name__}: {e}"}
    return out


def forensics_ready(cfg: Any, node: Node) -> tuple[bool, str]:
    """Whether an incident on ``node`` will hold Python stacks, and why not (``sparkserve doctor``)."""
    arch = node_arch(node)
    if arch is None:
        return False, "uname -m did not answer"
    if cfg.runtime == "docker":
        data, where = binary_for(arch)
        if data is None:
            return False, where
        return True, (f"py-spy ({where}, {arch}) runs in a helper container in each rank's PID namespace "
                      "with CAP_SYS_PTRACE (the rank itself is unchanged)")
    q = json.dumps(pyspy_candidates(cfg, node))
    res = node.run(["python3", "-I", "-S", "-c", "import json, os, shutil, sys\n"
                    "print(next((shutil.which(os.path.expanduser(c)) for c in json.loads(sys.argv[1]) "
                    "if shutil.which(os.path.expanduser(c))), ''))", q], step="forensics", timeout=30, check=False)
    found = res.stdout.strip() if res.ok else ""
    if found:
        return True, f"py-spy at {found}"
    data, where = binary_for(arch)
    if data is not None and node.rsync_remote() is not None:
        return True, f"no py-spy on the node; sparkserve copies its own ({where}) under process.run_dir at an incident"
    return False, f"no py-spy on the node ({', '.join(json.loads(q))}) and none to copy: {where}"


def forensics_checks(cfg: Any, nodes: dict[str, Node]) -> list[Any]:
    """`doctor`'s "forensics" row per reachable node: ok when an incident will hold Python stacks, warn (and
    why not) otherwise — a missing py-spy never refuses a boot."""
    from sparkserve.deploy.doctor import Check
    from sparkserve.nodes.parallel import on_all

    def one(node: Node) -> tuple[bool, str]:
        try:
            return forensics_ready(cfg, node)
        except Exception as e:  # noqa: BLE001 - a doctor row, never a crash
            return False, f"{type(e).__name__}: {e}"

    got = on_all(list(nodes.values()), one, name=lambda n: n.name)
    return [Check(name, "forensics", "ok" if ok else "warn", why) for name, (ok, why) in got.items()]
