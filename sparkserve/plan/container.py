"""One rank's container: :class:`ContainerSpec`, and the two ways it is handed to docker.

Both renderings live here, next to the fields they render, so they cannot drift apart:

* :meth:`ContainerSpec.docker_run_argv` — the ``docker run`` argv people see (``plan``, ``launcher``);
* :meth:`ContainerSpec.docker_sdk_kwargs` — what :meth:`sparkserve.nodes.engine.Engine.run` gives the
  docker SDK's low-level ``create_host_config`` / ``create_container`` (plain dicts and lists: this stage
  never imports docker).

tests/unit/test_container.py changes every field of the spec in turn and requires both renderings to
change: a new field fails it until both carry it (or it is listed there as not docker's business).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

REDACTED = "<redacted>"
LABEL_PREFIX = "io.sparkserve"
LABEL_MANAGED = f"{LABEL_PREFIX}.managed"
LABEL_FINGERPRINT = f"{LABEL_PREFIX}.fingerprint"
LABEL_NODE = f"{LABEL_PREFIX}.node"
LABEL_RANK = f"{LABEL_PREFIX}.rank"
LABEL_ROLE = f"{LABEL_PREFIX}.role"


class Mount(BaseModel):
    """A bind mount of a node path into the container."""

    model_config = ConfigDict(frozen=True)
    source: str
    target: str
    read_only: bool = True

    def mount_arg(self) -> str:
        """``docker run --mount`` value (CSV: a field with a comma or quote is quoted)."""
        fields = ["type=bind", f"source={self.source}", f"target={self.target}"]
        if self.read_only:
            fields.append("readonly")
        return ",".join(_csv_field(f) for f in fields)

    def sdk_mount(self) -> dict[str, object]:
        """The Engine API's mount object (what ``docker.types.Mount`` builds for a plain bind)."""
        return {"Target": self.target, "Source": self.source, "Type": "bind", "ReadOnly": self.read_only}


def _csv_field(f: str) -> str:
    if any(c in f for c in ',"'):
        return '"' + f.replace('"', '""') + '"'
    return f


