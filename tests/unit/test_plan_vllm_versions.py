"""serve.vllm_version: the plan and validate follow the configured engine version (0.33.0 or 0.25.1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from _fixtures import DrafterSpec, config_file, write_drafter, write_target

from sparkserve.config import load_config
from sparkserve.errors import BadInput
from sparkserve.plan.build import build_plan
from sparkserve.plan.validate import validate
from sparkserve.plan.vllm_args import (
    SUPPORTED_VERSIONS,
    OptionList,
    ParserUnavailable,
    get_judge,
    renderable,
)


def _cfg(tmp: Path, over: dict[str, Any] | None = None):
    return load_config(config_file(tmp / "c.yaml", over or {}))


def _models(tmp: Path, arch: str = "DFlashDraftModel") -> tuple[Path, Path]:
    return write_drafter(tmp / "d", DrafterSpec(architecture=arch)), write_target(tmp / "t")


def test_each_version_has_its_own_option_list() -> None:
    old, new = OptionList.load(version="0.25.1"), OptionList.load(version="0.33.0")
    assert (old.vllm_version, new.vllm_version) == ("0.25.1", "0.33.0")
    assert old.accepts("--speculative-config") and new.accepts("--speculative-config")
    assert new.accepts("--disable-prefix-caching") and not old.accepts("--disable-prefix-caching")
    assert old.accepts("--calculate-kv-scales") and not new.accepts("--calculate-kv-scales")
    with pytest.raises(ParserUnavailable, match="no option list for vLLM 0.20.0"):
        OptionList.load(version="0.20.0")


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
@pytest.mark.parametrize("over", [{}, {"serve": {"enforce_eager": True, "attention_backend": "FLASH_ATTN",
                                                 "host": "127.0.0.1"}}],
                         ids=["default", "eager-backend-host"])
def test_every_flag_the_plan_renders_exists_in_the_configured_version(tmp_path: Path, version: str,
                                                                      over: dict[str, Any]) -> None:
    cfg = _cfg(tmp_path, {**over, "serve": {**over.get("serve", {}), "vllm_version": version}})
    judge = OptionList.load(version=version)
    for spec in build_plan(cfg).specs:
        argv = spec.serve_argv()
        if argv[:2] != ["vllm", "serve"]:
            continue
        flags = [a.split("=", 1)[0] for a in argv[2:] if a.startswith("--")]
        assert flags and all(renderable(f, version) for f in flags), [f for f in flags if not renderable(f, version)]
        assert judge.check(argv).ok, judge.check(argv).error


def test_a_flag_only_the_newer_engine_has_is_refused_for_0_25_1(tmp_path: Path) -> None:
    d, t = _models(tmp_path)
    over = {"serve": {"extra_args": ["--disable-prefix-caching"]}, "speculative": {"num_speculative_tokens": 7}}
    ok = validate(_cfg(tmp_path, over), drafter_dir=d, target_dir=t, parser="list")
    assert ok.ok, ok.errors
    over["serve"]["vllm_version"] = "0.25.1"
    r = validate(_cfg(tmp_path, over), drafter_dir=d, target_dir=t, parser="list")
    assert r.argv_judge == "vLLM 0.25.1 option list (committed dump)"
    assert [(e.where, "unrecognized arguments: --disable-prefix-caching" in e.what) for e in r.errors] == [
        ("serve.extra_args", True)]


def test_a_kv_cache_dtype_the_older_engine_lacks_is_refused(tmp_path: Path) -> None:
    d, t = _models(tmp_path)
    r = validate(_cfg(tmp_path, {"serve": {"vllm_version": "0.25.1", "kv_cache_dtype": "nvfp4_4over6"}}),
                 drafter_dir=d, target_dir=t, parser="list")
    assert len(r.errors) == 1 and "argument --kv-cache-dtype: invalid choice: 'nvfp4_4over6'" in r.errors[0].what


def test_a_dflash2_drafter_is_refused_for_an_engine_that_does_not_register_it(tmp_path: Path) -> None:
    d, t = _models(tmp_path, "DFlash2DraftModel")
    r = validate(_cfg(tmp_path, {"serve": {"vllm_version": "0.25.1"}}), drafter_dir=d, target_dir=t, parser="none")
    assert [e.what for e in r.errors] == [
        "architectures ['DFlash2DraftModel']: vLLM 0.25.1 (the engine's dialect) registers only DFlashDraftModel"]
    assert validate(_cfg(tmp_path), drafter_dir=d, target_dir=t, parser="none").ok


def test_an_unsupported_version_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        _cfg(tmp_path, {"serve": {"vllm_version": "0.20.0"}})
    assert e.value.where == "serve.vllm_version"


def test_the_default_version_leaves_the_fingerprint_as_it_was(tmp_path: Path) -> None:
    base = _cfg(tmp_path)
    assert "vllm_version" not in base.normalized()["serve"]
    assert _cfg(tmp_path, {"serve": {"vllm_version": "0.25.1"}}).fingerprint() != base.fingerprint()


def test_auto_uses_the_configured_versions_list_when_the_installed_parser_is_another_version() -> None:
    j = get_judge("auto", "0.25.1")  # the test venv's vLLM is 0.33.0: its parser is not 0.25.1's judge
    assert isinstance(j, OptionList) and j.vllm_version == "0.25.1"


@pytest.mark.vllm
def test_the_real_parser_of_another_version_is_refused_in_vllm_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    # this interpreter's vLLM: its metadata says 0.33.0, refused before the parser starts (no vLLM import)
    import sparkserve.plan.vllm_args as vllm_args

    started = []
    with monkeypatch.context() as m:
        m.setattr(vllm_args, "RealParser", lambda *a, **k: started.append(a) or pytest.fail("parser started"))
        with pytest.raises(ParserUnavailable,
                           match=r"the installed vLLM is 0\.33\.0, but the engine's dialect is vLLM 0\.25\.1"):
            get_judge("vllm", "0.25.1")
    assert started == []
    # another interpreter (SPARKSERVE_VLLM_PYTHON): no metadata to read here, its parser is started and asked
    monkeypatch.setenv("SPARKSERVE_VLLM_PYTHON", sys.executable)
    with pytest.raises(ParserUnavailable,
                       match=r"the installed vLLM is 0\.33\.0, but the engine's dialect is vLLM 0\.25\.1"):
        get_judge("vllm", "0.25.1")
