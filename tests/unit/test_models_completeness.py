"""Checkpoint completeness (models/completeness.py): config-implied tensors against safetensors headers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _fixtures import DrafterSpec, write_drafter, write_speculators_drafter, write_target
from safetensors.numpy import save_file

from sparkserve.config import load_config
from sparkserve.models.completeness import Completeness as C
from sparkserve.models.completeness import check_completeness, drafter_rule, judge, target_rule
from sparkserve.plan.validate import validate


def _save_names(d: Path, names: list[str], cfg: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    save_file({n: np.zeros((2,), dtype=np.float16) for n in names}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _qwen3(layers: int = 2, **extra: object) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": layers, "hidden_size": 256,
            "num_attention_heads": 4, "vocab_size": 154880, **extra}


def _full_qwen3_names(layers: int, *, lm_head: bool = True) -> list[str]:
    rule = target_rule(_qwen3(layers, tie_word_embeddings=not lm_head), ["Qwen3ForCausalLM"])
    return list(rule.required)


@pytest.mark.parametrize("kind", ["target", "dflash2", "dflash", "speculators-dflash2"])
def test_the_tiny_fixture_checkpoints_are_complete(tmp_path: Path, kind: str) -> None:
    if kind == "target":
        path, role = write_target(tmp_path / "t"), "target"
    elif kind == "speculators-dflash2":
        path, role = write_speculators_drafter(tmp_path / "d"), "drafter"
    else:
        arch = "DFlash2DraftModel" if kind == "dflash2" else "DFlashDraftModel"
        path, role = write_drafter(tmp_path / "d", DrafterSpec(architecture=arch)), "drafter"
    cfg = json.loads((path / "config.json").read_text())
    if kind == "speculators-dflash2":  # validate hands the normalized facts; here: the layer config
        cfg = {**cfg["transformer_layer_config"], "dflash_config": {}}
        archs = ["DFlash2DraftModel"]
    else:
        archs = cfg["architectures"]
    c = check_completeness(path, cfg, role=role, architectures=archs)  # type: ignore[arg-type]
    assert c.complete and c.missing == [] and c.extra == [] and not c.conservative, c
    assert c.tensors > 20


def test_validate_passes_the_fixtures_with_no_completeness_finding(tmp_path: Path) -> None:
    d, t = write_drafter(tmp_path / "d"), write_target(tmp_path / "t")
    r = validate(load_config(None), drafter_dir=d, target_dir=t, parser="none")
    assert r.ok, r.errors
    assert set(r.completeness) == {"drafter", "target"}
    assert not [w for w in r.warnings if "tensor" in w.what or "completeness" in w.what], r.warnings


def test_dflash2e_shape_needs_3_selector_and_32_conv_tensors() -> None:
    rule = drafter_rule({"num_hidden_layers": 8, "dflash_config": {}}, ["DFlash2DraftModel"])
    assert sum("candidate_selector." in n for n in rule.required) == 3
    assert sum("_conv." in n for n in rule.required) == 32
    assert "fc.weight" in rule.required and "hidden_norm.weight" in rule.required
    v1 = drafter_rule({"num_hidden_layers": 8, "dflash_config": {}}, ["DFlashDraftModel"])
    assert not [n for n in v1.required if "conv" in n or "selector" in n]
    no_aux = drafter_rule({"num_hidden_layers": 1, "dflash_config": {"use_aux_hidden_state": False}},
                          ["DFlashDraftModel"])
    assert "fc.weight" not in no_aux.required


def test_quantized_and_fused_names_satisfy_the_plain_ones() -> None:
    names = []
    for n in _full_qwen3_names(1):
        if ".q_proj." in n or ".k_proj." in n or ".v_proj." in n:
            n = n.replace(".q_proj.", ".qkv_proj.").replace(".k_proj.", ".qkv_proj.").replace(".v_proj.", ".qkv_proj.")
        elif n.endswith("_proj.weight"):
            names += [n + "_packed", n + "_scale"]  # compressed-tensors W4A16
            continue
        names.append(n)
    c = judge(sorted(set(names)), target_rule(_qwen3(1), ["Qwen3ForCausalLM"]), C("x", ""))
    assert c.missing == []


def test_untied_target_needs_lm_head_and_tied_does_not(tmp_path: Path) -> None:
    names = _full_qwen3_names(2, lm_head=False)
    untied = check_completeness(_save_names(tmp_path / "u", names, _qwen3(2)), _qwen3(2), role="target")
    assert untied.missing == ["lm_head.weight"]
    tied_cfg = _qwen3(2, tie_word_embeddings=True)
    tied = check_completeness(_save_names(tmp_path / "t", names, tied_cfg), tied_cfg, role="target")
    assert tied.complete and tied.extra == []


def test_missing_names_are_listed_in_order_and_extras_are_reported(tmp_path: Path) -> None:
    names = [n for n in _full_qwen3_names(3) if not n.startswith("model.layers.1.mlp.")] + ["model.vision.x"]
    c = check_completeness(_save_names(tmp_path / "t", names, _qwen3(3)), _qwen3(3), role="target")
    assert c.missing == [f"model.layers.1.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    assert c.extra == ["model.vision.x"]
    r = validate(load_config(None), drafter_dir=write_drafter(tmp_path / "d"), target_dir=tmp_path / "t",
                 parser="none")
    [err] = [e for e in r.errors if e.where == "model.target"]
    assert "lacks 3 tensors its config.json implies: model.layers.1.mlp.gate_proj.weight, " in err.what
    assert "model.layers.1.mlp.down_proj.weight" in err.what
    assert any(w.where == "model.target" and "model.vision.x" in w.what for w in r.warnings)


def test_vllm_drafter_renames_are_applied(tmp_path: Path) -> None:
    cfg = {"architectures": ["DFlashDraftModel"], "num_hidden_layers": 1, "dflash_config": {}}
    rule = drafter_rule(cfg, cfg["architectures"])
    names = [n.replace("layers.0.", "midlayer.").replace("hidden_norm.", "encoder.output_norm_enc.")
             .replace("fc.", "encoder.fc.") for n in rule.required] + ["lm_head.weight", "embed_tokens.weight", "d2t"]
    c = check_completeness(_save_names(tmp_path / "d", names, cfg), cfg, role="drafter")
    assert c.complete and c.extra == [], c


def test_moe_decoder_rule_checks_norms_attention_and_mlp_and_expects_mtp_layers(tmp_path: Path) -> None:
    cfg = {"architectures": ["GlmMoeDsaForCausalLM"], "num_hidden_layers": 2, "num_nextn_predict_layers": 1,
           "tie_word_embeddings": False}
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(3):  # layer 2 is the MTP layer
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                  p + "self_attn.q_a_proj.weight", p + "mlp.experts.0.down_proj.weight_packed"]
    c = check_completeness(_save_names(tmp_path / "ok", names, cfg), cfg, role="target")
    assert c.complete and c.extra == [] and not c.conservative
    broken = [n for n in names if not n.startswith("model.layers.1.mlp.")]
    c = check_completeness(_save_names(tmp_path / "bad", broken, cfg), cfg, role="target")
    assert c.missing == ["model.layers.1.mlp.*"]


def test_an_unknown_architecture_gets_the_conservative_rule_and_says_so(tmp_path: Path) -> None:
    cfg = {"architectures": ["MysteryForCausalLM"], "text_config": {"num_hidden_layers": 3}}
    names = [f"model.language_model.layers.{i}.anything.weight" for i in (0, 2)] + ["whatever"]
    c = check_completeness(_save_names(tmp_path / "t", names, cfg), cfg, role="target")
    assert c.conservative and c.missing == ["layers.1.*"] and c.extra == []
    assert "MysteryForCausalLM" in c.rule


def test_a_shard_missing_from_the_index_is_its_own_finding_and_stops_the_judgement(tmp_path: Path) -> None:
    d = _save_names(tmp_path / "t", ["model.norm.weight"], _qwen3(1))
    (d / "model.safetensors").rename(d / "a.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "a.safetensors", "lm_head.weight": "b.safetensors"}}))
    c = check_completeness(d, _qwen3(1), role="target")
    assert c.missing_shards == ["b.safetensors"] and c.missing == [] and not c.complete


def test_a_target_without_weights_here_is_a_warning_not_an_error(tmp_path: Path) -> None:
    t = write_target(tmp_path / "t")
    (t / "model.safetensors").unlink()
    r = validate(load_config(None), drafter_dir=write_drafter(tmp_path / "d"), target_dir=t, parser="none")
    assert r.ok, r.errors
    assert any("completeness not checked" in w.what for w in r.warnings)