def docker_size(n: int) -> str:
    """Bytes → docker's size syntax (``64g`` = 64 GiB: docker's units are binary)."""
    for letter, factor in (("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if n % factor == 0:
            return f"{n // factor}{letter}"
    return str(n)


def restart_policy(restart: str) -> dict[str, object]:
    """``docker run --restart`` syntax (``no``, ``always``, ``on-failure:3``) → the API's RestartPolicy."""
    name, _, retries = restart.partition(":")
    policy: dict[str, object] = {"Name": name}
    if retries:
        policy["MaximumRetryCount"] = int(retries)
    return policy


class ContainerSpec(BaseModel):
    """Everything needed to start one rank's container on one node."""

    node: str
    host: str
    rank: int
    role: Literal["head", "follower"]
    name: str
    image: str
    command: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    # host directories that must exist before the rank starts (docker refuses a bind mount whose source is
    # missing): the writable mounts' sources, made by the node user. Every consumer of a plan (`up`, the
    # launcher, a `render --json` reader) creates them; the plan is their one source.
    make_dirs: list[str] = Field(default_factory=list)
    labels: dict[str, str]
    network_mode: str = "host"
    ipc_mode: str = "host"
    # docker ignores --shm-size under --ipc=host (the host's /dev/shm is used): rendered only when set
    shm_size: int | None = None
    memory: int | None = None  # docker --memory (the card: 118g)
    ulimits: dict[str, tuple[int, int]] = Field(default_factory=lambda: {"memlock": (-1, -1)})
    cap_add: list[str] = Field(default_factory=lambda: ["IPC_LOCK"])
    devices: list[str] = Field(default_factory=list)
    gpus: bool = True
    # ray only: the `vllm serve` argv exec'd in the head container once every worker has joined
    exec_after_join: list[str] | None = None
    restart: str = "no"
    stop_timeout: int = 30
    # Secrets (VLLM_API_KEY on the head, only when deploying): never dumped, never in an argv, shown
    # redacted. Docker receives them as environment: `-e NAME` in an argv reads the caller's env.
    secret_env: dict[str, str] = Field(default_factory=dict, exclude=True, repr=False)

    def serve_argv(self) -> list[str]:
        """The `vllm serve …` argv this rank runs (directly or via exec_after_join)."""
        return self.exec_after_join or self.command

    @property
    def entrypoint(self) -> str:
        """The container's entrypoint: command[0] (the image's own ENTRYPOINT is always replaced)."""
        return self.command[0]

    def run_env(self) -> dict[str, str]:
        """The environment the container gets: env plus secrets (give this to docker, never print it)."""
        return {**self.env, **self.secret_env}

    def public(self) -> dict[str, object]:
        """JSON-ready view for people and tools: secrets appear as ``<redacted>``."""
        d = self.model_dump()
        d["env"] = {**self.env, **{k: REDACTED for k in self.secret_env}}
        d["docker_run"] = self.docker_run_argv()
        return d

    def docker_run_argv(self, *, docker: str = "docker") -> list[str]:
        """``docker run`` argv for this rank. Secrets appear as ``-e NAME`` (value from the environment)."""
        argv = [docker, "run", "-d", "--name", self.name, "--restart", self.restart,
                "--stop-timeout", str(self.stop_timeout)]
        for k, v in self.labels.items():
            argv += ["--label", f"{k}={v}"]
        argv += [f"--network={self.network_mode}", f"--ipc={self.ipc_mode}"]
        if self.shm_size is not None:
            argv += ["--shm-size", docker_size(self.shm_size)]
        if self.memory is not None:
            argv += ["--memory", docker_size(self.memory)]
        for name, (soft, hard) in self.ulimits.items():
            argv += ["--ulimit", f"{name}={soft}:{hard}"]
        for cap in self.cap_add:
            argv += ["--cap-add", cap]
        for dev in self.devices:
            argv += ["--device", dev]
        if self.gpus:
            argv += ["--gpus", "all"]
        for k, v in self.env.items():
            argv += ["-e", f"{k}={v}"]
        for k in self.secret_env:
            argv += ["-e", k]
        for m in self.mounts:
            argv += ["--mount", m.mount_arg()]
        argv += ["--entrypoint", self.entrypoint, self.image, *self.command[1:]]
        return argv

    def docker_sdk_kwargs(self) -> dict[str, dict[str, Any]]:
        """The same container for the docker SDK: ``{"host_config": …, "create": …}``.

        ``host_config`` goes to ``APIClient.create_host_config``, ``create`` (plus that host config) to
        ``APIClient.create_container``. The low-level calls, because docker-py's ``containers.create``
        has no ``stop_timeout``. Secrets are real values here: this is what docker receives, never print it.
        """
        host_config: dict[str, Any] = {
            "network_mode": self.network_mode,
            "ipc_mode": self.ipc_mode,
            "shm_size": self.shm_size,
            "mem_limit": self.memory,
            "ulimits": [{"name": k, "soft": s, "hard": h} for k, (s, h) in self.ulimits.items()],
            "cap_add": list(self.cap_add) or None,
            "devices": [f"{d}:{d}:rwm" for d in self.devices] or None,
            "mounts": [m.sdk_mount() for m in self.mounts],
            "restart_policy": restart_policy(self.restart),
        }
        if self.gpus:  # `--gpus all`
            host_config["device_requests"] = [{"count": -1, "capabilities": [["gpu"]]}]
        create: dict[str, Any] = {
            "image": self.image,
            "entrypoint": [self.entrypoint],  # the image's own ENTRYPOINT (e.g. `vllm serve`) is replaced
            "command": list(self.command[1:]),
            "name": self.name,
            "environment": self.run_env(),
            "labels": dict(self.labels),
            "stop_timeout": self.stop_timeout,
            "detach": True,
        }
        return {"host_config": host_config, "create": create}
