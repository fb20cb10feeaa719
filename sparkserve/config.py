"""Typed configuration: YAML file + ``SPARKSERVE_…`` env overrides over the embedded production default.

Field names follow ``vllm serve`` where one exists. The embedded default
(``sparkserve/data/default.yaml``) is the model card's banked launcher (drafter -G); ``sparkserve init``
writes it out with the hosts to fill in.

One file on purpose (~480 lines, over the house's ~400): it is the whole config contract — every section, each
field's validator beside its field, and the loader that turns a bad value into ``error: <field>: …`` — so a
reader checking what a key means, or why it was refused, reads one module.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sparkserve import profiles
from sparkserve.errors import BadInput
from sparkserve.router_config import RouterConfig, router_rules
from sparkserve.units import parse_size

DEFAULT_CONFIG_NAME = "sparkserve.yaml"
ENV_PREFIX = "SPARKSERVE_"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM's fallback for --api-key; the key never goes into an argv

# Accepted by vLLM 0.33.0's --kv-cache-dtype (validated after parsing, listed in the parser's metavar).
KV_CACHE_DTYPES = (
    "auto", "bfloat16", "float16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
    "fp8_per_token_head", "int4_per_token_head", "int8_per_token_head", "nvfp4", "nvfp4_4over6",
    "nvfp4_ds_mla", "octave_k3v3", "octave_k3v3_compact", "octave_k3v4", "turboquant_3bit_nc",
    "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_k8v4", "ultraquant_4bit",
)


# The card launcher's variables that belong to its image and GPU (GB10, SM121a), not to every engine: a config
# for another GPU replaces serve.env (tests/real does). FLASHINFER_DISABLE_VERSION_CHECK: without it a
# flashinfer/jit-cache version skew kills model inspection on the card's fork.
CARD_ENV = {
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "TORCH_CUDA_ARCH_LIST": "12.1a",
    "FLASHINFER_CUDA_ARCH_LIST": "12.1a",
    "FLASHINFER_DISABLE_VERSION_CHECK": "1",
}


def dialect_names() -> tuple[str, ...]:
    """The engine dialects shipped in sparkserve/data/dialects (their files are plan/dialects.py's to read)."""
    d = resources.files("sparkserve").joinpath("data/dialects")
    return tuple(json.loads(f.read_text())["name"] for f in sorted(d.iterdir(), key=lambda f: f.name)
                 if f.name.endswith(".json"))


def _size(v: Any) -> int:
    try:
        return parse_size(v)
    except ValueError as e:  # re-raised by pydantic as a field error
        raise ValueError(str(e)) from None


ByteSize = Annotated[int, BeforeValidator(_size), PlainSerializer(lambda n: n, return_type=int)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)


class CUDAGraphMode(enum.StrEnum):
    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"

    @classmethod
    def _missing_(cls, value: object) -> CUDAGraphMode | None:
        if isinstance(value, str):  # vLLM accepts any case on the CLI
            return cls.__members__.get(value.upper())
        return None


class NodeConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", description="the node's name in every message, "
                      "container name and journal row")
    host: str = Field(min_length=1, description="SSH address of the node (management network)")
    fabric_ip: str = Field(description="this node's ConnectX-7 IPv4: VLLM_HOST_IP and, on the head, --master-addr")
    user: str = Field(default="root", description="SSH login user (default: ~/.ssh/config's User for this host, else "
                      "root)")
    port: int = Field(default=22, ge=1, le=65535, description="SSH port (default: ~/.ssh/config's Port for this host, "
                      "else 22)")
    gpus: int = Field(default=1, ge=1, description="GPUs on this node (1 on a DGX Spark)")
    local: bool = Field(default=False, description="run on this machine without SSH (sparkserve on the head)")

    @field_validator("fabric_ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError(f"{v!r} is not an IP address") from None


class SSHConfig(Strict):
    known_hosts: Path = Field(default=Path("~/.ssh/known_hosts"), description="the known_hosts file host keys are "
                              "verified against (plain or hashed entries; default: ~/.ssh/config's "
                              "UserKnownHostsFile, else this file); an accepted new key is added here")
    identity_file: Path | None = Field(default=Path("~/.ssh/id_ed25519"), description="a private key file to offer "
                                       "first (unset: what `ssh` itself offers — ~/.ssh/config's IdentityFile, the "
                                       "ssh-agent, OpenSSH's default key files); set and missing: refused")
    accept_new_host_keys: bool = Field(
        default=False, description="add unknown host keys to known_hosts (off: unknown keys are refused)"
    )
    connect_timeout_s: float = Field(default=10.0, gt=0, description="seconds a node's SSH connection may take to "
                                     "open before the node is unreachable")
    keepalive_s: int = Field(default=15, ge=0, description="SSH keepalive interval in seconds (0: off); also "
                             "ServerAliveInterval for rsync")
    # how nodes are reached, not what runs: excluded from the dump, so not part of the deployment fingerprint
    config_file: Path | None = Field(default=Path("~/.ssh/config"), exclude=True, description="OpenSSH client "
                                     "config: Host aliases, HostName, User, Port, IdentityFile, ProxyJump (null: none)")

    def resolved_config_file(self) -> Path | None:
        return self.config_file.expanduser() if self.config_file else None

    def resolved_known_hosts(self) -> Path:
        return self.known_hosts.expanduser()

    def resolved_identity(self) -> Path | None:
        return self.identity_file.expanduser() if self.identity_file else None


class FabricConfig(Strict):
    interface: str = Field(default="auto", description="CX-7 netdev (e.g. enp1s0f1np1) or auto")
    hca: str = Field(default="auto", description="comma-separated RDMA devices for NCCL_IB_HCA, or auto")
    gid_index: int | Literal["auto"] = Field(default="auto", description="NCCL_IB_GID_INDEX, or auto: one HCA, its "
                                             "RoCE v2 IPv4 entry read on each node; several, unset (NCCL picks per "
                                             "HCA)")
    master_port: int = Field(default=29521, ge=1024, le=65535, description="torch.distributed rendezvous "
                             "port on the head (the card's launcher: 29521)")
    sysfs_root: Path = Field(default=Path("/sys"), description="where to read /sys/class/{net,infiniband}")
    nccl_debug: str = Field(default="INFO", description="NCCL_DEBUG; INFO (with NCCL_DEBUG_SUBSYS=INIT,NET) "
                            "prints the transport NCCL chose while communicators are set up — the boot "
                            "window — so the faults gate can tell RDMA from the socket fallback")
    nccl_net: str | None = Field(default="IB", description="NCCL_NET: IB makes NCCL fail closed instead of "
                                 "falling back to sockets silently (null: unset, NCCL picks)")
    addr_range: str = Field(default="auto", description="NCCL_IB_ADDR_RANGE: the fabric subnet NCCL takes RoCE "
                            "v2 IPv4 GIDs from; auto = the smallest network (at least /24) holding every "
                            "node's fabric_ip (and, detected, every listed HCA's own address)")

    @field_validator("addr_range")
    @classmethod
    def _addr_range(cls, v: str) -> str:
        if v == "auto":
            return v
        try:
            return str(ipaddress.ip_network(v, strict=False))
        except ValueError:
            raise ValueError(f"{v!r} is not a network (e.g. 192.168.102.0/24) or auto") from None


class ImageConfig(Strict):
    ref: str = Field(min_length=1, description="the image every rank runs (tag, or tag@sha256:digest); the same "
                     "content fingerprint is required on every node (`image ship` copies it)")


def _host_path(v: Path) -> Path:
    s = str(v)
    if not v.is_absolute():
        raise ValueError(f"{s!r} must be an absolute path (it is bind-mounted on every node)")
    if any(c in s for c in "\n\r\0"):
        raise ValueError(f"{s!r} contains a control character")
    return v


HostPath = Annotated[Path, AfterValidator(_host_path)]


# a Hugging Face repo id, `org/name` or `org/name@revision` (resolved on the nodes by nodes/hf_models)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
                      r"(@[A-Za-z0-9][A-Za-z0-9._/-]{0,199})?")


