"""Issue 26's fault cases that need real daemons and real disks (the reliability list's A2, A30, A34, E3): each
ends with the exit code the contract gives, a headline naming the cause, and nothing of ours left on a node."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import rig as riglib

pytestmark = pytest.mark.rig


def kill_dockerd(n) -> None:
    """SIGKILL the node's dockerd (what the OOM killer or a crash does: no graceful shutdown)."""
    pid = riglib.read_pid(Path(n.dir) / "dockerd.pid")
    assert pid and riglib.pid_alive(pid)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while riglib.docker_ping(n.docker_socket):
        assert time.monotonic() - t0 < 10
        time.sleep(0.05)


def wait_for(proc: subprocess.Popen, seen: list[str], needle: str, timeout: float = 90) -> None:
    """Read ``proc``'s stderr until a line holds ``needle`` (kept in ``seen``)."""
    assert proc.stderr is not None
    t0 = time.monotonic()
    for line in proc.stderr:
        seen.append(line)
        if needle in line:
            return
        assert time.monotonic() - t0 < timeout, "".join(seen)
    raise AssertionError(f"{needle!r} never came:\n{''.join(seen)}")


def finish(proc: subprocess.Popen, seen: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err)


def kill_and_bring_back(proc: subprocess.Popen, n, seen: list[str], kill=None, *,
                        seen_gone: bool = True) -> subprocess.CompletedProcess:
    """Kill node ``n``'s dockerd (``kill``, default SIGKILL) while ``proc`` runs; once the run says it waits for that
    daemon (``seen_gone``; else at once) bring it back, as systemd would, and return the run's outcome. The
    daemon is back and the run ended whatever happens."""
    try:
        (kill or kill_dockerd)(n)
        if seen_gone:
            wait_for(proc, seen, f"{n.name}: its docker daemon does not answer; waiting up to")
        riglib.start_node(n)
        return finish(proc, seen)
    finally:
        if proc.poll() is None:
            proc.kill()
        riglib.start_node(n)


def test_a2_follower_dockerd_killed_during_the_boot_names_docker_and_leaves_nothing(e2e) -> None:
    """node-b's dockerd is SIGKILLed while the stack boots and comes back (as systemd restarts it) once the run
    has seen it gone: the error names node-b's docker, and the teardown waits for the daemon, so no exited
    container is left there. (It came back after a fixed 5 s before: under load no poll fell in that gap, the
    restarted daemon stopped the rank, and the run saw an exit, not a daemon: a race in the test.)"""
    n = e2e.rig.node("node-b")
    cfg = e2e.config({"serve": {"env": {"SSEMU_BOOT_SECONDS": "60"}}})
    proc = e2e.popen("up", cfg=cfg)
    seen: list[str] = []
    t0 = time.monotonic()
    try:
        while len(e2e.running_ids()) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 60, "the stack never started"
            time.sleep(0.2)
    except BaseException:
        proc.kill()
        raise
    p = kill_and_bring_back(proc, n, seen)
    e2e.assert_explained(p, code=3, node="node-b", step="docker", says=("docker daemon stopped answering",))
    # the teardown waited for the daemon and removed the follower's container once it answered: with
    # live-restore off the restarted daemon holds it as exited
    assert e2e.leftovers() == {}, p.stderr


@pytest.mark.parametrize("kill", ["SIGKILL", "SIGTERM"])
def test_follower_dockerd_gone_during_settle_names_docker_not_the_container(e2e, kill: str) -> None:
    """Issue 29: node-b's dockerd dies after the gates passed, while `up` watches the settle window. Its rank's
    container dies with it (exit 137 once containerd goes, or stopped by a daemon shutting down): the headline
    names node-b's docker daemon, not an exit of the container, and once the daemon is back nothing of ours is
    left on any node."""
    n = e2e.rig.node("node-b")
    cfg = e2e.config({"gates": {"settle_s": 30}})
    proc = e2e.popen("up", cfg=cfg)
    seen: list[str] = []
    wait_for(proc, seen, "settle: watching every rank")
    # SIGTERM: a graceful shutdown (systemctl stop docker): it stops the containers, then goes away
    graceful = None if kill == "SIGKILL" else lambda n: os.kill(riglib.read_pid(Path(n.dir) / "dockerd.pid"),
                                                                signal.SIGTERM)
    p = kill_and_bring_back(proc, n, seen, graceful)
    e2e.assert_explained(p, code=3, node="node-b", step="docker",
                         says=("docker daemon stopped answering", "after the gates passed"))
    assert e2e.leftovers() == {}, p.stderr


