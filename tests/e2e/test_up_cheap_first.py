"""`up` judges its cheap answers first (issue 45): a taken API port, a GPU already full and a drafter missing on a
node are refused from the node checks alone — before the engine identity and the drafter sync, which cost seconds
on a real engine (28.8 s there, before the port refusal) — and nothing is copied or started.

Each refusal is asserted by what did not happen (no drafter copied to the nodes, no `image:` identity line, no
`drafter:` line); how long each takes, before and after, is measured by bench/bench_up_refusals.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import rig as riglib

pytestmark = pytest.mark.rig

PROC = "/srv/spark/proc"
SYNCED = "/srv/spark/e2e/cheap-first-drafter"  # where drafter.source would be copied on every node


@pytest.fixture
def source(e2e, tmp_path) -> Path:
    """A drafter copy on this machine (drafter.source): `up` would sync it to every node before it boots."""
    import shutil

    src = tmp_path / "drafter"
    shutil.copytree(e2e.node_path("node-a", e2e.rig.models["drafter"]), src)
    yield src
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, SYNCED), ignore_errors=True)
        riglib.write_fake_proc(n)


def _refused(e2e, cfg: Path, *, code: int, node: str, step: str, says: str) -> str:
    p = e2e.cli("up", cfg=cfg)
    text = e2e.assert_explained(p, code=code, node=node, step=step, says=(says,))
    out = p.stdout + p.stderr
    assert "image:" not in out and "drafter:" not in out, f"a slow step ran before the refusal:\n{out}"
    for n in e2e.rig.nodes:
        assert not e2e.node_path(n.name, SYNCED).exists(), f"the drafter was copied to {n.name} first"
    assert e2e.leftovers() == {}
    return text


def test_a_taken_port_is_refused_before_the_engine_identity_and_the_drafter_sync(e2e, source) -> None:
    cfg = e2e.config({"drafter": {"path": SYNCED, "source": str(source)}})
    port = e2e.load(cfg).serve.port
    with socket.socket() as s:
        s.bind((e2e.rig.nodes[0].host, port))
        s.listen()
        _refused(e2e, cfg, code=3, node="node-a", step="ports", says=f":{port} is already in use on node-a")


def test_a_gpu_already_full_is_refused_before_the_drafter_sync(e2e, source) -> None:
    # another process holds the memory: dropping the page cache (MemAvailable) would not free enough
    (e2e.node_path("node-b", PROC) / "meminfo").write_text(riglib.fake_meminfo(free_gib=8, available_gib=9))
    cfg = e2e.config({"drafter": {"path": SYNCED, "source": str(source)}})
    _refused(e2e, cfg, code=1, node="node-b", step="memory", says="even with the page cache dropped")


def test_a_drafter_missing_on_a_node_is_refused_from_the_node_checks(e2e, source) -> None:
    """The drafter is on the head (validate reads it there) but not on node-b, and there is no copy on this
    machine to sync from: node-b's checks refuse it, before the engine identity."""
    import shutil

    shutil.copytree(source, e2e.node_path("node-a", SYNCED))
    cfg = e2e.config({"drafter": {"path": SYNCED}})
    p = e2e.cli("up", cfg=cfg)
    e2e.assert_explained(p, code=3, node="node-b", step="drafter", says=(f"{SYNCED} is missing on node-b",
                                                                          "drafter.source"))
    assert "image:" not in p.stdout + p.stderr and e2e.leftovers() == {}