def _model_target(v: Path) -> Path:
    if not v.is_absolute() and _REPO_ID.fullmatch(str(v)):
        return v
    try:
        return _host_path(v)
    except ValueError:
        raise ValueError(f"{str(v)!r} must be an absolute path (it is bind-mounted on every node) or a Hugging "
                         "Face repo id, org/name[@revision], found in each node's cache") from None


ModelTarget = Annotated[Path, AfterValidator(_model_target)]


class ModelConfig(Strict):
    target: ModelTarget = Field(description="host path of the target model (a Hugging Face cache snapshot "
                                "path works), same on every node, mounted ro; or org/name[@revision]")
    served_name: str = Field(min_length=1, description="--served-model-name: the `model` the API serves and every "
                             "request names")

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, v: str) -> str:
        # vLLM takes any string, but every request and every /metrics line carries it: a 100,000-character name
        # served, and made `up` parse megabytes of /metrics (fault case D17)
        if len(v) > 256:
            raise ValueError(f"is {len(v)} characters long; at most 256")
        if not v.isprintable():
            raise ValueError(f"{v[:40]!r} contains a control character")
        return v


class DrafterConfig(Strict):
    path: HostPath = Field(description="host path of the drafter, same on every node, mounted ro")
    source: Path | None = Field(
        default=None,
        description="the controller's copy, synced to `path` on every node (default: `path`, when it exists "
        "on this machine; otherwise the head node's copy is the reference and must match on every node)",
    )


