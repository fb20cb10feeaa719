"""The card's small print (issue 45), judged by `validate` and `profiles` before any node is touched.

Sources (docs/card-now-2026-12.md, read 2026-12-07): the launcher at 1c142c9 picks its flag dialect from the image
tag (`*v1-w4a16*` → `--kv-cache-memory-bytes` and `--no-enable-flashinfer-autotune`) and the README at 1c142c9 calls
that v1 base broken on SM121; the README's MTP section: "native MTP on *this* image has not been validated by us
yet"; a third-party summary of the W4A16 card: a config.json older than 2026-09-08 fails with
`KeyError: 'layers.0.mlp.gate_up_proj.weight'`, and `--max-num-seqs` must be ≤ 512.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _fixtures import DrafterSpec, clean_env, cli, config_file, write_drafter, write_target
from tiny_models import save_f16_with_zeros

from sparkserve.config import load_config
from sparkserve.errors import BadInput
from sparkserve.plan.dialects import shipped
from sparkserve.plan.validate import refuse_inexpressible, validate

V1 = "ghcr.io/canada-quant/vllm-glm53-flash-sm121:v1-w4a16-dflash2e"
V2 = "ghcr.io/canada-quant/vllm-glm53-flash-sm121:v2-w4a16-dflash2e"


def _validate(tmp: Path, over: dict[str, Any], *, target: Path | None = None, drop: list[str] | None = None):
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = load_config(config_file(tmp / "c.yaml", over, drop=drop))
    return validate(cfg, drafter_dir=write_drafter(tmp / "d", DrafterSpec()),
                    target_dir=target or write_target(tmp / "t"), parser="none")


def test_a_v1_image_tag_is_refused_with_the_cards_reason_never_half_its_dialect(tmp_path: Path) -> None:
    r = _validate(tmp_path, {"image": {"ref": V1}})
    (err,) = [e for e in r.errors if e.where == "image.ref"]
    assert V1 in err.what and "dies at FlashInfer sparse-MLA warmup" in err.what
    assert "--kv-cache-memory-bytes and --no-enable-flashinfer-autotune" in err.what and V2 in err.what
    cfg = load_config(config_file(tmp_path / "v1.yaml", {"image": {"ref": V1 + "@sha256:" + "ab" * 32}}))
    with pytest.raises(BadInput) as e:  # `up` refuses it too, before any container, whatever its digest
        refuse_inexpressible(cfg, shipped("0.33.0"))
    assert e.value.where == "image.ref"
    assert not [e for e in _validate(tmp_path / "v2", {"image": {"ref": V2}}).errors if e.where == "image.ref"]


def test_max_num_seqs_above_512_is_refused_as_the_fork_does(tmp_path: Path) -> None:
    (err,) = [e for e in _validate(tmp_path, {"serve": {"max_num_seqs": 513}}).errors]
    assert err.where == "serve.max_num_seqs" and "512" in err.what
    assert not _validate(tmp_path / "ok", {"serve": {"max_num_seqs": 512}}).errors


def _glm_target(path: Path, *, first_k_dense: int | None) -> Path:
    """A tiny MoE decoder whose weights hold a dense layer 0 (gate/up/down projections) and experts after it, as
    the W4A16 checkpoint does; its config.json with or without ``first_k_dense_replace``."""
    path.mkdir(parents=True)
    h, n = 256, 3
    cfg: dict[str, Any] = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": h,
                           "num_hidden_layers": n, "num_attention_heads": 4, "num_key_value_heads": 4,
                           "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 262144,
                           "n_routed_experts": 2, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    if first_k_dense is not None:
        cfg["first_k_dense_replace"] = first_k_dense
    (path / "config.json").write_text(json.dumps(cfg))
    z = np.zeros((4, 4), dtype=np.float16)
    t = {"model.embed_tokens.weight": z, "model.norm.weight": z, "lm_head.weight": z}
    for i in range(n):
        p = f"model.layers.{i}."
        t |= {p + x: z for x in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                 "self_attn.o_proj.weight")}
        mlp = ("gate_proj", "up_proj", "down_proj") if i == 0 else (
            "experts.0.gate_proj", "experts.1.up_proj", "gate")
        t |= {p + f"mlp.{m}.weight": z for m in mlp}
    save_f16_with_zeros(path / "model.safetensors", t, {})
    return path


def test_a_target_config_from_before_2026_09_08_is_caught_from_its_own_fields_with_the_fix(tmp_path: Path) -> None:
    stale = _validate(tmp_path / "a", {}, target=_glm_target(tmp_path / "old", first_k_dense=None))
    (err,) = [e for e in stale.errors if e.where.endswith("old/config.json")]
    assert "before 2026-09-08" in err.what and "KeyError: 'layers.0.mlp.gate_up_proj.weight'" in err.what
    assert "download the current config.json" in err.what and "first_k_dense_replace is 0" in err.what
    current = _validate(tmp_path / "b", {}, target=_glm_target(tmp_path / "new", first_k_dense=1))
    assert not current.errors, current.errors


def test_mtp_says_the_card_has_not_validated_it_in_profiles_and_validate(tmp_path: Path) -> None:
    r = _validate(tmp_path, {"profile": "mtp"}, drop=["drafter"])
    (w,) = [w for w in r.warnings if w.where == "profile"]
    assert "has not been validated by us yet" in w.what and "banked" in w.what
    assert not [w for w in _validate(tmp_path / "g4", {}).warnings if w.where == "profile"]
    env = clean_env(tmp_path)
    p = cli("profiles", "-c", str(config_file(tmp_path / "m.yaml", {"profile": "mtp"}, drop=["drafter"])), env=env)
    assert p.returncode == 0, p.stderr
    assert "mtp: ahead of the card" in p.stdout and "has not been validated by us yet" in p.stdout
    j = cli("profiles", "--json", env=env)
    by = {x["name"]: x for x in json.loads(j.stdout)["profiles"]}
    assert "has not been validated by us yet" in by["mtp"]["caveat"] and by["g4-262k"]["caveat"] is None


def _launcher_in_venv(tmp: Path, version: str) -> Path:
    """A `vllm-router` console script in a venv of its own whose `vllm-router` distribution is ``version``, with
    vllm-project/router's flags in its --help (the PrimeIntellect fork keeps the package name and the launcher)."""
    import subprocess
    import sys

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    info = site / f"vllm_router-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-router\nVersion: {version}\n")
    exe = venv / "bin" / "vllm-router"
    exe.write_text(f"#!{venv}/bin/python\nprint('usage: vllm-router --worker-urls --retry-max-retries "
                   "--cb-failure-threshold')\n")
    exe.chmod(0o755)
    return exe


