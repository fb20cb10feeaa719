"""Drafters by what they are: validate names the card's E/F/G (one config.json between them) or the incoai
reference (a 2,048-token sliding window), and warns when a profile meets a drafter the card never validated it
with (800K with -E, 1M with -G). Facts: the DFlash2-G card's architecture table and provenance (config.json
sha256 699bdf29…c51778, "identical to -E / -F"), its Memory-cost table, the reference's licence CC-BY-NC-ND-4.0.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from _fixtures import DrafterSpec, config_file, write_drafter

from sparkserve.config import load_config
from sparkserve.models import drafter_identity
from sparkserve.models.drafter import inspect_drafter
from sparkserve.models.drafter_identity import identify
from sparkserve.plan.findings import Report
from sparkserve.plan.profile_checks import check_identity, check_profile

EFG = DrafterSpec(hidden_size=4096, num_hidden_layers=8, block_size=8, mask_token_id=154856,
                  target_layer_ids=[5, 9, 14, 19, 24, 28, 33, 38, 42], weights=False)


def efg(tmp: Path, name: str) -> Path:
    return write_drafter(tmp / name, EFG)


def incoai(tmp: Path) -> Path:
    d = write_drafter(tmp / "GLM-5.3-Flash-DFlash2", EFG)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"].update(use_swa=True, swa_window_size=2048)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_the_release_comes_from_the_directory_and_the_family_from_config(tmp_path: Path) -> None:
    for rel in "EFG":
        ident = identify(inspect_drafter(efg(tmp_path, f"GLM-5.3-Flash-DFlash2-{rel}")))
        assert (ident.family, ident.release) == ("E/F/G", rel) and ident.name == f"canada-quant DFlash2-{rel}"
    anon = identify(inspect_drafter(efg(tmp_path, "drafter")))
    assert (anon.family, anon.release) == ("E/F/G", None) and "not in config.json" in anon.name
    assert "another config.json digest" in anon.evidence


def test_the_published_config_digest_is_recognised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = efg(tmp_path, "GLM-5.3-Flash-DFlash2-G")
    digest = hashlib.sha256((d / "config.json").read_bytes()).hexdigest()
    monkeypatch.setattr(drafter_identity, "EFG_CONFIG_SHA256", (digest[:8], digest[-6:]))
    ident = identify(inspect_drafter(d))
    assert ident.family == "E/F/G" and f"sha256 {digest[:8]}…{digest[-6:]}" in ident.evidence


def test_the_reference_is_told_by_its_sliding_window(tmp_path: Path) -> None:
    ident = identify(inspect_drafter(incoai(tmp_path)))
    assert (ident.family, ident.licence) == ("incoai", "CC-BY-NC-ND-4.0")
    assert "2048-token sliding window" in ident.evidence


def test_another_drafter_is_not_one_of_the_cards(tmp_path: Path) -> None:
    other = write_drafter(tmp_path / "x", DrafterSpec(weights=False))
    assert identify(inspect_drafter(other)).family is None
    assert _warnings(tmp_path, "long-800k", other) == []  # the card says nothing about it: named, not warned


def _warnings(tmp: Path, profile: str, drafter: Path) -> list[str]:
    cfg = load_config(config_file(tmp / f"{profile}-{drafter.name}.yaml", {"profile": profile,
                                                                          "drafter": {"path": str(drafter)}}))
    r = Report()
    check_identity(cfg, inspect_drafter(drafter), r, str(drafter))
    return [f"{w.where}: {w.what}" for w in r.warnings]


def test_a_profile_warns_about_a_drafter_the_card_never_validated_it_with(tmp_path: Path) -> None:
    e, g, ref = efg(tmp_path, "GLM-5.3-Flash-DFlash2-E"), efg(tmp_path, "GLM-5.3-Flash-DFlash2-G"), incoai(tmp_path)
    assert _warnings(tmp_path, "long-800k", g) == []
    (w,) = _warnings(tmp_path, "long-800k", e)
    assert "never validated profile long-800k with canada-quant DFlash2-E" in w and "-G" in w
    (w,) = _warnings(tmp_path, "incoai-1m", g)
    assert "never validated profile incoai-1m with canada-quant DFlash2-G" in w and "incoai reference" in w
    assert _warnings(tmp_path, "g4-262k", e) == [] and _warnings(tmp_path, "g4-262k", g) == []
    licence, *_ = _warnings(tmp_path, "incoai-1m", ref)
    assert "CC-BY-NC-ND-4.0" in licence and len(_warnings(tmp_path, "incoai-1m", ref)) == 1
    assert any("never validated profile g4-262k" in x for x in _warnings(tmp_path, "g4-262k", ref))


def test_mtp_says_an_unused_drafter_and_overrides_are_said(tmp_path: Path) -> None:
    cfg = load_config(config_file(tmp_path / "m.yaml", {"profile": "mtp", "serve": {"max_model_len": 131072}}))
    r = Report()
    check_profile(cfg, r)
    said = {w.where: w.what for w in r.warnings}
    assert "131072 overrides profile mtp's 262144" in said["serve.max_model_len"]
    assert "not served: speculative.method mtp" in said["drafter.path"]
