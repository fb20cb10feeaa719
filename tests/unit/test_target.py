"""Target facts from config.json: layers, hidden size, KV geometry and bytes per token."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from _fixtures import TargetSpec, write_target

from sparkserve.errors import BadInput
from sparkserve.models.target import inspect_target


def _target(tmp: Path, cfg: dict[str, Any]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(cfg))
    return tmp


def test_fixture_gqa_target(tmp_path: Path) -> None:
    t = inspect_target(write_target(tmp_path / "t", TargetSpec()))
    assert (t.num_hidden_layers, t.hidden_size, t.attention) == (4, 256, "gqa")
    assert (t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.vocab_size) == (4, 2, 64, 154880)
    # K and V: 2 x 2 heads x 64 x 4 layers
    assert t.kv_bytes_per_token("auto") == 2 * 2 * 64 * 4 * 2  # bf16 model dtype
    assert t.kv_bytes_per_token("fp8_e4m3") == 2 * 2 * 64 * 4
    assert t.kv_bytes_per_token("fp8_e4m3", tp=2) == 2 * 1 * 64 * 4  # KV heads split over TP
    assert t.kv_bytes_per_token("fp8_e4m3", tp=4) == 2 * 1 * 64 * 4  # fewer heads than ranks: replicated
    assert t.kv_bytes_per_token("no-such-dtype") is None


def test_mla_target_caches_one_latent_replicated_on_every_rank(tmp_path: Path) -> None:
    t = inspect_target(_target(tmp_path, {
        "architectures": ["Glm4MoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "num_hidden_layers": 47,
        "hidden_size": 6144, "num_attention_heads": 64, "num_key_value_heads": 64, "kv_lora_rank": 512,
        "qk_rope_head_dim": 64, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16"}))
    assert (t.attention, t.mtp_layers) == ("mla", 1)
    assert t.kv_bytes_per_token("fp8_e4m3", tp=2) == (512 + 64) * 47  # not divided by TP
    assert t.kv_bytes_per_token("auto") == (512 + 64) * 47 * 2
    assert t.kv_bytes_per_token("fp8_ds_mla") == 656 * 47


def test_multimodal_config_reads_the_text_model(tmp_path: Path) -> None:
    t = inspect_target(_target(tmp_path, {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "text_config": {"num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}}))
    assert (t.num_hidden_layers, t.hidden_size, t.head_dim, t.attention) == (36, 4096, 128, "gqa")


def test_head_dim_defaults_to_hidden_over_heads(tmp_path: Path) -> None:
    t = inspect_target(_target(tmp_path, {"num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8}))
    assert (t.head_dim, t.num_key_value_heads, t.attention) == (64, 8, "mha")


@pytest.mark.parametrize(("cfg", "needle"), [
    ({"hidden_size": 8}, "num_hidden_layers is missing"),
    ({"num_hidden_layers": 2}, "hidden_size is missing"),
    ({"num_hidden_layers": "2", "hidden_size": 8}, "num_hidden_layers is missing or not a positive integer"),
])
def test_bad_target_config_names_the_file(tmp_path: Path, cfg: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadInput) as e:
        inspect_target(_target(tmp_path, cfg))
    assert e.value.where == str(tmp_path / "config.json") and needle in e.value.what


def test_missing_target_dir_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        inspect_target(tmp_path / "nope")
    assert e.value.where == "model.target"


# --- hostile inputs (issue 15 item 9) ----------------------------------------------------------------------

@pytest.mark.timeout(10)
def test_a_fifo_config_json_is_bad_input_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    os.mkfifo(tmp_path / "t" / "config.json")
    with pytest.raises(BadInput) as e:
        inspect_target(tmp_path / "t")
    assert (e.value.where, e.value.what) == (str(tmp_path / "t" / "config.json"), "is a FIFO, not a regular file")


def test_config_json_nested_100000_deep_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(BadInput, match="not valid JSON: nested more than"):
        inspect_target(tmp_path / "t")


@pytest.mark.parametrize("value", [5, "x", [1], {"a": 1}, None, 10**30, 1.5, True, ["a", 1], -3], ids=repr)
def test_any_json_type_in_any_target_field_is_judged_not_a_crash(tmp_path: Path, value: object) -> None:
    good = json.loads((write_target(tmp_path / "t", TargetSpec()) / "config.json").read_text())
    for key in ["architectures", "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "torch_dtype",
                "kv_lora_rank", "qk_rope_head_dim", "num_nextn_predict_layers", "text_config"]:
        path = _target(tmp_path / key, {**good, key: value})
        try:
            t = inspect_target(path)
        except BadInput:
            continue
        for dtype in ("auto", "fp8", "fp8_ds_mla", "nope"):
            json.dumps(t.to_json(dtype, tp=2))
