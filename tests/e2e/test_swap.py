"""`sparkserve swap-drafter PATH` on the rig: a good drafter swaps (new bind mount on every rank, gates
pass); a bad one is refused with exit 2 before anything changes; one that fails at boot rolls back and the
old stack serves again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from e2e_support import BOTH_RUNTIMES

pytestmark = pytest.mark.rig

E2E_DIR = "/srv/spark/e2e"


@pytest.fixture
def stack(e2e):
    """A running stack whose drafter is a private copy at /srv/spark/e2e/drafter on every node."""
    node_path = f"{E2E_DIR}/drafter"
    for n in e2e.rig.nodes:
        dst = e2e.node_path(n.name, node_path)
        shutil.rmtree(e2e.node_path(n.name, E2E_DIR), ignore_errors=True)
        shutil.copytree(e2e.node_path(n.name, e2e.rig.models["drafter"]), dst)
    cfg = e2e.config({"drafter": {"path": node_path}})
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    yield cfg
    e2e.cli("down", cfg=cfg)
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, E2E_DIR), ignore_errors=True)


def drafter_mounts(e2e) -> dict[str, str]:
    """node → host path bind-mounted as the drafter in its running sparkserve container (runtime process:
    the drafter its running engine's argv names)."""
    from sparkserve.plan.serve_argv import drafter_in_argv

    out = {}
    for n in e2e.rig.nodes:
        (c,) = [c for c in e2e.managed(n.name) if c.status == "running"]
        if e2e.runtime == "process":
            out[n.name] = drafter_in_argv(c.argv)
            continue
        (src,) = [m["Source"] for m in c.attrs["Mounts"] if m["Source"].startswith(E2E_DIR)]
        out[n.name] = src
    return out


def serving(e2e, cfg: Path) -> bool:
    c = e2e.load(cfg)
    r = httpx.get(f"http://{c.serve.host}:{c.serve.port}/v1/models", timeout=5)
    return r.status_code == 200 and c.model.served_name in r.text


def local_drafter(e2e, tmp_path: Path, name: str, variant: str = "drafter") -> Path:
    """A drafter on this machine (the swap source), copied from the rig's fixture ``variant``."""
    d = tmp_path / name
    shutil.copytree(e2e.node_path("node-a", e2e.rig.models[variant]), d)
    return d


@BOTH_RUNTIMES
def test_good_drafter_swaps_with_a_new_bind_mount(e2e, stack, tmp_path) -> None:
    new = local_drafter(e2e, tmp_path, "dflash2-next")
    w = new / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01  # new weights, same shape: a different digest
    w.write_bytes(bytes(data))
    before = e2e.running_ids()

    out = e2e.json("swap-drafter", str(new), cfg=stack, timeout=240)
    assert out["ok"] is True and out["rolled_back"] is False
    assert out["gates"]["ok"] is True
    node_path = out["drafter_path"]
    assert node_path.startswith(f"{E2E_DIR}/dflash2-next-")
    assert drafter_mounts(e2e) == {"node-a": node_path, "node-b": node_path}
    assert not set(e2e.running_ids().values()) & set(before.values())  # a new stack
    for n in e2e.rig.nodes:  # the new bytes on every node, the old drafter untouched
        assert (e2e.node_path(n.name, node_path) / "model.safetensors").read_bytes() == w.read_bytes()
        assert (e2e.node_path(n.name, f"{E2E_DIR}/drafter") / "model.safetensors").read_bytes() != w.read_bytes()
    assert serving(e2e, stack)


def _block_size(drafter: Path, block: int) -> None:
    """The drafter's config.json with another block_size (wherever the drafter's config keeps it)."""
    cfg = json.loads((drafter / "config.json").read_text())
    for d in (cfg, cfg.get("dflash_config") or {}):
        if "block_size" in d:
            d["block_size"] = block
    (drafter / "config.json").write_text(json.dumps(cfg))


# block 4: K=7 > block_size - 1 = 3 is refused (a K below block_size - 1 boots, with a warning: the drafter card)
@pytest.mark.parametrize(("variant", "why"), [("drafter-b4", "num_speculative_tokens"),
                                              ("drafter-nomask", "mask_embedding.pt")])
def test_bad_drafter_is_refused_before_anything_changes(e2e, stack, tmp_path, variant: str, why: str) -> None:
    bad = local_drafter(e2e, tmp_path, f"bad-{variant}", "drafter" if variant == "drafter-b4" else variant)
    if variant == "drafter-b4":
        _block_size(bad, 4)
    before = e2e.running_ids()
    mounts = drafter_mounts(e2e)
    p = e2e.cli("swap-drafter", str(bad), cfg=stack)
    e2e.assert_explained(p, code=2, node=None, step=None, says=(why,))
    assert e2e.running_ids() == before and drafter_mounts(e2e) == mounts
    for n in e2e.rig.nodes:  # nothing was synced either
        assert sorted(p.name for p in e2e.node_path(n.name, E2E_DIR).iterdir()) == ["drafter"]
    assert serving(e2e, stack)


def test_drafter_failing_at_boot_rolls_back_and_the_old_stack_serves(e2e, stack, tmp_path) -> None:
    broken = local_drafter(e2e, tmp_path, "dflash2-broken")
    (broken / "ssemu-faults").write_text("crash_boot@rank=1\n")  # the emulator reads faults from the drafter dir
    mounts = drafter_mounts(e2e)

    p = e2e.cli("swap-drafter", str(broken), cfg=stack, timeout=240)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "rolled back to /srv/spark/e2e/drafter" in p.stdout and "serving again" in p.stdout
    assert "node-b" in p.stdout and "boot" in p.stdout  # which node failed, at which step
    assert not any(ln.startswith("Traceback") for ln in p.stderr.splitlines())
    assert drafter_mounts(e2e) == mounts  # the previous drafter is mounted again
    assert serving(e2e, stack)
    st = e2e.json("status", cfg=stack)
    assert st["ok"] is True and len(st["deployments"]) == 1


def test_rollback_returns_to_the_drafter_that_was_serving(e2e, stack, tmp_path) -> None:
    first = local_drafter(e2e, tmp_path, "dflash2-first")
    w = first / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01
    w.write_bytes(bytes(data))
    out = e2e.json("swap-drafter", str(first), cfg=stack, timeout=240)
    assert out["ok"] is True
    serving_path = out["drafter_path"]  # the config file still says /srv/spark/e2e/drafter
    broken = local_drafter(e2e, tmp_path, "dflash2-broken")
    (broken / "ssemu-faults").write_text("crash_boot@rank=1\n")

    p = e2e.cli("swap-drafter", str(broken), cfg=stack, timeout=240)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"rolled back to {serving_path}" in p.stdout and "serving again" in p.stdout
    assert drafter_mounts(e2e) == {"node-a": serving_path, "node-b": serving_path}
    assert serving(e2e, stack)


def test_rollback_that_fails_too_has_its_own_exit_code(e2e, stack, tmp_path) -> None:
    for n in e2e.rig.nodes:  # the serving drafter will not boot again (the running stack read it at boot)
        (e2e.node_path(n.name, f"{E2E_DIR}/drafter") / "ssemu-faults").write_text("crash_boot@rank=1\n")
    broken = local_drafter(e2e, tmp_path, "dflash2-broken")
    (broken / "ssemu-faults").write_text("crash_boot@rank=1\n")

    p = e2e.cli("swap-drafter", str(broken), cfg=stack, timeout=240)
    text = e2e.assert_explained(p, code=4, node=None, says=("ROLLBACK FAILED", "nothing runs"))
    assert text.splitlines()[0].startswith("error: swap-drafter: ROLLBACK FAILED"), text
    assert e2e.leftovers() == {}  # nothing half-done on any node
