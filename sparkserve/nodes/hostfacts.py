"""Host facts of a node, the GB10 way: unified memory as CUDA sees it, the host settings the field has catalogued,
and the kernel's own NVRM/Xid lines.

    q = host_question(cfg, drop=True)            # asked inside the one node probe (deploy/probe.py)
    facts = HostFacts.from_answer(answer)         # memory, host settings, sudo rule, GPU memory
    memory_verdict(cfg, node_cfg, facts)          # (status, detail): free accelerator memory against GMU
    host_verdicts(cfg, facts_by_node)             # warn/fail items, each with its fix line; nodes compared
    kernel_faults(node, cfg, since=t)             # NVRM/Xid kernel lines logged since unix time t

Why MemFree: on GB10 the GPU allocates from the kernel's free pages in 2 MiB blocks, and ``cudaMemGetInfo`` free
tracks ``MemFree`` (unsloth#10704), while ``MemAvailable`` counts page cache the driver cannot take. After an earlier
boot or a copied target, page cache holds tens of GB: every MemAvailable check passes, then the driver fails an
allocation (``NV_ERR_NO_MEMORY``) and the host livelocks. So before the ranks start, every node syncs, drops the
page cache and compacts (``sudo -n /usr/bin/tee /proc/sys/vm/drop_caches``; the exact sudoers line is
:func:`sudoers_line`), and free memory is MemFree after the drop. A node whose ``nvidia-smi`` reports numbers has a
discrete GPU: its free memory is the driver's.

The node-side programs are :mod:`sparkserve.nodes.hostfacts_node` (stdlib only, shipped by source); every path
they read is under ``host.proc_root`` (``/proc``) or ``fabric.sysfs_root`` so the rig can hand each node fake sources.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sparkserve.config import Config, NodeConfig
from sparkserve.errors import SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.hostfacts_node import KERNEL_PROGRAM
from sparkserve.units import human_bytes

Status = Literal["ok", "warn", "fail"]
TEE = "/usr/bin/tee"  # the one program the sudoers rule allows, with exactly these two files as its argument
VM_FILES = ("drop_caches", "compact_memory")


def sudoers_line(user: str, proc_root: str = "/proc") -> str:
    """The one sudoers line the page-cache drop needs: ``tee`` on exactly the two vm files, nothing else."""
    files = [f"{proc_root.rstrip('/')}/sys/vm/{n}" for n in VM_FILES]
    return f"{user} ALL=(root) NOPASSWD: " + ", ".join(f"{TEE} {f}" for f in files)


def sudoers_fix(user: str, proc_root: str = "/proc") -> str:
    """How to add :func:`sudoers_line` (validated by visudo, in a file of its own)."""
    return (f"add `{sudoers_line(user, proc_root)}` with `sudo visudo -f /etc/sudoers.d/sparkserve` on the node")


def host_question(cfg: Config, *, drop: bool, sudo_check: bool = False, gpu: bool = True) -> dict[str, Any]:
    """What the probe asks every node about its host (``drop``: drop the page cache and compact first; ``gpu``:
    ask nvidia-smi for the GPU's memory — a tenth of a second or more, so `up`'s pre-flight leaves it to the
    look just before the ranks start)."""
    venvs = []
    if cfg.runtime == "process" and "/" in cfg.serve.vllm:  # serve.vllm: a venv dir, or <venv>/bin/vllm
        v = cfg.serve.vllm.rstrip("/")
        venvs.append(v.rsplit("/bin/", 1)[0] if "/bin/" in v else v)
    return {"proc_root": str(cfg.host.proc_root), "sysfs_root": str(cfg.fabric.sysfs_root), "drop": drop,
            "nvidia_smi": cfg.host.nvidia_smi if gpu else None, "sudo_check": sudo_check, "venvs": venvs}


def meminfo_bytes(meminfo: str, key: str) -> int | None:
    """Bytes of one /proc/meminfo line (``MemFree``, ``MemAvailable``, ``MemTotal``); None when absent."""
    m = re.search(rf"^{key}:\s+(\d+)\s+kB", meminfo, re.M)
    return int(m.group(1)) * 1024 if m else None


def high_order_free(buddyinfo: str, page_size: int = 4096, order: int = 9) -> int | None:
    """Bytes free in blocks of order >= ``order`` (2 MiB and up with 4 KiB pages) over every zone of
    /proc/buddyinfo; None when it has no zone line."""
    total, seen = 0, False
    for line in buddyinfo.splitlines():
        if "zone" not in line:
            continue
        counts = line.split("zone", 1)[1].split()[1:]
        seen = True
        for k, c in enumerate(counts):
            if k >= order and c.isdigit():
                total += int(c) << k
    return total * page_size if seen else None


@dataclass
class GpuMemory:
    """Free and total accelerator memory of one node, and where it was read."""

    free: int
    total: int
    unified: bool
    source: str  # "MemFree" | "nvidia-smi"


@dataclass
class HostFacts:
    """One node's host answers (see :func:`_node_host`)."""

    meminfo: str = ""
    buddyinfo: str = ""
    page_size: int = 4096
    uptime: float | None = None
    drop: str | None = None  # None: not asked; "": done; else why it could not be done
    osrelease: str = ""
    cmdline: str = ""
    swappiness: str = ""
    driver: str = ""
    earlyoom: bool = False
    fw: dict[str, str] = field(default_factory=dict)
    shm: tuple[int, int] | None = None
    nccl_system: list[str] = field(default_factory=list)
    nccl_pip: list[str] = field(default_factory=list)
    gpu: dict[str, Any] | None = None
    sudo: str | None = None  # None: not checked; "": the rule works

    @classmethod
    def from_answer(cls, a: Mapping[str, Any]) -> HostFacts:
        try:
            up = float(a.get("uptime") or "")
        except ValueError:
            up = None
        shm = a.get("shm")
        return cls(meminfo=a.get("meminfo", ""), buddyinfo=a.get("buddyinfo", ""),
                   page_size=int(a.get("page_size") or 4096), uptime=up, drop=a.get("drop"),
                   osrelease=a.get("osrelease", ""), cmdline=a.get("cmdline", ""),
                   swappiness=a.get("swappiness", ""), driver=a.get("driver", ""),
                   earlyoom=bool(a.get("earlyoom")), fw=dict(a.get("fw") or {}),
                   shm=(int(shm[0]), int(shm[1])) if shm else None, nccl_system=list(a.get("nccl_system") or []),
                   nccl_pip=list(a.get("nccl_pip") or []), gpu=a.get("gpu"), sudo=a.get("sudo"))

    def gpus(self) -> list[tuple[int, int]] | None:
        """(free, total) bytes per discrete GPU from nvidia-smi; None when there is none with its own memory
        (no nvidia-smi, or GB10's ``[N/A]``: unified memory)."""
        g = self.gpu
        if not g or g.get("rc") != 0:
            return None
        out = []
        for line in str(g.get("out", "")).splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                return None
            out.append((int(parts[0]) * 2**20, int(parts[1]) * 2**20))
        return out or None

    def memory(self, gpu_indices: list[int]) -> GpuMemory | None:
        """Free accelerator memory: the fullest of the node's discrete GPUs, else MemFree of unified memory."""
        gpus = self.gpus()
        if gpus is not None:
            mine = [gpus[i] for i in gpu_indices if 0 <= i < len(gpus)] or gpus[:1]
            free, total = min(mine)
            return GpuMemory(free, total, False, "nvidia-smi")
        free, total = meminfo_bytes(self.meminfo, "MemFree"), meminfo_bytes(self.meminfo, "MemTotal")
        if free is None or not total:
            return None
        return GpuMemory(free, total, True, "MemFree")

    def fingerprint(self) -> dict[str, Any]:
        """What "this host" means when two boots are compared (`doctor --drift`)."""
        args = self.cmdline.split()
        return {"kernel": self.osrelease, "driver": self.driver, "cx7_firmware": dict(sorted(self.fw.items())),
                "iommu": [a for a in args if a.startswith(("iommu", "amd_iommu", "intel_iommu"))],
                "swappiness": self.swappiness, "earlyoom": self.earlyoom,
                "shm_bytes": self.shm[0] if self.shm else None, "nccl_system": self.nccl_system,
                "nccl_pip": self.nccl_pip, "mem_total": meminfo_bytes(self.meminfo, "MemTotal")}


