"""Target model facts from its config.json: layers, hidden size, KV-cache geometry.

Only config.json is read (a controller may hold just that file of a 100 GB target). Multimodal configs
keep the language model under ``text_config``; MLA models (DeepSeek/GLM-MoE-DSA style, ``kv_lora_rank``)
cache one latent per token and layer instead of K and V heads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from sparkserve.errors import BadInput
from sparkserve.models.files import as_int, name_list, read_config

# Bits per cached element for each vLLM 0.33 --kv-cache-dtype. Sub-byte formats are approximate (their
# scales are ignored); "auto" follows the model dtype.
KV_DTYPE_BITS: dict[str, float] = {
    "bfloat16": 16, "float16": 16, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "fp8_inc": 8,
    "fp8_per_token_head": 8, "int8_per_token_head": 8, "int4_per_token_head": 4, "nvfp4": 4.5,
    "nvfp4_4over6": 4.5, "octave_k3v3": 3, "octave_k3v3_compact": 3, "octave_k3v4": 3.5,
    "turboquant_3bit_nc": 3, "turboquant_4bit_nc": 4, "turboquant_k3v4_nc": 3.5, "turboquant_k8v4": 6,
    "ultraquant_4bit": 4,
}
# DeepSeek sparse-MLA fp8 layouts store a fixed number of bytes per token and layer.
MLA_FIXED_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
MODEL_DTYPE_BITS = {"bfloat16": 16, "float16": 16, "float32": 32, "half": 16, "float": 32}


@dataclass
class TargetFacts:
    path: str
    architectures: list[str]
    model_type: str | None
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    max_position_embeddings: int | None
    torch_dtype: str | None
    attention: Literal["mha", "gqa", "mla"]
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    mtp_layers: int
    rope_factor: float = 1.0  # the RoPE scaling factor vLLM multiplies max_position_embeddings by (1: none)

    @property
    def derived_max_model_len(self) -> int | None:
        """The longest max_model_len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: max_position_embeddings
        times the RoPE factor (vllm/config/model.py ``_get_and_verify_max_len``, 0.33.0); None when unknown."""
        if self.max_position_embeddings is None:
            return None
        return int(self.max_position_embeddings * self.rope_factor)

    def kv_elements_per_token_layer(self, tp: int = 1) -> int:
        """Cached elements per token per layer on one rank of a TP group."""
        if self.attention == "mla":  # the latent is replicated on every rank
            return (self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0)
        heads = self.num_key_value_heads or self.num_attention_heads or 0
        per_rank = max(1, heads // tp) if tp > 1 else heads
        return 2 * per_rank * (self.head_dim or 0)

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto", *, tp: int = 1) -> float | None:
        """KV-cache bytes one token costs on one rank (all layers); None when the dtype is unknown."""
        if self.attention == "mla" and kv_cache_dtype in MLA_FIXED_BYTES:
            return float(MLA_FIXED_BYTES[kv_cache_dtype] * self.num_hidden_layers)
        if kv_cache_dtype == "auto":
            bits = MODEL_DTYPE_BITS.get(str(self.torch_dtype), 16)
        elif kv_cache_dtype in KV_DTYPE_BITS:
            bits = KV_DTYPE_BITS[kv_cache_dtype]
        else:
            return None
        return self.kv_elements_per_token_layer(tp) * self.num_hidden_layers * bits / 8

    def to_json(self, kv_cache_dtype: str | None = None, tp: int = 1) -> dict[str, Any]:
        d = asdict(self)
        if kv_cache_dtype:
            d["kv_cache_dtype"] = kv_cache_dtype
            d["tensor_parallel_size"] = tp
            d["kv_bytes_per_token_per_rank"] = self.kv_bytes_per_token(kv_cache_dtype, tp=tp)
        return d


def inspect_target(path: Path | str, *, where: str = "model.target") -> TargetFacts:
    """Facts of a target model directory (its config.json). BadInput naming the field or file."""
    path = Path(path)
    raw = read_config(path, where=where)
    cfg = raw
    if as_int(raw.get("num_hidden_layers")) is None and isinstance(raw.get("text_config"), dict):
        cfg = raw["text_config"]
    cfg_file = path / "config.json"
    architectures = name_list(raw, "architectures", cfg_file)
    model_type = cfg.get("model_type") or raw.get("model_type")
    layers, hidden = as_int(cfg.get("num_hidden_layers")), as_int(cfg.get("hidden_size"))
    if not layers or layers <= 0:
        raise BadInput(str(cfg_file), "num_hidden_layers is missing or not a positive integer")
    if not hidden or hidden <= 0:
        raise BadInput(str(cfg_file), "hidden_size is missing or not a positive integer")
    heads = as_int(cfg.get("num_attention_heads"))
    kv_heads = as_int(cfg.get("num_key_value_heads")) or heads
    head_dim = as_int(cfg.get("head_dim")) or (hidden // heads if heads else None)
    kv_lora = as_int(cfg.get("kv_lora_rank"))
    attention: Literal["mha", "gqa", "mla"]
    if kv_lora:
        attention = "mla"
    elif kv_heads and heads and kv_heads < heads:
        attention = "gqa"
    else:
        attention = "mha"
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype")
    dtype = dtype if isinstance(dtype, str) else None
    return TargetFacts(
        path=str(path),
        architectures=architectures,
        model_type=model_type if isinstance(model_type, str) else None,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=as_int(cfg.get("vocab_size")),
        max_position_embeddings=as_int(cfg.get("max_position_embeddings")),
        torch_dtype=dtype,
        attention=attention,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=as_int(cfg.get("qk_rope_head_dim")),
        mtp_layers=as_int(cfg.get("num_nextn_predict_layers")) or 0,
        rope_factor=_rope_factor(cfg),
    )


# RoPE types whose max_position_embeddings is already the scaled length (vLLM applies no factor to them)
_ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _rope_factor(cfg: dict[str, Any]) -> float:
    """The scaling factor vLLM applies to max_position_embeddings (1.0 for none, or a pre-scaled RoPE type)."""
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(rp, dict):
        return 1.0
    kind = rp.get("rope_type") or rp.get("type") or "default"
    factor = rp.get("factor")
    if kind in _ROPE_PRESCALED or kind == "default" or not isinstance(factor, int | float) or factor <= 0:
        return 1.0
    return float(factor)
