"""`sparkserve up` when something is wrong, on the two-node rig: each fault ends with exit 3 (or the code
the contract gives), a one-screen explanation naming the node and the step, and no container of ours left
on any node. Faults are real: a stopped sshd or dockerd, a busy port, images and drafter bytes changed on
one node, a process interrupted with SIGINT, the engine emulator's own fault modes."""

from __future__ import annotations

import hashlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import rig as riglib
from e2e_support import BOTH_RUNTIMES, kill_pid

pytestmark = pytest.mark.rig

E2E_DIR = "/srv/spark/e2e"  # node-local scratch for per-test drafter copies


def up_fails(e2e, cfg: Path, *, node: str, step: str, says: tuple[str, ...] = (), code: int = 3,
             args: tuple[str, ...] = ()) -> str:
    p = e2e.cli("up", *args, cfg=cfg)
    text = e2e.assert_explained(p, code=code, node=node, step=step, says=says)
    assert e2e.leftovers() == {}, "containers left behind"
    return text


def stop(proc: subprocess.Popen) -> None:
    """A test that failed half-way still lets `up` clean up (SIGINT) before anything harsher."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- nodes and their daemons ----------------------------------------------------------------------------


def test_follower_sshd_stopped(e2e) -> None:
    n = e2e.rig.node("node-b")
    pid = riglib.read_pid(Path(n.dir) / "ssh" / "sshd.pid")
    assert pid and riglib.pid_alive(pid)
    kill_pid(pid)
    try:
        assert not riglib.port_open(n.host, n.port)
        up_fails(e2e, e2e.config(), node="node-b", step="ssh", says=(f"{n.host}:{n.port}",))
    finally:
        riglib.start_node(n)
    assert riglib.port_open(n.host, n.port)


def test_node_dockerd_stopped(e2e) -> None:
    n = e2e.rig.node("node-b")
    riglib.stop_pid(riglib.read_pid(Path(n.dir) / "dockerd.pid"), "node-b dockerd (e2e)")
    try:
        assert not riglib.docker_ping(n.docker_socket)
        p = e2e.cli("up", cfg=e2e.config())
        e2e.assert_explained(p, code=3, node="node-b", step="docker")
        assert not e2e.ours("node-a")  # nothing was started on the node that still had docker
    finally:
        riglib.start_node(n)
    assert riglib.docker_ping(n.docker_socket)
    assert e2e.leftovers() == {}


def test_port_busy_on_the_head(e2e) -> None:
    cfg = e2e.config()
    port = e2e.load(cfg).serve.port
    with socket.socket() as s:
        s.bind(("127.0.0.2", port))
        s.listen()
        up_fails(e2e, cfg, node="node-a", step="ports", says=(f"127.0.0.2:{port} is already in use",))


def test_follower_dockerd_stopped_during_boot_is_named_and_its_container_reported(e2e) -> None:
    """rank 1's dockerd stops under its running container: `up` must say the node's docker daemon stopped
    answering, not that the container exited, and name the container that may still be there."""
    n = e2e.rig.node("node-b")
    cfg = e2e.config({"serve": {"env": {"SSEMU_BOOT_SECONDS": "60"}}})
    proc = e2e.popen("up", cfg=cfg)
    try:
        t0 = time.monotonic()
        while len(e2e.running_ids()) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 60, "the stack never started"
            time.sleep(0.2)
        (cid,) = [c.id for c in e2e.managed("node-b")]
        riglib.stop_pid(riglib.read_pid(Path(n.dir) / "dockerd.pid"), "node-b dockerd (e2e)")
        out, err = proc.communicate(timeout=120)
    finally:
        stop(proc)
        riglib.start_node(n)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    text = e2e.assert_explained(p, code=3, node="node-b", step="docker", says=("stopped answering", cid[:12]))
    assert "exit code 0" not in text and "stopped (exit" not in text.splitlines()[0], text
    assert not e2e.ours("node-a")  # the head was still taken down


# -- images -----------------------------------------------------------------------------------------------


def test_image_missing_on_one_node_then_shipped(e2e) -> None:
    b = e2e.docker["node-b"]
    ref, want = e2e.rig.image_ref, e2e.rig.image_id
    b.images.remove(ref, force=True)  # untags (and deletes unless a container still uses it)
    try:
        text = up_fails(e2e, e2e.config(), node="node-b", step="image", says=("is not on this node",))
        assert "sparkserve image ship" in text and "node-a" in text  # who has it, and how to fix
    finally:
        p = e2e.cli("image", "ship", cfg=e2e.config())
    assert p.returncode == 0, p.stderr
    assert b.images.get(ref).id == want


def test_image_id_differs_between_nodes(e2e) -> None:
    n = e2e.rig.node("node-b")
    ref, want = e2e.rig.image_ref, e2e.rig.image_id
    build = subprocess.run(["docker", "-H", n.docker_url, "build", "-q", "-t", ref, "-"],
                           input=f"FROM {ref}\nLABEL io.sparkserve.e2e=differs\n", text=True,
                           capture_output=True, env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"})
    assert build.returncode == 0, build.stderr
    other = build.stdout.strip()
    assert other != want
    try:
        up_fails(e2e, e2e.config(), node="node-b", step="image",
                 says=(other.removeprefix("sha256:")[:12], want.removeprefix("sha256:")[:12]))
    finally:
        e2e.docker["node-b"].images.get(want).tag(ref)
        e2e.docker["node-b"].images.remove(other)
    assert e2e.docker["node-b"].images.get(ref).id == want


# -- the drafter ------------------------------------------------------------------------------------------


@pytest.fixture
def drafter_copies(e2e):
    """A private copy of the rig's drafter on every node at /srv/spark/e2e/drafter-sync."""
    node_path = f"{E2E_DIR}/drafter-sync"
    for n in e2e.rig.nodes:
        dst = e2e.node_path(n.name, node_path)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(e2e.node_path(n.name, e2e.rig.models["drafter"]), dst)
    yield node_path
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, E2E_DIR), ignore_errors=True)


