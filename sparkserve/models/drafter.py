"""DFlash / DFlash2 drafter inspection: config.json, safetensors headers, mask_embedding.pt.

Reads only what vLLM 0.33 reads (vllm-facts.md section 5) and never loads a weight: tensor facts come
from the safetensors headers, the mask file is read by sparkserve.models.torchfile without torch. Problems that
still leave something to show (no weights, unreadable mask file) are recorded in ``problems``; preflight
turns them into errors. Only an unreadable directory or config.json raises. Every file is read through
sparkserve.models.files (regular files only, size-capped), cheapest first: config.json, the index, the
safetensors headers, the mask file; nothing here hashes or reads weights.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sparkserve.errors import BadInput
from sparkserve.models.files import (
    INDEX_LIMIT,
    BadFile,
    MissingFile,
    as_int,
    name_list,
    parse_json,
    read_config,
    read_regular,
)
from sparkserve.models.safetensors_header import TensorHeader, read_header
from sparkserve.models.torchfile import MaskEmbeddingInfo, read_mask_embedding

MASK_FILE = "mask_embedding.pt"
INDEX_FILE = "model.safetensors.index.json"

DrafterKind = Literal["dflash", "dflash2", "lilicorr", "xpress"]

# The DFlash-family drafter architectures vLLM 0.33.0 registers (vllm-facts.md 5.1), and what each runs as.
KNOWN_ARCHITECTURES: dict[str, DrafterKind] = {
    "DFlashDraftModel": "dflash",
    "DFlash2DraftModel": "dflash2",
    "DFlash2BeamDraftModel": "dflash2",
    "LiLiCorrDraftModel": "lilicorr",
    "Qwen3XPressModel": "xpress",
    "DFlashQwen3XPressModel": "xpress",
}
# The DFlash-family architectures each supported vLLM release registers (0.25.1: its wheel's registry.py).
ARCHITECTURES_BY_VLLM: dict[str, tuple[str, ...]] = {
    "0.33.0": tuple(KNOWN_ARCHITECTURES),
    "0.25.1": ("DFlashDraftModel",),
}
# DFlash2 layers index these dflash_config keys directly: a missing one is a KeyError at model build.
DFLASH2_REQUIRED_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")

CONV_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.(attention_conv|mlp_conv)\.(base_kernel|kernel_projection\.weight)$")
SELECTOR_RE = re.compile(
    r"(?:^|\.)candidate_selector\.(predecessor_codebook|successor_codebook|hidden_projection\.weight)$"
)
FC_RE = re.compile(r"(?:^|\.)fc\.weight$")


@dataclass
class WeightFacts:
    files: list[str]
    tensor_count: int
    param_count: int
    dtypes: dict[str, int]  # safetensors dtype -> parameters stored in it
    dtype: str | None  # the dtype holding most parameters
    selector_tensors: int
    conv_tensors: int
    fc_shape: list[int] | None
    mask_hidden_tensors: list[str]
    has_d2t: bool

    @property
    def fc_input_width(self) -> int | None:
        return self.fc_shape[1] if self.fc_shape and len(self.fc_shape) == 2 else None


@dataclass
class MaskFacts:
    present: bool
    form: str | None = None
    mask_token_id: int | None = None
    embedding_shape: list[int] | None = None
    embedding_dtype: str | None = None
    error: str | None = None


@dataclass
class Problem:
    """Something inspection found that makes the drafter unusable; ``where`` is a file or field."""

    where: str
    what: str


@dataclass
class DrafterFacts:
    path: str
    format: Literal["dflash", "speculators"]
    architectures: list[str]
    architecture: str | None
    kind: DrafterKind | None
    model_type: str | None
    hidden_size: int | None
    target_hidden_size: int | None
    num_hidden_layers: int | None
    vocab_size: int | None
    block_size: int | None
    mask_token_id: int | None
    mask_token_id_source: str | None
    target_layer_ids: list[int] | None  # DFlash semantics (vLLM uses id + 1 as the aux layer)
    aux_layer_ids: list[int] | None  # what vLLM logs as "Using Eagle3 auxiliary layers from config"
    conv_kernel_size: int | None
    conv_group_size: int | None
    selector_rank: int | None
    selector_top_k: int | None
    use_aux_hidden_state: bool
    sample_from_anchor: bool
    speculative_tokens: int | None  # speculators format: proposal_methods[0].speculative_tokens
    dflash_config: dict[str, Any]
    weights: WeightFacts | None
    mask: MaskFacts
    problems: list[Problem] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return self.kind is not None

    @property
    def taps(self) -> int | None:
        return len(self.target_layer_ids) if self.target_layer_ids is not None else None

    @property
    def expected_k(self) -> int | None:
        return self.block_size - 1 if self.block_size else None

    @property
    def fc_taps(self) -> float | None:
        """fc input width / target hidden size: how many target layers the weights were trained on."""
        width = self.weights.fc_input_width if self.weights else None
        th = self.target_hidden_size or self.hidden_size
        if not width or not th:
            return None
        return width / th

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(known=self.known, taps=self.taps, expected_k=self.expected_k, fc_taps=self.fc_taps,
                 fc_input_width=self.weights.fc_input_width if self.weights else None)
        return d


def _int_list(v: Any) -> list[int] | None:
    if isinstance(v, list | tuple) and all(as_int(x) is not None for x in v):
        return list(v)
    return None


def _obj(raw: dict[str, Any], key: str, cfg_file: Path) -> dict[str, Any]:
    """``raw[key]`` as a JSON object ({} when absent); BadInput when it is something else."""
    v = raw.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadInput(str(cfg_file), f"{key} must be an object")
    return v


def _normalize_speculators(raw: dict[str, Any], cfg_file: Path) -> tuple[dict[str, Any], int | None]:
    """Apply vLLM's speculators conversion (speculators.algos.update_dflash/update_dflash2)."""
    layer = dict(_obj(raw, "transformer_layer_config", cfg_file))
    mtype = raw.get("speculators_model_type")
    dflash: dict[str, Any] = {}
    if raw.get("mask_token_id") is not None:
        dflash["mask_token_id"] = raw["mask_token_id"]
    aux = _int_list(raw.get("aux_hidden_state_layer_ids"))
    if aux is not None:
        layer["eagle_aux_hidden_state_layer_ids"] = aux
        dflash["target_layer_ids"] = [i - 1 for i in aux]
    dflash["sample_from_anchor"] = raw.get("sample_from_anchor", False)
    if mtype == "dflash2":
        for key in DFLASH2_REQUIRED_KEYS:
            if raw.get(key) is not None:
                dflash[key] = raw[key]
        layer["architectures"] = ["DFlash2DraftModel"]
    elif mtype == "dflash":
        layer["architectures"] = ["DFlashDraftModel"]
    else:
        layer["architectures"] = [f"speculators:{mtype}"]
    if raw.get("block_size") is not None:
        dflash["block_size"] = raw["block_size"]
    if raw.get("target_hidden_size") is not None:
        layer["target_hidden_size"] = raw["target_hidden_size"]
    layer["dflash_config"] = dflash
    k = None
    methods = _obj(raw, "speculators_config", cfg_file).get("proposal_methods")
    if isinstance(methods, list) and methods and isinstance(methods[0], dict):
        k = as_int(methods[0].get("speculative_tokens"))
    return layer, k


