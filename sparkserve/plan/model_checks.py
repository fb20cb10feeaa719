"""Pre-flight rules on the models: the drafter alone and against the config (kind, mask token and file, K
against block_size, sampling, DFlash2 structure, taps, completeness), the target (max_model_len, completeness)
and the two together (hidden size, layer ids, vocabulary). Each rule writes its findings into a
:class:`~sparkserve.plan.findings.Report`; :func:`sparkserve.plan.validate.validate` runs them all.

Pure: the facts come in already read (:mod:`sparkserve.models`); only the completeness rules read safetensors
headers and config.json through :mod:`sparkserve.models.completeness` / :mod:`sparkserve.models.files`."""

from __future__ import annotations

import math
import re
from pathlib import Path

from sparkserve.config import Config
from sparkserve.models.completeness import Completeness, check_completeness, first_dense_layers, summary
from sparkserve.models.drafter import (
    ARCHITECTURES_BY_VLLM,
    CONV_RE,
    DFLASH2_REQUIRED_KEYS,
    KNOWN_ARCHITECTURES,
    MASK_FILE,
    SELECTOR_RE,
    DrafterFacts,
)
from sparkserve.models.files import read_config
from sparkserve.models.target import TargetFacts
from sparkserve.plan.dialects import dialect_for, has_no_v1_runner
from sparkserve.plan.findings import Report

# --- drafter -----------------------------------------------------------------------------------------------

def check_drafter(cfg: Config, d: DrafterFacts, r: Report) -> None:
    """Every rule on the drafter alone and against the config: kind, mask token and file, K, DFlash2
    structure, taps."""
    cfg_file = str(Path(d.path) / "config.json")
    for check in (_check_kind, _check_mask, _check_k_rule, _check_sampling, _check_dflash2, _check_taps,
                  _check_drafter_complete):
        check(cfg, d, r, cfg_file)


