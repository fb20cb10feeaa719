"""The deploy stage without a rig: rank parity's wording, the one wait, the gate failure `up` raises, and the
records behind `up/down/status/swap-drafter --json` (their shapes are the CLI's contract)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from sparkserve.config import Config, load_config
from sparkserve.deploy import gates_live, parity, up, wait
from sparkserve.deploy.stack import ApiStatus, ContainerStatus, DownResult, StackStatus
from sparkserve.deploy.swap import SwapResult
from sparkserve.deploy.up import UpResult
from sparkserve.deploy.wait import BootFailure, wait_running
from sparkserve.errors import GateFailed, RemoteFailure
from sparkserve.nodes.engine import ContainerState
from sparkserve.observe.gate_report import Evidence, GateReport, Verdict
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

    def daemon_answers(self, *, watch_s: float = 0.0) -> bool:  # asked before a stopped container is blamed
        return True

    def restarted_since(self, cid: str, started_at: str) -> bool:
        return False


def test_wait_running_names_the_follower_whose_container_stopped(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    f = plan.followers[0].node
    LogEngine.lines, LogEngine.running = {f: ["ValueError: bad flag"]}, {f: False}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: LogEngine(node))
    with pytest.raises(BootFailure) as e:
        wait_running(plan, {f: f}, {f: "c1"})  # type: ignore[dict-item]
    assert e.value.node == f and "stopped (exit code 1)" in e.value.what
    assert "ValueError: bad flag" in e.value.details


def test_wait_running_lets_a_running_rank_through_after_one_look(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    f = plan.followers[0].node
    LogEngine.lines, LogEngine.running = {f: ["loading"]}, {}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: LogEngine(node))
    wait_running(plan, {f: f}, {f: "c1"})  # type: ignore[dict-item]


class StartEngine:
    """Engine stand-in for `up`'s start step: records every call, in order, across nodes."""

    calls: list[tuple[str, str]] = []

    def __init__(self, node: str) -> None:
        self.node = node

    def run(self, spec: object, *, make_dirs: bool = True) -> str:
        time.sleep(0.05 if self.node != "n0" else 0)  # followers take a while to start
        StartEngine.calls.append(("run", self.node))
        return f"c-{self.node}"

    def state(self, cid: str) -> ContainerState:
        StartEngine.calls.append(("state", self.node))
        return ContainerState("running", True, None, False, "", "", "")

    def logs(self, cid: str, **kw: object) -> list[str]:
        StartEngine.calls.append(("logs", self.node))
        return []


def test_the_head_starts_once_every_follower_runs_without_waiting_for_their_logs(monkeypatch,
                                                                                 tmp_path: Path) -> None:
    from _fixtures import config_file

    cfg3 = load_config(config_file(tmp_path / "c.yaml", {
        "nodes": [{"name": f"n{i}", "host": f"h{i}.lan", "fabric_ip": f"10.0.0.{i + 1}"} for i in range(3)],
        "serve": {"tensor_parallel_size": 3}}))
    plan = build_plan(cfg3)
    StartEngine.calls = []
    monkeypatch.setattr(up, "engine_for", lambda node, how=None: StartEngine(node))
    started: dict[str, list[str]] = {}
    containers = up._start(plan, {n: n for n in ("n0", "n1", "n2")}, started, lambda _: None)  # type: ignore[misc]
    assert sorted(StartEngine.calls[:2]) == [("run", "n1"), ("run", "n2")]  # both followers, side by side
    assert StartEngine.calls[2:] == [("run", "n0")]  # then the head, with nothing read from the followers
    assert containers == {"n0": "c-n0", "n1": "c-n1", "n2": "c-n2"} and started == {k: [v] for k, v in
                                                                                   containers.items()}


