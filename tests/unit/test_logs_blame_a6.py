"""A6 (issue 26): the head crashes at boot; the healthy follower then reports that it lost its peer. The headline
quotes the head's own cause, never the follower's "the remote server went away" line, whatever the stamps say."""

from __future__ import annotations

import pytest
from test_reach_and_blame import StampedEngine, _boot, cfg  # noqa: F401  (cfg is a fixture)

from sparkserve.config import Config
from sparkserve.deploy import wait
from sparkserve.observe.logpatterns import PEER_LOST
from sparkserve.plan.build import build_plan

WK = "(Worker pid=90) ERROR 12-01 09:53:51 [multiproc_executor.py:1057] "
EC = "(EngineCore pid=83) ERROR 12-01 09:53:51 [core.py:1584] "
T = "2026-12-01T09:53:51.{ms:03d}Z"


def head_crash(at_ms: int) -> list[tuple[str, str]]:
    """The head's worker fails NCCL init (as the rig emulator and real vLLM print it), EngineCore relays it."""
    return [
        (T.format(ms=at_ms), WK + "WorkerProc failed to start."),
        (T.format(ms=at_ms), WK + "Traceback (most recent call last):"),
        (T.format(ms=at_ms), WK + '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/'
                                  'device_communicators/pynccl_wrapper.py", line 464, in NCCL_CHECK'),
        (T.format(ms=at_ms), WK + "    raise RuntimeError(f\"NCCL error: {error_str}\")"),
        (T.format(ms=at_ms), WK + "RuntimeError: NCCL error: unhandled system error"),
        (T.format(ms=at_ms + 40), EC + "EngineCore failed to start."),
    ]


def follower_lost_head(at_ms: int) -> list[tuple[str, str]]:
    """The real c10d wording (Anemll/dspark-vllm-gx10 worker logs, tests/fixtures/logs/public)."""
    return [
        (T.format(ms=at_ms), f"[rank1]:[W1201 09:53:51.{at_ms:03d}988395 TCPStore.cpp:125] [c10d] recvValue failed "
                             "on SocketImpl(fd=29, addr=[spark-b]:49450, remote=[::ffff:10.200.0.1]:25000): Failed to "
                             "recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or "
                             "crash?"),
        (T.format(ms=at_ms + 1), f"[rank1]:[W1201 09:53:51.{at_ms + 1:03d}135540 ProcessGroupNCCL.cpp:1826] [PG ID 0 "
                                 "PG GUID 0 Rank 1] Failed to check the \"should dump\" flag on TCPStore, (maybe "
                                 "TCPStore server has shut down too early), with error: Failed to recv, got 0 bytes."),
    ]


@pytest.mark.parametrize("follower_ms", [302, 298, 250])  # 2 ms after the head's crash, 2 ms and 50 ms before
def test_the_heads_crash_is_quoted_never_the_follower_that_lost_it(monkeypatch, cfg: Config,  # noqa: F811
                                                                   follower_ms: int) -> None:
    plan = build_plan(cfg)
    head, follower = plan.head.node, plan.followers[0].node
    f = _boot(monkeypatch, cfg, {head: head_crash(300), follower: follower_lost_head(follower_ms)},
              {head: (1, T.format(ms=400))})
    assert f.node == head and f.step == "boot", f.what
    assert "RuntimeError: NCCL error: unhandled system error" in f.what  # the cause, not the header above it
    assert "recvValue" not in f.what and "WorkerProc failed to start" not in f.what


def test_a_follower_that_exited_after_losing_the_head_is_not_the_cause(monkeypatch, cfg: Config) -> None:  # noqa: F811
    """The follower's container exited (it lost the store) and docker stamped its exit before the head's: still the
    head's crash is the cause; the follower's exit rides along."""
    plan = build_plan(cfg)
    head, follower = plan.head.node, plan.followers[0].node
    f = _boot(monkeypatch, cfg, {head: head_crash(300), follower: follower_lost_head(298)},
              {head: (1, T.format(ms=400)), follower: (1, T.format(ms=299))})
    assert f.node == head and "NCCL error: unhandled system error" in f.what
    assert any(follower in d for d in f.details)


def test_a_follower_with_a_cause_of_its_own_is_still_blamed(monkeypatch, cfg: Config) -> None:  # noqa: F811
    """The rule is about peer-lost lines only: a follower whose own root cause came first keeps the blame."""
    plan = build_plan(cfg)
    head, follower = plan.head.node, plan.followers[0].node
    own = [(T.format(ms=100), "(Worker_TP1_EP1 pid=175) ERROR 12-01 09:53:51 [multiproc_executor.py:1189] "
                              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB.")]
    f = _boot(monkeypatch, cfg, {head: head_crash(300), follower: own + follower_lost_head(310)},
              {head: (1, T.format(ms=400))})
    assert f.node == follower and "CUDA out of memory" in f.what


@pytest.mark.parametrize("line", [
    "[c10d] recvValue failed on SocketImpl(fd=31): Failed to recv, got 0 bytes. Did the remote server shutdown or "
    "crash?",
    "[c10d] sendBytes failed on SocketImpl(fd=12, addr=[::ffff:10.0.0.2]:41000, remote=[10.0.0.1]:29501): Broken pipe",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:62115",
    "ConnectionResetError: [Errno 104] Connection reset by peer",
])
def test_peer_lost_lines(line: str) -> None:
    assert PEER_LOST.search(line)


def test_a_cause_is_not_a_peer_lost_line() -> None:
    for line in ("RuntimeError: NCCL error: unhandled system error", "torch.OutOfMemoryError: CUDA out of memory.",
                 "ValueError: Free memory on device cuda:0 (28.77/139.8 GiB) on startup is less than desired"):
        assert not PEER_LOST.search(line)
    assert wait._only_lost_its_peer(wait.NodeView("b", 1, "c", log=[ln for _, ln in follower_lost_head(5)]))


def test_a_stopped_rank_is_headlined_with_its_logs_cause(monkeypatch, cfg: Config) -> None:  # noqa: F811
    """Issue 26 item 2: the headline was `rank 0 … stopped (exit code 1)` / `EngineCore failed to start.` with the
    cause on a later line. The real public log of vllm-project/vllm#25837 (free memory below GMU): its ValueError
    leads."""
    from pathlib import Path

    log = Path(__file__).resolve().parents[1] / "fixtures/logs/public/vllm-25837-free-memory-less-than-gmu.log"
    lines = [(T.format(ms=100), ln) for ln in log.read_text().splitlines()]
    plan = build_plan(cfg)
    f = _boot(monkeypatch, cfg, {plan.head.node: lines}, {plan.head.node: (1, T.format(ms=400))})
    assert f.node == plan.head.node and "stopped (exit code 1): " in f.what
    assert "ValueError: Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU memory" in f.what