class CompilationConfig(Strict):
    cudagraph_mode: CUDAGraphMode = Field(default=CUDAGraphMode.FULL_AND_PIECEWISE, description="--compilation-config "
                                          "cudagraph_mode; the graphs gate checks it on every rank")
    cudagraph_capture_sizes: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16, 24, 32],
        description="--compilation-config cudagraph_capture_sizes: the batch sizes captured (ascending, no repeats)")

    @field_validator("cudagraph_capture_sizes")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        if any(s <= 0 for s in v):
            raise ValueError(f"capture sizes must be positive, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"capture sizes must not repeat, got {v}")
        if v != sorted(v):
            raise ValueError(f"capture sizes must be sorted ascending, got {v}")
        return v


class ServeConfig(Strict):
    executor: Literal["mp", "ray"] = Field(default="mp", description="--distributed-executor-backend across nodes: mp "
                                           "(vLLM's own multi-node, the card's) or ray")
    tensor_parallel_size: int = Field(default=2, ge=1, description="--tensor-parallel-size: must equal the number of "
                                      "nodes × nodes[].gpus")
    enable_expert_parallel: bool = Field(default=True, description="--enable-expert-parallel")
    max_model_len: int = Field(default=262144, ge=1, description="--max-model-len: the context length in tokens")
    max_num_seqs: int | None = Field(default=6, ge=1, description="--max-num-seqs: requests in flight at once (null: "
                                     "vLLM's default)")
    block_size: int | None = Field(default=2304, ge=1, description="--block-size (the card: 2304; the engine "
                                   "raises it to 4608 for mamba-page alignment)")
    kv_cache_dtype: str = Field(default="fp8_e4m3", description="--kv-cache-dtype (one of the values vLLM 0.33 "
                                "accepts)")
    gpu_memory_utilization: float = Field(default=0.795, description="--gpu-memory-utilization: the share of unified "
                                          "memory vLLM may take, in (0, 0.95]; above 0.85 validate warns")
    # 8053063680 = 7.5 GiB, the card's "8 GiB" (its 366,749-token pool): rendered as the exact integer
    kv_cache_memory_bytes: ByteSize | None = Field(default=8053063680, description="the KV cache per GPU in bytes (or "
                                                   "`8GiB`), with the image's flag (the card's fork: "
                                                   "--kv-cache-memory; vLLM 0.33: --kv-cache-memory-bytes); it fixes "
                                                   "the pool gates.pool_tokens expects (null: sized by "
                                                   "gpu_memory_utilization)")
    trust_remote_code: bool = Field(default=True, description="--trust-remote-code")
    tool_call_parser: str | None = Field(default="glm47", description="--tool-call-parser (with "
                                         "--enable-auto-tool-choice when enable_auto_tool_choice)")
    enable_auto_tool_choice: bool = Field(default=True, description="--enable-auto-tool-choice (with tool_call_parser)")
    reasoning_parser: str | None = Field(default="glm45", description="--reasoning-parser")
    default_chat_template_kwargs: dict[str, Any] | None = Field(
        default_factory=lambda: {"enable_thinking": True}, description="--default-chat-template-kwargs (JSON)")
    compilation: CompilationConfig = Field(default_factory=CompilationConfig)
    enforce_eager: bool = Field(default=False, description="--enforce-eager: no CUDA graphs (the launcher's EAGER=1); "
                                "the graphs gate fails on it")
    attention_backend: str | None = Field(default=None, description="--attention-backend (null: vLLM picks)")
    host: str | None = Field(default=None, description="API bind address on the head (None = all)")
    port: int = Field(default=8000, ge=1, le=65535, description="--port: the API port on the head")
    api_key_env: str | None = Field(default=None, description="name of an env var holding the API key")
    api_key_file: Path | None = Field(default=None, description="file holding the API key")
    env: dict[str, str] = Field(
        default_factory=lambda: dict(CARD_ENV),
        description="extra environment for every rank (the default: the card's image/GPU-specific variables)",
    )
    extra_args: list[str] = Field(default_factory=list, description="extra vllm serve arguments, verbatim")
    ready_timeout_s: float = Field(default=3600.0, gt=0, description="seconds `up` waits for the head to serve before "
                                   "it stops every rank (a cold boot JIT-compiles kernels)")
    vllm: str = Field(default="vllm", min_length=1, description="runtime: process only — the executable run as "
                      "`<vllm> serve …` on every node (a name looked up on the node's PATH, or a path), or a "
                      "venv directory (then <dir>/bin/vllm)")
    vllm_version: str | None = Field(
        default=None, description="override of the engine's flag dialect (a dialect under sparkserve/data/dialects: "
        "0.33.0, 0.25.1, 0.1.dev20051+g487ecf187). Default: the image's own (its facts from `image verify`, else "
        "the shipped table); the plan renders and validate checks only what that `vllm serve` accepts")

    @field_validator("vllm_version", mode="before")
    @classmethod
    def _dialect(cls, v: Any) -> Any:
        if v is None:
            return v
        v = str(v)
        names = dialect_names()
        if v not in names:
            raise ValueError(f"no engine dialect {v!r} (shipped: {', '.join(names)})")
        return v

    @field_validator("vllm")
    @classmethod
    def _vllm(cls, v: str) -> str:
        if any(c in v for c in "\n\r\0"):
            raise ValueError(f"{v!r} contains a control character")
        return v

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, v: str) -> str:
        if v not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {v!r}; vLLM 0.33 accepts: {', '.join(KV_CACHE_DTYPES)}")
        return v

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _gmu(cls, v: float) -> float:
        if not 0 < v <= 0.95:
            raise ValueError(f"{v} is outside (0, 0.95]; on unified memory the OS needs the rest")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not k or not (k[0].isalpha() or k[0] == "_") or not all(c.isalnum() or c == "_" for c in k):
                raise ValueError(f"{k!r} is not an environment variable name")
            if k == API_KEY_ENV:
                raise ValueError(f"{k} does not belong in the config (it is printed); use serve.api_key_env "
                                 "or serve.api_key_file")
        return {k: str(x) for k, x in v.items()}

    @model_validator(mode="after")
    def _one_key_source(self) -> ServeConfig:
        if self.api_key_env and self.api_key_file:
            raise ValueError("@api_key_file: set api_key_env or api_key_file, not both")
        return self