def gpu_indices(cfg: Config, node_cfg: NodeConfig) -> list[int]:
    """The GPUs a node's ranks use: serve.env's CUDA_VISIBLE_DEVICES when it lists indices, else the first
    ``gpus``."""
    vis = cfg.serve.env.get("CUDA_VISIBLE_DEVICES", "")
    if vis and all(p.strip().isdigit() for p in vis.split(",")):
        return [int(p) for p in vis.split(",")][: node_cfg.gpus]
    return list(range(node_cfg.gpus))


Verdict = tuple[str, Status, str]  # (check name, status, detail with its fix)


def memory_verdict(cfg: Config, node_cfg: NodeConfig, f: HostFacts, *, dropped: bool) -> list[Verdict]:
    """Free accelerator memory against ``gpu_memory_utilization`` x total, as vLLM checks it at start-up (and
    kv_cache_memory_bytes against the whole memory). ``dropped``: the page cache was to be dropped just before
    (`up`); without it (`doctor`) page cache that a drop would free only warns."""
    name, gmu = node_cfg.name, cfg.serve.gpu_memory_utilization
    mem = f.memory(gpu_indices(cfg, node_cfg))
    if mem is None:
        return [("memory", "warn", f"no MemFree/MemTotal under {cfg.host.proc_root}/meminfo and no GPU memory from "
                 f"{cfg.host.nvidia_smi}: free memory not checked")]
    out: list[Verdict] = []
    kv = cfg.serve.kv_cache_memory_bytes
    if kv is not None and kv > mem.total:
        out.append(("kv_cache", "fail", f"serve.kv_cache_memory_bytes {human_bytes(kv)} is more than {name}'s whole "
                    f"accelerator memory ({human_bytes(mem.total)})"))
    need = int(gmu * mem.total)
    kind = "unified memory" if mem.unified else "GPU memory"
    where = " (MemFree after dropping the page cache)" if mem.unified and dropped else (
        " (MemFree)" if mem.unified else "")
    detail = (f"free {kind} {human_bytes(mem.free)}{where} of {human_bytes(mem.total)}; gpu_memory_utilization "
              f"{gmu} x total = {human_bytes(need)}")
    if mem.unified:
        avail, high = meminfo_bytes(f.meminfo, "MemAvailable"), high_order_free(f.buddyinfo, f.page_size)
        if avail is not None:
            detail += f"; MemAvailable {human_bytes(avail)}"
        if high is not None:
            detail += f"; {human_bytes(high)} in 2 MiB+ blocks"
    if mem.free >= need:
        return [*out, ("memory", "ok", detail)]
    user = node_cfg.user
    if mem.unified and not dropped:
        avail = meminfo_bytes(f.meminfo, "MemAvailable") or 0
        if avail >= need and f.sudo == "":
            return [*out, ("memory", "warn", detail + " — page cache holds the difference; `up` drops it before "
                           "the boot")]
        fix = (" — page cache holds the difference and cannot be dropped: " + sudoers_fix(user)) if avail >= need \
            else f" — free memory on {name} or lower serve.gpu_memory_utilization"
        return [*out, ("memory", "fail", f"free {kind} {human_bytes(mem.free)} is below gpu_memory_utilization {gmu} "
                       f"x {human_bytes(mem.total)} = {human_bytes(need)}: {detail}{fix}")]
    fix = f" — free memory on {name} (another process holds it) or lower serve.gpu_memory_utilization"
    if mem.unified and f.drop:
        fix += f"; the page cache could not be dropped ({f.drop}): {sudoers_fix(user)}"
    return [*out, ("memory", "fail", f"free {kind} {human_bytes(mem.free)} is below gpu_memory_utilization {gmu} x "
                   f"{human_bytes(mem.total)} = {human_bytes(need)}: vLLM would refuse to start{fix}")]


