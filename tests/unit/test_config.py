"""Typed config: the embedded default is the model card's production state; YAML + env override it."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fixtures import config_file

from sparkserve.config import CUDAGraphMode, default_yaml_text, load_config, resolve_api_key
from sparkserve.errors import BadInput


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("SPARKSERVE_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)


def test_embedded_default_is_the_model_cards_production_state() -> None:
    c = load_config()
    s = c.serve
    assert [n.name for n in c.nodes] == ["spark-a", "spark-b"] and c.head.name == "spark-a"
    assert (s.executor, s.tensor_parallel_size, s.enable_expert_parallel) == ("mp", 2, True)
    assert (s.max_model_len, s.kv_cache_dtype, s.gpu_memory_utilization) == (262144, "fp8_e4m3", 0.795)
    assert s.kv_cache_memory_bytes == 8053063680  # 7.5 GiB, the card's "8 GiB" (its 366,749-token pool)
    assert (s.max_num_seqs, s.block_size, s.trust_remote_code) == (6, 2304, True)
    assert (s.tool_call_parser, s.enable_auto_tool_choice, s.reasoning_parser) == ("glm47", True, "glm45")
    assert s.default_chat_template_kwargs == {"enable_thinking": True} and s.vllm_version is None
    assert (c.fabric.master_port, c.fabric.nccl_net, c.container.memory) == (29521, "IB", 118 * 2**30)
    assert s.compilation.cudagraph_mode is CUDAGraphMode.FULL_AND_PIECEWISE
    assert s.compilation.cudagraph_capture_sizes == [1, 2, 4, 8, 16, 24, 32]
    assert s.env == {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0", "TORCH_CUDA_ARCH_LIST": "12.1a",
                     "FLASHINFER_CUDA_ARCH_LIST": "12.1a", "FLASHINFER_DISABLE_VERSION_CHECK": "1"}
    assert not s.enforce_eager
    assert (c.speculative.method, c.speculative.num_speculative_tokens) == ("dflash", 7)
    assert (c.gates.pool_tokens, c.gates.mask_token_id) == (366749, 154856)
    assert c.image.ref == "ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e"
    assert str(c.model.target).endswith("GLM-5.3-Flash-W4A16-MTP")
    assert str(c.drafter.path).endswith("GLM-5.3-Flash-DFlash2-G")  # the launcher@1c142c9 default (-F, -E drop-in)


def test_init_text_is_commented_and_names_the_hosts_to_fill_in() -> None:
    text = default_yaml_text()
    assert "Fill in the hosts" in text and text.count("#") > 20 and "api_key_env" in text
    assert "host: spark-a.lan" in text and "fabric_ip: 192.168.200.2" in text


def test_file_then_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = config_file(tmp_path / "c.yaml", {"serve": {"port": 8001, "kv_cache_memory_bytes": "4GiB"}})
    c = load_config(f)
    assert c.serve.port == 8001 and c.serve.kv_cache_memory_bytes == 4 * 2**30
    assert c.serve.max_model_len == 262144  # untouched fields keep the file's (= default's) values
    monkeypatch.setenv("SPARKSERVE_SERVE__PORT", "8002")
    monkeypatch.setenv("SPARKSERVE_DRAFTER__PATH", "/models/other drafter")
    c = load_config(f)
    assert c.serve.port == 8002 and str(c.drafter.path) == "/models/other drafter"
    assert c.serve.kv_cache_memory_bytes == 4 * 2**30


def test_sparkserve_yaml_in_the_working_dir_is_found(tmp_path: Path) -> None:
    config_file(tmp_path / "sparkserve.yaml", {"serve": {"port": 8123}})
    assert load_config().serve.port == 8123


def test_cudagraph_mode_is_case_insensitive_like_vllm(tmp_path: Path) -> None:
    c = load_config(config_file(tmp_path / "c.yaml", {"serve": {"compilation": {"cudagraph_mode": "piecewise"}}}))
    assert c.serve.compilation.cudagraph_mode is CUDAGraphMode.PIECEWISE


def test_n_nodes_and_fingerprint_changes_with_config(tmp_path: Path) -> None:
    nodes = [{"name": f"n{i}", "host": f"h{i}", "fabric_ip": f"10.0.0.{i}"} for i in range(4)]
    c = load_config(config_file(tmp_path / "c.yaml", {"nodes": nodes, "serve": {"tensor_parallel_size": 4}}))
    assert len(c.followers) == 3
    assert c.fingerprint() != load_config().fingerprint() and len(c.fingerprint()) == 64
    assert load_config().fingerprint() == load_config().fingerprint()


def test_nodes_may_share_an_ssh_address_on_different_ports(tmp_path: Path) -> None:
    nodes = [{"name": "a", "host": "127.0.0.1", "port": 2201, "fabric_ip": "10.0.0.1"},
             {"name": "b", "host": "127.0.0.1", "port": 2202, "fabric_ip": "10.0.0.2"}]
    assert len(load_config(config_file(tmp_path / "c.yaml", {"nodes": nodes})).nodes) == 2
    nodes[1]["port"] = 2201
    with pytest.raises(BadInput) as e:
        load_config(config_file(tmp_path / "c.yaml", {"nodes": nodes}))
    assert e.value.where == "nodes.1.host"


def test_more_than_one_problem_is_counted_in_the_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        load_config(config_file(tmp_path / "c.yaml", {"serve": {"port": 0, "max_model_len": 0}}))
    assert e.value.line().endswith("(and 1 more problem)")


def test_missing_required_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        load_config(config_file(tmp_path / "c.yaml", drop=["image"]))
    assert (e.value.where, e.value.what) == ("image", "is required")


def test_unreadable_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        load_config(tmp_path / "nope.yaml")
    assert e.value.where == str(tmp_path / "nope.yaml") and e.value.what == "does not exist"


@pytest.mark.parametrize("field", ["model.target", "drafter.path", "container.cache_root"])
def test_host_paths_must_be_absolute(tmp_path: Path, field: str) -> None:
    section, key = field.split(".")
    with pytest.raises(BadInput) as e:
        load_config(config_file(tmp_path / "c.yaml", {section: {key: "relative/deeper/dir"}}))
    assert e.value.where == field and "absolute" in e.value.what


def test_model_target_may_be_a_hugging_face_repo_id(tmp_path: Path) -> None:
    for ref in ("zai-org/GLM-5.3-Flash", "zai-org/GLM-5.3-Flash@main", "a/b@0123456789abcdef0123456789abcdef01234567"):
        assert str(load_config(config_file(tmp_path / "c.yaml", {"model": {"target": ref}})).model.target) == ref
    with pytest.raises(BadInput) as e:  # a repo id is only for the target model: the drafter is synced as a dir
        load_config(config_file(tmp_path / "c.yaml", {"drafter": {"path": "a/b"}}))
    assert e.value.where == "drafter.path"


def test_api_key_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_api_key(load_config()) is None
    c = load_config(config_file(tmp_path / "c.yaml", {"serve": {"api_key_env": "MY_KEY"}}))
    with pytest.raises(BadInput) as e:
        resolve_api_key(c)
    assert e.value.where == "serve.api_key_env"
    monkeypatch.setenv("MY_KEY", "k-123\n")
    assert resolve_api_key(c) == "k-123"
    key = tmp_path / "key"
    key.write_text("file-key\n")
    c = load_config(config_file(tmp_path / "d.yaml", {"serve": {"api_key_file": str(key)}}))
    assert resolve_api_key(c) == "file-key"
    key.write_text("")
    with pytest.raises(BadInput) as e:
        resolve_api_key(c)
    assert e.value.where == "serve.api_key_file" and "empty" in e.value.what
