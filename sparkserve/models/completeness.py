"""Checkpoint completeness: the tensors a config.json implies, against the safetensors headers.

Real vLLM 0.25.1 boots and serves, with no warning, a drafter missing a decoder tensor or ``fc.weight``
and a target missing a layer tensor (docs/real-vllm-notes.md): the loader fills what it does not find
with whatever the buffer held. Only a comparison of the names a config implies with the names the
headers carry catches it. Only headers are read (:mod:`sparkserve.models.safetensors_header`), never a
weight, so a 600-shard target costs one small read per shard.

    c = check_completeness(path, config, role="target")   # Completeness(missing, extra, missing_shards, rule)

The names follow vLLM 0.33's model code:

* **Qwen3 / Qwen2 / Llama / Mistral dense targets** (``qwen3.py``, ``llama.py``): ``model.embed_tokens``,
  ``model.norm``, ``lm_head`` unless ``tie_word_embeddings``, and per layer ``self_attn.{q,k,v,o}_proj``
  (``q_norm``/``k_norm`` for Qwen3), ``input_layernorm``, ``post_attention_layernorm``,
  ``mlp.{gate,up,down}_proj``.
* **MoE / MLA decoder targets** (Qwen3-MoE, GLM-4-MoE, DeepSeek-V2/V3/V3.2, GLM-MoE-DSA): the same top
  tensors, and per layer both norms plus some ``self_attn.*`` and some ``mlp.*`` tensor (expert counts and
  dense-first layers vary too much to list). Layers past ``num_hidden_layers`` up to the MTP layers
  (``num_nextn_predict_layers``) are expected, not extra.
* **DFlash / DFlash2 drafters** (``qwen3_dflash.py``, ``qwen3_dflash2.py``; names without ``model.``):
  per layer the Qwen3 decoder above, ``fc`` (unless ``use_aux_hidden_state`` is false), ``hidden_norm``,
  ``norm``; DFlash2 adds per layer ``{attention,mlp}_conv.{base_kernel,kernel_projection}`` and the three
  ``candidate_selector`` tensors. ``embed_tokens``, ``lm_head`` and ``d2t``/``t2d`` are optional (shared
  from the target when absent). vLLM's renames (``midlayer`` -> ``layers.0``, ``encoder.fc`` -> ``fc``,
  ``encoder.output_norm_enc`` -> ``hidden_norm``) are applied first.
* **Any other architecture**: only that each of the ``num_hidden_layers`` layers has some tensor (the
  conservative rule; ``rule`` says so, and no extra tensor is reported).

A required ``X.weight`` is present when any tensor of module ``X`` is (quantized checkpoints store
``X.weight_packed``, ``X.qweight``, ``X.weight_scale`` …); fused ``qkv_proj`` / ``gate_up_proj`` stand for
their parts. A shard the index names but the directory lacks is reported on its own, and the tensors are
then not judged (they may be in that shard).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkserve.models.files import INDEX_LIMIT, BadFile, MissingFile, as_int, parse_json, read_regular
from sparkserve.models.safetensors_header import read_header

INDEX_FILE = "model.safetensors.index.json"
Role = Literal["target", "drafter"]

DENSE_TARGETS = {
    "Qwen3ForCausalLM": True, "Qwen2ForCausalLM": False, "LlamaForCausalLM": False,
    "MistralForCausalLM": False,
}  # architecture -> has q_norm/k_norm
DECODER_TARGETS = {
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM",
}
DFLASH_DRAFTERS = {"DFlashDraftModel": False, "DFlash2DraftModel": True, "DFlash2BeamDraftModel": True}

_ATTN = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight")
_QK_NORM = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_CONV = ("attention_conv.base_kernel", "attention_conv.kernel_projection.weight", "mlp_conv.base_kernel",
         "mlp_conv.kernel_projection.weight")
_SELECTOR = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
             "candidate_selector.hidden_projection.weight")
_FUSED = {".q_proj.": ".qkv_proj.", ".k_proj.": ".qkv_proj.", ".v_proj.": ".qkv_proj.",
          ".gate_proj.": ".gate_up_proj.", ".up_proj.": ".gate_up_proj."}
_DRAFTER_RENAMES = (
    (re.compile(r"(?<![A-Za-z0-9_])midlayer(?=\.|$)"), "layers.0"),
    (re.compile(r"(?<![A-Za-z0-9_])encoder\.output_norm_enc(?=\.|$)"), "hidden_norm"),
    (re.compile(r"(?<![A-Za-z0-9_])encoder\.fc(?=\.|$)"), "fc"),
)
_DRAFTER_OPTIONAL = re.compile(r"^(embed_tokens|lm_head)\.|(^|\.)(d2t|t2d)$")
_LAYER = re.compile(r"^(?P<prefix>(?:.*?\.)?)layers\.(?P<i>\d+)\.")


@dataclass
class Completeness:
    """What a checkpoint lacks against its config. ``rule`` names the rule applied (see the module doc)."""

    path: str
    rule: str
    tensors: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    missing_shards: list[str] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (file, what is wrong)
    no_weights: bool = False
    layer0_mlp: Literal["dense", "moe"] | None = None  # what the weights hold at model.layers.0.mlp (None: neither)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.missing_shards or self.unreadable or self.no_weights)

    @property
    def conservative(self) -> bool:
        return self.rule.startswith("generic")


@dataclass(frozen=True)
class _Rule:
    name: str
    required: list[str]
    expected_prefixes: tuple[str, ...] | None  # names under these are not extra; None: extras not judged
    optional: re.Pattern[str] | None = None
    layer_groups: list[tuple[str, ...]] = field(default_factory=list)  # per layer: some tensor under each


def tensor_names(path: Path) -> tuple[list[str], Completeness]:
    """Every tensor name in ``path``'s safetensors files, and a Completeness holding the shard problems
    (index shards missing, headers unreadable, no weights at all)."""
    c = Completeness(str(path), rule="")
    listed: list[str] = []
    index = path / INDEX_FILE
    try:
        data = parse_json(read_regular(index, limit=INDEX_LIMIT))
    except MissingFile:
        data = None
    except BadFile as e:
        c.unreadable.append((str(index), str(e)))
        return [], c
    if data is not None:
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            c.unreadable.append((str(index), "not a valid safetensors index (weight_map)"))
            return [], c
        listed = sorted(set(wm.values()))
    c.missing_shards = [s for s in listed if not (path / s).is_file()]
    files = sorted({p for p in path.glob("*.safetensors") if p.is_file()} | {path / s for s in listed
                                                                         if (path / s).is_file()})
    if not files and not listed:
        c.no_weights = True
    names: list[str] = []
    for f in files:
        try:
            tensors, _meta = read_header(f)
        except BadFile as e:
            c.unreadable.append((str(f), str(e)))
            continue
        names.extend(t.name for t in tensors)
    c.tensors = len(names)
    return names, c


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    if as_int(cfg.get("num_hidden_layers")) is None and isinstance(cfg.get("text_config"), dict):
        return cfg["text_config"]
    return cfg


def _layers(cfg: dict[str, Any]) -> int:
    return max(0, as_int(_text_config(cfg).get("num_hidden_layers")) or 0)


def _tied(cfg: dict[str, Any]) -> bool:
    t = _text_config(cfg).get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    return bool(t)


def target_rule(cfg: dict[str, Any], archs: Iterable[str]) -> _Rule:
    archs = list(archs)
    n = _layers(cfg)
    top = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if _tied(cfg) else ["lm_head.weight"])
    dense = next((a for a in archs if a in DENSE_TARGETS), None)
    if dense:
        per = _ATTN + (_QK_NORM if DENSE_TARGETS[dense] else ()) + _NORMS + _MLP
        req = top + [f"model.layers.{i}.{p}" for i in range(n) for p in per]
        if _text_config(cfg).get("attention_bias"):
            req += [f"model.layers.{i}.self_attn.{x}_proj.bias" for i in range(n) for x in "qkv"]
        return _Rule(f"{dense} (vLLM dense decoder)", req, ("model.embed_tokens.", "model.norm.", "lm_head.",
                                                            *(f"model.layers.{i}." for i in range(n))))
    if any(a in DECODER_TARGETS for a in archs):
        mtp = max(0, as_int(_text_config(cfg).get("num_nextn_predict_layers")) or 0)
        req = top + [f"model.layers.{i}.{p}" for i in range(n) for p in _NORMS]
        groups = [(f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.") for i in range(n)]
        name = next(a for a in archs if a in DECODER_TARGETS)
        return _Rule(f"{name} (vLLM MoE decoder: norms, some attention and some MLP tensor per layer)", req,
                     ("model.embed_tokens.", "model.norm.", "lm_head.",
                      *(f"model.layers.{i}." for i in range(n + mtp))), layer_groups=groups)
    return _generic(archs, n)


def _generic(archs: list[str], n: int) -> _Rule:
    return _Rule(f"generic ({', '.join(archs) or 'no architectures'}: only that each of the {n} layers has "
                 "tensors)", [], None, layer_groups=[(f"layers.{i}.",) for i in range(n)])


def drafter_rule(cfg: dict[str, Any], archs: Iterable[str]) -> _Rule:
    archs = list(archs)
    n = _layers(cfg)
    arch = next((a for a in archs if a in DFLASH_DRAFTERS), None)
    if arch is None:
        return _generic(archs, n)
    dflash = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    per = _ATTN + _QK_NORM + _NORMS + _MLP + (_CONV if DFLASH_DRAFTERS[arch] else ())
    req = [f"layers.{i}.{p}" for i in range(n) for p in per]
    if cfg.get("attention_bias"):
        req += [f"layers.{i}.self_attn.{x}_proj.bias" for i in range(n) for x in ("q", "k", "v", "o")]
    if dflash.get("use_aux_hidden_state", cfg.get("use_aux_hidden_state", True)):
        req.append("fc.weight")
    req += ["hidden_norm.weight", "norm.weight"]
    if DFLASH_DRAFTERS[arch]:
        req += list(_SELECTOR)
    return _Rule(f"{arch} (vLLM DFlash drafter)", req,
                 ("fc.", "hidden_norm.", "norm.", "candidate_selector.", *(f"layers.{i}." for i in range(n))),
                 optional=_DRAFTER_OPTIONAL)


class _Names:
    """Exact and prefix look-ups over a checkpoint's tensor names (a sorted list: one bisect each)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.exact = set(names)
        self.sorted = sorted(self.exact)
        self.parents = {n.rsplit(".", 1)[0] for n in self.exact}

    def under(self, prefix: str) -> bool:
        i = bisect.bisect_left(self.sorted, prefix)
        return i < len(self.sorted) and self.sorted[i].startswith(prefix)

    def present(self, want: str) -> bool:
        if want in self.exact:
            return True
        if not want.endswith(".weight"):
            return False
        module = want[: -len(".weight")]
        if module in self.parents:  # quantized: X.weight_packed, X.qweight, X.weight_scale …
            return True
        for part, fused in _FUSED.items():
            if part in module + ".":
                return (module + ".").replace(part, fused)[:-1] in self.parents
        return False


