"""How vLLM serves: ``serve`` (every ``vllm serve`` flag the config sets, its ``compilation`` section, the
ranks' environment) and ``speculative`` (the ``--speculative-config``), with the values vLLM accepts."""

from __future__ import annotations

import enum
import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sparkserve.config.fields import ByteSize, Strict

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
        "0.34.0, 0.33.0, 0.25.1, 0.1.dev20051+g487ecf187). Default: the image's own (its facts from `image verify`, "
        "else the shipped table); the plan renders and validate checks only what that `vllm serve` accepts")

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

