"""Who is blamed, and what is said, when a boot or a node fails: a follower's root cause relayed by the head,
a docker daemon that stops answering under a running container, nodes that cannot be reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.config import Config, load_config
from sparkserve.deploy import wait
from sparkserve.deploy.wait import BootFailure, wait_running
from sparkserve.nodes.engine import ContainerState
from sparkserve.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg() -> Config:
    return load_config(REPO / "sparkserve" / "data" / "default.yaml")


class StampedEngine:
    """Engine stand-in: each node's container log as (docker timestamp, line) and whether it runs."""

    logs_of: dict[str, list[tuple[str, str]]] = {}
    exited: dict[str, tuple[int, str]] = {}  # node → (exit code, FinishedAt)

    def __init__(self, node: str) -> None:
        self.node = node

    def state(self, cid: str) -> ContainerState:
        if self.node in self.exited:
            code, at = self.exited[self.node]
            return ContainerState("exited", False, code, False, "", "", at)
        return ContainerState("running", True, None, False, "", "", "0001-01-01T00:00:00Z")

    def logs(self, cid: str, *, tail: int, timestamps: bool) -> list[str]:
        return [f"{s} {line}" for s, line in self.logs_of.get(self.node, [])]

    def daemon_answers(self, *, watch_s: float = 0.0) -> bool:
        return True

    def restarted_since(self, cid: str, started_at: str) -> bool:
        return False


W = "(Worker_TP1_EP1 pid=175) ERROR 12-01 09:53:51 [multiproc_executor.py:1189] "
E = "(EngineCore pid=183) ERROR 12-01 09:53:51 [core.py:1584] "
FOLLOWER_CAPTURE_CRASH = [
    ("2026-12-01T09:53:51.100Z", "(Worker_TP1_EP1 pid=175) INFO 12-01 09:53:51 [gpu_worker.py:676] Initial free "
                                 "memory 118.31 GiB, reserved 8.0 GiB memory for KV Cache"),
    ("2026-12-01T09:53:51.540Z", W + "WorkerProc hit an exception."),
    ("2026-12-01T09:53:51.541Z", W + "Traceback (most recent call last):"),
    ("2026-12-01T09:53:51.541Z", W + '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/'
                                     'multiproc_executor.py", line 1177, in worker_busy_loop'),
    ("2026-12-01T09:53:51.541Z", W + "    output = func(*args, **kwargs)"),
    ("2026-12-01T09:53:51.541Z", W + "RuntimeError: CUDA error: an illegal memory access was encountered"),
    ("2026-12-01T09:53:51.700Z", "[rank1]:[W1201 09:53:51.564994816 TCPStore.cpp:125] [c10d] recvValue failed on "
                                 "SocketImpl(fd=31): Failed to recv, got 0 bytes. Connection was likely closed."),
]
HEAD_RELAY = [
    ("2026-12-01T09:53:51.560Z", E + "EngineCore failed to start."),
    ("2026-12-01T09:53:51.560Z", E + "Traceback (most recent call last):"),
    ("2026-12-01T09:53:51.561Z", E + "RuntimeError: Worker failed with error 'CUDA error: an illegal memory "
                                     "access was encountered', please check the stack trace above for the root cause"),
    ("2026-12-01T09:53:51.600Z", "RuntimeError: Engine core initialization failed. See root cause above. Failed "
                                 "core proc(s): {'EngineCore': 1}"),
]
HEAD_OWN_CRASH = [
    ("2026-12-01T09:53:51.300Z", "(Worker_TP0_EP0 pid=90) ERROR 12-01 09:53:51 [multiproc_executor.py:1189] "
                                 "RuntimeError: NCCL error: unhandled system error"),
    ("2026-12-01T09:53:51.560Z", E + "EngineCore failed to start."),
]
FOLLOWER_AFTER_HEAD = [  # what a follower logs once the head is gone: consequences, not causes
    ("2026-12-01T09:53:51.900Z", "[rank1]:[W1201 09:53:51.9 TCPStore.cpp:125] [c10d] recvValue failed on "
                                 "SocketImpl(fd=31): Failed to recv, got 0 bytes. Connection was likely closed."),
    ("2026-12-01T09:53:51.950Z", W + "RuntimeError: NCCL error: remote process exited or there was a network "
                                     "error"),
]


