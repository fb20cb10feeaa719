"""The plan on both runtimes and on one node: what `runtime: process` runs (host paths, serve.vllm), what a
one-node stack runs (no rendezvous flags, TP = the node's GPUs), and the config rules around them. Pure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _fixtures import config_file

from sparkserve.config import Config, load_config
from sparkserve.deploy.up import planned_steps
from sparkserve.errors import BadInput
from sparkserve.plan.build import build_plan, parity_view
from sparkserve.plan.dialects import shipped
from sparkserve.plan.mounts import DRAFTER_MOUNT, TARGET_MOUNT
from sparkserve.plan.serve_argv import drafter_in_argv
from sparkserve.plan.validate import check_config

RENDEZVOUS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
              "--distributed-executor-backend")
ONE_NODE = {"nodes": [{"name": "solo", "host": "127.0.0.1", "fabric_ip": "127.0.0.1", "local": True, "gpus": 1}],
            "serve": {"tensor_parallel_size": 1}}
PROCESS = {"runtime": "process", "serve": {"vllm": "/opt/vllm-venv"}}


def _cfg(tmp_path: Path, *overs: dict[str, Any]) -> Config:
    merged: dict[str, Any] = {}
    for o in overs:
        merged = _deep(merged, o)
    return load_config(config_file(tmp_path / "c.yaml", merged))


def _deep(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_one_node_plan_has_no_rendezvous_flags_and_tp_is_the_nodes_gpus(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, ONE_NODE, {"serve": {"host": "127.0.0.1", "port": 8011}})
    plan = build_plan(cfg)
    (head,) = plan.specs
    argv = head.command
    assert head.role == "head" and plan.followers == [] and plan.start_order() == [head]
    assert not [a for a in argv if a.split("=")[0] in RENDEZVOUS]
    assert _value(argv, "--tensor-parallel-size") == "1"
    assert _value(argv, "--host") == "127.0.0.1" and _value(argv, "--port") == "8011"
    assert check_config(cfg).errors == []


def test_one_node_with_four_gpus_must_use_all_of_them(tmp_path: Path) -> None:
    four = {"nodes": [{**ONE_NODE["nodes"][0], "gpus": 4}]}
    bad = check_config(_cfg(tmp_path, ONE_NODE, four)).errors
    assert [e.where for e in bad] == ["serve.tensor_parallel_size"] and "1 nodes x 4 GPU = 4" in bad[0].what
    good = _cfg(tmp_path, ONE_NODE, four, {"serve": {"tensor_parallel_size": 4}})
    assert check_config(good).errors == [] and _value(build_plan(good).head.command, "--tensor-parallel-size") == "4"


def test_the_two_node_default_still_rendezvous(tmp_path: Path) -> None:
    plan = build_plan(_cfg(tmp_path))
    head, follower = plan.specs
    assert _value(head.command, "--nnodes") == "2" and "--headless" in follower.command
    assert _value(head.command, "--tensor-parallel-size") == "2"
    assert plan.runtime == "docker" and plan.head.command[2] == TARGET_MOUNT


def test_process_plan_runs_serve_vllm_on_the_host_paths_without_mounts(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, PROCESS)
    plan = build_plan(cfg)
    # in the process runtime's dialect: no image there, so serve.vllm_version, else vLLM 0.33.0's flag names
    docker_plan = build_plan(_cfg(tmp_path), dialect=shipped("0.33.0"))
    for spec, dspec in zip(plan.specs, docker_plan.specs, strict=True):
        argv = plan.process_argv(spec)
        assert argv[:3] == ["/opt/vllm-venv", "serve", str(cfg.model.target)]
        assert json.loads(_value(argv, "--speculative-config"))["model"] == str(cfg.drafter.path)
        assert drafter_in_argv(argv) == str(cfg.drafter.path)
        assert spec.mounts == []
        # the rest of the argv is the docker plan's, flag for flag
        assert [a for a in spec.command[3:] if "speculative" not in a and "model" not in a] == \
               [a for a in dspec.command[3:] if "speculative" not in a and "model" not in a]
        assert spec.command[0] == "vllm"  # what vLLM's own parser checks (validate) is unchanged
    pub = plan.public()
    assert pub["runtime"] == "process" and "docker_run" not in pub["specs"][0]
    assert pub["specs"][0]["process_argv"][0] == "/opt/vllm-venv"


def test_drafter_in_argv_reads_either_form_and_only_the_model() -> None:
    spec = json.dumps({"method": "dflash", "model": "/m/d", "num_speculative_tokens": 7})
    assert drafter_in_argv(["vllm", "serve", "/t", "--speculative-config", spec]) == "/m/d"
    assert drafter_in_argv(["vllm", "serve", f"--speculative-config={spec}"]) == "/m/d"
    assert drafter_in_argv(["vllm", "serve", "/t"]) is None
    assert drafter_in_argv(["vllm", "--speculative-config", "not json"]) is None
    assert drafter_in_argv(["vllm", "serve", "--speculative-config", json.dumps({"model": DRAFTER_MOUNT})]) == \
           DRAFTER_MOUNT


def test_parity_of_process_ranks_ignores_rank_flags_like_docker(tmp_path: Path) -> None:
    plan = build_plan(_cfg(tmp_path, PROCESS))
    head, follower = (parity_view(s) for s in plan.specs)
    assert head["argv"] == follower["argv"] and head["mounts"] == follower["mounts"] == []


def test_planned_steps_say_where_a_process_rank_runs(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, PROCESS)
    steps = planned_steps(cfg, build_plan(cfg))
    image = next(s for s in steps if s["step"] == "image")
    assert "serve.vllm /opt/vllm-venv" in image["detail"]
    starts = [s for s in steps if s["step"] == "start"]
    assert [s["rank"] for s in starts] == [1, 0]
    assert all("host process in its own session" in s["detail"] and "~/.local/state/sparkserve/run" in s["detail"]
               for s in starts)


def test_process_runtime_refuses_the_ray_executor(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        _cfg(tmp_path, PROCESS, {"serve": {"executor": "ray"}})
    assert e.value.where == "serve.executor" and "ray needs runtime: docker" in e.value.what


@pytest.mark.parametrize("run_dir", ["relative/dir", "/a/../b", "~user/x"])
def test_a_run_dir_must_be_absolute_or_under_home(tmp_path: Path, run_dir: str) -> None:
    with pytest.raises(BadInput) as e:
        _cfg(tmp_path, PROCESS, {"process": {"run_dir": run_dir}})
    assert e.value.where == "process.run_dir"


def test_no_nodes_is_refused_but_one_is_a_stack(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        _cfg(tmp_path, {"nodes": []})
    assert e.value.where == "nodes"
    assert len(_cfg(tmp_path, ONE_NODE).nodes) == 1


def test_process_fields_leave_a_docker_fingerprint_alone_and_change_a_process_one(tmp_path: Path) -> None:
    docker = _cfg(tmp_path)
    assert "runtime" not in docker.normalized() and "vllm" not in docker.normalized()["serve"]
    assert _cfg(tmp_path, {"serve": {"vllm": "/elsewhere"}}).fingerprint() == docker.fingerprint()
    proc = _cfg(tmp_path, PROCESS)
    assert proc.fingerprint() != docker.fingerprint()
    assert _cfg(tmp_path, PROCESS, {"serve": {"vllm": "/other-venv"}}).fingerprint() != proc.fingerprint()
