"""Drafter inspection from config.json, safetensors headers (never the data) and mask_embedding.pt."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from _fixtures import DrafterSpec, write_drafter, write_speculators_drafter
from safetensors.numpy import save_file

from sparkserve.errors import BadInput
from sparkserve.models.drafter import CONV_RE, SELECTOR_RE, inspect_drafter
from sparkserve.models.files import BadFile
from sparkserve.models.safetensors_header import HeaderError, read_header


def test_fixture_dflash2_facts(tmp_path: Path) -> None:
    d = inspect_drafter(write_drafter(tmp_path / "d"))
    assert (d.architecture, d.kind, d.format, d.known) == ("DFlash2DraftModel", "dflash2", "dflash", True)
    assert (d.hidden_size, d.target_hidden_size, d.num_hidden_layers, d.vocab_size) == (256, 256, 2, 154880)
    assert (d.block_size, d.expected_k, d.mask_token_id) == (8, 7, 154856)
    assert d.mask_token_id_source == "dflash_config.mask_token_id"
    assert (d.target_layer_ids, d.aux_layer_ids, d.taps) == ([0, 1, 2], [1, 2, 3], 3)
    assert (d.conv_kernel_size, d.conv_group_size, d.selector_rank, d.selector_top_k) == (4, 64, 8, 4)
    w = d.weights
    assert w is not None and w.files == ["model.safetensors"]
    assert (w.selector_tensors, w.conv_tensors) == (3, 4 * 2)  # 3 selector + 4 per layer, as the card counts
    assert w.fc_shape == [256, 768] and w.fc_input_width == 768 and d.fc_taps == 3
    assert w.dtype == "F16" and w.dtypes == {"F16": w.param_count}
    # fc, hidden_norm, norm + 3 selector + per layer 15 (attention 4 + q/k norms 2, norms 2, MLP 3, conv 4)
    assert w.tensor_count == 3 + 3 + 2 * 15 and w.param_count == 3_899_136
    assert (d.mask.present, d.mask.form, d.mask.mask_token_id, d.mask.embedding_shape) == (True, "dict", 154856, [256])
    assert d.problems == []


def test_dflash_v1_has_no_selector_or_conv(tmp_path: Path) -> None:
    d = inspect_drafter(write_drafter(tmp_path / "d", DrafterSpec(architecture="DFlashDraftModel")))
    assert d.kind == "dflash" and d.weights and (d.weights.selector_tensors, d.weights.conv_tensors) == (0, 0)
    assert d.conv_group_size is None


def test_dflash2e_shaped_counts_32_conv_tensors(tmp_path: Path) -> None:
    """The model card verified 3 selector + 32 conv tensors for dflash2E: 8 layers x 4."""
    d = inspect_drafter(write_drafter(tmp_path / "d", DrafterSpec(num_hidden_layers=8, hidden_size=128,
                                                                   conv_group_size=32)))
    assert d.weights and (d.weights.selector_tensors, d.weights.conv_tensors) == (3, 32)


def test_speculators_format_is_converted_like_vllm_does(tmp_path: Path) -> None:
    d = inspect_drafter(write_speculators_drafter(tmp_path / "d", speculative_tokens=7))
    assert (d.format, d.architecture, d.kind) == ("speculators", "DFlash2DraftModel", "dflash2")
    assert d.aux_layer_ids == [1, 2, 3] and d.target_layer_ids == [0, 1, 2]  # aux - 1, as update_dflash does
    assert (d.mask_token_id, d.block_size, d.speculative_tokens, d.conv_group_size) == (154856, 8, 7, 64)
    assert d.hidden_size == 256 and d.target_hidden_size == 256


def test_layer_id_precedence_eagle_aux_ids_win(tmp_path: Path) -> None:
    path = write_drafter(tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 3, 4]
    (path / "config.json").write_text(json.dumps(cfg))
    d = inspect_drafter(path)
    assert d.aux_layer_ids == [2, 3, 4] and d.target_layer_ids == [1, 2, 3]


def test_top_level_mask_token_id_is_the_fallback(tmp_path: Path) -> None:
    path = write_drafter(tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    cfg["mask_token_id"] = cfg["dflash_config"].pop("mask_token_id")
    (path / "config.json").write_text(json.dumps(cfg))
    d = inspect_drafter(path)
    assert (d.mask_token_id, d.mask_token_id_source) == (154856, "mask_token_id")


def test_sharded_weights_and_a_missing_shard(tmp_path: Path) -> None:
    path = write_drafter(tmp_path / "d")
    (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
    save_file({"lm_head.weight": np.zeros((4, 4), dtype=np.float32)}, str(path / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {"fc.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    d = inspect_drafter(path)
    assert d.weights and d.weights.tensor_count == 36 + 1 and d.weights.dtypes["F32"] == 16 and d.problems == []
    assert d.weights.dtype == "F16"
    (path / "model-00002-of-00002.safetensors").unlink()
    d = inspect_drafter(path)
    assert [p.what for p in d.problems] == ["missing (listed in model.safetensors.index.json)"]


def test_header_is_read_without_touching_the_data(tmp_path: Path) -> None:
    """A 64 GiB (sparse) file: only its header is read, so this takes milliseconds."""
    f = tmp_path / "big.safetensors"
    n_params = 32 * 2**30
    header = json.dumps({"w": {"dtype": "BF16", "shape": [n_params], "data_offsets": [0, 2 * n_params]}}).encode()
    with f.open("wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + 2 * n_params)
    t = time.perf_counter()
    tensors, _ = read_header(f)
    assert time.perf_counter() - t < 0.5
    assert tensors[0].numel == n_params and tensors[0].dtype == "BF16"


_H = json.dumps({"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}).encode()


@pytest.mark.parametrize(("content", "needle"), [
    (b"abc", "too short"),
    (struct.pack("<Q", 10**12) + b"{}", "does not fit"),
    (struct.pack("<Q", 4) + b"nope", "not valid JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", len(_H)) + _H + b"\0" * 4, "truncated: tensors need"),
])
def test_bad_headers(tmp_path: Path, content: bytes, needle: str) -> None:
    f = tmp_path / "x.safetensors"
    f.write_bytes(content)
    with pytest.raises(HeaderError, match=needle):
        read_header(f)


def test_unreadable_dir_or_config_raises_bad_input_naming_it(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        inspect_drafter(tmp_path / "nope")
    assert e.value.where == "drafter.path"
    (tmp_path / "f").write_text("")
    with pytest.raises(BadInput, match="not a directory"):
        inspect_drafter(tmp_path / "f")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("[1]")
    with pytest.raises(BadInput) as e:
        inspect_drafter(tmp_path / "d")
    assert e.value.where.endswith("config.json") and "JSON object" in e.value.what


def test_unreadable_mask_file_is_a_fact_not_a_crash(tmp_path: Path) -> None:
    path = write_drafter(tmp_path / "d")
    (path / "mask_embedding.pt").write_bytes(b"garbage")
    d = inspect_drafter(path)
    assert d.mask.present and d.mask.error and "zip" in d.mask.error


def test_tensor_name_matchers_tolerate_a_prefix() -> None:
    assert CONV_RE.search("model.layers.3.mlp_conv.kernel_projection.weight")
    assert CONV_RE.search("layers.0.attention_conv.base_kernel")
    assert not CONV_RE.search("layers.0.attention_conv.kernel_projection.weight_scale")
    assert SELECTOR_RE.search("model.candidate_selector.hidden_projection.weight")
    assert not SELECTOR_RE.search("candidate_selector.bias")


def test_to_json_is_serialisable(tmp_path: Path) -> None:
    d = inspect_drafter(write_drafter(tmp_path / "d"))
    data = json.loads(json.dumps(d.to_json()))
    assert data["fc_input_width"] == 768 and data["expected_k"] == 7 and data["known"] is True


# --- hostile inputs: exit 2 with one line, never a traceback or a hang (issue 15 item 9) -------------------

def _special(kind: str, at: Path, tmp_path: Path) -> None:
    """Put a non-regular file of ``kind`` at ``at`` (replacing what is there)."""
    if at.exists() or at.is_symlink():
        at.unlink()
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "symlink to a fifo":
        os.mkfifo(tmp_path / "elsewhere.fifo")
        at.symlink_to(tmp_path / "elsewhere.fifo")
    elif kind == "char device":
        at.symlink_to("/dev/zero")  # endless: a reader without a type check never returns
    elif kind == "directory":
        at.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(at))  # bound, never accepting: opening it fails, it must not be waited on
        _sockets.append(s)


_sockets: list[socket.socket] = []
SPECIALS = ["fifo", "symlink to a fifo", "char device", "directory", "socket"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", SPECIALS)
def test_a_special_config_json_is_bad_input_not_a_hang(tmp_path: Path, kind: str) -> None:
    path = write_drafter(tmp_path / "d")
    _special(kind, path / "config.json", tmp_path)
    t = time.monotonic()
    with pytest.raises(BadInput) as e:
        inspect_drafter(path)
    assert time.monotonic() - t < 2
    assert e.value.where == str(path / "config.json") and "not a regular file" in e.value.what


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", SPECIALS)
def test_a_special_mask_file_is_a_problem_not_a_hang(tmp_path: Path, kind: str) -> None:
    path = write_drafter(tmp_path / "d")
    _special(kind, path / "mask_embedding.pt", tmp_path)
    d = inspect_drafter(path)
    assert d.mask.present and d.mask.error and "not a regular file" in d.mask.error


@pytest.mark.timeout(10)
def test_a_fifo_index_or_weights_file_is_a_problem_not_a_hang(tmp_path: Path) -> None:
    path = write_drafter(tmp_path / "d")
    os.mkfifo(path / "model.safetensors.index.json")
    d = inspect_drafter(path)
    assert [(p.where, p.what) for p in d.problems] == \
        [(str(path / "model.safetensors.index.json"), "is a FIFO, not a regular file")]
    (path / "model.safetensors.index.json").unlink()
    os.mkfifo(path / "model-2.safetensors")  # not a weights file: left out, never opened
    d = inspect_drafter(path)
    assert d.problems == [] and d.weights and d.weights.files == ["model.safetensors"]
    with pytest.raises(BadFile, match="is a FIFO"):
        read_header(path / "model-2.safetensors")


def test_config_json_nested_100000_deep_is_bad_input(tmp_path: Path) -> None:
    path = write_drafter(tmp_path / "d")
    (path / "config.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(BadInput) as e:
        inspect_drafter(path)
    assert e.value.where == str(path / "config.json") and e.value.what.startswith("not valid JSON: nested more than")


def test_nesting_the_parser_allows_but_printing_would_not_is_refused(tmp_path: Path) -> None:
    """900 levels parse (the recursion limit is 1000) but asdict/json.dumps of the facts would overflow."""
    path = write_drafter(tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg)[:-1] + ', "x": ' + "[" * 900 + "]" * 900 + "}")
    with pytest.raises(BadInput, match="nested more than 64 levels deep"):
        inspect_drafter(path)


def test_an_oversized_config_json_is_refused_unread(tmp_path: Path) -> None:
    path = write_drafter(tmp_path / "d")
    with (path / "config.json").open("a") as f:
        f.write(" " * 5 * 2**20)  # valid JSON, 5 MiB: no model config is that big
    with pytest.raises(BadInput, match=r"is 5,24\d,\d{3} bytes; refusing to read more than 4,194,304"):
        inspect_drafter(path)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b'{"a": ' + b"1" * 5000 + b"}", b"{\"a\": NaN"])
def test_undecodable_config_json_is_bad_input(tmp_path: Path, content: bytes) -> None:
    path = write_drafter(tmp_path / "d")
    (path / "config.json").write_bytes(content)
    with pytest.raises(BadInput, match="^.*not valid JSON"):
        inspect_drafter(path)


WRONG_TYPES = [5, "x", [1], {"a": 1}, None, 10**30, 1.5, True, [[[]]], ["a", 1]]
DRAFTER_KEYS = ["architectures", "dflash_config", "model_type", "hidden_size", "target_hidden_size",
                "num_hidden_layers", "vocab_size", "block_size", "mask_token_id", "target_layer_ids",
                "eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"]
SPECULATORS_KEYS = ["transformer_layer_config", "speculators_config", "speculators_model_type",
                    "aux_hidden_state_layer_ids", "mask_token_id", "block_size", "sample_from_anchor"]


def _judged(path: Path) -> None:
    """inspect + every rule + the --json rendering: only BadInput may come out."""
    from sparkserve.config import load_config
    from sparkserve.plan.findings import Report
    from sparkserve.plan.model_checks import check_drafter

    try:
        d = inspect_drafter(path)
    except BadInput:
        return
    check_drafter(load_config(None), d, Report(drafter=d))
    json.dumps(d.to_json())


@pytest.mark.parametrize("value", WRONG_TYPES, ids=repr)
def test_any_json_type_in_any_drafter_field_is_judged_not_a_crash(tmp_path: Path, value: object) -> None:
    path = write_drafter(tmp_path / "d")
    good = json.loads((path / "config.json").read_text())
    for key in DRAFTER_KEYS:
        cfg = {**good, key: value}
        cfg["dflash_config"] = value if key == "dflash_config" else {**good["dflash_config"], key: value}
        (path / "config.json").write_text(json.dumps(cfg))
        _judged(path)
    path = write_speculators_drafter(tmp_path / "s", speculative_tokens=7)
    good = json.loads((path / "config.json").read_text())
    for key in SPECULATORS_KEYS:
        cfg = {**good, key: value}
        if isinstance(cfg.get("speculators_config"), dict):
            cfg["speculators_config"] = {**cfg["speculators_config"], "proposal_methods": value}
        (path / "config.json").write_text(json.dumps(cfg))
        _judged(path)


@pytest.mark.parametrize("index", [[1], {"weight_map": [1]}, {"weight_map": {"w": [1]}}, {"weight_map": "x"}],
                         ids=repr)
def test_a_malformed_index_is_a_problem_not_a_crash(tmp_path: Path, index: object) -> None:
    path = write_drafter(tmp_path / "d")
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    d = inspect_drafter(path)
    assert [p.what for p in d.problems] == ["not a valid safetensors index (weight_map)"]


def test_an_infinite_dimension_in_a_header_is_a_header_error(tmp_path: Path) -> None:
    f = tmp_path / "x.safetensors"
    h = b'{"w": {"dtype": "F16", "shape": [Infinity], "data_offsets": [0, 8]}}'
    f.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    with pytest.raises(HeaderError, match="malformed header entry"):
        read_header(f)