def _check_kind(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """A DFlash drafter vLLM 0.33 knows, and the inspection's own problems."""
    if not d.known:
        known = ", ".join(KNOWN_ARCHITECTURES)
        if d.format == "speculators":
            r.error(cfg_file, f"speculators_model_type {d.architecture.split(':', 1)[-1] if d.architecture else None!r}"
                    " is not a DFlash drafter (vLLM 0.33 converts only dflash and dflash2)")
        else:
            r.error(cfg_file, f"architectures {d.architectures} is not a DFlash drafter vLLM 0.33 knows ({known})")
    version = dialect_for(cfg).vllm_version
    by_version = ARCHITECTURES_BY_VLLM.get(version)  # None: a build (the card's fork) sparkserve has no list for
    if d.known and by_version is not None and not any(a in by_version for a in d.architectures):
        r.error(cfg_file, f"architectures {d.architectures}: vLLM {version} (the engine's dialect) registers only "
                f"{', '.join(by_version)}")
    for p in d.problems:
        r.error(p.where, p.what)


def _check_mask(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """The mask token: drafter config, ``mask_embedding.pt`` and the gates agree, and the file is there."""
    if d.mask_token_id is None:
        r.error(cfg_file, "dflash_config.mask_token_id is missing (vLLM refuses a DFlash drafter without it)")
    elif d.vocab_size is not None and not 0 <= d.mask_token_id < d.vocab_size:
        r.error(cfg_file, f"{d.mask_token_id_source} {d.mask_token_id} is outside the vocabulary (vocab_size "
                f"{d.vocab_size})")
    mask_file = str(Path(d.path) / MASK_FILE)
    if not d.mask.present:
        r.error("drafter.path", f"{d.path} has no {MASK_FILE}: vLLM would silently use the embedding row of "
                "mask_token_id instead of the trained mask (do not serve)")
    elif d.mask.error:
        r.error(mask_file, d.mask.error)
    else:
        if d.mask.mask_token_id is not None and d.mask_token_id is not None and d.mask.mask_token_id != d.mask_token_id:
            r.error(mask_file, f"mask_token_id {d.mask.mask_token_id} but config.json {d.mask_token_id_source} is "
                    f"{d.mask_token_id} (vLLM refuses the pair)")
        shape = d.mask.embedding_shape or []
        if d.hidden_size and math.prod(shape) != d.hidden_size:
            r.error(mask_file, f"embedding of shape {shape} cannot be reshaped to the drafter's hidden_size "
                    f"{d.hidden_size}")
    gate_id = cfg.gates.mask_token_id
    if gate_id is not None and d.mask_token_id is not None and gate_id != d.mask_token_id:
        r.error("gates.mask_token_id", f"{gate_id} but the drafter's {d.mask_token_id_source} is {d.mask_token_id}")


def _check_k_rule(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """K against block_size: K > block_size − 1 is an error for DFlash2 (a block holds the anchor and block_size − 1
    masked slots); a smaller K boots (drafter card GLM-5.3-Flash-DFlash2-E.md, "Hard constraints"): a warning."""
    k, b = cfg.speculative.num_speculative_tokens, d.block_size
    if b is None and d.kind == "dflash2":
        r.warn(cfg_file, "dflash_config.block_size is missing: cannot check num_speculative_tokens against it")
    elif b is not None and k != b - 1:
        what = f"{k} but the drafter's block_size is {b}"
        if d.kind == "dflash2" and k > b - 1:
            r.error("speculative.num_speculative_tokens", f"{what}: a block drafts at most block_size - 1 = {b - 1}")
        elif d.kind == "dflash2":
            r.warn("speculative.num_speculative_tokens", f"{what}: the drafter card trained and measured K = "
                   f"block_size - 1 = {b - 1}; fewer boot on the SM121 image (the card: k=5, not benchmarked; "
                   "its K=4 column is from H200)")
        else:
            r.warn("speculative.num_speculative_tokens", what + ": the convention is K = block_size - 1 (not enforced)")
    if d.speculative_tokens is not None and d.speculative_tokens != k:
        r.warn("speculative.num_speculative_tokens", f"{k} but the speculators config proposes {d.speculative_tokens}")


def _check_sampling(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """Draft sampling options vLLM 0.33 refuses for DFlash."""
    if d.sample_from_anchor:
        r.error(cfg_file, "dflash_config.sample_from_anchor is true; vLLM 0.33 does not support it for DFlash")


def _check_dflash2(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """DFlash2's structure: its config keys, selector and convolution tensors, the V2 runner."""
    if d.kind == "dflash2":
        missing = [k_ for k_ in DFLASH2_REQUIRED_KEYS if d.dflash_config.get(k_) is None]
        if missing:
            r.error(cfg_file, f"dflash_config lacks {', '.join(missing)} (a DFlash2 drafter needs them; vLLM fails "
                    "with KeyError)")
        g, h = d.conv_group_size, d.hidden_size
        if g is not None and h and (g <= 0 or h % g):
            r.error(cfg_file, f"dflash_config.conv_group_size={g} must divide hidden_size={h}")
        if d.weights:
            if d.weights.selector_tensors != 3:
                r.error("drafter.path", f"{d.weights.selector_tensors} candidate_selector tensors in the weights; a "
                        "DFlash2 drafter has 3 (predecessor/successor codebook, hidden_projection)")
            layers = d.num_hidden_layers or 0
            if layers and d.weights.conv_tensors != 4 * layers:
                r.error("drafter.path", f"{d.weights.conv_tensors} convolution tensors in the weights; a DFlash2 "
                        f"drafter with {layers} layers has {4 * layers}")
        mode = cfg.serve.env.get("VLLM_USE_V2_MODEL_RUNNER")
        version = dialect_for(cfg).vllm_version
        if mode is not None and has_no_v1_runner(version):
            # 0.34 removed the V1 runner and the variable with it (its envs.py has no VLLM_USE_V2_MODEL_RUNNER;
            # session 47's real 0.34.0 boot printed no runner line): the setting does nothing there
            r.warn("serve.env.VLLM_USE_V2_MODEL_RUNNER", f"vLLM {version} has no V1 runner and no such variable: "
                   "the setting does nothing; delete it")
        elif mode is not None and mode.strip() == "0":
            r.error("serve.env.VLLM_USE_V2_MODEL_RUNNER", "0 forces the V1 runner, which refuses DFlash2 "
                    "candidate-head drafts")
    if d.weights and d.weights.mask_hidden_tensors:
        r.error("drafter.path", f"the weights ship {d.weights.mask_hidden_tensors[0]}; vLLM asserts DFlash drafters "
                "carry no mask_hidden weight")


def _check_taps(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """Taps: target_layer_ids against the fc projection's input width (a missing fc.weight is the
    completeness rule's, _check_drafter_complete)."""
    if d.target_layer_ids is None:
        r.error(cfg_file, "dflash_config.target_layer_ids is missing (which target layers feed the drafter?)")
    elif d.weights and d.use_aux_hidden_state:
        width, th = d.weights.fc_input_width, d.target_hidden_size
        taps = len(d.target_layer_ids)
        if width is not None and th and width != th * taps:
            trained = f"{width // th} taps" if width % th == 0 else f"not a multiple of {th}"
            r.error(cfg_file, f"dflash_config.target_layer_ids lists {taps} layers but fc.weight's input width is "
                    f"{width} ({trained} x target_hidden_size {th})")


def _check_drafter_complete(cfg: Config, d: DrafterFacts, r: Report, cfg_file: str) -> None:
    """Every tensor the drafter's config implies is in its safetensors headers (real vLLM boots without one,
    silently). Names an earlier rule already counted (DFlash2 selector, convolutions) are not named twice."""
    if d.problems or not d.weights:  # unreadable or missing weights are the inspection's own errors
        return
    ccfg = {"num_hidden_layers": d.num_hidden_layers,
            "dflash_config": {**d.dflash_config, "use_aux_hidden_state": d.use_aux_hidden_state}}
    c = check_completeness(d.path, ccfg, role="drafter", architectures=d.architectures)
    said: list[re.Pattern[str]] = []
    if d.kind == "dflash2" and d.weights.selector_tensors != 3:
        said.append(SELECTOR_RE)
    if d.kind == "dflash2" and d.num_hidden_layers and d.weights.conv_tensors != 4 * d.num_hidden_layers:
        said.append(CONV_RE)
    c.missing = [m for m in c.missing if not any(rx.search(m) for rx in said)]
    report_completeness(c, "drafter.path", r)
    r.completeness["drafter"] = c


def report_completeness(c: Completeness, where: str, r: Report) -> None:
    """A Completeness as findings: each missing shard or unreadable header, the missing tensors (one
    error naming the first few), extra tensors and the conservative rule (warnings)."""
    for shard in c.missing_shards:
        r.error(str(Path(c.path) / shard), "missing (listed in model.safetensors.index.json)")
    for f, what in c.unreadable:
        r.error(f, what)
    if c.missing:
        r.error(where, f"{c.path} lacks {len(c.missing)} tensor{'s' if len(c.missing) > 1 else ''} its config.json "
                f"implies: {summary(c.missing)} (vLLM boots such a checkpoint without a word and serves "
                f"uninitialised weights; rule: {c.rule})")
    if c.extra:
        r.warn(where, f"{c.path} holds {len(c.extra)} tensor{'s' if len(c.extra) > 1 else ''} its config.json "
               f"does not imply: {summary(c.extra)} (rule: {c.rule})")
    if c.conservative and not c.no_weights:
        r.warn(where, f"completeness of {c.path} checked by the {c.rule} rule only")


def check_target_complete(t: TargetFacts, r: Report) -> None:
    """Every tensor the target's config implies is in its safetensors headers (the shards of its index
    included). A directory without any safetensors file (a controller holding only config.json) is a
    warning: nothing to compare."""
    c = check_completeness(t.path, read_config(Path(t.path), where="model.target"), role="target",
                           architectures=t.architectures)
    if c.no_weights:
        r.warn("model.target", f"{t.path} has no *.safetensors here: checkpoint completeness not checked")
        return
    report_completeness(c, "model.target", r)
    r.completeness["target"] = c
    check_target_config_date(t, c, r)


# The W4A16 checkpoint's config.json was corrected on 2026-09-08: a copy from before boots into
# `KeyError: 'layers.0.mlp.gate_up_proj.weight'` (a third-party summary of the card's HF page, read 2026-12-07:
# "re-download the config"). That KeyError is vLLM's loader meeting a dense layer-0 MLP tensor (gate/up
# projection) in the weights that the model the config describes has no parameter for: the config makes layer 0
# a MoE layer (first_k_dense_replace 0 or absent). So the stale config is told by its own fields against the
# weights' names, before the boot.
CONFIG_FIXED_ON = "2026-09-08"


def check_target_config_date(t: TargetFacts, c: Completeness, r: Report) -> None:
    """A target config.json from before 2026-09-08 (see above): an error naming the fix."""
    if c.layer0_mlp != "dense":
        return
    dense = first_dense_layers(read_config(Path(t.path), where="model.target"))
    if dense is None or dense >= 1:
        return
    r.error(str(Path(t.path) / "config.json"),
            f"first_k_dense_replace is {dense} (layer 0 routed to experts) but the weights hold a dense layer-0 MLP "
            f"(model.layers.0.mlp.gate_proj/up_proj): this config.json is from before {CONFIG_FIXED_ON} and boots "
            "into KeyError: 'layers.0.mlp.gate_up_proj.weight' — download the current config.json from the "
            "checkpoint's repository")


def check_target(cfg: Config, d: DrafterFacts | None, t: TargetFacts, r: Report) -> None:
    check_max_model_len(cfg, t, r)
    if d is None:
        return
    cfg_file = str(Path(d.path) / "config.json")
    if d.target_hidden_size and d.target_hidden_size != t.hidden_size:
        r.error(cfg_file, f"target_hidden_size {d.target_hidden_size} but the target's hidden_size is "
                f"{t.hidden_size} ({t.path})")
    if d.target_layer_ids:
        bad = [i for i in d.target_layer_ids if not 0 <= i < t.num_hidden_layers]
        if bad:
            r.error(cfg_file, f"target_layer_ids has {bad[0]} but the target has {t.num_hidden_layers} layers "
                    f"(0..{t.num_hidden_layers - 1})")
    if d.vocab_size and t.vocab_size and d.vocab_size != t.vocab_size and not (d.weights and d.weights.has_d2t):
        r.warn(cfg_file, f"vocab_size {d.vocab_size} differs from the target's {t.vocab_size} and the weights "
               "carry no d2t map")


def check_max_model_len(cfg: Config, t: TargetFacts, r: Report) -> None:
    """As vLLM does at start-up (``_get_and_verify_max_len``): a max_model_len beyond the target's derived length
    is a ValueError, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (then vLLM only warns). Refused here, before boot."""
    derived, want = t.derived_max_model_len, cfg.serve.max_model_len
    if not want or derived is None or want <= derived:
        return
    scaled = f" x RoPE factor {t.rope_factor:g}" if t.rope_factor != 1 else ""
    what = (f"{want} is greater than the target's derived max_model_len {derived} (max_position_embeddings "
            f"{t.max_position_embeddings}{scaled}; {t.path})")
    if cfg.serve.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true"):
        r.warn("serve.max_model_len", what + "; allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN (RoPE positions past "
               "it give nan)")
    else:
        r.error("serve.max_model_len", what + "; vLLM refuses it (set serve.env VLLM_ALLOW_LONG_MAX_MODEL_LEN: "
                "\"1\" to override)")