class ApiServer:
    """/v1/models on 127.0.0.1: 503 until ``ready`` is set, then the served model; records the auth header."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.auth: list[str | None] = []
        self.paths: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.auth.append(self.headers.get("Authorization"))
                outer.paths.append(self.path)
                ok = outer.ready.is_set() and self.path.endswith("/v1/models")
                body = json.dumps({"data": [{"id": "m"}]}).encode() if ok else b"{}"
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_served_models_sends_the_key_and_is_none_until_the_api_serves() -> None:
    api = ApiServer()
    try:
        assert wait.served_models(api.url, api_key="k") is None  # 503
        api.ready.set()
        assert wait.served_models(api.url, api_key="k") == ["m"] and api.auth[-1] == "Bearer k"
        assert wait.served_models(api.url) == ["m"] and api.auth[-1] is None
    finally:
        api.close()
    assert wait.served_models(api.url, timeout=0.5) is None  # nobody listens


def test_served_models_goes_through_the_proxy_the_environment_names(monkeypatch) -> None:
    api = ApiServer()
    api.ready.set()
    try:
        monkeypatch.setenv("http_proxy", api.url)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        assert wait.served_models("http://spark-a.invalid:8000") == ["m"]
        assert api.paths[-1] == "http://spark-a.invalid:8000/v1/models"  # the proxy was asked for the URL
        monkeypatch.setenv("no_proxy", "spark-a.invalid")
        assert wait.served_models("http://spark-a.invalid:8000", timeout=0.5) is None  # exempt: direct
    finally:
        api.close()


@pytest.mark.timeout(30)
def test_wait_ready_sees_the_api_between_looks_and_looks_at_every_rank_once_more(monkeypatch, cfg: Config) -> None:
    api = ApiServer()
    host, port = api.url.removeprefix("http://").split(":")
    cfg = cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"host": host, "port": int(port)}),
                                 "model": cfg.model.model_copy(update={"served_name": "m"})})
    plan = build_plan(cfg)
    looks: list[float] = []
    monkeypatch.setattr(wait, "_poll_all", lambda *a, **k: looks.append(time.monotonic()))
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: LogEngine(node))
    threading.Timer(0.3, api.ready.set).start()
    try:
        t0 = time.monotonic()
        wait.wait_ready(plan, {n.name: n.name for n in cfg.nodes}, {n.name: "c" for n in cfg.nodes},  # type: ignore[misc]
                        timeout_s=60, poll_s=20)
        took = time.monotonic() - t0
    finally:
        api.close()
    assert 0.3 <= took < 5  # between two looks 20 s apart: the API alone was asked
    assert len(looks) == 2 and looks[1] - t0 >= 0.3  # the first look, and one after the API served


# -- the gates `up` runs ----------------------------------------------------------------------------------


def report(faults_ok: bool) -> GateReport:
    return GateReport([
        Verdict("pool", True, 1, [1], "fine"),
        Verdict("faults", faults_ok, None, None, "node-b died",
                [Evidence("node-b", 7, "WorkerProc failed to start"), Evidence("node-b", 9, "again")]),
    ])


def test_a_failed_gate_stops_up_naming_the_gate_its_nodes_and_evidence(monkeypatch, cfg: Config) -> None:
    monkeypatch.setattr(gates_live, "collect_and_judge", lambda *a, **k: report(False))
    with pytest.raises(GateFailed) as e:
        up._gate(cfg, {}, build_plan(cfg), {})
    assert e.value.what == "faults (node-b) failed after boot; the stack was stopped"
    assert e.value.details == ["faults: node-b died", "  node-b:7: WorkerProc failed to start", "  node-b:9: again"]


def test_passing_gates_come_back_typed(monkeypatch, cfg: Config) -> None:
    monkeypatch.setattr(gates_live, "collect_and_judge", lambda *a, **k: report(True))
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
        "gates_this_boot": "not judged", "unreachable": {}}


def test_swap_json_has_the_keys_of_its_outcome() -> None:
    ok = SwapResult(True, False, "swapped", drafter_path="/d", drafter_digest="g", deployment="fp",
                    gates=report(True))
    assert list(ok.to_json()) == ["ok", "rolled_back", "unchanged", "drafter_path", "drafter_digest", "deployment",
                                  "gates", "message"]
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
