"""The pre-flight probe answers the drafter's manifest from the node's cache in the same python3 run (one
start per node for every `up` check), as the drafter sync's own program would: run for real on a LocalNode."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sparkserve.config import load_config
from sparkserve.deploy.doctor import _manifest_state
from sparkserve.deploy.drafter import all_cached
from sparkserve.deploy.probe import probe_node
from sparkserve.deploy.sync import manifest_args, remote_manifest, state_from
from sparkserve.nodes import LocalNode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def drafter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the node's manifest cache lives under ~
    d = tmp_path / "drafter"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"architectures": ["DFlash2DraftModel"]}')
    (d / "sub" / "model.safetensors").write_bytes(b"\x01" * 4096)
    for f in (d / "config.json", d / "sub" / "model.safetensors"):  # older than the cache's 2 s racy window
        os.utime(f, (time.time() - 3600, time.time() - 3600))
    return d


def test_the_probe_answers_the_cached_manifest_and_reads_no_file_the_cache_does_not_know(drafter: Path) -> None:
    node = LocalNode("n1")
    cold = probe_node(node, paths=[str(drafter)], manifest=manifest_args(str(drafter), cached_only=True))
    assert cold.paths[str(drafter)] is True  # the checks are still answered
    state = state_from(str(drafter), cold.manifest or {})
    assert state.exists and sorted(state.uncached) == ["config.json", "sub/model.safetensors"]

    full = remote_manifest(node, str(drafter))  # the sync's own program: hashes, and fills the cache
    warm = probe_node(node, manifest=manifest_args(str(drafter), cached_only=True))
    state = state_from(str(drafter), warm.manifest or {})
    assert state.uncached == [] and state.manifest.digest == full.manifest.digest


def test_a_probe_without_the_question_carries_no_manifest_and_a_failed_answer_is_none(drafter: Path) -> None:
    assert probe_node(LocalNode("n1"), paths=[str(drafter)]).manifest is None
    assert _manifest_state(str(drafter), {"error": "PermissionError: denied"}) is None
    assert _manifest_state(str(drafter), {"files": "not a mapping"}) is None


def test_all_cached_needs_every_configured_node_answered_in_full(drafter: Path) -> None:
    cfg = load_config(REPO / "sparkserve" / "data" / "default.yaml")
    node = LocalNode("n1")
    remote_manifest(node, str(drafter))
    answer = probe_node(node, manifest=manifest_args(str(drafter), cached_only=True)).manifest or {}
    good = state_from(str(drafter), answer)
    names = [n.name for n in cfg.nodes]
    assert all_cached(cfg, dict.fromkeys(names, good)) == dict.fromkeys(names, good)
    assert all_cached(cfg, {names[0]: good}) is None  # a node that did not answer
    assert all_cached(cfg, {names[0]: good, names[1]: None}) is None  # a node whose answer failed
