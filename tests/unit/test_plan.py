"""Plan: config → the exact per-node container spec. Pure: no I/O."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _fixtures import config_file

from sparkserve.config import Config, load_config
from sparkserve.plan.build import build_plan, parity_view
from sparkserve.plan.container import Mount
from sparkserve.plan.mounts import DRAFTER_MOUNT, TARGET_MOUNT


def _cfg(tmp_path: Path, over: dict[str, Any] | None = None) -> Config:
    return load_config(config_file(tmp_path / "c.yaml", over or {}))


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_mp_head_serves_the_api_and_followers_run_headless(tmp_path: Path) -> None:
    plan = build_plan(_cfg(tmp_path))
    head, follower = plan.specs
    assert (head.role, head.rank, follower.role, follower.rank) == ("head", 0, "follower", 1)
    for s in plan.specs:
        a = s.command
        assert a[:3] == ["vllm", "serve", TARGET_MOUNT]
        assert _value(a, "--nnodes") == "2" and _value(a, "--node-rank") == str(s.rank)
        assert _value(a, "--master-addr") == "192.168.200.1" and _value(a, "--master-port") == "29521"
        assert _value(a, "--distributed-executor-backend") == "mp"
        # the card's bytes, exactly, in the default image's (the card's fork) dialect; never "8G"
        assert _value(a, "--kv-cache-memory") == "8053063680" and "--kv-cache-memory-bytes" not in a
        assert _value(a, "--block-size") == "2304" and _value(a, "--max-num-seqs") == "6"
        assert json.loads(_value(a, "--speculative-config")) == {
            "method": "dflash", "model": DRAFTER_MOUNT, "num_speculative_tokens": 7}
        assert json.loads(_value(a, "--compilation-config")) == {
            "cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32]}
        assert s.exec_after_join is None and s.serve_argv() == a
    assert "--headless" in follower.command and "--port" not in follower.command
    assert "--headless" not in head.command and _value(head.command, "--port") == "8000"
    assert [s.node for s in plan.start_order()] == ["spark-b", "spark-a"]


def test_env_per_node_and_parity_view_identical_across_ranks(tmp_path: Path) -> None:
    plan = build_plan(_cfg(tmp_path), fabric_env={
        "spark-a": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_GID_INDEX": "3"},
        "spark-b": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "NCCL_IB_GID_INDEX": ""},
    })
    a, b = plan.specs
    assert a.env["VLLM_HOST_IP"] == "192.168.200.1" and b.env["VLLM_HOST_IP"] == "192.168.200.2"
    assert a.env["NCCL_IB_GID_INDEX"] == "3" and "NCCL_IB_GID_INDEX" not in b.env  # never defined-empty
    assert a.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert parity_view(a) == parity_view(b)


def test_parity_view_catches_a_drifted_worker(tmp_path: Path) -> None:
    plan = build_plan(_cfg(tmp_path))
    b = plan.specs[1].model_copy(deep=True)
    b.command[b.command.index("--max-num-seqs") + 1] = "8"
    assert parity_view(plan.specs[0]) != parity_view(b)


def test_mounts_target_and_drafter_read_only_at_fixed_paths_plus_caches(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"drafter": {"path": "/models/whatever-name"}})
    m = build_plan(cfg).head.mounts
    assert m[0] == Mount(source=str(cfg.model.target), target=TARGET_MOUNT, read_only=True)
    assert m[1] == Mount(source="/models/whatever-name", target=DRAFTER_MOUNT, read_only=True)
    assert {x.target for x in m[2:]} == {"/cache", "/root/.cache/vllm", "/root/.cache/flashinfer", "/root/.tilelang",
                                          "/root/.triton", "/root/.deep_gemm"}
    assert all(not x.read_only for x in m[2:])
    # under the node user's home, one directory per image (the ref's key until the image ID is known)
    cache = m[2].source
    assert cache.startswith("/home/ubuntu/.cache/sparkserve/ref-") and all(x.source.startswith(cache) for x in m[2:])
    by_id = build_plan(cfg, image_id="sha256:0123456789abcdef" + "0" * 48).head.mounts
    assert by_id[2].source == "/home/ubuntu/.cache/sparkserve/0123456789ab"


def test_ray_head_starts_ray_then_execs_serve_and_workers_join(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"serve": {"executor": "ray"}})
    plan = build_plan(cfg)
    head, worker = plan.specs
    assert head.command[:3] == ["ray", "start", "--head"] and "--node-ip-address=192.168.200.1" in head.command
    assert worker.command[:2] == ["ray", "start"] and "--address=192.168.200.1:6379" in worker.command
    assert head.exec_after_join is not None and worker.exec_after_join is None
    assert _value(head.exec_after_join, "--distributed-executor-backend") == "ray"
    assert "--nnodes" not in head.exec_after_join and "--headless" not in head.exec_after_join
    assert head.env["RAY_NODE_IP_ADDRESS"] == "192.168.200.1" and worker.env["RAY_memory_monitor_refresh_ms"] == "0"
    assert [s.node for s in plan.start_order()] == ["spark-a", "spark-b"]
    assert plan.serve_argvs() == [head.exec_after_join]


def test_three_nodes(tmp_path: Path) -> None:
    nodes = [{"name": f"n{i}", "host": f"h{i}", "fabric_ip": f"10.0.0.{i + 1}"} for i in range(3)]
    plan = build_plan(_cfg(tmp_path, {"nodes": nodes, "serve": {"tensor_parallel_size": 3}}))
    assert [(_value(s.command, "--node-rank"), _value(s.command, "--nnodes")) for s in plan.specs] == \
        [("0", "3"), ("1", "3"), ("2", "3")]
    assert [s.node for s in plan.start_order()] == ["n1", "n2", "n0"]
    assert len({json.dumps(parity_view(s)) for s in plan.specs}) == 1


def test_eager_drops_the_compilation_config(tmp_path: Path) -> None:
    a = build_plan(_cfg(tmp_path, {"serve": {"enforce_eager": True}})).head.command
    assert "--enforce-eager" in a and "--compilation-config" not in a


def test_api_key_is_a_head_secret_never_dumped_never_in_argv(tmp_path: Path) -> None:
    plan = build_plan(_cfg(tmp_path), api_key="sk-very-secret")
    head, follower = plan.specs
    assert head.run_env()["VLLM_API_KEY"] == "sk-very-secret" and "VLLM_API_KEY" not in follower.run_env()
    assert "VLLM_API_KEY" not in head.env  # env is what gets printed and compared
    for text in (plan.model_dump_json(), repr(plan), json.dumps(plan.public()), " ".join(head.docker_run_argv())):
        assert "sk-very-secret" not in text
    assert plan.public()["specs"][0]["env"]["VLLM_API_KEY"] == "<redacted>"
    argv = head.docker_run_argv()
    assert argv[argv.index("VLLM_API_KEY") - 1] == "-e"  # docker reads the value from its own environment


@pytest.mark.parametrize(("over", "flag", "value"), [
    ({"serve": {"kv_cache_memory_bytes": "512MiB"}}, "--kv-cache-memory", "536870912"),
    ({"serve": {"kv_cache_memory_bytes": "512MiB", "vllm_version": "0.33.0"}}, "--kv-cache-memory-bytes",
     "536870912"),
    ({"serve": {"attention_backend": "FLASH_ATTN"}}, "--attention-backend", "FLASH_ATTN"),
    ({"serve": {"host": "0.0.0.0"}}, "--host", "0.0.0.0"),
    ({"fabric": {"master_port": 29501}}, "--master-port", "29501"),
])
def test_variants_render_their_flag(tmp_path: Path, over: dict[str, Any], flag: str, value: str) -> None:
    assert _value(build_plan(_cfg(tmp_path, over)).head.command, flag) == value


def test_the_plan_is_pure_and_repeatable(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert build_plan(cfg).model_dump() == build_plan(cfg).model_dump()


def test_the_fabric_subnet_is_the_card_ranges_rule_over_the_fabric_ips(tmp_path: Path) -> None:
    """NCCL_IB_ADDR_RANGE on auto: plan/fabric.py's smallest network (at least /24) holding every fabric IP."""
    card = build_plan(_cfg(tmp_path, {"nodes": [{"name": "a", "host": "a", "fabric_ip": "192.168.102.1"},
                                                {"name": "b", "host": "b", "fabric_ip": "192.168.102.2"}]}))
    assert {s.env["NCCL_IB_ADDR_RANGE"] for s in card.specs} == {"192.168.102.0/24"}
    assert {(s.env["NCCL_IB_ROCE_VERSION_NUM"], s.env["NCCL_IB_ADDR_FAMILY"], s.env["NCCL_NET"]) for s in card.specs} \
        == {("2", "AF_INET", "IB")}
    two_subnets = build_plan(_cfg(tmp_path, {"nodes": [{"name": "a", "host": "a", "fabric_ip": "192.168.200.1"},
                                                       {"name": "b", "host": "b", "fabric_ip": "192.168.201.2"}]}))
    assert two_subnets.head.env["NCCL_IB_ADDR_RANGE"] == "192.168.200.0/23"
    pinned = build_plan(_cfg(tmp_path, {"fabric": {"addr_range": "10.9.0.0/16"}}))
    assert pinned.head.env["NCCL_IB_ADDR_RANGE"] == "10.9.0.0/16"
    one = build_plan(_cfg(tmp_path, {"nodes": [{"name": "a", "host": "a", "fabric_ip": "192.168.102.1"}],
                                     "serve": {"tensor_parallel_size": 1}}))
    assert not {"NCCL_NET", "NCCL_IB_ADDR_RANGE", "NCCL_IB_ROCE_VERSION_NUM"} & set(one.head.env)  # no fabric
