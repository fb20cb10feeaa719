"""Pre-flight: every bad input — config or drafter — exits 2 through the real CLI with ONE line that names
the field or file, and no traceback. The good default passes."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _fixtures import (
    DrafterSpec,
    TargetSpec,
    clean_env,
    cli,
    cli_batch,
    config_file,
    write_drafter,
    write_speculators_drafter,
    write_target,
)
from safetensors.numpy import save_file
from tiny_models import drop_tensor

from sparkserve.config import load_config
from sparkserve.plan.findings import Report
from sparkserve.plan.validate import check_config, validate


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("good")
    return write_drafter(root / "drafter"), write_target(root / "target")


# --- drafter mutations -------------------------------------------------------------------------------------

def _edit_config(d: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _evil_mask(d: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("mask_embedding/data.pkl", pickle.dumps({"embedding": _Evil(d / "PWNED")}, protocol=2))
        z.writestr("mask_embedding/version", "3\n")
    (d / "mask_embedding.pt").write_bytes(buf.getvalue())


def _truncate_weights(d: Path) -> None:
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:200])


def _deep_header(f: Path) -> None:
    h = b"[" * 100000 + b"]" * 100000
    f.write_bytes(struct.pack("<Q", len(h)) + h)


def _split_target_and_lose_a_shard(t: Path) -> None:
    """The target as two shards with an index naming both; the second shard is then deleted."""
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    (t / "model.safetensors").rename(t / one)
    moved = {"lm_head.weight", "model.norm.weight"}
    drop_tensor(t / one, "", into=t / two, take=moved)
    from safetensors import safe_open

    with safe_open(str(t / one), "np") as st:
        names = list(st.keys())
    index = {"weight_map": {**{n: one for n in names}, **{n: two for n in moved}}}
    (t / "model.safetensors.index.json").write_text(json.dumps(index))
    (t / two).unlink()


def _mask_hidden(d: Path) -> None:
    import numpy as np

    save_file({"mask_hidden": np.zeros((4,), dtype=np.float16)}, str(d / "extra.safetensors"))


@dataclass
class Bad:
    id: str
    where: str  # the one line must start with "error: " + a `where` containing this
    what: str  # ... and contain this
    config: dict[str, Any] = field(default_factory=dict)
    drafter: dict[str, Any] | None = None  # DrafterSpec fields → a fresh drafter
    mutate: Callable[[Path], None] | None = None  # applied to a fresh default drafter
    target: dict[str, Any] | None = None
    mutate_target: Callable[[Path], None] | None = None  # applied to a fresh default target
    raw_config: str | None = None
    drafter_path: str | None = None
    target_path: str | None = None
    pass_dirs: bool = True  # False: the config's own paths are judged (no --drafter/--target)


BAD: list[Bad] = [
    # config
    Bad("tp-not-nodes-x-gpus", "serve.tensor_parallel_size", "2 nodes x 1 GPU = 2",
        {"serve": {"tensor_parallel_size": 4}}),
    Bad("gmu-above-0.95", "serve.gpu_memory_utilization", "outside (0, 0.95]",
        {"serve": {"gpu_memory_utilization": 0.97}}),
    Bad("gmu-zero", "serve.gpu_memory_utilization", "outside (0, 0.95]", {"serve": {"gpu_memory_utilization": 0}}),
    Bad("kv-dtype-unknown", "serve.kv_cache_dtype", "unknown kv_cache_dtype 'fp9'",
        {"serve": {"kv_cache_dtype": "fp9"}}),
    Bad("capture-unsorted", "serve.compilation.cudagraph_capture_sizes", "sorted",
        {"serve": {"compilation": {"cudagraph_capture_sizes": [1, 4, 2]}}}),
    Bad("capture-duplicated", "serve.compilation.cudagraph_capture_sizes", "must not repeat",
        {"serve": {"compilation": {"cudagraph_capture_sizes": [1, 2, 2, 4]}}}),
    Bad("capture-non-positive", "serve.compilation.cudagraph_capture_sizes", "positive",
        {"serve": {"compilation": {"cudagraph_capture_sizes": [0, 1, 2]}}}),
    Bad("cudagraph-mode-unknown", "serve.compilation.cudagraph_mode", "FULL_AND_PIECEWISE",
        {"serve": {"compilation": {"cudagraph_mode": "ALWAYS"}}}),
    Bad("no-node", "nodes", "at least 1", {"nodes": []}),
    Bad("node-name-repeats", "nodes.1.name", "repeats nodes[0]",
        {"nodes": [{"name": "a", "host": "a", "fabric_ip": "10.0.0.1"}, {"name": "a", "host": "b",
                "fabric_ip": "10.0.0.2"}]}),
    Bad("fabric-ip-not-ip", "nodes.1.fabric_ip", "not an IP address",
        {"nodes": [{"name": "a", "host": "a", "fabric_ip": "10.0.0.1"}, {"name": "b", "host": "b",
                "fabric_ip": "spark-b"}]}),
    Bad("misspelt-field", "serve.tensor_paralel_size", "unknown field", {"serve": {"tensor_paralel_size": 2}}),
    Bad("kv-bytes-not-a-size", "serve.kv_cache_memory_bytes", "is not a size",
        {"serve": {"kv_cache_memory_bytes": "8 gigs"}}),
    Bad("executor-unknown", "serve.executor", "'mp' or 'ray'", {"serve": {"executor": "slurm"}}),
    Bad("method-not-dflash", "speculative.method", "'dflash'", {"speculative": {"method": "eagle3"}}),
    Bad("relative-drafter-path", "drafter.path", "must be an absolute path", {"drafter": {"path": "models/d"}},
        pass_dirs=False),
    Bad("extra-arg-rendered", "serve.extra_args", "--port is rendered by sparkserve from serve.port",
        {"serve": {"extra_args": ["--port", "9000"]}}),
    Bad("extra-arg-api-key", "serve.extra_args", "never goes into an argv",
        {"serve": {"extra_args": ["--api-key=abc"]}}),
    Bad("extra-arg-misspelt", "serve.extra_args", "unrecognized arguments: --enable-prefix-cashing",
        {"serve": {"extra_args": ["--enable-prefix-cashing"]}}),
    Bad("api-key-in-env", "serve.env", "VLLM_API_KEY does not belong in the config",
        {"serve": {"env": {"VLLM_API_KEY": "secret"}}}),
    Bad("api-key-two-sources", "serve.api_key_file", "not both",
        {"serve": {"api_key_env": "MY_KEY", "api_key_file": "/run/key"}}),
    Bad("v1-runner-forced", "serve.env.VLLM_USE_V2_MODEL_RUNNER", "refuses DFlash2",
        {"serve": {"env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}}),
    Bad("k-above-block-minus-1", "speculative.num_speculative_tokens", "a block drafts at most block_size - 1 = 7",
        {"speculative": {"num_speculative_tokens": 15}}),
    Bad("gates-mask-differs", "gates.mask_token_id", "151669 but the drafter's dflash_config.mask_token_id is 154856",
        {"gates": {"mask_token_id": 151669}}),
    Bad("yaml-broken", "c.yaml:3", "not valid YAML", raw_config="nodes:\n  - name: a\n   host: [b\n"),
    Bad("config-not-a-mapping", "c.yaml", "must be a YAML mapping", raw_config="- just\n- a list\n"),
    # drafter
    Bad("no-mask-file", "drafter.path", "has no mask_embedding.pt", drafter={"mask_file": None}),
    Bad("mask-file-id-differs", "mask_embedding.pt", "mask_token_id 151669 but config.json",
        drafter={"mask_file_token_id": 151669}),
    Bad("mask-file-wrong-width", "mask_embedding.pt", "cannot be reshaped to the drafter's hidden_size 256",
        mutate=lambda d: __import__("tiny_models").write_mask_embedding(d / "mask_embedding.pt", hidden=128,
                                                                          token_id=154856)),
    Bad("mask-file-pickle-exploit", "mask_embedding.pt", "refusing pickle global posix.system", mutate=_evil_mask),
    Bad("mask-file-not-torch", "mask_embedding.pt", "not a torch zip archive",
        mutate=lambda d: (d / "mask_embedding.pt").write_bytes(b"\x80\x02}q\x00.")),
    Bad("drafter-mask-id-missing", "config.json", "dflash_config.mask_token_id is missing",
        mutate=lambda d: _edit_config(d, lambda c: c["dflash_config"].pop("mask_token_id"))),
    Bad("drafter-mask-id-outside-vocab", "config.json", "outside the vocabulary",
        mutate=lambda d: _edit_config(d, lambda c: c.update(vocab_size=1000))),
    Bad("fc-width-vs-taps", "config.json",
        "lists 3 layers but fc.weight's input width is 512 (2 taps x target_hidden_size 256)",
        drafter={"fc_taps": 2}),
    Bad("tap-beyond-target", "config.json", "target_layer_ids has 4 but the target has 4 layers (0..3)",
        drafter={"target_layer_ids": [0, 2, 4]}),
    Bad("target-hidden-differs", "config.json", "target_hidden_size 512 but the target's hidden_size is 256",
        drafter={"target_hidden_size": 512}),
    Bad("conv-group-not-dividing", "config.json", "conv_group_size=96 must divide hidden_size=256",
        drafter={"conv_group_size": 96}),
    Bad("dflash2-key-missing", "config.json", "dflash_config lacks conv_kernel_size",
        mutate=lambda d: _edit_config(d, lambda c: c["dflash_config"].pop("conv_kernel_size"))),
    Bad("unknown-architecture", "config.json", "architectures ['EagleLlamaForCausalLM'] is not a DFlash drafter",
        mutate=lambda d: _edit_config(d, lambda c: c.update(architectures=["EagleLlamaForCausalLM"]))),
    Bad("speculators-unsupported", "config.json", "speculators_model_type 'eagle3' is not a DFlash drafter",
        mutate=lambda d: write_speculators_drafter(d, model_type="eagle3")),
    Bad("selector-tensors-missing", "drafter.path", "2 candidate_selector tensors", drafter={"selector_tensors": 2}),
    Bad("mask-hidden-weight", "drafter.path", "the weights ship mask_hidden", mutate=_mask_hidden),
    Bad("sample-from-anchor", "config.json", "sample_from_anchor is true",
        mutate=lambda d: _edit_config(d, lambda c: c["dflash_config"].update(sample_from_anchor=True))),
    Bad("no-weights", "drafter.path", "has no *.safetensors weights", drafter={"weights": False}),
    Bad("weights-truncated", "model.safetensors", "does not fit the file", mutate=_truncate_weights),
    Bad("drafter-config-not-json", "config.json", "not valid JSON",
        mutate=lambda d: (d / "config.json").write_text("{")),
    Bad("drafter-config-missing", "config.json", "missing", mutate=lambda d: (d / "config.json").unlink()),
    Bad("drafter-dir-missing", "drafter.path", "does not exist", drafter_path="/nonexistent/drafter"),
    # hostile drafter inputs (issue 15 item 9): parse errors are one line too
    Bad("drafter-config-nested-100000-deep", "config.json", "not valid JSON: nested more than 64 levels deep",
        mutate=lambda d: (d / "config.json").write_text("[" * 100000 + "]" * 100000)),
    Bad("drafter-config-oversized", "config.json", "refusing to read more than 4,194,304",
        mutate=lambda d: (d / "config.json").write_text("{}" + " " * 5 * 2**20)),
    Bad("drafter-config-not-utf8", "config.json", "not valid JSON: not UTF-8 text",
        mutate=lambda d: (d / "config.json").write_bytes(b'{"a": "\xff"}')),
    Bad("drafter-architectures-not-a-list", "config.json", "architectures must be a list of names",
        mutate=lambda d: _edit_config(d, lambda c: c.update(architectures="DFlash2DraftModel"))),
    Bad("speculators-config-not-an-object", "config.json", "speculators_config must be an object",
        mutate=lambda d: (write_speculators_drafter(d), _edit_config(d, lambda c: c.update(speculators_config=[1])))),
    Bad("drafter-index-not-an-index", "model.safetensors.index.json", "not a valid safetensors index",
        mutate=lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": [1]}')),
    Bad("weights-header-nested-deep", "model.safetensors", "header is not valid JSON: nested more than",
        mutate=lambda d: _deep_header(d / "model.safetensors")),
    # checkpoint completeness (real vLLM boots and serves each of these without a word)
    Bad("drafter-decoder-tensor-missing", "drafter.path", "lacks 1 tensor its config.json implies: "
        "layers.0.mlp.down_proj.weight", mutate=lambda d: drop_tensor(d / "model.safetensors",
                                                                       "layers.0.mlp.down_proj.weight")),
    Bad("drafter-fc-missing", "drafter.path", "lacks 1 tensor its config.json implies: fc.weight",
        mutate=lambda d: drop_tensor(d / "model.safetensors", "fc.weight")),
    Bad("target-layer-tensor-missing", "model.target", "lacks 1 tensor its config.json implies: "
        "model.layers.3.mlp.down_proj.weight", mutate_target=lambda t: drop_tensor(
            t / "model.safetensors", "model.layers.3.mlp.down_proj.weight")),
    Bad("target-shard-missing-from-index", "model-00002-of-00002.safetensors",
        "missing (listed in model.safetensors.index.json)", mutate_target=_split_target_and_lose_a_shard),
    # target
    Bad("target-config-nested-100000-deep", "config.json", "not valid JSON: nested more than",
        mutate_target=lambda t: (t / "config.json").write_text("[" * 100000 + "]" * 100000)),
    Bad("target-architectures-not-a-list", "config.json", "architectures must be a list of names",
        mutate_target=lambda t: _edit_config(t, lambda c: c.update(architectures={"a": 1}))),
    Bad("target-dir-missing", "model.target", "does not exist", target_path="/nonexistent/target"),
    Bad("target-layers-missing", "config.json", "num_hidden_layers is missing",
        target={}, mutate=None),
]


def _materialize(b: Bad, tmp: Path, good: tuple[Path, Path]) -> list[str]:
    drafter, target = good
    if b.drafter is not None or b.mutate is not None:
        drafter = write_drafter(tmp / "drafter", DrafterSpec(**(b.drafter or {})))
        if b.mutate:
            b.mutate(drafter)
    if b.target is not None or b.mutate_target is not None:
        target = write_target(tmp / "target", TargetSpec(**(b.target or {})))
        if b.id == "target-layers-missing":
            _edit_config(target, lambda c: c.pop("num_hidden_layers"))
        if b.mutate_target:
            b.mutate_target(target)
    cfg = tmp / "c.yaml"
    if b.raw_config is not None:
        cfg.write_text(b.raw_config)
    else:
        config_file(cfg, b.config)
    if not b.pass_dirs:
        return ["validate", "-c", str(cfg), "--parser", "list"]
    return ["validate", "-c", str(cfg), "--drafter", b.drafter_path or str(drafter),
            "--target", b.target_path or str(target), "--parser", "list"]


def test_there_are_at_least_25_bad_inputs_of_both_kinds() -> None:
    drafter_kind = [b for b in BAD if b.drafter is not None or b.mutate or b.drafter_path]
    config_kind = [b for b in BAD if b.config or b.raw_config]
    assert len(BAD) >= 25 and len(drafter_kind) >= 12 and len(config_kind) >= 12
    assert len({b.id for b in BAD}) == len(BAD)


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory: pytest.TempPathFactory, good: tuple[Path, Path],
             ) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Every bad input through the real CLI, each in its own process (see cli_batch)."""
    jobs, tmps = [], []
    for b in BAD:
        tmp = tmp_path_factory.mktemp(b.id)
        tmps.append(tmp)
        jobs.append((_materialize(b, tmp, good), clean_env(tmp)))
    runs = cli_batch(jobs, tmp_path_factory.mktemp("runs"))
    return {b.id: (tmp, run) for b, tmp, run in zip(BAD, tmps, runs, strict=True)}


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_input_exits_2_with_one_line_naming_the_field_or_file(
        bad: Bad, bad_runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]]) -> None:
    tmp_path, p = bad_runs[bad.id]
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in p.stderr
    where = line[len("error: "):].split(": ", 1)[0]
    assert bad.where in where, line
    assert bad.what in line, line
    assert "more problem" not in line, f"one bad input must make one error: {line}"
    assert p.stdout == ""
    if bad.id == "mask-file-pickle-exploit":
        assert not list(tmp_path.rglob("PWNED")), "the pickle ran"