class SpeculativeConfig(Strict):
    method: Literal["dflash", "mtp"] = Field(default="dflash", description="the --speculative-config method: "
                                             "dflash, the DFlash/DFlash2 drafter at drafter.path; mtp, the target's "
                                             "built-in MTP head, no drafter")
    num_speculative_tokens: int = Field(default=7, ge=1, description="K, the tokens drafted per step: the drafter "
                                        "card's block_size - 1; more is refused, fewer boots with a warning")
    attention_backend: str | None = Field(default=None, description="the drafter's attention_backend in "
                                          "--speculative-config (null: vLLM picks)")


class SmokeCell(Strict):
    prompts: int = Field(default=20, ge=1, description="requests in the smoke cell")
    concurrency: int = Field(default=1, ge=1, description="smoke requests in flight at once")
    max_tokens: int = Field(default=512, ge=1, description="max_tokens of each smoke request")
    request_timeout_s: float = Field(default=120.0, gt=0, description="the deadline of each smoke request; one past "
                                     "it fails the smoke gate")


class GatesConfig(Strict):
    pool_tokens: int | None = Field(default=366749, ge=1, description="the KV pool every rank must report (`KV cache "
                                    "size: N tokens`: the card's 8-GiB discriminator); null: the pool banked for this "
                                    "deployment (`gates --bank`), else any")
    mask_token_id: int | None = Field(default=154856, description="the id the mask gate expects in the mask-loader "
                                      "line, checked against the drafter's config by validate; null: the gate is "
                                      "required only for a drafter with mask_embedding.pt")
    smoke: SmokeCell = Field(default_factory=SmokeCell)
    # how long `up` watches, not what runs: excluded from the dump, so not part of the deployment fingerprint
    settle_s: float = Field(default=3.0, ge=0, exclude=True, description="after the gates pass, `up` keeps "
                            "watching every rank this long before it says serving (a rank dying then fails `up`)")


