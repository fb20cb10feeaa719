"""How each rank runs on its node: ``container`` (docker), ``process`` (runtime: process), the boot's
unified-memory ``watchdog``, and ``host`` (where host facts are read, which kernels are refused)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from sparkserve.config.fields import ByteSize, CacheRoot, Strict, _run_dir


class ContainerConfig(Strict):
    """How each rank's container is run. The rig turns GPUs and RDMA devices off."""

    name_prefix: str = Field(default="sparkserve", pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="container names: "
                             "{prefix}-r{rank}-{node}")
    gpus: Literal["all", "none"] = Field(default="all", description="--gpus all, or none (the rig: no GPU)")
    rdma_devices: list[str] = Field(default_factory=lambda: ["/dev/infiniband"], description="devices passed with "
                                    "--device (the RDMA devices NCCL needs; empty without RDMA)")
    shm_size: ByteSize | None = Field(default=None, description="ignored: the containers share the host's IPC "
                                      "namespace (--ipc=host), so /dev/shm is the host's and docker drops "
                                      "--shm-size; kept so older configs load (validate warns)")
    cache_root: CacheRoot = Field(default="~/.cache/sparkserve", description="JIT caches on each node (~/ = the "
                                  "node user's home), one directory per image ID")
    stop_timeout_s: int = Field(default=30, ge=1, description="docker stop -t: seconds a rank has to exit before it "
                                "is killed (never rm -f a GPU-active container on GB10)")
    memlock: int = Field(default=-1, ge=-1, description="RLIMIT_MEMLOCK bytes for RDMA (-1 = unlimited)")
    memory: ByteSize | None = Field(default=118 * 2**30, description="docker --memory (the card: 118g; null: no "
                                    "limit)")
    core_dumps: bool = Field(default=False, description="false: --ulimit core=0 (a crashing rank with ~90 GB "
                             "resident on unified memory must not dump core)")


class ProcessConfig(Strict):
    """runtime: process — where each rank's log and manifest live on its node."""

    run_dir: Annotated[str, AfterValidator(_run_dir)] = Field(
        default="~/.local/state/sparkserve/run",
        description="per-deployment run dirs on each node (~/ = the node user's home)")


class WatchdogConfig(Strict):
    """The unified-memory watchdog of a boot (deploy/watchdog.py). It reads MemFree, not MemAvailable: on GB10 the
    driver allocates from free pages in 2 MiB blocks, never from page cache (docs/concepts/gb10-guards.md)."""

    memory_floor_bytes: ByteSize = Field(default=8 * 2**30, description="the hard floor: MemFree below it, after a "
                                         "drop and compaction, stops every rank")
    enabled: bool = Field(default=True, description="the unified-memory watchdog during every boot (false: off)")
    # how `up` watches, not what runs: excluded from the dump, so not part of the deployment fingerprint
    soft_floor_bytes: ByteSize = Field(default=12 * 2**30, exclude=True, description="MemFree below it: drop the "
                                       "page cache and compact (at most every drop_interval_s; never below the "
                                       "hard floor)")
    high_order_floor_bytes: ByteSize = Field(default=2 * 2**30, exclude=True, description="free memory in blocks "
                                             "of order >= 9 (/proc/buddyinfo) below it: compact")
    drop_interval_s: float = Field(default=15.0, ge=0, exclude=True, description="at least this many seconds between "
                                   "two page-cache drops under the soft floor")
    drop_caches: bool = Field(default=True, exclude=True, description="before ranks start, `sync`, drop the page "
                              "cache and compact on every node (sudo -n; `doctor` prints the sudoers line)")


#: Kernels whose RDMA memory registration fails above ~90 GB resident (ibv_reg_mr ENOMEM; eugr/spark-vllm-docker#392).
KNOWN_BAD_RDMA_KERNELS = ("7.0.0-1019-nvidia",)


class HostConfig(Strict):
    """Where each node's host facts are read (tests point these at fake sources) and the host rules."""

    proc_root: Path = Field(default=Path("/proc"), description="where to read meminfo, buddyinfo, uptime, cmdline, "
                            "sys/vm/* and sys/kernel/osrelease (like fabric.sysfs_root)")
    kernel_log: str = Field(default="auto", description="auto: /dev/kmsg, else `journalctl -k`, else `dmesg`; or "
                            "the path of a file in /dev/kmsg's record format")
    nvidia_smi: str = Field(default="nvidia-smi", description="the executable asked for a discrete GPU's free "
                            "memory (none, or [N/A] on GB10: unified memory, MemFree is what CUDA sees)")
    known_bad_kernels: list[str] = Field(default_factory=lambda: list(KNOWN_BAD_RDMA_KERNELS),
                                         description="kernel releases refused on a multi-node stack")
    min_shm_bytes: ByteSize = Field(default=2 * 2**30, description="the host /dev/shm (--ipc=host uses it)")

    @field_validator("kernel_log", "nvidia_smi")
    @classmethod
    def _no_control(cls, v: str) -> str:
        if not v or any(c in v for c in "\n\r\0"):
            raise ValueError(f"{v!r} is empty or contains a control character")
        return v