def normalize_drafter_names(names: Iterable[str]) -> list[str]:
    """Apply vLLM's DFlash renames (``midlayer`` -> ``layers.0`` …)."""
    out = []
    for n in names:
        for rx, new in _DRAFTER_RENAMES:
            n = rx.sub(new, n)
        out.append(n)
    return out


def judge(names: list[str], rule: _Rule, c: Completeness) -> Completeness:
    """Fill ``c.missing`` / ``c.extra`` for ``names`` (file order) under ``rule``."""
    have = _Names(names)
    c.rule = rule.name
    c.missing = [w for w in rule.required if not have.present(w)]
    generic_layers: set[int] | None = None
    for group in rule.layer_groups:
        for prefix in group:
            if prefix.startswith("layers."):  # generic: the layers may sit under model., model.language_model. …
                if generic_layers is None:
                    generic_layers = {int(m["i"]) for n in names if (m := _LAYER.match(n))}
                ok = int(prefix.split(".")[1]) in generic_layers
            else:
                ok = have.under(prefix)
            if not ok:
                c.missing.append(prefix + "*")
    if rule.expected_prefixes is not None:
        req = set(rule.required)
        c.extra = [n for n in names if n not in req and not n.startswith(rule.expected_prefixes)
                   and not (rule.optional and rule.optional.search(n))]
    return c