class BenchConfig(Strict):
    prompts: Path | None = Field(default=None, description="the JSONL `bench` and `ab run` read when --prompts "
                                 "is not given (the card's drafter/eval/prompts_holdout_500.jsonl: each cell "
                                 "takes its first N rows)")


def _run_dir(v: str) -> str:
    if not (v.startswith("/") or v.startswith("~/")):
        raise ValueError(f"{v!r} must be an absolute path or start with ~/ (the node user's home)")
    if any(c in v for c in "\n\r\0") or ".." in v.split("/"):
        raise ValueError(f"{v!r} contains a control character or a .. component")
    return v.rstrip("/") or "/"


CacheRoot = Annotated[str, AfterValidator(_run_dir)]


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


class SuperviseConfig(Strict):
    """`sparkserve supervise`: the checks that keep a serving stack honest, and the bounds of its recovery."""

    interval_s: float = Field(default=5.0, gt=0, description="one round of checks every N seconds")
    canary_deadline_s: float = Field(default=10.0, gt=0, description="a canary generation slower than this "
                                     "is a failed progress check")
    canary_max_tokens: int = Field(default=4, ge=1, le=64, description="max_tokens of each canary generation")
    stall_s: float = Field(default=15.0, gt=0, description="requests running while the generation counters "
                           "stay frozen this long = wedged")
    confirm_rounds: int = Field(default=1, ge=1, description="rounds a fault must hold before recovery acts")
    acceptance_window_s: float = Field(default=30.0, gt=0, description="acceptance is judged per window of "
                                       "this length (from /metrics deltas)")
    acceptance_min_drafts: int = Field(default=50, ge=1, description="a window with fewer drafts is not judged")
    acceptance_drop: float = Field(default=0.5, gt=0, lt=1, description="alarm when the live acceptance "
                                   "length − 1 falls below this fraction of the banked band's")
    memfree_floor_bytes: ByteSize = Field(default=4 * 2**30, description="each node's MemFree floor while "
                                          "serving (GB10: the driver allocates from MemFree, not MemAvailable)")
    meminfo_path: str = Field(default="/proc/meminfo", description="where each node's memory facts are read "
                              "({node} = the node's name: a fake source for tests)")
    kmsg_path: str = Field(default="/dev/kmsg", description="each node's kernel log (NVRM / Xid lines); a "
                           "plain file is read as text ({node} as above)")
    log_follow: bool = Field(default=True, description="read every rank's new log lines each round and judge them for "
                             "fault lines (false: do not)")
    max_restarts: int = Field(default=3, ge=0, description="the give-up budget: restarts within budget_window_s")
    budget_window_s: float = Field(default=1800.0, gt=0, description="the window, in seconds, in which the give-up "
                                   "budget counts restarts")
    backoff_s: float = Field(default=10.0, ge=0, description="the first wait before a restart; doubled each "
                             "time, up to backoff_max_s")
    backoff_max_s: float = Field(default=300.0, ge=0, description="the longest wait between two restarts, in seconds")
    recover: bool = Field(default=True, description="false: detect, keep forensics and alert, never restart")
    incidents_dir: str | None = Field(default=None, description="where incident dirs go (default: the "
                                      "state dir's supervise/incidents)")
    listen: str = Field(default="127.0.0.1:9321", description="the exporter and status page (host:port; "
                        "empty: off)")
    alert_urls: list[str] = Field(default_factory=list, description="apprise notification URLs (Slack, "
                                  "Discord, ntfy, mailto, json:// webhooks)")
    pyspy: str = Field(default="py-spy", description="the py-spy executable on each node (or next to "
                       "serve.vllm's venv)")