def test_follower_dockerd_restarted_unseen_during_the_gates_names_docker(e2e) -> None:
    """Issue 29: node-b's dockerd is SIGKILLed while the smoke cell runs on the head and is back (as systemd's
    Restart=always brings it) before anything looked at node-b. The restarted daemon answers and reports rank 1's
    container exited 137, as if the engine had died (the head's requests hang on the lost peer, the faults gate
    sees node-b's engine gone): the headline names node-b's docker daemon (it has no record of the container's
    start), not the gates, and nothing of ours is left behind. The same daemon seen by the settle window's first
    look: tests/unit/test_reach_and_blame.py."""
    n = e2e.rig.node("node-b")
    cfg = e2e.config({"gates": {"smoke": {"prompts": 60, "max_tokens": 512, "request_timeout_s": 30}},
                      "serve": {"env": {"SSEMU_TOKEN_RATE": "1000"}}})
    proc = e2e.popen("up", cfg=cfg)
    seen: list[str] = []
    wait_for(proc, seen, "gates: smoke cell")
    p = kill_and_bring_back(proc, n, seen, seen_gone=False)  # back before anything looked at node-b
    e2e.assert_explained(p, code=3, node="node-b", step="docker",
                         says=("docker daemon stopped answering while the gates ran", "it restarted since rank 1"))
    assert e2e.leftovers() == {}, p.stderr


def test_a30_head_dockerd_killed_during_the_gates_is_exit_3_naming_docker(e2e) -> None:
    """The head's dockerd dies while the smoke cell runs: the gates would fail, but the cause is the node's docker
    (exit 3, step docker), in every run."""
    n = e2e.rig.node("node-a")
    cfg = e2e.config({"gates": {"smoke": {"prompts": 12, "max_tokens": 256, "request_timeout_s": 10}}})
    proc = e2e.popen("up", cfg=cfg)
    seen: list[str] = []
    try:
        wait_for(proc, seen, "gates: smoke")
        kill_dockerd(n)
        p = finish(proc, seen)
    finally:
        if proc.poll() is None:
            proc.kill()
        riglib.start_node(n)
    e2e.assert_explained(p, code=3, node="node-a", step="docker", says=("docker daemon stopped answering",
                                                                       "while the gates ran"))


def test_a34_bench_on_a_stack_with_a_dead_follower_names_it_at_once(e2e) -> None:
    cfg = e2e.config()
    assert e2e.cli("up", "--no-gates", cfg=cfg).returncode == 0
    e2e.kill_rank("node-b")
    t0 = time.monotonic()
    p = e2e.cli("bench", "--protocol", "forced", "--cell", "smoke", cfg=cfg)
    took = time.monotonic() - t0
    text = e2e.assert_explained(p, code=3, node="node-b", step="bench", says=("rank 1", "exited",
                                                                              "the stack cannot serve"))
    assert took < 15, f"{took:.1f}s: the dead rank must be named before any request ({text})"
    assert e2e.cli("down", cfg=cfg).returncode == 0


def test_e3_a_full_state_dir_never_leaves_full_logs_pointing_at_empty_files(e2e, tmp_path: Path) -> None:
    """The state dir is on a file system with no space left: the logs folder and its file names can be made,
    their bytes cannot. The failed `up`'s "full logs:" line must point at files that hold the ranks' logs."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(state)], check=True)
    try:
        (state / "sparkserve" / "logs").mkdir(parents=True)
        with pytest.raises(OSError), open(state / "filler", "wb", buffering=0) as f:  # every free block taken
            while True:
                f.write(b"\0" * 4096)
        e2e.state = state
        cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "crash_boot@rank=1"}}})
        p = e2e.cli("up", cfg=cfg)
        text = e2e.assert_explained(p, code=3, node="node-b", step="boot")
        [line] = [ln for ln in text.splitlines() if "full logs:" in ln]
        saved = Path(line.split("full logs:", 1)[1].strip())
        logs = sorted(saved.glob("*.log"))
        assert len(logs) == 2 and all(f.stat().st_size > 0 for f in logs), (saved, [f.stat().st_size for f in logs])
        assert any("WorkerProc failed to start" in f.read_text() for f in logs)
        assert "warning: state dir:" in p.stderr
        assert e2e.leftovers() == {}
    finally:
        subprocess.run(["umount", str(state)], check=False)
