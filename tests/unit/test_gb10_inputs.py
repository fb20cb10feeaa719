"""Issue 26's bad inputs and records, through the real CLI where a user meets them: a named identity file that is
not there (C4), an absurd served name (D17), a max_model_len the target cannot take (D7, as real vLLM refuses it);
the target manifest's comparisons, and the host fingerprints the journal keeps for `doctor --drift`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from _fixtures import clean_env, cli, config_file, write_drafter, write_target

from sparkserve.config import load_config
from sparkserve.journal import Journal
from sparkserve.models.target import inspect_target
from sparkserve.models.target_manifest import TargetManifest, target_manifest
from sparkserve.plan.findings import Report
from sparkserve.plan.model_checks import check_max_model_len


def one_error_line(p, field: str) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


# -- C4 ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["up", "doctor", "down"])
def test_a_named_identity_file_that_is_missing_is_bad_input_before_any_node(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no-such-key"
    cfg = config_file(tmp_path / "c.yaml", {"ssh": {"identity_file": str(missing)},
                                            "nodes": [{"name": "a", "host": "192.0.2.1", "fabric_ip": "10.0.0.1"},
                                                      {"name": "b", "host": "192.0.2.2", "fabric_ip": "10.0.0.2"}]})
    p = cli(command, "-c", str(cfg), env=clean_env(tmp_path), timeout=60)
    line = one_error_line(p, "ssh.identity_file")
    assert f"{missing} does not exist" in line and "ssh-agent" in line


def test_an_unset_identity_file_is_not_refused(tmp_path: Path) -> None:
    from sparkserve.nodes.factory import check_identity_file

    cfg = load_config(overrides={"ssh": {"identity_file": None}})
    check_identity_file(cfg)  # nothing named, nothing to refuse: ~/.ssh/config or the agent may log in


# -- D17 ---------------------------------------------------------------------------------------------------------


def test_an_absurd_served_name_is_refused(tmp_path: Path) -> None:
    cfg = config_file(tmp_path / "c.yaml", {"model": {"served_name": "x" * 100_000}})
    p = cli("validate", "-c", str(cfg), "--offline", env=clean_env(tmp_path), timeout=60)
    line = one_error_line(p, "model.served_name")
    assert "100000 characters long; at most 256" in line
    assert load_config(overrides={"model": {"served_name": "org/model-name@v2 with spaces"}})


# -- D7 ----------------------------------------------------------------------------------------------------------


def _with_config(target: Path, **keys: object) -> Path:
    cfg = json.loads((target / "config.json").read_text())
    cfg.update(keys)
    (target / "config.json").write_text(json.dumps(cfg))
    return target


def test_max_model_len_beyond_the_targets_length_is_an_error_as_in_vllm(tmp_path: Path) -> None:
    target = _with_config(write_target(tmp_path / "t"), max_position_embeddings=131072)
    facts = inspect_target(target)
    r = Report()
    check_max_model_len(load_config(overrides={"serve": {"max_model_len": 262144}}), facts, r)
    [e] = r.errors
    assert e.where == "serve.max_model_len" and "262144 is greater than the target's derived max_model_len 131072" \
        in e.what and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in e.what
    r = Report()  # vLLM's own override: then only its warning
    check_max_model_len(load_config(overrides={"serve": {"max_model_len": 262144, "env": {
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}}), facts, r)
    assert not r.errors and r.warnings[0].where == "serve.max_model_len"
    # a linear RoPE factor scales the length, as vLLM does; yarn's max_position_embeddings is already scaled
    r = Report()
    scaled = inspect_target(_with_config(target, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    check_max_model_len(load_config(overrides={"serve": {"max_model_len": 262144}}), scaled, r)
    assert scaled.derived_max_model_len == 262144 and not r.errors
    yarn = inspect_target(_with_config(target, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    assert yarn.derived_max_model_len == 131072


def test_validate_refuses_it_through_the_cli(tmp_path: Path) -> None:
    target = _with_config(write_target(tmp_path / "t"), max_position_embeddings=4096)
    drafter = write_drafter(tmp_path / "d")
    cfg = config_file(tmp_path / "c.yaml", {"model": {"target": str(target)}, "drafter": {"path": str(drafter)},
                                            "serve": {"max_model_len": 8192}})
    p = cli("validate", "-c", str(cfg), env=clean_env(tmp_path), timeout=120)
    line = one_error_line(p, "serve.max_model_len")
    assert "8192 is greater than the target's derived max_model_len 4096" in line


# -- the target manifest -------------------------------------------------------------------------------------------


def _shard(path: Path, tensors: dict[str, list[int]], pad: int = 64) -> None:
    header = {name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 4]} for name, shape in tensors.items()}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * pad)


def _checkpoint(root: Path, shards: int = 3) -> Path:
    root.mkdir(parents=True)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for i, n in enumerate(names):
        _shard(root / n, {f"model.layers.{i}.mlp.experts.w": [4, 4]})
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"model.layers.{i}.mlp.experts.w": n for i, n in enumerate(names)}}))
    return root


def test_the_target_manifest_names_each_kind_of_difference(tmp_path: Path) -> None:
    head = TargetManifest.from_answer(target_manifest(str(_checkpoint(tmp_path / "a"))))
    assert head.problems() is None and len(head.shards) == 3
    b = _checkpoint(tmp_path / "b")
    assert TargetManifest.from_answer(target_manifest(str(b))).differs_from(head) is None
    (b / "model-00003-of-00003.safetensors").unlink()  # a partial rsync
    m = TargetManifest.from_answer(target_manifest(str(b)))
    assert m.problems() == "1 shard(s) its index names are missing: model-00003-of-00003.safetensors"
    assert m.differs_from(head) == "1 shard(s) missing: model-00003-of-00003.safetensors"
    _shard(b / "model-00003-of-00003.safetensors", {"model.layers.2.mlp.experts.w": [4, 4]}, pad=32)
    m = TargetManifest.from_answer(target_manifest(str(b)))
    assert m.differs_from(head) == ("1 shard(s) differ in size, first model-00003-of-00003.safetensors: "
                                    f"{m.shards['model-00003-of-00003.safetensors']} bytes, not "
                                    f"{head.shards['model-00003-of-00003.safetensors']}")
    _shard(b / "model-00003-of-00003.safetensors", {"model.layers.2.mlp.experts.v": [4, 4]})  # same size
    m = TargetManifest.from_answer(target_manifest(str(b)))
    assert m.shards == head.shards
    assert m.differs_from(head) == "the safetensors headers differ (tensor names, shapes or dtypes): another revision"
    (b / "model.safetensors.index.json").write_text("{}")
    assert "index.json differs" in (TargetManifest.from_answer(target_manifest(str(b))).differs_from(head) or "")
    (b / "model-00002-of-00003.safetensors").write_bytes(b"\x01\x02")  # cut inside the header
    assert "unreadable safetensors header in model-00002" in (
        TargetManifest.from_answer(target_manifest(str(b))).problems() or "")
    assert TargetManifest.from_answer(target_manifest(str(tmp_path / "none"))).problems().endswith(
        "No such file or directory")


# -- the journal's host fingerprints --------------------------------------------------------------------------------


def test_the_last_boot_whose_gates_passed_is_the_drift_reference(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.sqlite") as j:
        assert j.last_good_host_facts() is None
        j.record_host_facts("fp-good", True, {"a": {"kernel": "6.11"}})
        j.record_host_facts("fp-bad", False, {"a": {"kernel": "7.0"}})
        ref = j.last_good_host_facts()
    assert ref is not None and ref["fingerprint"] == "fp-good" and ref["hosts"] == {"a": {"kernel": "6.11"}}