def test_drafter_bytes_differ(e2e, drafter_copies, tmp_path) -> None:
    weights = e2e.node_path("node-b", drafter_copies) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte in the tensor data (the header stays valid)
    weights.write_bytes(bytes(data))
    good = e2e.node_path("node-a", drafter_copies) / "model.safetensors"
    assert sha(weights) != sha(good)

    cfg = e2e.config({"drafter": {"path": drafter_copies}})
    up_fails(e2e, cfg, node="node-b", step="drafter", says=("differ", "drafter.source"))
    assert sha(weights) != sha(good)  # without a source nothing was copied

    source = tmp_path / "drafter"
    shutil.copytree(e2e.node_path("node-a", drafter_copies), source)
    synced = e2e.derive(cfg, {"drafter": {"source": str(source)}})
    p = e2e.cli("up", cfg=synced)
    assert p.returncode == 0, p.stderr
    assert "all gates passed" in p.stdout  # identity: the same drafter digest on every node
    assert sha(weights) == sha(good)
    assert e2e.cli("down", cfg=synced).returncode == 0
    assert e2e.leftovers() == {}


# -- ssh host keys ----------------------------------------------------------------------------------------


def test_unknown_host_key_refused_then_accepted_with_the_flag(e2e, tmp_path) -> None:
    kh = tmp_path / "known_hosts"
    lines = e2e.rig.known_hosts.read_text().splitlines()
    kh.write_text("".join(f"{ln}\n" for ln in lines if ln.startswith("[127.0.0.2]:2222 ")))
    cfg = e2e.config({"ssh": {"known_hosts": str(kh)}})
    up_fails(e2e, cfg, node="node-b", step="ssh", says=("host key",))
    assert "127.0.0.3" not in kh.read_text()  # refused means refused: nothing was written

    p = e2e.cli("up", "--no-gates", "--accept-new-host-keys", cfg=cfg)
    assert p.returncode == 0, p.stderr
    import paramiko

    learnt = paramiko.HostKeys(str(kh))  # written hashed, as `ssh-keyscan -H` / HashKnownHosts do
    assert learnt.lookup("[127.0.0.3]:2222") is not None and "127.0.0.3" not in kh.read_text()
    assert len(e2e.running_ids()) == 2
    assert e2e.cli("down", cfg=cfg).returncode == 0  # the key is known now: no flag needed
    assert e2e.leftovers() == {}


# -- during boot ------------------------------------------------------------------------------------------


@BOTH_RUNTIMES
def test_engine_crash_at_boot_on_rank_1(e2e) -> None:
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "crash_boot@rank=1"}}})
    up_fails(e2e, cfg, node="node-b", step="boot", says=("rank 1", "WorkerProc failed to start"))


@BOTH_RUNTIMES
def test_follower_crash_during_capture_names_the_follower(e2e) -> None:
    """Rank 1 raises while capturing CUDA graphs; the head relays it and exits, the follower's worker logs
    the root cause and stays up. The failure is the follower's, and its root-cause line is quoted."""
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "crash_boot@rank=1,phase=capture"}}})
    text = up_fails(e2e, cfg, node="node-b", step="boot",
                    says=("rank 1", "RuntimeError: CUDA error: an illegal memory access was encountered"))
    first = text.splitlines()[0]
    assert "node-a" not in first, first


def test_nccl_timeout_fails_the_gates_and_stops_everything(e2e) -> None:
    """The collective hangs on rank 1 at the first request: its NCCL watchdog fires and the worker dies;
    the head's request hangs (bounded by the smoke deadline). Gates fail → exit 1, nothing left."""
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "nccl_timeout@rank=1,at=request"}},
                      "gates": {"smoke": {"request_timeout_s": 5}}})
    t0 = time.monotonic()
    text = up_fails(e2e, cfg, code=1, node=None, step="gates",
                    says=("faults", "node-b", "Watchdog caught collective operation timeout"))
    assert "smoke" in text and time.monotonic() - t0 < 60


def test_memory_floor_crossed_during_boot(e2e) -> None:
    cfg = e2e.config({"watchdog": {"memory_floor_bytes": "1000TiB"}})
    text = up_fails(e2e, cfg, node="node-a", step="memory watchdog", says=("below the floor of",))
    assert "stopped every rank" in text