def host_verdicts(cfg: Config, facts: Mapping[str, HostFacts], *, multi_node: bool) -> list[tuple[str, Verdict]]:
    """The host checks of every node, then the cross-node comparisons: (node, verdict) pairs, each fix inline."""
    out: list[tuple[str, Verdict]] = []
    for name, f in facts.items():
        user = next((n.user for n in cfg.nodes if n.name == name), "root")
        if f.osrelease and f.osrelease in cfg.host.known_bad_kernels and multi_node:
            out.append((name, ("kernel", "fail", f"kernel {f.osrelease}: RDMA memory registration fails above ~90 GB "
                               "resident (ibv_reg_mr ENOMEM, eugr/spark-vllm-docker#392) — boot another kernel "
                               "(`sudo grub-reboot` to the previous one), or drop it from host.known_bad_kernels "
                               "once fixed")))
        elif f.osrelease:
            out.append((name, ("kernel", "ok", f.osrelease)))
        if multi_node and f.fw:
            args = f.cmdline.split()
            pt = any(a in ("iommu.passthrough=1", "iommu=pt") for a in args)
            out.append((name, ("iommu", "ok", "passthrough") if pt else (
                "iommu", "warn", "iommu not in passthrough (one report: a CX-7 function went from 13 to 112 Gb/s "
                "with it) — add iommu.passthrough=1 to GRUB_CMDLINE_LINUX_DEFAULT, `sudo update-grub`, reboot")))
        if f.swappiness:
            sw = int(f.swappiness) if f.swappiness.isdigit() else -1
            out.append((name, ("swappiness", "ok", f"vm.swappiness {sw}") if 0 <= sw <= 10 else (
                "swappiness", "warn", f"vm.swappiness {f.swappiness}: swapping unified memory wedges a GB10 under "
                "load — `sudo sysctl -w vm.swappiness=1` (and in /etc/sysctl.d/)")))
        if f.earlyoom:
            out.append((name, ("earlyoom", "warn", "earlyoom is running: it kills the vLLM worker when MemAvailable "
                               "dips during load — `sudo systemctl disable --now earlyoom`, or start it with "
                               "--avoid '(^|/)(python3?|vllm)$'")))
        if f.shm is not None:
            size, used = f.shm
            if size < cfg.host.min_shm_bytes:
                out.append((name, ("shm", "warn", f"/dev/shm is {human_bytes(size)} (--ipc=host uses the host's) — "
                                   "`sudo mount -o remount,size=16G /dev/shm`")))
            elif used > 2**30:
                out.append((name, ("shm", "warn", f"/dev/shm holds {human_bytes(used)} (segments of killed ranks "
                                   "hold unified memory) — remove stale psm_*/nccl-* files with no stack running")))
            else:
                out.append((name, ("shm", "ok", f"/dev/shm {human_bytes(size)}, {human_bytes(used)} used")))
        if f.nccl_pip and f.nccl_system:
            out.append((name, ("nccl", "warn", f"vLLM loads the pip NCCL ({', '.join(f.nccl_pip)}) while the system "
                               f"has {f.nccl_system[0]}: pip and system builds of one version behave differently "
                               "under load (vllm#42354) — set serve.env VLLM_NCCL_SO_PATH to the system library")))
        if f.sudo is not None:
            out.append((name, ("page cache drop", "ok", "sudo -n may drop the page cache and compact") if f.sudo == ""
                        else ("page cache drop", "warn", f"sudo -n cannot drop the page cache ({f.sudo}) — "
                              + sudoers_fix(user, str(cfg.host.proc_root)))))
    if len(facts) > 1:
        out += _differ(facts, "kernel", lambda f: f.osrelease, "boot the same kernel on every node")
        out += _differ(facts, "driver", lambda f: f.driver, "install the same NVIDIA driver on every node")
        out += _differ(facts, "firmware", lambda f: json.dumps(sorted(f.fw.values())),
                       "flash the same ConnectX-7 firmware on every node (mlxfwmanager)")
        out += _differ(facts, "nccl", lambda f: json.dumps([f.nccl_system, f.nccl_pip]),
                       "use one NCCL build on every node")
    return out


