"""Engine dialects: data files chosen by the image (override, the image's stored facts, the shipped table), what
the plan renders in each, and the refusal of a setting the image's dialect cannot express."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _fixtures import REPO, DrafterSpec, config_file, write_drafter, write_target

from sparkserve.config import load_config
from sparkserve.errors import BadInput
from sparkserve.image.dialect import remember
from sparkserve.plan.build import build_plan
from sparkserve.plan.dialects import dialect_for, shipped, shipped_for_image, shipped_names, stored_facts
from sparkserve.plan.validate import refuse_inexpressible, validate
from sparkserve.plan.vllm_args import OptionList

FORK = "0.1.dev20051+g487ecf187"
UPSTREAM_IMAGE = "registry.example/vllm-upstream:0.33.0"
ID = "sha256:" + "ab" * 32


def _cfg(tmp: Path, over: dict[str, Any] | None = None):
    return load_config(config_file(tmp / "c.yaml", over or {}))


def _kv_flag(cfg) -> tuple[str, str]:
    argv = build_plan(cfg).head.command
    i = next(i for i, a in enumerate(argv) if a.startswith("--kv-cache-memory"))
    return argv[i], argv[i + 1]


def test_the_shipped_dialects_and_where_the_forks_facts_come_from() -> None:
    assert set(shipped_names()) == {"0.34.0", "0.33.0", "0.25.1", FORK}
    fork, up = shipped(FORK), shipped("0.33.0")
    assert fork.accepts("--kv-cache-memory") and not fork.accepts("--kv-cache-memory-bytes")
    assert not fork.accepts("--enable-flashinfer-autotune") and up.accepts("--enable-flashinfer-autotune")
    assert up.accepts("--kv-cache-memory-bytes") and not up.accepts("--kv-cache-memory")
    assert (fork.kv_flag, up.kv_flag, shipped("0.25.1").kv_flag) == (
        "--kv-cache-memory", "--kv-cache-memory-bytes", "--kv-cache-memory-bytes")
    spec = json.loads((REPO / "sparkserve" / "data" / "dialects" / "fork-0.1.dev20051.json").read_text())
    for change in spec["options"]["remove"] + spec["options"]["add"]:
        assert "launch_glm53_w4a16_dflash2_sm121.sh" in change["source"]  # each fact says where it came from
    assert [s.name for s in fork.signature] == ["sparse-mla-backend", "drafter-group"] and up.signature == ()
    assert shipped_for_image("ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e") == fork


def test_the_default_image_renders_the_forks_flag_with_the_exact_bytes(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert dialect_for(cfg).name == FORK  # before any node is reached: the shipped facts of the default image
    assert _kv_flag(cfg) == ("--kv-cache-memory", "8053063680")
    assert OptionList.load(version=FORK).check(build_plan(cfg).head.command).ok


def test_the_render_follows_the_image(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, {"image": {"ref": UPSTREAM_IMAGE}})
    assert dialect_for(cfg).name == "0.33.0"  # nothing known about it: vLLM 0.33.0
    assert _kv_flag(cfg) == ("--kv-cache-memory-bytes", "8053063680")
    remember(UPSTREAM_IMAGE, ID, {"vllm_version": FORK, "options": None, "how": "vllm --version", "error": None})
    assert _kv_flag(cfg) == ("--kv-cache-memory", "8053063680")  # what `image verify` read from the image
    assert stored_facts()["by_ref"][UPSTREAM_IMAGE]["image_id"] == ID
    # facts of another image ID under that ref are stale for `up`: the shipped table / 0.33.0 again
    assert dialect_for(cfg, image_id="sha256:" + "cd" * 32).name == "0.33.0"
    assert dialect_for(cfg, image_id=ID).name == FORK
    # the override wins over the image
    over = _cfg(tmp_path, {"image": {"ref": UPSTREAM_IMAGE}, "serve": {"vllm_version": "0.33.0"}})
    assert _kv_flag(over) == ("--kv-cache-memory-bytes", "8053063680")


def test_an_image_whose_own_parser_lacks_a_configured_flag_is_refused_naming_field_and_image(tmp_path: Path) -> None:
    options = json.loads(json.dumps(shipped("0.33.0").options))
    options["options"] = [o for o in options["options"] if "--block-size" not in o["option_strings"]]
    remember(UPSTREAM_IMAGE, ID, {"vllm_version": "0.33.0+old", "options": options, "how": "parser", "error": None})
    cfg = _cfg(tmp_path, {"image": {"ref": UPSTREAM_IMAGE}})
    d = dialect_for(cfg)
    assert d.list_origin.startswith("the image's own parser") and not d.accepts("--block-size")
    with pytest.raises(BadInput) as e:
        refuse_inexpressible(cfg, d)
    assert e.value.where == "serve.block_size"
    assert UPSTREAM_IMAGE in e.value.what and "has no --block-size" in e.value.what
    # unset, the setting is not rendered and nothing is refused
    refuse_inexpressible(_cfg(tmp_path, {"image": {"ref": UPSTREAM_IMAGE}, "serve": {"block_size": None}}), d)
    # validate says the same before any argv is judged
    r = validate(cfg, drafter_dir=write_drafter(tmp_path / "d", DrafterSpec()), target_dir=write_target(tmp_path / "t"),
                 parser="none")
    assert [e.where for e in r.errors] == ["serve.block_size"]


def test_an_unknown_dialect_override_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        _cfg(tmp_path, {"serve": {"vllm_version": "0.20.0"}})
    assert e.value.where == "serve.vllm_version" and FORK in e.value.what


def test_vllm_0_34_is_a_dialect_validate_accepts_and_its_changes_against_0_33_are_named(tmp_path: Path) -> None:
    # issue 43: upstream 0.34.0 (the registry's newest) beside 0.33.0 and 0.25.1; its dump removed no flag
    cfg = _cfg(tmp_path, {"serve": {"vllm_version": "0.34.0"}})
    d, prev = dialect_for(cfg), shipped("0.33.0")
    assert d.name == "0.34.0" and d.kv_flag == "--kv-cache-memory-bytes"
    argv = build_plan(cfg, dialect=d).head.command
    assert OptionList.load(version="0.34.0").check(argv).ok
    flags = {f for o in d.options["options"] for f in o["option_strings"]}
    before = {f for o in prev.options["options"] for f in o["option_strings"]}
    assert before - flags == set()  # nothing removed or renamed: what the dialect file says
    facts = " ".join(json.loads((REPO / "sparkserve" / "data" / "dialects" / "0.34.0.json").read_text())["facts"])
    assert all(f in facts for f in flags - before), sorted(flags - before)  # each added flag is named there
    assert "--gpu-memory-utilization" in facts  # its default went from 0.92 to none


def _facts_tool(tmp_path: Path, path_dirs: list[Path]) -> dict[str, Any]:
    """docker/tools/image_facts.py --serve-dialect under a python that cannot import vllm, PATH = path_dirs."""
    env = {"PATH": os.pathsep.join(str(p) for p in path_dirs), "PYTHONNOUSERSITE": "1"}
    p = subprocess.run([sys.executable, "-I", "-S", str(REPO / "docker" / "tools" / "image_facts.py"),
                        "--serve-dialect"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_the_facts_tool_takes_the_version_from_the_images_own_cli_when_vllm_does_not_import(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!/bin/sh\necho '{FORK} (an engine)'\n")
    (bin_dir / "vllm").chmod(0o755)
    got = _facts_tool(tmp_path, [bin_dir, Path("/usr/bin"), Path("/bin")])
    assert (got["vllm_version"], got["how"], got["options"]) == (FORK, "vllm --version", None)
    assert "ModuleNotFoundError" in got["error"]
    (tmp_path / "empty").mkdir()
    none = _facts_tool(tmp_path, [tmp_path / "empty"])
    assert none["vllm_version"] is None and "no vllm on PATH" in none["error"]


def test_the_facts_tool_dumps_the_images_own_parser_as_the_committed_list() -> None:
    """In an interpreter that has vLLM (the test venv's 0.33.0): its own parser, equal to the committed list."""
    p = subprocess.run([sys.executable, str(REPO / "docker" / "tools" / "image_facts.py"), "--serve-dialect"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout)
    assert (got["vllm_version"], got["how"]) == ("0.33.0", "parser")
    committed = shipped("0.33.0").options["options"]

    def strip(o: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in o.items() if k != "help"}

    assert [strip(o) for o in got["options"]["options"]] == [strip(o) for o in committed]


@pytest.mark.parametrize(("version", "kind"), [("0.33.0", "error"), ("0.34.0", "warning")])
def test_forcing_the_v1_runner_is_refused_where_it_exists_and_told_useless_where_it_does_not(
        tmp_path: Path, version: str, kind: str) -> None:
    # 0.33: VLLM_USE_V2_MODEL_RUNNER=0 walks the V1 runner, which refuses DFlash2; 0.34 has neither the V1 runner
    # nor the variable (its envs.py; the real 0.34.0 boot of session 47 printed no runner line)
    cfg = _cfg(tmp_path, {"serve": {"vllm_version": version, "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}})
    r = validate(cfg, drafter_dir=write_drafter(tmp_path / "d", DrafterSpec()), target_dir=write_target(tmp_path / "t"),
                 parser="none")
    where = "serve.env.VLLM_USE_V2_MODEL_RUNNER"
    errors = [e.what for e in r.errors if e.where == where]
    warnings = [w.what for w in r.warnings if w.where == where]
    if kind == "error":
        assert errors == ["0 forces the V1 runner, which refuses DFlash2 candidate-head drafts"] and not warnings
    else:
        assert not errors and warnings == ["vLLM 0.34.0 has no V1 runner and no such variable: the setting does "
                                           "nothing; delete it"]