class Config(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", validate_assignment=True
    )

    nodes: list[NodeConfig] = Field(min_length=1, description="the Sparks, in order: the first is the head (API "
                                    "server, node-rank 0), the others followers")
    replicas: int = Field(default=1, ge=1, description="copies of the stack behind vllm-router: `nodes` split in "
                          "order into this many equal groups, each one TP x EP stack (docs: replicas)")
    runtime: Literal["docker", "process"] = Field(
        default="docker", description="docker: each rank in a container; process: `serve.vllm serve` as a host "
        "process in its own session on the node")
    ssh: SSHConfig = Field(default_factory=SSHConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
    profile: str | None = Field(default=None, description="the card's named profile (`sparkserve profiles`; "
                                "none: g4-262k): its values apply where a field is left out")
    image: ImageConfig
    model: ModelConfig
    drafter: DrafterConfig | None = Field(description="required unless speculative.method is mtp (then unset)")
    serve: ServeConfig = Field(default_factory=ServeConfig)
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    gates: GatesConfig = Field(default_factory=GatesConfig)
    container: ContainerConfig = Field(default_factory=ContainerConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    process: ProcessConfig = Field(default_factory=ProcessConfig)
    # where host facts are read and which hosts are refused, not what runs: not part of the deployment fingerprint
    host: HostConfig = Field(default_factory=HostConfig, exclude=True)
    # how the stack is watched, not what runs: excluded from the dump, so not part of the deployment fingerprint
    supervise: SuperviseConfig = Field(default_factory=SuperviseConfig, exclude=True)
    # which prompts the bench reads, not what runs: not part of the deployment fingerprint
    bench: BenchConfig = Field(default_factory=BenchConfig, exclude=True)
    # where the replicas' router runs and how it balances: not what any replica runs (not in the fingerprint)
    router: RouterConfig = Field(default_factory=RouterConfig, exclude=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # env overrides the file; the file arrives as init kwargs (see load_config)
        return (env_settings, init_settings)

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data: Any) -> Any:  # the named profile fills the fields the data leaves out
        return profiles.apply(data)

    @model_validator(mode="after")
    def _drafter_for_dflash(self) -> Config:
        if self.drafter is None and self.speculative.method != "mtp":
            raise ValueError("@drafter: required: speculative.method dflash serves the drafter at drafter.path")
        return self

    @model_validator(mode="after")
    def _unique_nodes(self) -> Config:
        for attr in ("name", "host", "fabric_ip"):
            seen: dict[str, int] = {}
            for i, n in enumerate(self.nodes):
                key = getattr(n, attr)
                if attr == "host" and n.local:
                    continue
                if key in seen and not (attr == "host" and self._same_host_ok(i, seen[key])):
                    raise ValueError(f"@nodes.{i}.{attr}: {key!r} repeats nodes[{seen[key]}]")
                seen[key] = i
        return self

    @model_validator(mode="after")
    def _process_runs_mp(self) -> Config:
        if self.runtime == "process" and self.serve.executor != "mp":
            raise ValueError("@serve.executor: runtime: process runs vLLM's own multi-node executor (mp); "
                             "ray needs runtime: docker")
        return self

    @model_validator(mode="after")
    def _replicas_split(self) -> Config:
        local = {p for n in self.nodes if n.local for p in (self.serve.port, self.fabric.master_port)}
        listen = self.supervise.listen.rpartition(":")[2]
        if listen.isdigit():
            local.add(int(listen))
        bad = router_rules(self.router, replicas=self.replicas, nodes=len(self.nodes), local_ports=local,
                           serve_host=self.serve.host, first_head=(self.nodes[0].host, self.nodes[0].fabric_ip))
        if bad:
            raise ValueError(bad)
        return self

    def _same_host_ok(self, i: int, j: int) -> bool:
        # two nodes may share an SSH address only when their ports differ (the rig: one address each anyway)
        return self.nodes[i].port != self.nodes[j].port

    @property
    def head(self) -> NodeConfig:
        return self.nodes[0]

    @property
    def followers(self) -> list[NodeConfig]:
        return self.nodes[1:]

    def normalized(self) -> dict[str, Any]:
        """The config as plain JSON data (paths as strings, sizes as ints), stable for hashing. With runtime
        docker the process-only fields (runtime, process, serve.vllm) are left out: they change nothing that
        runs, so a docker deployment's fingerprint (and its banked pool) is what it was before they existed."""
        data = json.loads(self.model_dump_json())
        if self.runtime == "docker":
            for key in ("runtime", "process"):
                data.pop(key, None)
            data["serve"].pop("vllm", None)
        if data.get("replicas") == 1:  # one stack: its fingerprint is what it was before replicas existed
            data.pop("replicas")
        if data["serve"].get("vllm_version") is None:  # the default (the image decides): not in the fingerprint
            data["serve"].pop("vllm_version")
        for key in ("profile", "drafter"):  # unset (the default profile; mtp): as before the fields existed
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def fingerprint(self) -> str:
        """sha256 of the normalized config (the deploy adds image ID and drafter manifest to it)."""
        blob = json.dumps(self.normalized(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def resolve_api_key(cfg: Config) -> str | None:
    """The API key from ``serve.api_key_env`` or ``serve.api_key_file`` (None when neither is set).

    Raises BadInput naming the field when the source is configured but empty or unreadable.
    """
    s = cfg.serve
    if s.api_key_env:
        key = os.environ.get(s.api_key_env, "").strip()
        if not key:
            raise BadInput("serve.api_key_env", f"${s.api_key_env} is not set or empty")
        return key
    if s.api_key_file:
        try:
            key = s.api_key_file.expanduser().read_text().strip()
        except OSError as e:
            raise BadInput("serve.api_key_file", f"cannot read {s.api_key_file}: {e.strerror or e}") from None
        if not key:
            raise BadInput("serve.api_key_file", f"{s.api_key_file} is empty")
        return key
    return None


def default_yaml_text() -> str:
    return resources.files("sparkserve").joinpath("data/default.yaml").read_text()


#: The hosts `sparkserve init` writes: a command that would connect to one names it as a placeholder.
PLACEHOLDER_HOSTS = ("spark-a.lan", "spark-b.lan")


def placeholder_hosts(cfg: Config) -> list[str]:
    """``nodes.N.host`` fields still holding the init file's placeholder host names."""
    return [f"nodes.{i}.host" for i, n in enumerate(cfg.nodes) if n.host in PLACEHOLDER_HOSTS and not n.local]


def refuse_placeholders(cfg: Config) -> None:
    """BadInput when a node's host is still `sparkserve init`'s placeholder (nothing would answer there)."""
    bad = placeholder_hosts(cfg)
    if bad:
        first = bad[0]
        host = cfg.nodes[int(first.split(".")[1])].host
        raise BadInput(first, f"{host} is a placeholder from `sparkserve init`: put your Spark's SSH address "
                       "(or ~/.ssh/config alias) there", details=[f"{b}: {cfg.nodes[int(b.split('.')[1])].host} "
                                                              "is a placeholder too" for b in bad[1:]])


def _yaml_lines(text: str) -> Any:
    """The YAML's node tree (for line numbers), or None when it cannot be composed."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def _line_of(root: Any, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of ``loc`` (a pydantic error location) in the YAML node tree: the deepest key found."""
    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if getattr(k, "value", None) == str(part)), None)
            if hit is None:
                return line
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the config section at ``loc`` (for "did you mean")."""
    import types
    import typing

    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann: Any = field.annotation
        for _ in range(4):  # unwrap Optional / list / Annotated down to a model
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                break
            if typing.get_origin(ann) in (list, typing.Union, types.UnionType, Annotated) and args:
                ann = args[0]
            else:
                break
        model = ann
    return list(getattr(model, "model_fields", {}))


def _one_error(err: Any, root: Any, source: str) -> tuple[str, str]:
    """One pydantic error as (field, what), with its YAML line and, for an unknown key, "did you mean"."""
    import difflib

    loc_t = tuple(err["loc"])
    loc = ".".join(str(p) for p in loc_t) or source
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if msg.startswith("@") and ": " in msg:  # a model-level rule naming its own field: "@nodes.1.name: ..."
        field, msg = msg[1:].split(": ", 1)
        loc = f"{loc}.{field}" if err["loc"] else field
        loc_t = loc_t + tuple(int(p) if p.isdigit() else p for p in field.split("."))
    if err["type"] == "extra_forbidden":
        near = difflib.get_close_matches(str(loc_t[-1]), _fields_at(loc_t[:-1]), n=1, cutoff=0.6)
        msg = "unknown field" + (f"; did you mean `{near[0]}`?" if near else
                                 " (check the spelling; names follow `vllm serve`)")
    elif err["type"] == "missing":
        msg = "is required"
    line = _line_of(root, loc_t) if root is not None else None
    if line is None and err["type"] == "missing" and root is not None:
        line = _line_of(root, loc_t[:-1])  # the section it is missing from
    where = f" ({source} line {line})" if line else ""
    return loc, msg + where


def _format_error(e: ValidationError, source: str, text: str | None = None) -> BadInput:
    """Every problem of a config, the unknown keys first (a misspelt key also makes its real name
    "required"): the first as the error's headline, each further one a detail line ``<field>: <what>``."""
    root = _yaml_lines(text) if text is not None else None
    errs = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
    found = [_one_error(err, root, source) for err in errs]
    (loc, msg), rest = found[0], found[1:]
    more = len(rest)
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return BadInput(loc, msg + tail, details=[f"{w}: {m}" for w, m in rest])


def find_config_path(path: Path | None) -> Path | None:
    if path is not None:
        return path
    env = os.environ.get(f"{ENV_PREFIX}CONFIG")
    if env:
        return Path(env)
    cwd = Path(DEFAULT_CONFIG_NAME)
    return cwd if cwd.exists() else None


def no_config_error() -> BadInput:
    """Exit 2 for a command that needs a config file and finds none."""
    return BadInput("config", f"no {DEFAULT_CONFIG_NAME} in {Path.cwd()} (or -c / {ENV_PREFIX}CONFIG); "
                    "run `sparkserve init`")


def load_config(path: Path | None = None, *, overrides: dict[str, Any] | None = None,
                require_file: bool = False) -> Config:
    """Load ``path`` (or ./sparkserve.yaml, or the embedded default) with env overrides applied.

    ``require_file``: no file found is an error (a command that reaches nodes never runs on the embedded
    default's placeholder hosts). Raises BadInput naming the field or file on any problem.
    """
    path = find_config_path(path)
    if path is None and require_file:
        raise no_config_error()
    source = str(path) if path else "embedded default"
    if path is not None and not path.exists():
        raise BadInput(str(path), "does not exist" + _near_file(path))
    try:
        text = path.read_text() if path else default_yaml_text()
    except OSError as e:
        raise BadInput(str(path), f"cannot read config: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise BadInput(where, f"not valid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        raise BadInput(source, "the config file is empty (run `sparkserve init` for a commented one)")
    if not isinstance(data, dict):
        raise BadInput(source, "the config must be a YAML mapping")
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return Config(**data)
    except ValidationError as e:
        raise _format_error(e, source, text) from None


def _near_file(path: Path) -> str:
    """"; did you mean X?" for a file next to ``path`` whose name is close to it."""
    import difflib

    try:
        names = [p.name for p in (path.parent if str(path.parent) else Path(".")).iterdir()]
    except OSError:
        return ""
    near = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean {path.parent / near[0]}?" if near else ""


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
