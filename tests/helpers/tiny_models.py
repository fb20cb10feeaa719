"""Generate tiny but real target / DFlash(2) drafter directories for tests, the rig and the demo.

Real safetensors files with the tensor names vLLM 0.33 expects (vllm-facts.md 5.5), small shapes, a
real ``config.json``, and a real ``mask_embedding.pt`` written with torch (dict form:
``{"embedding": tensor, "mask_token_id": int}``, as in the real 0.25.1 capture). torch is part of the
test venv (scripts/test installs the CPU wheel), so the mask file is always real in CI.

CLI: ``python tests/helpers/tiny_models.py target DIR`` / ``drafter DIR [--no-mask] [--block-size 8]``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# The default config's mask token (GLM-5.3-Flash vocabulary) and geometry the fixtures share.
DEFAULT_MASK_TOKEN_ID = 154856
DEFAULT_VOCAB = 154880


@dataclass
class TargetSpec:
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    vocab_size: int = DEFAULT_VOCAB
    architecture: str = "Qwen3ForCausalLM"
    model_type: str = "qwen3"


@dataclass
class DrafterSpec:
    architecture: str = "DFlash2DraftModel"
    hidden_size: int = 256
    target_hidden_size: int | None = None  # default: hidden_size
    num_hidden_layers: int = 2
    block_size: int = 8
    mask_token_id: int = DEFAULT_MASK_TOKEN_ID
    target_layer_ids: list[int] = field(default_factory=lambda: [0, 1, 2])
    conv_kernel_size: int = 4
    conv_group_size: int = 64
    selector_rank: int = 8
    selector_top_k: int = 4
    vocab_size: int = DEFAULT_VOCAB
    mask_file: str | None = "dict"  # "dict", "tensor" or None (no file)
    mask_file_token_id: int | None = None  # id written into the dict form; default = mask_token_id
    fc_taps: int | None = None  # fc input = target_hidden × fc_taps; default = len(target_layer_ids)
    weights: bool = True
    selector_tensors: int = 3


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def write_target(path: Path, spec: TargetSpec | None = None) -> Path:
    spec = spec or TargetSpec()
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": [spec.architecture],
        "model_type": spec.model_type,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.hidden_size * 2,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    h, kv = spec.hidden_size, spec.num_key_value_heads * spec.head_dim
    r = _rng()
    tensors = {"model.norm.weight": np.ones(h, dtype=np.float16)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = r.standard_normal((spec.num_attention_heads * spec.head_dim, h),
                                                                   dtype=np.float32).astype(np.float16)
        tensors[p + "self_attn.k_proj.weight"] = np.zeros((kv, h), dtype=np.float16)
        tensors[p + "self_attn.v_proj.weight"] = np.zeros((kv, h), dtype=np.float16)
        tensors[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float16)
        # the rest of a Qwen3 decoder layer (vLLM qwen3.py), so the checkpoint is complete
        tensors[p + "self_attn.o_proj.weight"] = np.zeros((h, spec.num_attention_heads * spec.head_dim),
                                                          dtype=np.float16)
        tensors[p + "self_attn.q_norm.weight"] = np.ones(spec.head_dim, dtype=np.float16)
        tensors[p + "self_attn.k_norm.weight"] = np.ones(spec.head_dim, dtype=np.float16)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float16)
        for proj, shape in (("gate_proj", (2 * h, h)), ("up_proj", (2 * h, h)), ("down_proj", (h, 2 * h))):
            tensors[p + f"mlp.{proj}.weight"] = np.zeros(shape, dtype=np.float16)
    # vocab x hidden embeddings are ~80 MB each at the default vocabulary: stored as zeros in a file hole
    zeros = {"model.embed_tokens.weight": (spec.vocab_size, h), "lm_head.weight": (spec.vocab_size, h)}
    save_f16_with_zeros(path / "model.safetensors", tensors, zeros)
    return path


def save_f16_with_zeros(path: Path, tensors: dict[str, np.ndarray], zeros: dict[str, tuple[int, ...]]) -> None:
    """A safetensors file of float16 ``tensors`` followed by all-zero float16 tensors of the ``zeros``
    shapes, written as a sparse tail (real size, no blocks; reads as zeros)."""
    header: dict[str, object] = {}
    blobs, off = [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype=np.float16).tobytes()
        header[name] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    for name, shape in zeros.items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)
        f.truncate(8 + len(raw) + off)


def drop_tensor(f: Path, name: str, *, into: Path | None = None, take: set[str] | None = None) -> None:
    """Rewrite safetensors file ``f`` without tensor ``name`` (or move the tensors in ``take`` to a new file
    ``into``); all-zero tensors over a million elements stay file holes (see :func:`save_f16_with_zeros`)."""
    from safetensors import safe_open

    keep: tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]] = ({}, {})
    moved: tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]] = ({}, {})
    with safe_open(str(f), "np") as st:
        for k in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
            if k == name:
                continue
            a = st.get_tensor(k)
            to = moved if take and k in take else keep
            if a.size > 2**20 and not a.any():
                to[1][k] = a.shape
            else:
                to[0][k] = a
    save_f16_with_zeros(f, *keep)
    if into is not None:
        save_f16_with_zeros(into, *moved)


def write_drafter(path: Path, spec: DrafterSpec | None = None) -> Path:
    spec = spec or DrafterSpec()
    path.mkdir(parents=True, exist_ok=True)
    h = spec.hidden_size
    th = spec.target_hidden_size or h
    is_v2 = spec.architecture.startswith("DFlash2")
    dflash_config: dict[str, object] = {
        "block_size": spec.block_size,
        "mask_token_id": spec.mask_token_id,
        "target_layer_ids": spec.target_layer_ids,
    }
    if is_v2:
        dflash_config.update(
            conv_kernel_size=spec.conv_kernel_size,
            conv_group_size=spec.conv_group_size,
            selector_rank=spec.selector_rank,
            selector_top_k=spec.selector_top_k,
        )
    cfg = {
        "architectures": [spec.architecture],
        "model_type": "qwen3",
        "hidden_size": h,
        "target_hidden_size": th,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": h * 2,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": 1e-6,
        "dflash_config": dflash_config,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if spec.weights:
        taps = spec.fc_taps if spec.fc_taps is not None else len(spec.target_layer_ids)
        t: dict[str, np.ndarray] = {
            "fc.weight": np.zeros((h, th * taps), dtype=np.float16),
            "hidden_norm.weight": np.ones(h, dtype=np.float16),
            "norm.weight": np.ones(h, dtype=np.float16),
        }
        groups = h // spec.conv_group_size if spec.conv_group_size and h % spec.conv_group_size == 0 else 1
        for i in range(spec.num_hidden_layers):
            p = f"layers.{i}."
            t[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float16)
            t[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float16)
            t[p + "self_attn.q_norm.weight"] = np.ones(64, dtype=np.float16)
            t[p + "self_attn.k_norm.weight"] = np.ones(64, dtype=np.float16)
            for proj, shape in (("gate_proj", (2 * h, h)), ("up_proj", (2 * h, h)), ("down_proj", (h, 2 * h))):
                t[p + f"mlp.{proj}.weight"] = np.zeros(shape, dtype=np.float16)
            for proj in ("q_proj", "o_proj"):
                t[p + f"self_attn.{proj}.weight"] = np.zeros((h, h), dtype=np.float16)
            for proj in ("k_proj", "v_proj"):
                t[p + f"self_attn.{proj}.weight"] = np.zeros((128, h), dtype=np.float16)
            if is_v2:
                k = spec.conv_kernel_size
                for conv in ("attention_conv", "mlp_conv"):
                    t[p + f"{conv}.base_kernel"] = np.zeros((2, k, h), dtype=np.float16)
                    t[p + f"{conv}.kernel_projection.weight"] = np.zeros((2 * k * groups, h), dtype=np.float16)
        if is_v2:
            sel = {
                "candidate_selector.predecessor_codebook": (spec.vocab_size, spec.selector_rank),
                "candidate_selector.successor_codebook": (spec.vocab_size, spec.selector_rank),
                "candidate_selector.hidden_projection.weight": (spec.selector_rank, h),
            }
            for name, shape in list(sel.items())[: spec.selector_tensors]:
                t[name] = np.zeros(shape, dtype=np.float16)
        save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    if spec.mask_file:
        write_mask_embedding(
            path / "mask_embedding.pt",
            hidden=h,
            token_id=spec.mask_file_token_id if spec.mask_file_token_id is not None else spec.mask_token_id,
            form=spec.mask_file,
        )
    return path


def write_speculators_drafter(path: Path, spec: DrafterSpec | None = None, *, speculative_tokens: int = 7,
                              model_type: str = "dflash2") -> Path:
    """The same drafter in the vllm-project "speculators" layout (vllm-facts.md 5.2): top-level
    ``speculators_model_type``, ``transformer_layer_config``, ``aux_hidden_state_layer_ids`` (= DFlash
    target_layer_ids + 1) and the DFlash2 keys at the top."""
    spec = spec or DrafterSpec()
    write_drafter(path, spec)
    plain = json.loads((path / "config.json").read_text())
    dflash = plain.pop("dflash_config")
    layer_cfg = {k: v for k, v in plain.items() if k not in ("architectures", "target_hidden_size")}
    cfg = {
        "architectures": ["DFlash2Speculator"],
        "speculators_model_type": model_type,
        "transformer_layer_config": layer_cfg,
        "target_hidden_size": plain["target_hidden_size"],
        "mask_token_id": dflash["mask_token_id"],
        "aux_hidden_state_layer_ids": [i + 1 for i in dflash["target_layer_ids"]],
        "block_size": dflash["block_size"],
        **{k: dflash[k] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
           if k in dflash},
        "speculators_config": {
            "algorithm": model_type,
            "proposal_methods": [{"proposal_type": model_type, "speculative_tokens": speculative_tokens}],
            "verifier": {"name_or_path": "zai-org/GLM-5.3-Flash", "architectures": ["Glm5ForCausalLM"]},
        },
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def write_mask_embedding(path: Path, *, hidden: int, token_id: int, form: str = "dict") -> None:
    import torch  # the test venv carries the CPU wheel

    emb = torch.zeros(hidden, dtype=torch.bfloat16)
    obj = {"embedding": emb, "mask_token_id": token_id} if form == "dict" else emb
    torch.save(obj, str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    t = sub.add_parser("target")
    t.add_argument("dir", type=Path)
    d = sub.add_parser("drafter")
    d.add_argument("dir", type=Path)
    d.add_argument("--no-mask", action="store_true")
    d.add_argument("--block-size", type=int, default=8)
    d.add_argument("--mask-token-id", type=int, default=DEFAULT_MASK_TOKEN_ID)
    d.add_argument("--architecture", default="DFlash2DraftModel")
    a = ap.parse_args()
    if a.kind == "target":
        write_target(a.dir)
    else:
        write_drafter(a.dir, DrafterSpec(mask_file=None if a.no_mask else "dict", block_size=a.block_size,
                                         mask_token_id=a.mask_token_id, architecture=a.architecture))
    print(a.dir)


if __name__ == "__main__":
    main()
