"""Typed configuration: YAML file + ``SPARKSERVE_…`` env overrides over the embedded production default.

Field names follow ``vllm serve`` where one exists. The embedded default
(``sparkserve/data/default.yaml``) is the model card's banked launcher (drafter -G); ``sparkserve init``
writes it out with the hosts to fill in.

One module per group of sections, each field's validator beside its field: ``fields`` (the strict base and the
shared field types), ``nodes`` (nodes, ssh, fabric), ``model`` (image, model, drafter), ``serve`` (serve and
its compilation, speculative), ``gates`` (gates, bench), ``runtime`` (container, process, watchdog, host),
``supervise``; ``root`` holds :class:`Config` (the sections together, the rules across them, the
fingerprint) and ``load`` the loader that turns a bad value into ``error: <field>: …``. Import every name
from here: ``from sparkserve.config import Config, load_config``.
"""

from sparkserve.config.fields import ByteSize, CacheRoot, HostPath, Strict
from sparkserve.config.gates import BenchConfig, GatesConfig, SmokeCell
from sparkserve.config.load import default_yaml_text, find_config_path, load_config, no_config_error
from sparkserve.config.model import DrafterConfig, ImageConfig, ModelConfig, ModelTarget
from sparkserve.config.nodes import FabricConfig, NodeConfig, SSHConfig
from sparkserve.config.root import (
    DEFAULT_CONFIG_NAME,
    ENV_PREFIX,
    PLACEHOLDER_HOSTS,
    Config,
    placeholder_hosts,
    refuse_placeholders,
    resolve_api_key,
)
from sparkserve.config.runtime import (
    KNOWN_BAD_RDMA_KERNELS,
    ContainerConfig,
    HostConfig,
    ProcessConfig,
    WatchdogConfig,
)
from sparkserve.config.serve import (
    API_KEY_ENV,
    CARD_ENV,
    KV_CACHE_DTYPES,
    CompilationConfig,
    CUDAGraphMode,
    ServeConfig,
    SpeculativeConfig,
    dialect_names,
)
from sparkserve.config.supervise import SuperviseConfig

__all__ = [
    "API_KEY_ENV", "CARD_ENV", "DEFAULT_CONFIG_NAME", "ENV_PREFIX", "KNOWN_BAD_RDMA_KERNELS", "KV_CACHE_DTYPES",
    "PLACEHOLDER_HOSTS", "BenchConfig", "ByteSize", "CacheRoot", "CompilationConfig", "Config", "ContainerConfig",
    "CUDAGraphMode", "DrafterConfig", "FabricConfig", "GatesConfig", "HostConfig", "HostPath", "ImageConfig",
    "ModelConfig", "ModelTarget", "NodeConfig", "ProcessConfig", "SSHConfig", "ServeConfig", "SmokeCell",
    "SpeculativeConfig", "Strict", "SuperviseConfig", "WatchdogConfig", "default_yaml_text", "dialect_names",
    "find_config_path", "load_config", "no_config_error", "placeholder_hosts", "refuse_placeholders",
    "resolve_api_key",
]