def test_the_router_check_names_the_version_found_and_refuses_all_but_0_1_17(tmp_path: Path) -> None:
    from sparkserve.nodes.router import router_executable, router_version

    fork = _launcher_in_venv(tmp_path, "0.2.7")
    with pytest.raises(BadInput) as e:
        router_executable(str(fork))
    assert e.value.where == "router.executable"
    assert "found vllm-router 0.2.7" in e.value.what and "PrimeIntellect" in e.value.what
    assert "pip install 'vllm-router==0.1.17' --index-url https://pypi.org/simple" in e.value.what
    real = router_executable("vllm-router")  # the pinned wheel in sparkserve's own venv
    assert router_version(real) == "0.1.17"


CARD_DIGEST = "sha256:4def0ef644cb2e9814136dcffd5e385e21bc594f48f3b292234051904abe85a6"
TONY = "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v11-dflash2"
REHOST = "ghcr.io/canada-quant/vllm-glm53-flash-base:sm121-v11-dflash2"
RADIXARK = "radixark/vllm-glm53-flash:sm121-v11-dflash2"


def test_the_base_is_its_digest_in_the_lock_whatever_name_the_recipe_gives_it() -> None:
    from sparkserve.image.context import default_recipe, load_recipe_files
    from sparkserve.image.recipe import lock_problems

    files = load_recipe_files(default_recipe())
    assert files.recipe.base.image == f"{TONY}@{CARD_DIGEST}"
    for name in (REHOST, RADIXARK):  # the card's re-host (or the old name) of the same digest: the lock holds
        recipe = files.recipe.model_copy(update={"base": files.recipe.base.model_copy(
            update={"image": f"{name}@{CARD_DIGEST}"})})
        assert not [p for p in lock_problems(recipe, files.lock, files.series, files.checks) if "base.image" in p]
    other = files.recipe.model_copy(update={"base": files.recipe.base.model_copy(
        update={"image": f"{REHOST}@sha256:{'0' * 64}"})})
    assert [p for p in lock_problems(other, files.lock, files.series, files.checks) if "base.image" in p]


def test_a_failed_pull_of_one_name_says_which_other_names_hold_that_digest() -> None:
    import docker.errors

    from sparkserve.image.base_names import pull_errors
    from sparkserve.nodes import LocalNode, NodeError

    ref = f"{TONY}@{CARD_DIGEST}"
    with pytest.raises(NodeError) as e, pull_errors(LocalNode("spark-a"), "relock", ref):
        # what the docker SDK raises for a name the registry no longer serves
        raise docker.errors.NotFound("404 Client Error: Not Found (\"manifest unknown\")")
    what = e.value.what
    assert what.startswith(f"{ref}: ") and "manifest unknown" in what
    assert f"also published as {REHOST}@{CARD_DIGEST}" in what
    assert "radixark/vllm-glm53-flash:sm121-v11-dflash2: gone: \"now 404 on Docker Hub\"" in what
    assert TONY + "@" not in what.split("also published as", 1)[1]  # not the name that just failed


def test_image_verify_names_the_base_by_its_digest() -> None:
    from sparkserve.image.verify import ImageCheck

    facts = {"lock": {"base": {"image": f"{TONY}@{CARD_DIGEST}", "digest_ref": f"{TONY}@{CARD_DIGEST}"}}}
    base = ImageCheck("img", {"a": "sha256:1"}, {"a": "fp"}, None, {"a": facts}).base
    assert base is not None and base["digest"] == CARD_DIGEST and base["names"][:2] == [REHOST, TONY]
    assert str(base["line"]).startswith("base: sha256:4def0ef644cb… (" + REHOST)
