"""Where each rank's files are: the container's mount points for the target, the drafter and the image's
cache directory, and that cache directory on each node (``container.cache_root``, one per image ID).

Pure: no I/O (a local node's home is this machine's ``~``)."""

from __future__ import annotations

import hashlib
import os

from sparkserve.config import Config, NodeConfig

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

