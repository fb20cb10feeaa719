"""Live `gates` collection (sparkserve.deploy.gates_live) against fake engines: what it reads from each node and
what it runs — this boot's log only, and no smoke cell when the smoke gate is skipped."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkserve.config import load_config
from sparkserve.deploy import gates_live
from sparkserve.deploy import stack as deploy_stack
from sparkserve.nodes.engine import ContainerState
from sparkserve.observe.gate_inputs import SmokeResult

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
STARTED = "2026-11-29T16:35:50.250000000Z"  # 1795970150.25
PREVIOUS_END = "2026-11-29T16:35:49.750000000Z"


def state(started: str = STARTED, finished: str = "0001-01-01T00:00:00Z") -> ContainerState:
    return ContainerState("running", True, None, False, "", started, finished)


class FakeEngine:
    """One node's engine: the fixture log as its container log; records every `since` asked for."""

    since: dict[str, Any] = {}
    states: dict[str, ContainerState] = {}

    def __init__(self, node: SimpleNamespace) -> None:
        self.node = node

    def logs(self, cid: str, *, since: float | None = None, **_: object) -> list[str]:
        FakeEngine.since[self.node.name] = since
        return (LOGS / self.node.log).read_text().splitlines()

    def state(self, cid: str) -> ContainerState:
        return FakeEngine.states.get(self.node.name, state())

    def managed(self, cid: str) -> SimpleNamespace:
        return SimpleNamespace(image_id="sha256:img")


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    cfg = load_config(None)
    nodes = {
        cfg.nodes[0].name: SimpleNamespace(name=cfg.nodes[0].name, log="v0.33-head.log"),
        cfg.nodes[1].name: SimpleNamespace(name=cfg.nodes[1].name, log="v0.33-follower.log"),
    }
    smokes: list[str] = []

    def fake_smoke(cfg: object, plan: object) -> tuple[SmokeResult, dict[str, Any]]:
        smokes.append("smoke")
        n = cfg.gates.smoke.prompts  # type: ignore[attr-defined]
        return SmokeResult(requests=n, requests_ok=n, stream_errors=0, incomplete=0, errors=(), node="spark-a"), {}

    FakeEngine.since, FakeEngine.states = {}, {}
    monkeypatch.setattr(gates_live, "engine_for", lambda node, how=None: FakeEngine(node))
    monkeypatch.setattr(deploy_stack, "engine_for", lambda node, how=None: FakeEngine(node))  # boot_id's
    monkeypatch.setattr(gates_live, "run_smoke", fake_smoke)
    digest = SimpleNamespace(manifest=SimpleNamespace(digest="d"))
    monkeypatch.setattr(gates_live, "remote_manifest", lambda node, path: digest)
    monkeypatch.setattr(gates_live, "_drafter_has_mask", lambda node, path: True)
    monkeypatch.setattr(gates_live, "drafter_layers", lambda node, path: 8)
    # no kernel log on a fake node (the NVRM/Xid lines of the faults gate: tests/unit/test_hostfacts*)
    monkeypatch.setattr(gates_live, "kernel_faults", lambda node, cfg, since: SimpleNamespace(error=None, lines=[]))
    monkeypatch.setattr(gates_live, "lookup", lambda read, default: default)
    monkeypatch.setattr(gates_live, "record", lambda kind, **fields: None)
    fp = "f" * 64
    monkeypatch.setattr(
        gates_live, "managed_on_all",
        lambda nodes, how=None: {n: [SimpleNamespace(id=f"c-{n}", fingerprint=fp)] for n in nodes}
    )
    return {"cfg": cfg, "nodes": nodes, "smokes": smokes}


def test_skipping_smoke_never_runs_the_smoke_cell(stack: dict[str, Any]) -> None:
    report = gates_live.run_gates(stack["cfg"], stack["nodes"], skip=("smoke",))
    smoke = next(g for g in report.gates if g.name == "smoke")
    assert stack["smokes"] == [] and smoke.skipped and smoke.ok


def test_without_skip_the_smoke_cell_runs_once(stack: dict[str, Any]) -> None:
    report = gates_live.run_gates(stack["cfg"], stack["nodes"])
    assert stack["smokes"] == ["smoke"] and next(g for g in report.gates if g.name == "smoke").ok


def test_each_nodes_log_is_read_from_this_boots_start(stack: dict[str, Any]) -> None:
    head, follower = list(stack["nodes"])
    FakeEngine.states[follower] = state(finished=PREVIOUS_END)  # restarted: its previous run ended 0.5 s before
    report = gates_live.run_gates(stack["cfg"], stack["nodes"], skip=("smoke",))
    start = 1795970150.25
    assert FakeEngine.since[head] == pytest.approx(start - gates_live.BOOT_SLACK_S)
    assert FakeEngine.since[follower] == pytest.approx(start - 0.5)  # never into the previous run
    assert next(g for g in report.gates if g.name == "pool").ok  # the logs were read and judged


def test_boot_since_without_a_start_time_reads_the_whole_log() -> None:
    assert gates_live.boot_since(state(started="")) is None