def _layer_ids(cfg: dict[str, Any], dflash: dict[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """(target_layer_ids in DFlash semantics, aux layer ids as vLLM uses them), vLLM's lookup order."""
    eagle = _int_list(cfg.get("eagle_aux_hidden_state_layer_ids"))
    if eagle:
        return [i - 1 for i in eagle], eagle
    for ids in (dflash.get("target_layer_ids"), cfg.get("dspark_target_layer_ids"), cfg.get("target_layer_ids")):
        got = _int_list(ids)
        if got:
            return got, [i + 1 for i in got]
    as_is = _int_list(dflash.get("layer_ids"))
    if as_is:
        return [i - 1 for i in as_is], as_is
    return None, None


def _index_shards(index: Path) -> tuple[list[str], list[Problem]]:
    """The shard names ``model.safetensors.index.json`` lists (none when there is no index)."""
    try:
        data = parse_json(read_regular(index, limit=INDEX_LIMIT))
    except MissingFile:
        return [], []
    except BadFile as e:
        return [], [Problem(str(index), str(e))]
    weight_map = (data.get("weight_map") or {}) if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return [], [Problem(str(index), "not a valid safetensors index (weight_map)")]
    return sorted(set(weight_map.values())), []


def weight_facts(path: Path) -> tuple[WeightFacts | None, list[Problem]]:
    """Tensor facts from every ``*.safetensors`` header in ``path`` (regular files; the data is never read)."""
    files = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    shards, problems = _index_shards(path / INDEX_FILE)
    if problems:
        return None, problems
    for shard in shards:
        if not (path / shard).is_file():
            problems.append(Problem(str(path / shard), f"missing (listed in {INDEX_FILE})"))
    if not files:
        return None, problems + [Problem("drafter.path", f"{path} has no *.safetensors weights")]
    tensors: list[TensorHeader] = []
    for f in files:
        try:
            t, _meta = read_header(f)
        except BadFile as e:
            problems.append(Problem(str(f), str(e)))
            continue
        tensors.extend(t)
    if problems and not tensors:
        return None, problems
    dtypes: dict[str, int] = {}
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.numel
    fc = next((t for t in tensors if FC_RE.search(t.name)), None)
    facts = WeightFacts(
        files=[f.name for f in files],
        tensor_count=len(tensors),
        param_count=sum(t.numel for t in tensors),
        dtypes=dict(sorted(dtypes.items(), key=lambda kv: -kv[1])),
        dtype=max(dtypes, key=lambda k: dtypes[k]) if dtypes else None,
        selector_tensors=sum(1 for t in tensors if SELECTOR_RE.search(t.name)),
        conv_tensors=sum(1 for t in tensors if CONV_RE.search(t.name)),
        fc_shape=list(fc.shape) if fc else None,
        mask_hidden_tensors=[t.name for t in tensors if "mask_hidden" in t.name],
        has_d2t=any(t.name.endswith("d2t") for t in tensors),
    )
    return facts, problems


def mask_facts(path: Path) -> MaskFacts:
    """What ``mask_embedding.pt`` holds; an unreadable one (a FIFO, too big, not torch) is ``error``."""
    f = path / MASK_FILE
    try:
        info: MaskEmbeddingInfo = read_mask_embedding(f)
    except MissingFile:
        return MaskFacts(present=False)
    except BadFile as e:
        return MaskFacts(present=True, error=str(e))
    return MaskFacts(True, info.form, info.mask_token_id, info.embedding_shape, info.embedding_dtype)


def inspect_drafter(path: Path | str) -> DrafterFacts:
    """Everything sparkserve knows about a drafter directory. BadInput if the dir or config.json is unusable."""
    path = Path(path)
    raw = read_config(path)
    cfg_file = path / "config.json"
    fmt: Literal["dflash", "speculators"] = "dflash"
    spec_k = None
    cfg = raw
    if raw.get("speculators_model_type") is not None:
        fmt = "speculators"
        cfg, spec_k = _normalize_speculators(raw, cfg_file)
    dflash = _obj(cfg, "dflash_config", cfg_file)
    archs = name_list(cfg, "architectures", cfg_file)
    arch = archs[0] if archs else None
    kind = next((KNOWN_ARCHITECTURES[a] for a in archs if a in KNOWN_ARCHITECTURES), None)
    if dflash.get("mask_token_id") is not None:
        mask_id, mask_src = as_int(dflash.get("mask_token_id")), "dflash_config.mask_token_id"
    elif cfg.get("mask_token_id") is not None:
        mask_id, mask_src = as_int(cfg.get("mask_token_id")), "mask_token_id"
    else:
        mask_id, mask_src = None, None
    target_ids, aux_ids = _layer_ids(cfg, dflash)
    use_aux = dflash.get("use_aux_hidden_state", cfg.get("use_aux_hidden_state", True))
    weights, problems = weight_facts(path)
    hidden = as_int(cfg.get("hidden_size"))
    return DrafterFacts(
        path=str(path),
        format=fmt,
        architectures=archs,
        architecture=arch,
        kind=kind,
        model_type=cfg["model_type"] if isinstance(cfg.get("model_type"), str) else None,
        hidden_size=hidden,
        target_hidden_size=as_int(cfg.get("target_hidden_size")) or hidden,
        num_hidden_layers=as_int(cfg.get("num_hidden_layers")),
        vocab_size=as_int(cfg.get("vocab_size")),
        block_size=as_int(dflash.get("block_size")) or as_int(cfg.get("block_size")),
        mask_token_id=mask_id,
        mask_token_id_source=mask_src,
        target_layer_ids=target_ids,
        aux_layer_ids=aux_ids,
        conv_kernel_size=as_int(dflash.get("conv_kernel_size")),
        conv_group_size=as_int(dflash.get("conv_group_size")),
        selector_rank=as_int(dflash.get("selector_rank")),
        selector_top_k=as_int(dflash.get("selector_top_k")),
        use_aux_hidden_state=bool(use_aux),
        sample_from_anchor=bool(dflash.get("sample_from_anchor", False)),
        speculative_tokens=spec_k,
        dflash_config=dict(dflash),
        weights=weights,
        mask=mask_facts(path),
        problems=problems,
    )
