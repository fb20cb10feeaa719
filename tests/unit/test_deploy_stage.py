"""The deploy stage without a rig: rank parity's wording, the one wait, the gate failure `up` raises, and the
records behind `up/down/status/swap-drafter --json` (their shapes are the CLI's contract)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkserve.config import Config, load_config
from sparkserve.deploy import parity, up, wait
from sparkserve.deploy.stack import ApiStatus, ContainerStatus, DownResult, StackStatus
from sparkserve.deploy.swap import SwapResult
from sparkserve.deploy.up import UpResult
from sparkserve.deploy.wait import BootFailure, wait_running
from sparkserve.errors import GateFailed, RemoteFailure
from sparkserve.nodes.engine import ContainerState
from sparkserve.observe.gate_report import Evidence, GateReport, Verdict
from sparkserve.observe.logpatterns import FOLLOWER_WAITING
from sparkserve.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg() -> Config:
    return load_config(REPO / "sparkserve" / "data" / "default.yaml")


# -- rank parity ------------------------------------------------------------------------------------------


class FactsEngine:
    """Engine stand-in: each node's container reports the parity facts given for it."""

    facts: dict[str, dict[str, object]] = {}

    def __init__(self, node: str) -> None:
        self.node = node

    def parity_facts(self, ref: str) -> dict[str, object]:
        return self.facts[self.node]


def test_parity_names_the_drifted_rank_and_the_flag_that_changed(monkeypatch, cfg: Config) -> None:
    head, follower = cfg.nodes[0].name, cfg.nodes[1].name
    same = {"image_id": "sha256:1", "env": {"A": "1"}, "mounts": ["/m:/m:ro"]}
    FactsEngine.facts = {head: same | {"argv": ["vllm", "serve", "--max-num-seqs", "4"]},
                         follower: same | {"argv": ["vllm", "serve", "--max-num-seqs", "8"]}}
    monkeypatch.setattr(parity, "engine_for", lambda node, how=None: FactsEngine(node))
    with pytest.raises(RemoteFailure) as e:
        parity.check_parity(cfg, {head: head, follower: follower}, {head: "c0", follower: "c1"})  # type: ignore[dict-item]
    assert e.value.node == follower and e.value.step == "rank parity"
    assert e.value.what == ("argv differs from spark-a: head has '--max-num-seqs 4', this rank has "
                            "'--max-num-seqs 8'")


def test_parity_passes_when_every_rank_matches_the_head(monkeypatch, cfg: Config) -> None:
    facts = {"image_id": "sha256:1", "argv": ["vllm"], "env": {}, "mounts": []}
    FactsEngine.facts = {n.name: facts for n in cfg.nodes}
    monkeypatch.setattr(parity, "engine_for", lambda node, how=None: FactsEngine(node))
    parity.check_parity(cfg, {n.name: n.name for n in cfg.nodes}, {n.name: "c" for n in cfg.nodes})  # type: ignore[misc]


def test_difference_of_envs_names_the_keys_and_of_uneven_lists_the_extra_items() -> None:
    assert parity.describe_difference({"A": "1", "B": "2"}, {"A": "1", "B": "3"}) == "B: '2' vs '3'"
    assert parity.describe_difference(["/a", "/b"], ["/a"]) == "head has ['/b'], this rank has []"


# -- the one wait -----------------------------------------------------------------------------------------


class LogEngine:
    """Engine stand-in: every container runs (or not) and has logged the given lines."""

    lines: dict[str, list[str]] = {}
    running: dict[str, bool] = {}

    def __init__(self, node: str) -> None:
        self.node = node

    def state(self, cid: str) -> ContainerState:
        up = self.running.get(self.node, True)
        return ContainerState("running" if up else "exited", up, None if up else 1, False, "", "", "")

    def logs(self, cid: str, *, tail: int, timestamps: bool) -> list[str]:
        return [f"2026-01-01T00:00:0{i}.0Z {line}" for i, line in enumerate(self.lines.get(self.node, []))]


@pytest.mark.timeout(30)
def test_wait_running_returns_once_every_follower_logged_its_marker(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    f = plan.followers[0].node
    line = ("(EngineCore pid=77) INFO 11-29 17:51:01 [core.py:93] Launching vLLM (v0.33.0) headless multiproc "
            "executor, with head node address 10.0.0.1:29501 for torch.distributed process group.")
    LogEngine.lines, LogEngine.running = {f: ["starting", line]}, {}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: LogEngine(node))
    # no timeout to fall back on: only the marker line can end this wait
    wait_running(plan, {f: f}, {f: "c1"}, marker=FOLLOWER_WAITING, timeout_s=3600)  # type: ignore[dict-item]


def test_wait_running_names_the_follower_whose_container_stopped(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    f = plan.followers[0].node
    LogEngine.lines, LogEngine.running = {f: ["ValueError: bad flag"]}, {f: False}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: LogEngine(node))
    with pytest.raises(BootFailure) as e:
        wait_running(plan, {f: f}, {f: "c1"}, marker=FOLLOWER_WAITING, timeout_s=5)  # type: ignore[dict-item]
    assert e.value.node == f and "stopped (exit code 1)" in e.value.what
    assert "ValueError: bad flag" in e.value.details