@BOTH_RUNTIMES
def test_ctrl_c_during_boot_stops_everything(e2e) -> None:
    cfg = e2e.config({"serve": {"env": {"SSEMU_BOOT_SECONDS": "60"}}})
    proc = e2e.popen("up", cfg=cfg)
    try:
        t0 = time.monotonic()
        while len(e2e.running_ids()) < 2:  # the head starts last: both running = waiting for readiness
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 60, "the stack never started"
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    text = e2e.assert_explained(p, code=3, node=None, step="interrupted")
    assert "stopped and removed" in text
    assert e2e.leftovers() == {}


def test_ctrl_c_during_preflight_exits_3_with_nothing_started(e2e) -> None:
    proc = e2e.popen("up", cfg=e2e.config())
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the read-only preflight phase has begun (the lock is held)
            seen.append(line)
            if "preflight: checking every node" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err)
    e2e.assert_explained(p, code=3, node=None, step="interrupted")
    assert e2e.leftovers() == {}
    assert not e2e.rig.head.host_path("/tmp/sparkserve.deploy.lock").exists()  # the head's lock was released


# -- containers sparkserve did not start ------------------------------------------------------------------


def _rerun_with_flag(client, container, flag: str, value: str):
    """What an operator does by hand: the same container again, one flag changed."""
    import docker

    a = container.attrs
    cfg, host = a["Config"], a["HostConfig"]
    cmd = list(cfg["Cmd"])
    cmd[cmd.index(flag) + 1] = value
    container.stop(timeout=3)
    container.remove()
    return client.containers.run(
        cfg["Image"], command=cmd, entrypoint=cfg["Entrypoint"], name=a["Name"].lstrip("/"),
        environment=cfg["Env"], labels=cfg["Labels"], network_mode=host["NetworkMode"], ipc_mode=host["IpcMode"],
        shm_size=host["ShmSize"], detach=True,
        mounts=[docker.types.Mount(m["Destination"], m["Source"], type="bind", read_only=not m["RW"])
                for m in a["Mounts"]],
        ulimits=[docker.types.Ulimit(name=u["Name"], soft=u["Soft"], hard=u["Hard"])
                 for u in host.get("Ulimits") or []],
    )


def test_worker_started_by_hand_with_one_flag_changed_fails_parity(e2e) -> None:
    cfg = e2e.config()
    assert e2e.cli("up", "--no-gates", cfg=cfg).returncode == 0
    worker = e2e.managed("node-b")[0]
    flag = "--max-num-seqs"
    planned = str(e2e.load(cfg).serve.max_num_seqs)  # the card's 6 by default
    assert worker.attrs["Config"]["Cmd"][worker.attrs["Config"]["Cmd"].index(flag) + 1] == planned
    drifted = _rerun_with_flag(e2e.docker["node-b"], worker, flag, "8")
    drifted.reload()
    assert drifted.status == "running"
    up_fails(e2e, cfg, node="node-b", step="rank parity", says=(f"{flag} {planned}", f"{flag} 8"))


def test_unlabelled_container_with_our_name_is_left_alone(e2e) -> None:
    name = "e2e-r1-node-b"  # what the plan names rank 1's container (container.name_prefix: e2e)
    squatter = e2e.docker["node-b"].containers.run(
        e2e.rig.info["image"]["base_ref"], ["sleep", "600"], name=name, network_mode="none", detach=True)
    try:
        p = e2e.cli("up", cfg=e2e.config())
        e2e.assert_explained(p, code=3, node="node-b", step="run", says=(name, "sparkserve did not start",
                                                                        "left alone"))
        squatter.reload()
        assert squatter.status == "running"
        assert e2e.leftovers() == {"node-b": [f"{name} (running)"]}  # only the squatter
        assert all(not e2e.managed(n.name) for n in e2e.rig.nodes)
    finally:
        squatter.remove(force=True)


def test_an_unusable_state_dir_never_stands_between_a_failed_boot_and_its_cleanup(e2e, tmp_path: Path) -> None:
    """Issue 15 item 4 on real nodes: the state dir is a regular file, so neither the saved logs nor the journal
    can go there; a gate failure must still stop and remove every container, with warnings, not tracebacks."""
    state = tmp_path / "state-is-a-file"
    state.write_text("not a directory\n")
    e2e.state = state
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "graphs_off@rank=1"}}})
    p = e2e.cli("up", cfg=cfg)
    e2e.assert_explained(p, code=1, node=None, says=("graphs",))  # one error line, no traceback of ours
    warn = [ln for ln in p.stderr.splitlines() if ln.startswith("warning: state dir:")]
    assert len(warn) == 1, p.stderr
    saved = Path(warn[0].rsplit(" to ", 1)[-1].split(" ")[0])
    assert saved.is_dir() and any(saved.glob("*.log")), warn[0]  # the logs went to the temp dir it named
    assert e2e.leftovers() == {}  # every container of this run stopped and removed on every node
