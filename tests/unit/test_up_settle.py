"""Issue 43: where `up`'s boot spends its time after the head answers. The settle window follows the gates:
`up` with gates watches every rank for ``gates.settle_s`` after they pass; `up --no-gates` runs no gates and so
sits in no settle window (it was 3 s of the 4.3 s `up --no-gates` took over a bare `vllm serve` on the GPU,
tests/real/runs/2026-12-07-session43). The boot's steps are timed spans (`up --timings`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkserve.config import Config, load_config
from sparkserve.deploy import timings, up
from sparkserve.observe.gate_report import GateReport, Verdict
from sparkserve.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg() -> Config:
    c = load_config(REPO / "sparkserve" / "data" / "default.yaml")
    return c.model_copy(update={"gates": c.gates.model_copy(update={"settle_s": 2.5})})


def _boot(monkeypatch, cfg: Config, *, run_gates: bool) -> tuple[list[tuple[str, Any]], list[str], up.UpResult]:
    """`up._boot` with every remote step stood in for: what it called, in order, and what it said."""
    calls: list[tuple[str, Any]] = []
    said: list[str] = []
    monkeypatch.setattr(up, "_start", lambda plan, nodes, started, say, image_id="": calls.append(("start", None))
                        or {n.name: f"c-{n.name}" for n in cfg.nodes})
    monkeypatch.setattr(up, "wait_ready", lambda *a, **k: calls.append(("wait", None)) or 42.0)
    monkeypatch.setattr(up, "check_parity", lambda *a, **k: calls.append(("parity", None)))
    monkeypatch.setattr(up, "_gate", lambda *a, **k: calls.append(("gates", None))
                        or GateReport([Verdict("pool", True, 1, [1], "fine")]))
    monkeypatch.setattr(up, "watch_alive", lambda *a, seconds, **k: calls.append(("settle", seconds)))
    monkeypatch.setattr(up, "_record", lambda *a, **k: calls.append(("journal", a[-1])))
    monkeypatch.setattr(up, "_record_hosts", lambda *a, **k: None)
    found = SimpleNamespace(image_id="sha256:i", drafter=SimpleNamespace(digest="d", summary={}), hosts={})
    timings.reset()
    result = up._boot(cfg, {}, build_plan(cfg), found, status="started", t0=0.0,  # type: ignore[arg-type]
                      run_gates=run_gates, say=said.append, on_update=None)
    return calls, said, result


def test_up_with_gates_watches_the_settle_window_after_them(monkeypatch, cfg: Config) -> None:
    calls, said, result = _boot(monkeypatch, cfg, run_gates=True)
    assert [c for c, _ in calls] == ["start", "wait", "parity", "gates", "settle", "journal"]
    assert ("settle", 2.5) in calls and ("journal", "up+gates") in calls
    assert any(s.startswith("settle: watching every rank 2.5s more") for s in said)
    assert result.gates is not None and result.boot_seconds == 42.0
    names = [s["span"] for s in timings.spans()]
    for name in ("boot: start", "boot: wait for the head", "boot: parity", "gates", "settle"):
        assert name in names, names


def test_up_without_gates_sits_in_no_settle_window_and_says_so(monkeypatch, cfg: Config) -> None:
    calls, said, result = _boot(monkeypatch, cfg, run_gates=False)
    assert [c for c, _ in calls] == ["start", "wait", "parity", "journal"]  # no gates, no settle
    assert ("journal", "up") in calls and result.gates is None
    assert "no gates: no settle window either (gates.settle_s 2.5s follows the gates)" in said
    names = [s["span"] for s in timings.spans()]
    assert "settle" not in names and "gates" not in names and "boot: wait for the head" in names


def test_up_without_gates_and_no_settle_window_configured_says_nothing_of_it(monkeypatch, cfg: Config) -> None:
    cfg = cfg.model_copy(update={"gates": cfg.gates.model_copy(update={"settle_s": 0.0})})
    _, said, _ = _boot(monkeypatch, cfg, run_gates=False)
    assert not any("settle" in s for s in said)


def test_parity_of_a_one_rank_stack_asks_no_node(monkeypatch, cfg: Config) -> None:
    """One rank has nothing to compare with: `up` on one GPU spends no round trip on it; two ranks are asked."""
    from sparkserve.deploy import parity

    asked: list[str] = []

    class Engine:
        def __init__(self, node: str) -> None:
            self.node = node

        def parity_facts(self, ref: str) -> dict[str, object]:
            asked.append(self.node)
            return {"image_id": "sha256:1", "argv": ["vllm"], "env": {}, "mounts": []}

    monkeypatch.setattr(parity, "engine_for", lambda node, how=None: Engine(node))
    one = cfg.model_copy(update={"nodes": cfg.nodes[:1]})
    parity.check_parity(one, {one.nodes[0].name: one.nodes[0].name}, {one.nodes[0].name: "c"})  # type: ignore[dict-item]
    assert asked == []
    parity.check_parity(cfg, {n.name: n.name for n in cfg.nodes}, {n.name: "c" for n in cfg.nodes})  # type: ignore[misc]
    assert sorted(asked) == sorted(n.name for n in cfg.nodes)
