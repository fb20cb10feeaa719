"""Config → Plan: the one place where vLLM argv, env and the per-node container spec are built.

The spec itself and its two docker renderings are :mod:`sparkserve.plan.container`.

Pure: no I/O. Fabric values that are ``auto`` in the config are resolved on the nodes at ``up`` and
passed in as ``fabric_env``; without them the plan leaves those variables out (never empty).

Both runtimes get the same specs. ``runtime: docker`` runs ``command`` in a container with the mounts;
``runtime: process`` runs :meth:`Plan.process_argv` (``command`` with ``serve.vllm`` for ``vllm`` and the
host paths of the target and drafter where a container sees its mounts) as a host process, no mounts. A
one-node plan runs vLLM on one node alone: no ``--nnodes``/``--node-rank``/``--master-addr``/
``--master-port``/``--headless``, no executor flag (vLLM picks), TP = that node's GPUs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from typing import Literal

from pydantic import BaseModel

from sparkserve.config import API_KEY_ENV, Config, NodeConfig
from sparkserve.models.hf_cache import mount_for
from sparkserve.plan.container import (
    LABEL_FINGERPRINT,
    LABEL_MANAGED,
    LABEL_NODE,
    LABEL_RANK,
    LABEL_ROLE,
    ContainerSpec,
    Mount,
)
from sparkserve.plan.dialects import Dialect, dialect_for
from sparkserve.plan.fabric import NCCL_BOOT_SUBSYS
from sparkserve.plan.fabric import addr_range as fabric_addr_range

TARGET_MOUNT = "/models/target"
DRAFTER_MOUNT = "/models/drafter"
CACHE_MOUNT = "/cache"  # the image's cache dir (container.cache_root/<image key>), as the card mounts it
CACHE_MOUNTS = {  # subdir of the image's cache dir → container path (JIT caches survive restarts)
    "vllm": "/root/.cache/vllm",
    "flashinfer": "/root/.cache/flashinfer",  # the card's launcher
    "tilelang": "/root/.tilelang",  # the card's launcher (TileLang's default cache, ~/.tilelang)
    "triton": "/root/.triton",
    "deep_gemm": "/root/.deep_gemm",  # DeepGEMM's JIT cache (DG_JIT_CACHE_DIR, set below)
}
RAY_PORT = 6379

# Flags that legitimately differ between ranks (rank parity ignores them, with their values).
RANK_SPECIFIC_FLAGS = ("--node-rank", "--headless", "--host", "--port", "--api-server-count")
# Env that legitimately differs between nodes.
NODE_SPECIFIC_ENV = (
    "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
    "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "MN_IF_NAME", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS",
    API_KEY_ENV,  # the API key lives on the head only (the API server runs there)
)

# Environment every rank gets: the card's banked launcher (card-stack.md "Env"; docs/concepts/card-differences.md
# lists where sparkserve differs). The arch lists and FLASHINFER_DISABLE_VERSION_CHECK are serve.env defaults
# (they are the image's and the GPU's, not every engine's); the fabric's are node_env's.
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_ENGINE_READY_TIMEOUT_S": "3600",  # "load-bearing — cold JIT otherwise kills boot" (card README)
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "NCCL_IB_DISABLE": "0",
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    "NCCL_CROSS_NIC": "0",
    "NCCL_IB_MERGE_NICS": "0",
    "NCCL_BLOCKING_WAIT": "0",
    # a rank that JIT-compiles for minutes must not trip torch's 600 s NCCL watchdog on a cold boot
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "1800",
    "TORCH_NCCL_DISABLE_WATCHDOG": "1",
}
# Only in a container (runtime docker): paths inside the image's cache mount.
CONTAINER_ENV = {
    "HF_HOME": f"{CACHE_MOUNT}/huggingface",  # the card's launcher
    "DG_JIT_CACHE_DIR": CACHE_MOUNTS["deep_gemm"],
}
# The dual-rail rule's variables (issue 26), set with any multi-node fabric as the card does.
ROCE_ENV = {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET"}
SOCKET_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "MN_IF_NAME", "UCX_NET_DEVICES")


class Plan(BaseModel):
    fingerprint: str
    executor: Literal["mp", "ray"]
    runtime: Literal["docker", "process"] = "docker"
    vllm: str = "vllm"  # runtime process: serve.vllm (an executable or a venv dir, resolved on the node)
    run_dir: str = "~/.local/state/sparkserve/run"  # runtime process: process.run_dir
    nnodes: int
    master_addr: str
    master_port: int
    api_host: str
    api_port: int
    served_name: str
    specs: list[ContainerSpec]
    dialect: str = "0.33.0"  # the engine's flag dialect the argvs are rendered in (plan/dialects.py)
    dialect_source: str = ""

    @property
    def head(self) -> ContainerSpec:
        return self.specs[0]

    @property
    def followers(self) -> list[ContainerSpec]:
        return self.specs[1:]

    def spec_for(self, node: str) -> ContainerSpec:
        for s in self.specs:
            if s.node == node:
                return s
        raise KeyError(node)

    @property
    def api_url(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"

    def start_order(self) -> list[ContainerSpec]:
        """mp: followers first, head last (the head's API server comes up last). ray: head (Ray head)
        first, then the workers; the serve argv is exec'd on the head once all have joined."""
        return [*self.followers, self.head] if self.executor == "mp" else [self.head, *self.followers]

    def serve_argvs(self) -> list[list[str]]:
        """Every ``vllm serve`` argv this plan runs (mp: one per rank; ray: the head's exec_after_join)."""
        return [s.serve_argv() for s in self.specs if s.serve_argv()[:2] == ["vllm", "serve"]]

    def process_argv(self, spec: ContainerSpec) -> list[str]:
        """runtime process: the argv a rank runs on its node (``serve.vllm`` resolved there)."""
        argv = spec.serve_argv()
        return [self.vllm, *argv[1:]] if argv[:1] == ["vllm"] else list(argv)

    def public(self) -> dict[str, object]:
        """JSON-ready view (secrets redacted). runtime process: each spec shows the ``process_argv`` it runs
        (and no ``docker_run``)."""
        d = self.model_dump(exclude={"specs"})
        d["api_url"] = self.api_url
        d["start_order"] = [s.node for s in self.start_order()]
        d["specs"] = [s.public() for s in self.specs]
        if self.runtime == "process":
            for spec, out in zip(self.specs, d["specs"], strict=True):
                out.pop("docker_run", None)
                out["process_argv"] = self.process_argv(spec)
        return d


def model_paths(cfg: Config) -> tuple[str, str]:
    """(target, drafter) as the engine sees them: the container's mount points, or (runtime process) the
    host paths themselves."""
    if cfg.runtime == "process":
        return str(cfg.model.target), str(cfg.drafter.path)
    # a Hugging Face cache snapshot is mounted with its repo dir (its links into blobs/ must resolve)
    return mount_for(str(cfg.model.target), TARGET_MOUNT)[1], DRAFTER_MOUNT


def drafter_in_argv(argv: list[str]) -> str | None:
    """The drafter path a ``vllm serve`` argv names (``--speculative-config``'s ``model``), or None."""
    for i, a in enumerate(argv):
        text = a.partition("=")[2] if a.startswith("--speculative-config=") else (
            argv[i + 1] if a == "--speculative-config" and i + 1 < len(argv) else None)
        if text is None:
            continue
        try:
            model = json.loads(text).get("model")
        except (ValueError, AttributeError):
            return None
        return str(model) if model else None
    return None


def speculative_json(cfg: Config) -> str:
    spec: dict[str, object] = {
        "method": cfg.speculative.method,  # always explicit (auto-detection needs "dflash" in the path)
        "model": model_paths(cfg)[1],
        "num_speculative_tokens": cfg.speculative.num_speculative_tokens,
    }
    if cfg.speculative.attention_backend:
        spec["attention_backend"] = cfg.speculative.attention_backend
    return json.dumps(spec, separators=(",", ":"))


def compilation_json(cfg: Config) -> str:
    comp = cfg.serve.compilation
    return json.dumps(
        {"cudagraph_mode": comp.cudagraph_mode.value, "cudagraph_capture_sizes": comp.cudagraph_capture_sizes},
        separators=(",", ":"),
    )


def kv_bytes_flag(dialect: Dialect) -> str:
    """The flag that pins the KV pool in this dialect (0.33: --kv-cache-memory-bytes; the card's fork:
    --kv-cache-memory). A dialect with neither renders the upstream name, which validate then refuses."""
    return dialect.kv_flag or "--kv-cache-memory-bytes"


def engine_args(cfg: Config, dialect: Dialect | None = None) -> list[str]:
    """Arguments identical on every rank (the part rank parity compares), in the card's launcher's order."""
    s = cfg.serve
    d = dialect or dialect_for(cfg)
    argv = [model_paths(cfg)[0], "--served-model-name", cfg.model.served_name]
    if s.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    argv += ["--gpu-memory-utilization", repr(s.gpu_memory_utilization), "--max-model-len", str(s.max_model_len)]
    if s.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.block_size is not None:
        argv += ["--block-size", str(s.block_size)]
    argv += ["--speculative-config", speculative_json(cfg)]
    argv += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.kv_cache_memory_bytes is not None:  # the exact integer: the engine gets the bytes the pool was banked at
        argv += [kv_bytes_flag(d), str(s.kv_cache_memory_bytes)]
    if s.enforce_eager:
        argv.append("--enforce-eager")
    else:
        argv += ["--compilation-config", compilation_json(cfg)]
    if s.attention_backend:
        argv += ["--attention-backend", s.attention_backend]
    if s.tool_call_parser:
        argv += ["--tool-call-parser", s.tool_call_parser]
    if s.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if s.reasoning_parser:
        argv += ["--reasoning-parser", s.reasoning_parser]
    if s.default_chat_template_kwargs is not None:
        argv += ["--default-chat-template-kwargs", json.dumps(s.default_chat_template_kwargs, separators=(",", ":"))]
    argv += list(s.extra_args)
    return argv


def _mp_argv(cfg: Config, rank: int, dialect: Dialect) -> list[str]:
    argv = ["vllm", "serve", *engine_args(cfg, dialect)]
    if len(cfg.nodes) == 1:  # one node: vLLM alone on it, no rendezvous
        if cfg.serve.host:
            argv += ["--host", cfg.serve.host]
        return [*argv, "--port", str(cfg.serve.port)]
    argv += [
        "--distributed-executor-backend", "mp",
        "--nnodes", str(len(cfg.nodes)),
        "--node-rank", str(rank),
        "--master-addr", cfg.head.fabric_ip,
        "--master-port", str(cfg.fabric.master_port),
    ]
    if rank == 0:
        if cfg.serve.host:
            argv += ["--host", cfg.serve.host]
        argv += ["--port", str(cfg.serve.port)]
    else:
        argv.append("--headless")
    return argv


def _ray_serve_argv(cfg: Config, dialect: Dialect) -> list[str]:
    argv = ["vllm", "serve", *engine_args(cfg, dialect), "--distributed-executor-backend", "ray"]
    if cfg.serve.host:
        argv += ["--host", cfg.serve.host]
    argv += ["--port", str(cfg.serve.port)]
    return argv


def _ray_start_argv(cfg: Config, node: NodeConfig, rank: int) -> list[str]:
    if rank == 0:
        return ["ray", "start", "--head", f"--node-ip-address={node.fabric_ip}", f"--port={RAY_PORT}",
                "--num-gpus", str(node.gpus), "--block"]
    return ["ray", "start", f"--address={cfg.head.fabric_ip}:{RAY_PORT}",
            f"--node-ip-address={node.fabric_ip}", "--num-gpus", str(node.gpus), "--block"]


def addr_range(cfg: Config, detected: dict[str, str] | None = None) -> str | None:
    """NCCL_IB_ADDR_RANGE: fabric.addr_range, else the range detection derived (several HCAs: every listed HCA's
    own address), else plan/fabric.py's rule over every node's fabric_ip — the smallest IPv4 network holding
    them, at least a /24 (the card's 192.168.102.1/.2 → 192.168.102.0/24); None for IPv6 fabric addresses
    (RoCE v2 IPv4 GIDs only: NCCL then keeps its own default)."""
    if cfg.fabric.addr_range != "auto":
        return cfg.fabric.addr_range
    if detected and detected.get("NCCL_IB_ADDR_RANGE"):
        return detected["NCCL_IB_ADDR_RANGE"]
    ips = [n.fabric_ip for n in cfg.nodes]
    if any(ipaddress.ip_address(ip).version != 4 for ip in ips):
        return None
    return fabric_addr_range(ips)


def node_env(cfg: Config, node: NodeConfig, fabric_env: dict[str, str] | None) -> dict[str, str]:
    env = dict(BASE_ENV)
    if cfg.runtime == "docker":
        env.update(CONTAINER_ENV)
    env["NCCL_DEBUG"] = cfg.fabric.nccl_debug
    if cfg.fabric.nccl_debug.upper() == "INFO":  # only the INIT and NET lines: set-up time, not steady state
        env["NCCL_DEBUG_SUBSYS"] = NCCL_BOOT_SUBSYS
    env.update(cfg.serve.env)
    env["VLLM_HOST_IP"] = node.fabric_ip
    if cfg.serve.executor == "ray":
        env["RAY_NODE_IP_ADDRESS"] = node.fabric_ip
        env["RAY_OVERRIDE_NODE_IP_ADDRESS"] = node.fabric_ip
        env["RAY_memory_monitor_refresh_ms"] = "0"  # Ray's OOM killer misreads unified memory
    if len(cfg.nodes) > 1:  # the fabric's transport: one node has none (NCCL_NET=IB would fail its init there)
        if cfg.fabric.nccl_net:
            env["NCCL_NET"] = cfg.fabric.nccl_net
        env.update(ROCE_ENV)
        rng = addr_range(cfg, fabric_env)
        if rng:
            env["NCCL_IB_ADDR_RANGE"] = rng
    # explicit fabric values from the config; auto ones come from detection on the node
    if cfg.fabric.interface != "auto":
        for k in SOCKET_ENV:
            env[k] = cfg.fabric.interface
    if cfg.fabric.hca != "auto":
        env["NCCL_IB_HCA"] = cfg.fabric.hca
    if cfg.fabric.gid_index != "auto":
        env["NCCL_IB_GID_INDEX"] = str(cfg.fabric.gid_index)
    explicit = set(env)
    for k, v in (fabric_env or {}).items():
        # detection fills what the config left on auto; NCCL reads a defined-empty GID index as 0
        # (the link-local entry), so an empty value is never set
        if v != "" and k not in explicit:
            env[k] = v
    if "NCCL_SOCKET_IFNAME" in env and "MN_IF_NAME" not in env:  # the card sets all four socket names
        env["MN_IF_NAME"] = env["NCCL_SOCKET_IFNAME"]
    return env


def node_home(node: NodeConfig, homes: dict[str, str] | None = None) -> str:
    """The node user's home: what the node reported, else this machine's (a local node), else the usual
    one (/root for root, /home/<user> otherwise — DGX OS's layout)."""
    if homes and homes.get(node.name):
        return homes[node.name]
    if node.local:
        return os.path.expanduser("~")
    return "/root" if node.user == "root" else f"/home/{node.user}"


def image_key(cfg: Config, image_id: str | None) -> str:
    """The cache directory of one image: the first 12 hex of its ID (a new image never reuses kernels an
    older one built); before the ID is known (render, a plan without nodes), ``ref-`` and 12 hex of the ref."""
    if image_id:
        return image_id.split(":", 1)[-1][:12]
    return "ref-" + hashlib.sha256(cfg.image.ref.encode()).hexdigest()[:12]


def cache_dir(cfg: Config, node: NodeConfig, image_id: str | None = None,
              homes: dict[str, str] | None = None, key: str | None = None) -> str:
    """This image's cache directory on ``node`` (container.cache_root, ``~/`` = the node user's home);
    ``key`` replaces the image key (the launcher's run-time placeholder)."""
    root = cfg.container.cache_root
    if root.startswith("~/"):
        root = node_home(node, homes).rstrip("/") + root[1:]
    return f"{root.rstrip('/')}/{key or image_key(cfg, image_id)}"


def container_name(cfg: Config, node: NodeConfig, rank: int) -> str:
    return f"{cfg.container.name_prefix}-r{rank}-{node.name}"


def build_plan(
    cfg: Config,
    *,
    fabric_env: dict[str, dict[str, str]] | None = None,
    fingerprint: str | None = None,
    api_key: str | None = None,
    image_id: str | None = None,
    homes: dict[str, str] | None = None,
    dialect: Dialect | None = None,
    cache_key: str | None = None,
) -> Plan:
    """The per-node container specs ``up`` starts. ``fingerprint`` defaults to the config's own.

    ``api_key`` (from config.resolve_api_key, at deploy time) becomes the head's VLLM_API_KEY secret.
    ``image_id`` (known once the nodes were asked) keys the cache directories and picks the image's stored
    dialect facts; ``homes`` are the node users' homes; ``dialect`` defaults to :func:`dialect_for`;
    ``cache_key`` replaces the image key of the cache directories (the launcher's run-time placeholder).
    """
    fp = fingerprint or cfg.fingerprint()
    c = cfg.container
    d = dialect or dialect_for(cfg, image_id=image_id)
    specs = []
    for rank, node in enumerate(cfg.nodes):
        if cfg.serve.executor == "mp":
            command, after = _mp_argv(cfg, rank, d), None
        else:
            command = _ray_start_argv(cfg, node, rank)
            after = _ray_serve_argv(cfg, d) if rank == 0 else None
        mounts: list[Mount] = []
        if cfg.runtime == "docker":  # a host process sees the host paths themselves (model_paths)
            cache = cache_dir(cfg, node, image_id, homes, cache_key)
            mounts = [
                Mount(source=mount_for(str(cfg.model.target), TARGET_MOUNT)[0], target=TARGET_MOUNT, read_only=True),
                Mount(source=str(cfg.drafter.path), target=DRAFTER_MOUNT, read_only=True),
                Mount(source=cache, target=CACHE_MOUNT, read_only=False),
            ]
            mounts += [Mount(source=f"{cache}/{sub}", target=dst, read_only=False) for sub, dst in CACHE_MOUNTS.items()]
        ulimits = {"memlock": (c.memlock, c.memlock)}
        if not c.core_dumps:
            ulimits["core"] = (0, 0)
        specs.append(
            ContainerSpec(
                node=node.name,
                host=node.host,
                rank=rank,
                role="head" if rank == 0 else "follower",
                name=container_name(cfg, node, rank),
                image=cfg.image.ref,
                command=command,
                exec_after_join=after,
                env=node_env(cfg, node, (fabric_env or {}).get(node.name)),
                mounts=mounts,
                make_dirs=[m.source for m in mounts if not m.read_only],
                labels={
                    LABEL_MANAGED: "1",
                    LABEL_FINGERPRINT: fp,
                    LABEL_NODE: node.name,
                    LABEL_RANK: str(rank),
                    LABEL_ROLE: "head" if rank == 0 else "follower",
                },
                ulimits=ulimits,
                memory=c.memory,
                devices=list(c.rdma_devices),
                gpus=c.gpus == "all",
                stop_timeout=c.stop_timeout_s,
                secret_env={API_KEY_ENV: api_key} if api_key and rank == 0 else {},
            )
        )
    api_host = cfg.serve.host if cfg.serve.host not in (None, "0.0.0.0", "::") else cfg.head.host
    return Plan(
        fingerprint=fp,
        executor=cfg.serve.executor,
        runtime=cfg.runtime,
        vllm=cfg.serve.vllm,
        run_dir=cfg.process.run_dir,
        nnodes=len(cfg.nodes),
        master_addr=cfg.head.fabric_ip,
        master_port=cfg.fabric.master_port,
        api_host=str(api_host),
        api_port=cfg.serve.port,
        served_name=cfg.model.served_name,
        specs=specs,
        dialect=d.name,
        dialect_source=d.source,
    )


def cache_dirs(plan: Plan) -> dict[str, list[str]]:
    """node → the directories its rank needs before it starts (each spec's ``make_dirs``)."""
    return {s.node: list(s.make_dirs) for s in plan.specs}


def parity_view(spec: ContainerSpec) -> dict[str, object]:
    """What must be identical across ranks: argv minus rank flags, env minus per-node values, mounts."""
    argv = spec.serve_argv()
    kept: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        flag = a.split("=", 1)[0]
        if flag in RANK_SPECIFIC_FLAGS:
            takes_value = "=" not in a and flag != "--headless" and i + 1 < len(argv)
            skip = takes_value
            continue
        kept.append(a)
    return {
        "image": spec.image,
        "argv": kept,
        "env": {k: v for k, v in sorted(spec.env.items()) if k not in NODE_SPECIFIC_ENV},
        # the caches are per node (the node user's home, the image's key): only their targets must agree
        "mounts": sorted((m.source if m.read_only else "", m.target, m.read_only) for m in spec.mounts),
    }
