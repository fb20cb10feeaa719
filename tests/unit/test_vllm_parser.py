"""vLLM 0.33.0's own `vllm serve` parser judges every argv sparkserve renders.

These tests need vLLM 0.33.0 importable (the `vllm` extra; scripts/test installs it). Without it they
FAIL — the parser fixture raises — they never skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures import (
    REPO,
    config_file,
    default_data,
    install_shims,
    read_shim_log,
    write_drafter,
    write_fake_sysfs,
    write_target,
)

from sparkserve.config import Config, load_config
from sparkserve.plan.build import build_plan
from sparkserve.plan.launcher import render_launcher
from sparkserve.plan.validate import validate
from sparkserve.plan.vllm_args import ArgvVerdict, OptionList, RealParser, check_argvs

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_parser() -> Iterator[RealParser]:
    with RealParser() as p:  # raises ParserUnavailable (test error, not a skip) when vllm is missing
        assert p.vllm_version == "0.33.0", f"tests pin vLLM 0.33.0, found {p.vllm_version}"
        yield p


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


THREE_NODES = [
    {"name": "spark-a", "host": "spark-a.lan", "fabric_ip": "192.168.200.1"},
    {"name": "spark-b", "host": "spark-b.lan", "fabric_ip": "192.168.200.2"},
    {"name": "spark-c", "host": "spark-c.lan", "fabric_ip": "192.168.200.3"},
]
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "eager": {"serve": {"enforce_eager": True}},
    "three-nodes": {"nodes": THREE_NODES, "serve": {"tensor_parallel_size": 3}},
    "three-nodes-eager": {"nodes": THREE_NODES, "serve": {"tensor_parallel_size": 3, "enforce_eager": True}},
    "piecewise": {"serve": {"compilation": {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4]}}},
    "full-decode-only": {"serve": {"compilation": {"cudagraph_mode": "full_decode_only"}}},
    "no-kv-bytes-no-seqs": {"serve": {"kv_cache_memory_bytes": None, "max_num_seqs": None}},
    "kv-512MiB-auto-dtype": {"serve": {"kv_cache_memory_bytes": "512MiB", "kv_cache_dtype": "auto"}},
    "kv-decimal-bytes": {"serve": {"kv_cache_memory_bytes": 8_000_000_001}},
    "backends": {"serve": {"attention_backend": "FLASH_ATTN"}, "speculative": {"attention_backend": "flash_attn"}},
    "bind-host-and-port": {"serve": {"host": "0.0.0.0", "port": 8011}, "fabric": {"master_port": 29521}},
    "no-expert-parallel-short-ctx": {"serve": {"enable_expert_parallel": False, "max_model_len": 32768}},
    "extra-args": {"serve": {"extra_args": ["--enable-prefix-caching", "--max-num-batched-tokens", "8192"]}},
    "k15": {"speculative": {"num_speculative_tokens": 15}},
}


def rendered_argvs() -> list[tuple[str, list[str]]]:
    """Every `vllm serve` argv of every variant, mp and ray, head and followers."""
    out = []
    for name, over in VARIANTS.items():
        for executor in ("mp", "ray"):
            data = _merge(default_data(), _merge(over, {"serve": {"executor": executor}}))
            plan = build_plan(Config(**data))
            for spec in plan.specs:
                if executor == "ray" and spec.role == "follower":
                    assert spec.command[:2] == ["ray", "start"] and spec.exec_after_join is None
                    continue
                argv = spec.serve_argv()
                assert argv[:2] == ["vllm", "serve"]
                if executor == "ray":
                    assert spec.command[:3] == ["ray", "start", "--head"] and spec.exec_after_join == argv
                out.append((f"{name}/{executor}/{spec.role}-r{spec.rank}", argv))
    return out


ARGVS = rendered_argvs()


def test_the_matrix_covers_heads_followers_ray_eager_and_three_nodes() -> None:
    ids = [i for i, _ in ARGVS]
    assert "default/mp/head-r0" in ids and "default/mp/follower-r1" in ids and "default/ray/head-r0" in ids
    assert "three-nodes/mp/follower-r2" in ids and "eager/ray/head-r0" in ids
    # mp: every rank (3 in the two three-node variants); ray: only the head runs `vllm serve`
    assert len(ARGVS) == len(VARIANTS) * (2 + 1) + 2


@pytest.mark.parametrize("argv", [a for _, a in ARGVS], ids=[i for i, _ in ARGVS])
def test_every_rendered_argv_passes_vllm_0_33_parser(vllm_parser: RealParser, argv: list[str]) -> None:
    v = vllm_parser.check(argv)
    assert v.ok, f"vLLM rejects {argv}: {v.error}"


MISSPELT = [
    (["--tensor-paralel-size", "2"], "--tensor-paralel-size"),
    (["--enable-expert-paralel"], "--enable-expert-paralel"),
    (["--speculative_configg", "{}"], "--speculative-configg"),
    (["--kv-cache-memory-bytes", "8GiB"], "--kv-cache-memory-bytes"),
    (["--kv-cache-dtype", "fp8_e4m4"], "--kv-cache-dtype"),
    (["--headless=yes"], "--headless"),
    (["--max-num-seqs"], "--max-num-seqs"),
    (["--compilation-config", "{\"cudagraph_mode\": "], "--compilation-config"),
]


@pytest.mark.parametrize(("extra", "flag"), MISSPELT, ids=[m[1] + str(i) for i, m in enumerate(MISSPELT)])
def test_a_misspelled_or_malformed_flag_fails_naming_the_flag(vllm_parser: RealParser, extra: list[str],
                                                               flag: str) -> None:
    argv = ARGVS[0][1] + extra
    real = vllm_parser.check(argv)
    assert not real.ok and real.flag == flag, real
    listed = OptionList.load().check(argv)  # the no-vLLM fallback says the same
    assert not listed.ok and listed.flag == flag, listed


AGREEMENT_EXTRAS: list[list[str]] = [
    [], ["--kv-cache-memory", "8G"], ["--tensor_parallel_size", "2"], ["-cc.cudagraph_mode", "PIECEWISE"],
    ["-O3"], ["--served-model-name", "a", "b"], ["--max-model-len", "32k"], ["--max-model-len", "auto"],
    ["--no-enforce-eager"], ["-ep"], ["--kv-cache-memory-bytes", "8.5G"], ["--kv-cache-memory-bytes", "8.5g"],
    ["--moe-backend", "nope"], ["--max"], ["extra-positional"], ["--gpu-memory-utilization", "x"],
    ["--distributed-executor-backend", "uni"], ["--distributed-executor-backend", "slurm"],
    ["--speculative-config", "{bad"], ["--enforce-eager=1"], ["--api-key", "k1", "k2"], ["--port", "-1"],
]


def test_the_option_list_and_the_real_parser_agree(vllm_parser: RealParser) -> None:
    listed = OptionList.load()
    base = ARGVS[0][1]
    cases = [a for _, a in ARGVS] + [base + e for e in AGREEMENT_EXTRAS]
    disagree = []
    for argv in cases:
        r, o = vllm_parser.check(argv), listed.check(argv)
        if r.ok != o.ok or (not r.ok and r.flag != o.flag):
            disagree.append((argv[len(base):] if argv[:len(base)] == base else argv, r, o))
    assert not disagree, disagree


def test_check_argvs_uses_one_judge_for_many(vllm_parser: RealParser) -> None:
    name, verdicts = check_argvs([a for _, a in ARGVS[:3]] + [["vllm", "serve", "m", "--nope"]], vllm_parser)
    assert name == "vLLM 0.33.0 `vllm serve` parser"
    assert [v.ok for v in verdicts] == [True, True, True, False]
    assert verdicts[-1] == ArgvVerdict(False, "unrecognized arguments: --nope")


def test_committed_option_list_equals_what_the_installed_vllm_dumps(tmp_path: Path) -> None:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "dump_vllm_serve_args.py")], capture_output=True,
                       text=True, env=env, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    dumped = json.loads(p.stdout)
    committed = json.loads((REPO / "sparkserve" / "data" / "vllm-0.33.0-serve-args.json").read_text())
    assert dumped["vllm_version"] == committed["vllm_version"] == "0.33.0"
    # the interpreter's version is recorded, not judged; everything the parser says must match
    dumped.pop("python_version")
    committed.pop("python_version")
    assert dumped == committed
    assert "321 actions, 433 option strings" in p.stderr


def _launcher_runs(script: Path, tmp_path: Path, mode: dict[str, str]) -> list[list[str]]:
    """Run a launcher with fake ssh/docker (and a fake /sys holding both nodes' fabric addresses): the
    `vllm serve` argv each container would have run."""
    drafter = write_drafter(tmp_path / "drafter dir")
    install_shims(tmp_path / "bin")
    log = tmp_path / "shim.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKSERVE_", "GRAPHS", "EAGER"))}
    env.update(PATH=f"{tmp_path / 'bin'}:{env['PATH']}", SHIM_LOG=str(log), DRAFTER_HOST_PATH=str(drafter))
    log.unlink(missing_ok=True)
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={**env, **mode}, timeout=60)
    assert p.returncode == 0, p.stderr
    runs = [e["argv"] for e in read_shim_log(log) if e["prog"] == "docker" and e["argv"][:1] == ["run"]]
    assert len(runs) == 2
    serves = []
    for argv in runs:
        i = argv.index("--entrypoint")
        serves.append([argv[i + 1], *argv[i + 3:]])
        assert ("--enforce-eager" in serves[-1]) == bool(mode)
    return serves


def _runnable(text: str, tmp_path: Path, name: str) -> Path:
    """The launcher with its cache dirs and sysfs under tmp_path (the defaults name /home/ubuntu and /sys)."""
    sysfs = write_fake_sysfs(tmp_path / "sys")
    script = tmp_path / name
    script.write_text(text.replace("/home/ubuntu/.cache/sparkserve", str(tmp_path / "cache"))
                      .replace('"sysfs":"/sys"', f'"sysfs":"{sysfs}"'))
    return script


def test_the_launchers_recorded_docker_argvs_carry_parser_approved_vllm_argvs(vllm_parser: RealParser,
                                                                              tmp_path: Path) -> None:
    """Run launchers with fake ssh/docker and parse what they would have run inside each container: the
    committed one (the default image: the card's fork dialect) with the fork's option list, one rendered for
    a vLLM 0.33.0 image with vLLM 0.33.0's own parser."""
    committed = _runnable((REPO / "launch_dflash2_tp2.sh").read_text(), tmp_path, "committed.sh")
    fork = OptionList.load(version="0.1.dev20051+g487ecf187")
    cfg = load_config(config_file(tmp_path / "c.yaml", {"serve": {"vllm_version": "0.33.0"}}))
    upstream = _runnable(render_launcher(cfg), tmp_path, "upstream.sh")
    for mode in ({}, {"EAGER": "1"}):
        for serve in _launcher_runs(committed, tmp_path, mode):
            assert fork.check(serve).ok, (serve, fork.check(serve).error)
            assert serve[serve.index("--kv-cache-memory") + 1] == "8053063680"
        for serve in _launcher_runs(upstream, tmp_path, mode):
            v = vllm_parser.check(serve)
            assert v.ok, (serve, v.error)
            assert serve[serve.index("--kv-cache-memory-bytes") + 1] == "8053063680"


def test_validate_names_a_misspelt_extra_arg_with_the_real_parser(vllm_parser: RealParser, tmp_path: Path) -> None:
    cfg = load_config(config_file(tmp_path / "c.yaml", {
        "serve": {"extra_args": ["--enable-prefix-caching", "--max-num-batched-tokenz", "8192"]},
        "drafter": {"path": str(write_drafter(tmp_path / "d"))},
        "model": {"target": str(write_target(tmp_path / "t"))}}))
    r = validate(cfg, judge=vllm_parser)
    assert [e.where for e in r.errors] == ["serve.extra_args"]
    assert "unrecognized arguments: --max-num-batched-tokenz 8192" in r.errors[0].what
    assert r.errors[0].what.startswith("vLLM 0.33.0 `vllm serve` parser rejects head spark-a's argv")