def test_wait_running_lets_a_quiet_running_rank_through_after_the_timeout(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    f = plan.followers[0].node
    LogEngine.lines, LogEngine.running = {f: ["loading"]}, {}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: LogEngine(node))
    wait_running(plan, {f: f}, {f: "c1"}, marker=re.compile("never logged"), timeout_s=0.05, poll_s=0.01)  # type: ignore[dict-item]


# -- the gates `up` runs ----------------------------------------------------------------------------------


def report(faults_ok: bool) -> GateReport:
    return GateReport([
        Verdict("pool", True, 1, [1], "fine"),
        Verdict("faults", faults_ok, None, None, "node-b died",
                [Evidence("node-b", 7, "WorkerProc failed to start"), Evidence("node-b", 9, "again")]),
    ])


def test_a_failed_gate_stops_up_naming_the_gate_its_nodes_and_evidence(monkeypatch, cfg: Config) -> None:
    monkeypatch.setattr(up, "collect_and_judge", lambda *a, **k: report(False))
    with pytest.raises(GateFailed) as e:
        up._gate(cfg, {}, build_plan(cfg), {})
    assert e.value.what == "faults (node-b) failed after boot; the stack was stopped"
    assert e.value.details == ["faults: node-b died", "  node-b:7: WorkerProc failed to start", "  node-b:9: again"]


def test_passing_gates_come_back_typed(monkeypatch, cfg: Config) -> None:
    monkeypatch.setattr(up, "collect_and_judge", lambda *a, **k: report(True))
    assert up._gate(cfg, {}, build_plan(cfg), {}).ok


def test_up_runs_the_gates_and_validates_unless_told_not_to() -> None:
    import inspect

    params = inspect.signature(up.up).parameters
    assert params["run_gates"].default is True and params["validate"].default is True


# -- the --json records -----------------------------------------------------------------------------------


def test_up_json_keeps_its_keys_in_order_with_the_gate_report_as_json() -> None:
    r = UpResult("started", "http://h:8000", "m", "fp", "sha256:i", "d", 1.5, 1.0, {"a": "c"}, {"a": "same"},
                 report(True))
    out = r.to_json()
    assert list(out) == ["status", "api_url", "served_name", "fingerprint", "image_id", "drafter_digest",
                         "seconds", "boot_seconds", "containers", "sync", "gates"]
    assert out["gates"] == report(True).to_json()
    assert UpResult("unchanged", "u", "m", "fp", "i", "d", 0.1).to_json()["gates"] is None
    json.dumps(out)


def test_down_json() -> None:
    assert DownResult().to_json() == {"removed": {}, "logs": None, "unreachable": {}}
    gone = {"b": RemoteFailure("b: ssh", "cannot connect to 10.0.0.2:22", node="b", step="ssh")}
    assert DownResult({"a": ["x"]}, Path("/l"), gone).to_json() == {
        "removed": {"a": ["x"]}, "logs": "/l", "unreachable": {"b": "ssh: cannot connect to 10.0.0.2:22"}}


def test_status_json() -> None:
    c = ContainerStatus("x", "0123456789ab", 0, "head", "running", "fp", "sha256:i")
    st = StackStatus({"a": [c], "b": []}, ApiStatus("http://h", True, ["m"]), False, ["fp"])
    assert st.to_json() == {
        "nodes": {"a": [{"name": "x", "id": "0123456789ab", "rank": 0, "role": "head", "status": "running",
                         "deployment": "fp", "image_id": "sha256:i"}], "b": []},
        "api": {"url": "http://h", "serving": True, "models": ["m"]}, "ok": False, "deployments": ["fp"],
        "unreachable": {}}


def test_swap_json_has_the_keys_of_its_outcome() -> None:
    ok = SwapResult(True, False, "swapped", drafter_path="/d", drafter_digest="g", deployment="fp",
                    gates=report(True))
    assert list(ok.to_json()) == ["ok", "rolled_back", "drafter_path", "drafter_digest", "deployment", "gates",
                                  "message"]
    back = SwapResult(False, True, "rolled back", error="e", details=["x"], deployment="fp0")
    assert back.to_json() == {"ok": False, "rolled_back": True, "error": "e", "details": ["x"],
                              "deployment": "fp0", "message": "rolled back"}
    lost = SwapResult(False, False, "nothing runs", error="e", rollback_error="e2")
    assert lost.to_json() == {"ok": False, "rolled_back": False, "error": "e", "rollback_error": "e2",
                              "message": "nothing runs"}


def test_swap_refuses_a_wrong_drafter_before_hashing_its_weights(monkeypatch, cfg: Config, tmp_path: Path) -> None:
    """A 6 GB weights file took 26 s to hash before a bad header was reported: the cheap checks go first."""
    from sparkserve.deploy import swap
    from sparkserve.errors import BadInput

    seen: list[Path | None] = []

    def validate(c: Config, nodes: object) -> None:
        seen.append(c.drafter.source)
        raise BadInput("drafter.source", "no mask_embedding.pt")

    def never(_: Path) -> None:
        raise AssertionError("the drafter was hashed before it was validated")

    monkeypatch.setattr(swap, "validate_inputs", validate)
    monkeypatch.setattr(swap, "manifest", never)
    with pytest.raises(BadInput):
        swap.swap_drafter(cfg, {}, tmp_path)
    assert seen == [tmp_path.resolve()]  # the new drafter was the one validated
