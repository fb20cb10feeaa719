"""Checkpoint completeness where the checkpoints live only on the nodes (issue 13 item 3): the head's drafter
or target, mirrored here as metadata (config.json and sparse safetensors stubs at their real size), missing
a tensor is refused with one line, exit 2, before any node is touched — real vLLM would boot it silently."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from tiny_models import drop_tensor  # noqa: E402

pytestmark = pytest.mark.rig

E2E_DIR = "/srv/spark/e2e"


@pytest.fixture
def incomplete(e2e):
    """Node-local copies of the rig's drafter and target, each missing one tensor, on every node."""
    made = {"drafter": (f"{E2E_DIR}/drafter-missing-tensor", "layers.1.mlp.down_proj.weight"),
            "target": (f"{E2E_DIR}/target-missing-tensor", "model.layers.2.self_attn.o_proj.weight")}
    for n in e2e.rig.nodes:
        for model, (path, tensor) in made.items():
            dst = e2e.node_path(n.name, path)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(e2e.node_path(n.name, e2e.rig.models[model]), dst)
            drop_tensor(dst / "model.safetensors", tensor)
    assert not Path(made["drafter"][0]).exists()  # not on this machine: validate reads the head's copy
    yield made
    for n in e2e.rig.nodes:
        for path, _ in made.values():
            shutil.rmtree(e2e.node_path(n.name, path), ignore_errors=True)


@pytest.mark.parametrize("model", ["drafter", "target"])
def test_up_refuses_a_checkpoint_missing_a_tensor_on_the_head(e2e, incomplete, model: str) -> None:
    path, tensor = incomplete[model]
    field = {"drafter": {"drafter": {"path": path}}, "target": {"model": {"target": path}}}[model]
    cfg = e2e.config(field)
    p = e2e.cli("up", cfg=cfg)
    where = "drafter.path" if model == "drafter" else "model.target"
    line = e2e.assert_explained(p, code=2, node=None, says=(where, "lacks 1 tensor", tensor))
    assert "starting" not in p.stderr, line  # refused before any rank was started
    assert e2e.leftovers() == {}