def check_completeness(path: Path | str, cfg: dict[str, Any], *, role: Role,
                       architectures: Iterable[str] | None = None) -> Completeness:
    """Compare the tensors ``cfg`` (the directory's config.json, normalized for speculators drafters)
    implies with the safetensors headers in ``path``."""
    path = Path(path)
    archs = list(architectures if architectures is not None else cfg.get("architectures") or [])
    names, c = tensor_names(path)
    if role == "target":
        c.layer0_mlp = layer0_mlp(names)
    rule = target_rule(cfg, archs) if role == "target" else drafter_rule(cfg, archs)
    c.rule = rule.name
    if not c.complete:  # a missing shard or unreadable header: the tensors are not judged
        return c
    if role == "drafter":
        names = normalize_drafter_names(names)
    return judge(names, rule, c)


def layer0_mlp(names: Iterable[str]) -> Literal["dense", "moe"] | None:
    """What the checkpoint holds at layer 0's MLP: routed experts ("moe"), a dense gate/up projection ("dense"),
    or neither (None)."""
    seen: Literal["dense", "moe"] | None = None
    for n in names:
        if n.startswith("model.layers.0.mlp.experts.") or n.startswith("model.layers.0.mlp.gate.weight"):
            return "moe"
        if n.startswith(("model.layers.0.mlp.gate_proj.", "model.layers.0.mlp.gate_up_proj.",
                         "model.layers.0.mlp.up_proj.")):
            seen = "dense"
    return seen


def first_dense_layers(cfg: dict[str, Any]) -> int | None:
    """How many leading layers the config makes dense (``first_k_dense_replace``, the MoE decoders' field; absent
    reads as 0, as vLLM's GLM/DeepSeek model code does) — None when the config routes no experts at all."""
    text = _text_config(cfg)
    if not any(as_int(text.get(k)) for k in ("n_routed_experts", "num_experts")):
        return None
    return as_int(text.get("first_k_dense_replace")) or 0


def summary(names: list[str], first: int = 3) -> str:
    """``a, b, c and 5 more`` for a refusal line."""
    head = ", ".join(names[:first])
    return head + (f" and {len(names) - first} more" if len(names) > first else "")