def test_the_default_config_passes_with_the_fixture_drafter_and_target(tmp_path: Path,
                                                                        good: tuple[Path, Path]) -> None:
    drafter, target = good
    p = cli("validate", "--drafter", str(drafter), "--target", str(target), "--parser", "list",
            env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert "drafter ok: DFlash2DraftModel, block_size 8, K 7, mask_token_id 154856" in p.stdout
    # the default image is the card's fork: its dialect's list judges (0.33.0's, less/plus the card's facts)
    assert ("argv ok: 2 `vllm serve` argv(s) accepted by the model card's vLLM fork 0.1.dev20051+g487ecf187"
            in p.stdout)


@pytest.mark.vllm
def test_validate_parser_vllm_uses_vllms_real_parser_when_installed(tmp_path: Path,
                                                                     good: tuple[Path, Path]) -> None:
    drafter, target = good
    # the installed parser is vLLM 0.33.0's: the judge of an image of that dialect, not of the default fork image
    p = cli("validate", "--drafter", str(drafter), "--target", str(target), "--parser", "vllm",
            env={**clean_env(tmp_path), "SPARKSERVE_SERVE__VLLM_VERSION": "0.33.0"})
    assert p.returncode == 0, p.stderr
    assert "accepted by vLLM 0.33.0 `vllm serve` parser" in p.stdout
    fork = cli("validate", "--drafter", str(drafter), "--target", str(target), "--parser", "vllm",
               env=clean_env(tmp_path))
    assert fork.returncode == 2 and "the installed vLLM is 0.33.0, but the engine's dialect is vLLM " \
        "0.1.dev20051+g487ecf187" in fork.stderr


def test_drafter_path_from_the_environment_override(tmp_path: Path, good: tuple[Path, Path]) -> None:
    drafter, target = good
    env = clean_env(tmp_path, SPARKSERVE_DRAFTER__PATH=str(drafter), SPARKSERVE_MODEL__TARGET=str(target))
    p = cli("validate", "--parser", "list", env=env)
    assert p.returncode == 0, p.stderr


def test_validate_json_lists_every_error_and_exits_2(tmp_path: Path, good: tuple[Path, Path]) -> None:
    drafter = write_drafter(tmp_path / "d", DrafterSpec(mask_file=None, conv_group_size=96))
    p = cli("validate", "--json", "--drafter", str(drafter), "--target", str(good[1]), "--parser", "list",
            env=clean_env(tmp_path))
    assert p.returncode == 2
    data = json.loads(p.stdout)
    assert data["ok"] is False and [e["where"] for e in data["errors"]] == ["drafter.path", f"{drafter}/config.json"]
    assert data["drafter"]["block_size"] == 8 and data["target"]["num_hidden_layers"] == 4
    # without --json: every problem, one line each; never a hint that points at validate itself
    p = cli("validate", "--drafter", str(drafter), "--target", str(good[1]), "--parser", "list",
            env=clean_env(tmp_path))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and [ln.split(": ")[1] for ln in lines] == ["drafter.path", f"{drafter}/config.json"]
    assert all(ln.startswith("error: ") for ln in lines) and "sparkserve validate" not in p.stderr


@pytest.mark.parametrize(("over", "drafter", "needle"), [
    ({"serve": {"gpu_memory_utilization": 0.9}}, {}, "warning: serve.gpu_memory_utilization: 0.9 is above 0.85"),
    ({}, {"architecture": "DFlashDraftModel", "block_size": 6},
     "warning: speculative.num_speculative_tokens: 7 but the drafter's block_size is 6"),
    # DFlash2, K < block_size - 1: boots (the drafter card: k=5 on the SM121 image); a warning citing the card
    ({"speculative": {"num_speculative_tokens": 4}}, {},
     "warning: speculative.num_speculative_tokens: 4 but the drafter's block_size is 8: the drafter card trained "
     "and measured K = block_size - 1 = 7; fewer boot on the SM121 image (the card: k=5"),
    ({"serve": {"enforce_eager": True}}, {}, "warning: serve.enforce_eager: eager mode ignores serve.compilation"),
])
def test_warnings_are_printed_and_do_not_fail(tmp_path: Path, good: tuple[Path, Path], over: dict[str, Any],
                                              drafter: dict[str, Any], needle: str) -> None:
    d = write_drafter(tmp_path / "d", DrafterSpec(**drafter)) if drafter else good[0]
    cfg = config_file(tmp_path / "c.yaml", over)
    p = cli("validate", "-c", str(cfg), "--drafter", str(d), "--target", str(good[1]), "--parser", "list",
            env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert needle in p.stderr


# --- in-process ---------------------------------------------------------------------------------------------

def test_validate_reads_drafter_source_before_path(tmp_path: Path, good: tuple[Path, Path]) -> None:
    cfg = load_config(config_file(tmp_path / "c.yaml", {
        "drafter": {"path": "/models/on-the-nodes", "source": str(good[0])}, "model": {"target": str(good[1])}}))
    r = validate(cfg, parser="list")
    assert r.ok, r.errors
    assert r.drafter is not None and r.drafter.path == str(good[0])


def test_the_argv_check_is_skipped_once_another_rule_failed(tmp_path: Path, good: tuple[Path, Path]) -> None:
    cfg = load_config(config_file(tmp_path / "c.yaml", {
        "serve": {"extra_args": ["--bogus-flag"], "tensor_parallel_size": 3},
        "drafter": {"path": str(good[0])}, "model": {"target": str(good[1])}}))
    r = validate(cfg, parser="list")
    assert [e.where for e in r.errors] == ["serve.tensor_parallel_size"] and r.argvs_checked == 0


def test_three_nodes_need_tp_3(tmp_path: Path) -> None:
    nodes = [{"name": f"n{i}", "host": f"h{i}", "fabric_ip": f"10.0.0.{i}"} for i in range(3)]
    ok = load_config(config_file(tmp_path / "a.yaml", {"nodes": nodes, "serve": {"tensor_parallel_size": 3}}))
    assert check_config(ok).errors == []
    bad = load_config(config_file(tmp_path / "b.yaml", {"nodes": nodes}))
    assert [e.where for e in check_config(bad).errors] == ["serve.tensor_parallel_size"]


def test_report_raise_first_is_silent_when_ok() -> None:
    Report().raise_first()


# --- special files through the real CLI: exit 2 with one line within seconds, never a hang -------------------

def _fifo(f: Path) -> None:
    f.unlink()
    os.mkfifo(f)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("which", "file"), [("drafter", "config.json"), ("drafter", "mask_embedding.pt"),
                                             ("target", "config.json")])
def test_validate_on_a_fifo_exits_2_with_one_line(tmp_path: Path, which: str, file: str) -> None:
    dirs = {"drafter": write_drafter(tmp_path / "drafter"), "target": write_target(tmp_path / "target")}
    _fifo(dirs[which] / file)
    p = cli("validate", "--drafter", str(dirs["drafter"]), "--target", str(dirs["target"]), "--parser", "list",
            env=clean_env(tmp_path), timeout=30)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.splitlines() == [f"error: {dirs[which] / file}: is a FIFO, not a regular file"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", ["fifo", "nested"])
def test_drafter_inspect_on_a_hostile_config_json_exits_2_with_one_line(tmp_path: Path, bad: str) -> None:
    d = write_drafter(tmp_path / "d")
    if bad == "fifo":
        _fifo(d / "config.json")
    else:
        (d / "config.json").write_text("[" * 100000 + "]" * 100000)
    p = cli("drafter", "inspect", str(d), env=clean_env(tmp_path), timeout=30)
    what = "is a FIFO, not a regular file" if bad == "fifo" else "not valid JSON: nested more than 64 levels deep"
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.splitlines() == [f"error: {d / 'config.json'}: {what}"]


@pytest.mark.timeout(60)
def test_drafter_inspect_with_a_fifo_in_the_dir_reports_it_and_hashes_the_rest(tmp_path: Path) -> None:
    d = write_drafter(tmp_path / "d")
    _fifo(d / "mask_embedding.pt")
    os.mkfifo(d / "stray.pipe")
    p = cli("drafter", "inspect", str(d), "--json", env=clean_env(tmp_path), timeout=30)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["drafter"]["mask"]["error"] == "is a FIFO, not a regular file"
    assert set(data["manifest"]["files"]) == {"config.json", "model.safetensors"}
    assert {"where": str(d / "mask_embedding.pt"), "what": "is a FIFO, not a regular file"} in \
        data["checks"]["errors"]
