"""SIGTERM, SIGHUP and SIGINT at each phase of `up`, `swap-drafter` and `image ship`, on the two-node rig.

Every cell asserts the same thing: no container of this run left on any node, the head lock released,
exactly one ``error: … interrupted (SIG…)`` line on stderr (no traceback) and exit 3, the code of an
interrupted run. Each phase is reached deterministically: the signal goes out when the run's own `·`
progress line for that phase appears on stderr (slow phases made slow by the emulator's boot time and
token rate, a drafter big enough that its copy is still running: the test waits for rsync's temp file on a
node before it signals).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.rig

SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
SIG_IDS = [s.name for s in SIGNALS]
SCRATCH = "/srv/spark/e2e-signals"  # node-local: drafter copies these tests make
PADDING = 512 * 2**20  # a drafter this big is still copying when the signal arrives
TEMP = re.compile(r"\..+\.([A-Za-z0-9]{6}|sparkserve-tmp)$")  # rsync's and sparkserve's temp file names


@pytest.fixture(scope="module")
def big_drafter(rig_exclusive, tmp_path_factory) -> Path:
    """The rig's drafter on this machine, plus a large file, so that copying it takes seconds."""
    d = tmp_path_factory.mktemp("signals") / "big-drafter"
    shutil.copytree(rig_exclusive.node("node-a").host_path(rig_exclusive.models["drafter"]), d)
    with (d / "padding.bin").open("wb") as f:
        for _ in range(PADDING // 2**20):
            f.write(os.urandom(2**20))
    return d


@pytest.fixture
def scratch(e2e):
    """SCRATCH empty on every node before and after the test."""
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, SCRATCH), ignore_errors=True)
    yield SCRATCH
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, SCRATCH), ignore_errors=True)