def _differ(facts: Mapping[str, HostFacts], what: str, key: Any, fix: str) -> list[tuple[str, Verdict]]:
    values = {name: key(f) for name, f in facts.items() if key(f) not in ("", "[]", "[[], []]")}
    if len(set(values.values())) <= 1:
        return []
    first = next(iter(values))
    said = ", ".join(f"{n}: {v}" for n, v in values.items())
    return [(first, (f"{what} parity", "warn", f"{what} differs between the nodes ({said}) — {fix}"))]


def storage_parity(drivers: Mapping[str, str]) -> list[tuple[str, Verdict]]:
    """Docker storage drivers compared across nodes (the same image gets different IDs: eugr#327)."""
    known = {k: v for k, v in drivers.items() if v}
    if len(set(known.values())) <= 1:
        return []
    said = ", ".join(f"{n}: {v}" for n, v in known.items())
    first = next(iter(known))
    return [(first, ("storage parity", "warn", f"docker storage drivers differ ({said}): one image gets another ID "
                     "on each node — configure the same storage-driver (or containerd snapshotter) everywhere"))]


@dataclass
class KernelLines:
    """NVRM/Xid kernel lines of one node since a boot began; ``error`` when no kernel log could be read."""

    node: str
    lines: list[str]
    source: str | None
    error: str | None = None


def kernel_faults(node: Node, cfg: Config, *, since: float) -> KernelLines:
    """The NVRM/Xid lines ``node``'s kernel logged since unix time ``since`` (one python3 run); never raises."""
    q = {"since": since, "proc_root": str(cfg.host.proc_root), "source": cfg.host.kernel_log}
    try:
        res = node.run(["python3", "-c", KERNEL_PROGRAM], stdin=json.dumps(q).encode(), step="kernel log",
                       timeout=60, check=False)
        data = json.loads(res.stdout) if res.ok else {"error": (res.stderr.strip().splitlines() or ["failed"])[-1]}
    except (SparkserveError, ValueError) as e:
        data = {"error": getattr(e, "what", str(e))}
    return KernelLines(node.name, [str(t) for _, t in data.get("lines", [])], data.get("source"), data.get("error"))
