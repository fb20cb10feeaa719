"""Config → Plan: every rank's container spec, in start order — the argv (:mod:`sparkserve.plan.serve_argv`),
the env (:mod:`sparkserve.plan.rank_env`) and the mounts (:mod:`sparkserve.plan.mounts`) put together; and what
must be identical across ranks (:func:`parity_view`).

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

from typing import Literal

from pydantic import BaseModel

from sparkserve.config import API_KEY_ENV, Config, NodeConfig
from sparkserve.config.profiles import card_shm_size, drafter_path
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
from sparkserve.plan.mounts import CACHE_MOUNT, CACHE_MOUNTS, DRAFTER_MOUNT, TARGET_MOUNT, cache_dir
from sparkserve.plan.rank_env import node_env
from sparkserve.plan.serve_argv import mp_argv, ray_serve_argv, ray_start_argv

# Flags that legitimately differ between ranks (rank parity ignores them, with their values).
RANK_SPECIFIC_FLAGS = ("--node-rank", "--headless", "--host", "--port", "--api-server-count")
# Env that legitimately differs between nodes.
NODE_SPECIFIC_ENV = (
    "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
    "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "MN_IF_NAME", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS",
    API_KEY_ENV,  # the API key lives on the head only (the API server runs there)
)


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
            command, after = mp_argv(cfg, rank, d), None
        else:
            command = ray_start_argv(cfg, node, rank)
            after = ray_serve_argv(cfg, d) if rank == 0 else None
        mounts: list[Mount] = []
        if cfg.runtime == "docker":  # a host process sees the host paths themselves (model_paths)
            cache = cache_dir(cfg, node, image_id, homes, cache_key)
            mounts = [
                Mount(source=mount_for(str(cfg.model.target), TARGET_MOUNT)[0], target=TARGET_MOUNT, read_only=True),
                *(Mount(source=mount_for(d, DRAFTER_MOUNT)[0], target=DRAFTER_MOUNT, read_only=True)
                  for d in filter(None, [drafter_path(cfg)])),
                Mount(source=cache, target=CACHE_MOUNT, read_only=False),
            ]
            mounts += [Mount(source=f"{cache}/{sub}", target=dst, read_only=False) for sub, dst in CACHE_MOUNTS.items()]
        ulimits = {"memlock": (c.memlock, c.memlock), **({} if c.core_dumps else {"core": (0, 0)})}
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
                shm_size=card_shm_size(cfg),
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
