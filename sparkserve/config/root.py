"""The whole config: :class:`Config` (every section, ``SPARKSERVE_…`` env overrides over the file, the named
profile applied, the rules across sections), its fingerprint, the API key it points at, and the init file's
placeholder hosts."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sparkserve.config import profiles
from sparkserve.config.gates import BenchConfig, GatesConfig
from sparkserve.config.model import DrafterConfig, ImageConfig, ModelConfig
from sparkserve.config.nodes import FabricConfig, NodeConfig, SSHConfig
from sparkserve.config.router import RouterConfig, router_rules
from sparkserve.config.runtime import ContainerConfig, HostConfig, ProcessConfig, WatchdogConfig
from sparkserve.config.serve import ServeConfig, SpeculativeConfig
from sparkserve.config.supervise import SuperviseConfig
from sparkserve.errors import BadInput

DEFAULT_CONFIG_NAME = "sparkserve.yaml"
ENV_PREFIX = "SPARKSERVE_"


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
        if self.replicas > 1 and not len(self.nodes) % self.replicas:
            size = len(self.nodes) // self.replicas
            here = [k + 1 for k in range(self.replicas) if any(n.local for n in self.nodes[k * size:(k + 1) * size])]
            if len(here) > 1:  # seen on one H200 (tests/real/runs/2026-12-02-session7): the second `up` found the lock
                raise ValueError(f"@replicas: replicas {here[0]} and {here[1]} both run on this machine (local: true); "
                                 "each replica needs machines of its own: the deploy lock and a stack's ranks are one "
                                 "per machine, so the second replica's `up` would find the first's lock")
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

