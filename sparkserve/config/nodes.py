"""Where the stack runs and how it is reached: ``nodes`` (the Sparks, head first), ``ssh`` and ``fabric``
(the ConnectX-7 link NCCL uses between them)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from sparkserve.config.fields import Strict


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

