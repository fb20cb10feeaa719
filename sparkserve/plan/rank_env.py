"""Every rank's environment: the card's banked launcher variables, the container's cache paths, the fabric's
(explicit config values, else what detection found on the node) and ``serve.env`` — the one place a rank's
env is built (:func:`node_env`; :func:`sparkserve.plan.build.build_plan` puts it in each spec).

Pure: no I/O. Fabric values that are ``auto`` in the config come in as ``fabric_env`` (resolved on the nodes
at ``up``); without them the variables are left out (never empty)."""

from __future__ import annotations

import ipaddress

from sparkserve.config import Config, NodeConfig
from sparkserve.plan.fabric import NCCL_BOOT_SUBSYS
from sparkserve.plan.fabric import addr_range as fabric_addr_range
from sparkserve.plan.mounts import CACHE_MOUNT, CACHE_MOUNTS

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