def interrupt(e2e, args: tuple[str, ...], cfg: Path, marker: str, sig: signal.Signals, *,
              ready=None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``sparkserve ARGS -c CFG``; once stderr shows ``marker`` (and ``ready()`` holds), send ``sig``.
    The finished process, and the seconds from the signal to its exit."""
    proc = e2e.popen(*args, cfg=cfg)
    guard = threading.Timer(timeout, proc.kill)  # a hung run fails the test instead of hanging it
    guard.start()
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if marker in line:
                break
        else:
            pytest.fail(f"{marker!r} never appeared; exit {proc.wait()}:\n{''.join(seen)}")
        t0 = time.monotonic()
        while ready is not None and not ready():
            assert proc.poll() is None, f"exited {proc.returncode} before the phase was reached:\n{''.join(seen)}"
            assert time.monotonic() - t0 < 60, "the phase was never reached"
            time.sleep(0.02)
        t_sig = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate()
        took = time.monotonic() - t_sig
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err), took


def lock_held(e2e, cfg: Path) -> bool:
    """The head lock exists on the head (asked over SSH: the node's own view of its /tmp)."""
    from sparkserve.deploy.lock import LOCK_DIR
    from sparkserve.nodes.factory import open_nodes

    c = e2e.load(cfg)
    with open_nodes(c, names=[c.head.name]) as nodes:
        return nodes[c.head.name].run(["test", "-e", LOCK_DIR], check=False).exit_code == 0


def assert_interrupted(e2e, p: subprocess.CompletedProcess, cfg: Path, sig: signal.Signals,
                       running_before: dict[str, str] | None = None) -> str:
    """The cell's verdict: exit 3, one error line naming the signal, nothing of this run left, lock free."""
    text = e2e.assert_explained(p, code=3, node=None, step=f"interrupted ({sig.name})")
    assert e2e.running_ids() == (running_before or {}), "a container of this run was left behind"
    left = e2e.leftovers()
    assert sum(len(v) for v in left.values()) == len(running_before or {}), left
    assert not lock_held(e2e, cfg), "the head lock was not released"
    return text


def temp_files(e2e, node_dir: str) -> dict[str, list[str]]:
    """Temp files (half-written copies) under ``node_dir`` on each node."""
    out = {}
    for n in e2e.rig.nodes:
        root = e2e.node_path(n.name, node_dir)
        found = [str(p.relative_to(root)) for p in root.rglob("*") if TEMP.match(p.name)] if root.exists() else []
        if found:
            out[n.name] = found
    return out


def copy_running(e2e, node_dir: str):
    """``ready`` for :func:`interrupt`: rsync's temp file exists on a node (the copy is mid-transfer)."""
    return lambda: bool(temp_files(e2e, node_dir))


def assert_no_partial_copies(e2e, node_dir: str, source: Path) -> None:
    """Every file under ``node_dir`` on every node is whole (the source's size); no temp file is left."""
    assert temp_files(e2e, node_dir) == {}
    for n in e2e.rig.nodes:
        root = e2e.node_path(n.name, node_dir)
        for p in root.rglob("*") if root.exists() else []:
            if p.is_file():
                rel = p.relative_to(root)
                assert p.stat().st_size == (source / rel).stat().st_size, f"{n.name}: {rel} is partial"


# -- up ---------------------------------------------------------------------------------------------------

UP_PHASES = {  # phase -> (config overrides, the progress line that starts it)
    "preflight": ({}, "preflight: checking every node"),
    "followers": ({}, "starting 1 follower(s)"),
    "head-boot": ({"serve": {"env": {"SSEMU_BOOT_SECONDS": "60"}}}, "waiting for the head to serve"),
    "gates": ({"serve": {"env": {"SSEMU_TOKEN_RATE": "10"}}}, "gates: smoke cell"),
}


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
@pytest.mark.parametrize("phase", list(UP_PHASES))
def test_up_interrupted(e2e, phase: str, sig: signal.Signals) -> None:
    overrides, marker = UP_PHASES[phase]
    cfg = e2e.config(overrides)
    p, _ = interrupt(e2e, ("up",), cfg, marker, sig)
    text = assert_interrupted(e2e, p, cfg, sig)
    if phase != "preflight":
        assert "stopped and removed" in text


@pytest.mark.parametrize("e2e", ["process"], indirect=True)
def test_up_interrupted_during_boot_leaves_no_process(e2e) -> None:
    """runtime process: SIGTERM while the head boots stops every rank's process and removes its manifest on
    every node (Ctrl-C: test_up_faults' test_ctrl_c_during_boot_stops_everything[process]; the docker cells
    above cover containers)."""
    sig = signal.SIGTERM
    overrides, marker = UP_PHASES["head-boot"]
    cfg = e2e.config(overrides)
    p, _ = interrupt(e2e, ("up",), cfg, marker, sig)
    text = assert_interrupted(e2e, p, cfg, sig)
    assert "stopped and removed" in text and e2e.leftovers() == {}


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_up_interrupted_during_drafter_sync(e2e, scratch, big_drafter: Path, sig: signal.Signals) -> None:
    node_dir = f"{scratch}/drafter"
    cfg = e2e.config({"drafter": {"path": node_dir, "source": str(big_drafter)}})
    p, took = interrupt(e2e, ("up",), cfg, "drafter: syncing", sig, ready=copy_running(e2e, node_dir))
    assert_interrupted(e2e, p, cfg, sig)
    assert took < 4.0, f"the copy took {took:.1f}s to stop"
    assert_no_partial_copies(e2e, node_dir, big_drafter)


# -- swap-drafter -----------------------------------------------------------------------------------------


def _serving_stack(e2e, scratch: str) -> tuple[Path, dict[str, str]]:
    """A running stack whose drafter is a copy at SCRATCH/drafter on every node; its containers."""
    for n in e2e.rig.nodes:
        shutil.copytree(e2e.node_path(n.name, e2e.rig.models["drafter"]), e2e.node_path(n.name, f"{scratch}/drafter"))
    cfg = e2e.config({"drafter": {"path": f"{scratch}/drafter"}})
    p = e2e.cli("up", "--no-gates", cfg=cfg)
    assert p.returncode == 0, p.stderr
    return cfg, e2e.running_ids()


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_swap_interrupted_during_sync_leaves_the_old_stack_serving(e2e, scratch, big_drafter: Path,
                                                                  sig: signal.Signals) -> None:
    cfg, before = _serving_stack(e2e, scratch)
    p, took = interrupt(e2e, ("swap-drafter", str(big_drafter)), cfg, "drafter: syncing", sig,
                        ready=copy_running(e2e, scratch))
    assert_interrupted(e2e, p, cfg, sig, running_before=before)  # no rollback: nothing of this run started
    assert took < 4.0, f"the copy took {took:.1f}s to stop"
    assert temp_files(e2e, scratch) == {}


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_swap_interrupted_during_boot(e2e, scratch, tmp_path: Path, sig: signal.Signals) -> None:
    cfg, _ = _serving_stack(e2e, scratch)
    new = tmp_path / "next-drafter"
    shutil.copytree(e2e.node_path("node-a", e2e.rig.models["drafter"]), new)
    with (new / "config.json").open("a") as f:  # another digest: a swap to the serving drafter is a no-op
        f.write("\n")
    slow = e2e.derive(cfg, {"serve": {"env": {"SSEMU_BOOT_SECONDS": "60"}}})
    p, _ = interrupt(e2e, ("swap-drafter", str(new)), slow, "waiting for the head to serve", sig)
    text = assert_interrupted(e2e, p, slow, sig)  # the old stack was replaced before the boot: nothing runs
    assert "rolling back" not in text and "rolling back" not in p.stderr


# -- image ship -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_image_ship_interrupted(e2e, sig: signal.Signals) -> None:
    import docker.errors

    cfg = e2e.config()
    ref = e2e.load(cfg).image.ref
    src, dst = e2e.docker["node-a"], e2e.docker["node-b"]
    want = src.images.get(ref).id
    base = e2e.rig.info["image"]["base_ref"]
    had_base = bool(dst.images.list(name=base))
    dst.images.remove(ref, force=True)
    if had_base:  # every layer missing on node-b: the ship lasts long enough to be interrupted mid-stream
        dst.images.remove(base, force=True)
    try:
        p, _ = interrupt(e2e, ("image", "ship"), cfg, "node-a → node-b: ", sig)
        assert_interrupted(e2e, p, cfg, sig)
        with pytest.raises(docker.errors.ImageNotFound):  # "as it was": the partial load was discarded
            dst.images.get(ref)
    finally:  # the rig's other tests need the image (and the base) on node-b again
        if e2e.cli("image", "ship", cfg=cfg).returncode != 0:
            dst.images.load(src.images.get(ref).save(named=True))
        assert dst.images.get(ref).id == want
        if had_base and not dst.images.list(name=base):
            dst.images.load(src.images.get(base).save(named=True))