def _boot(monkeypatch, cfg: Config, logs: dict[str, list[tuple[str, str]]],
          exited: dict[str, tuple[int, str]]) -> BootFailure:
    plan = build_plan(cfg)
    StampedEngine.logs_of, StampedEngine.exited = logs, exited
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: StampedEngine(node))
    names = [s.node for s in plan.specs]
    with pytest.raises(BootFailure) as e:
        wait_running(plan, {n: n for n in names}, {n: f"c-{n}" for n in names})  # type: ignore[misc]
    return e.value


def test_a_follower_crash_relayed_by_the_head_is_the_followers(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    head, follower = plan.head.node, plan.followers[0].node
    f = _boot(monkeypatch, cfg, {head: HEAD_RELAY, follower: FOLLOWER_CAPTURE_CRASH},
              {head: (1, "2026-12-01T09:53:51.700Z")})
    assert f.node == follower and f.step == "boot"
    assert "rank 1" in f.what and "RuntimeError: CUDA error: an illegal memory access was encountered" in f.what
    assert any(head in d and "rank 0" in d for d in f.details)  # the head's own stop rides along


def test_the_heads_own_crash_stays_the_heads(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    head, follower = plan.head.node, plan.followers[0].node
    f = _boot(monkeypatch, cfg, {head: HEAD_OWN_CRASH, follower: FOLLOWER_AFTER_HEAD},
              {head: (1, "2026-12-01T09:53:51.700Z")})
    assert f.node == head


OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of "
       "119.70 GiB of which 1.07 GiB is free. Including non-PyTorch memory, this process has 118.30 GiB memory in "
       "use. Of the allocated memory 116.60 GiB is allocated by PyTorch, and 412.00 MiB is reserved by PyTorch but "
       "unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
       "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def test_the_oom_headline_quotes_the_line_from_its_start(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    follower = plan.followers[0].node
    f = _boot(monkeypatch, cfg, {follower: [("2026-12-01T09:53:51.5Z", W + OOM)]}, {})
    assert f.node == follower
    quoted = f.what.split("fatal line: ", 1)[1]
    assert quoted.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB.")
    assert quoted.endswith("…") and OOM.startswith(quoted[:-1])  # clipped at the end only


def test_the_graphs_headline_names_the_node_lacking_capture_not_the_healthy_one() -> None:
    from sparkserve.observe.gate_inputs import Expectations, NodeIdentity, SmokeResult
    from sparkserve.observe.gates import judge
    from sparkserve.observe.logs import parse_log

    logs_dir = REPO / "tests" / "fixtures" / "logs"
    lg = {n: parse_log((logs_dir / f).read_bytes(), file=f)
          for n, f in (("spark-a", "v0.33-head.log"), ("spark-b", "v0.33-follower-rank1-nographs.log"))}
    same = NodeIdentity("sha256:aa", "sha256:dd")
    r = judge(lg, Expectations.from_config(load_config(None), mask_file=True),
              smoke=SmokeResult(20, 20, 0, 0), liveness={"spark-a": True, "spark-b": True},
              identity={"spark-a": same, "spark-b": same})
    g = r.get("graphs")
    assert not g.ok and g.headline() == "graphs (spark-b)"
    assert g.evidence[0].node == "spark-b"  # what failed leads; the healthy rank's capture line follows


class DaemonGoneEngine(StampedEngine):
    """The follower's docker daemon stops: its container reads as exited 0 (the daemon stopped it on its way
    down), or inspecting it fails outright; either way the daemon no longer answers a ping."""

    inspect_fails = False
    logs_fail = False  # inspect answered, then the daemon went before the log read (seen on the rig: issue 26 A2)

    def state(self, cid: str) -> ContainerState:
        if self.inspect_fails and self.node in self.exited:
            from sparkserve.nodes.base import NodeError

            raise NodeError(self.node, "inspect", "Cannot connect to the Docker daemon")
        if self.logs_fail and self.node in self.exited:
            return ContainerState("running", True, None, False, "", "", "0001-01-01T00:00:00Z")
        return super().state(cid)

    def logs(self, cid: str, *, tail: int, timestamps: bool) -> list[str]:
        if self.logs_fail and self.node in self.exited:
            from sparkserve.nodes.base import NodeError

            raise NodeError(self.node, "logs", "dockerd not reachable: Cannot connect to the Docker daemon")
        return super().logs(cid, tail=tail, timestamps=timestamps)

    def daemon_answers(self, *, watch_s: float = 0.0) -> bool:
        return self.node not in self.exited


@pytest.mark.parametrize(("inspect_fails", "logs_fail"), [(False, False), (True, False), (False, True)],
                         ids=["stopped-it", "inspect-fails", "log-read-fails"])
def test_a_docker_daemon_that_stops_under_a_running_container_is_not_an_engine_exit(
        monkeypatch, cfg: Config, inspect_fails: bool, logs_fail: bool) -> None:
    plan = build_plan(cfg)
    follower = plan.followers[0].node
    DaemonGoneEngine.inspect_fails, DaemonGoneEngine.logs_fail = inspect_fails, logs_fail
    StampedEngine.logs_of, StampedEngine.exited = {}, {follower: (0, "2026-12-01T09:53:51Z")}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: DaemonGoneEngine(node))
    with pytest.raises(BootFailure) as e:
        wait_running(plan, {follower: follower}, {follower: "0123456789abcdef"})  # type: ignore[dict-item]
    f = e.value
    assert (f.node, f.step) == (follower, "docker") and "exit code" not in f.what
    assert "docker daemon stopped answering" in f.what and "0123456789ab may still be on the node" in f.what


class RestartedDaemonEngine(StampedEngine):
    """A daemon killed and restarted (systemd) between two looks: it answers again, has no record of the rank's
    container starting, and reports that container exited 137 (OOMKilled when ``oom``)."""

    oom = False

    def state(self, cid: str) -> ContainerState:
        return ContainerState("exited", False, 137, self.oom, "", "2026-12-01T09:53:40Z", "2026-12-01T09:53:51Z")

    def restarted_since(self, cid: str, started_at: str) -> bool:
        assert started_at == "2026-12-01T09:53:40Z"
        return True


def test_a_rank_stopped_by_a_restarted_docker_daemon_names_the_daemon(monkeypatch, cfg: Config) -> None:
    """Issue 29: exit 137 from a daemon that came back between two looks is the node's docker, not the engine."""
    plan = build_plan(cfg)
    follower = plan.followers[0].node
    RestartedDaemonEngine.oom, StampedEngine.logs_of = False, {}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: RestartedDaemonEngine(node))
    with pytest.raises(BootFailure) as e:
        wait_running(plan, {follower: follower}, {follower: "0123456789abcdef"})  # type: ignore[dict-item]
    assert (e.value.node, e.value.step) == (follower, "docker") and "exit code" not in e.value.what
    assert "restarted since rank 1's container started" in e.value.what


def test_an_oom_killed_rank_is_the_engines_own_exit_even_with_a_restarted_daemon(monkeypatch, cfg: Config) -> None:
    plan = build_plan(cfg)
    follower = plan.followers[0].node
    RestartedDaemonEngine.oom, StampedEngine.logs_of = True, {}
    monkeypatch.setattr(wait, "engine_for", lambda node, how=None: RestartedDaemonEngine(node))
    with pytest.raises(BootFailure) as e:
        wait_running(plan, {follower: follower}, {follower: "0123456789abcdef"})  # type: ignore[dict-item]
    assert e.value.step == "boot" and "exit code 137, OOM-killed" in e.value.what
