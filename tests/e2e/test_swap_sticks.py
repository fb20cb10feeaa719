"""A swap that sticks, on the rig: `swap-drafter` writes the new drafter into the config file (comments
kept); `--no-write` leaves the file alone, the journal keeps the drafter and the next `up` keeps it and says
so; `status` shows the serving drafter (path, digest, whether it is the config's), uptime and endpoint; `up`
ends with a curl line that works as pasted."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.rig

E2E_DIR = "/srv/spark/e2e-stick"


def _drafter_copy(e2e, tmp_path: Path, name: str, flip: int) -> Path:
    d = tmp_path / name
    shutil.copytree(e2e.node_path("node-a", e2e.rig.models["drafter"]), d)
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= flip  # new weights, same shape: another digest
    w.write_bytes(bytes(data))
    return d


@pytest.fixture
def commented(e2e):
    node_path = f"{E2E_DIR}/drafter"
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, E2E_DIR), ignore_errors=True)
        shutil.copytree(e2e.node_path(n.name, e2e.rig.models["drafter"]), e2e.node_path(n.name, node_path))
    cfg = e2e.config({"drafter": {"path": node_path}})
    text = cfg.read_text().replace("drafter:\n", "# the drafter we serve\ndrafter:  # swapped by hand before\n", 1)
    cfg.write_text("# my rig config: keep this comment\n" + text)
    yield cfg
    e2e.cli("down", cfg=cfg)
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, E2E_DIR), ignore_errors=True)


def test_swap_writes_the_config_no_write_keeps_it_in_the_journal_and_status_tells(e2e, commented, tmp_path):
    p = e2e.cli("up", cfg=commented)
    assert p.returncode == 0, p.stderr
    curl = next(ln.strip() for ln in p.stdout.splitlines() if ln.strip().startswith("curl "))
    r = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=60)  # as a person pastes it
    assert r.returncode == 0 and json.loads(r.stdout)["choices"][0]["message"]["content"], r.stdout

    new = _drafter_copy(e2e, tmp_path, "dflash2-next", 0x01)
    out = e2e.json("swap-drafter", str(new), cfg=commented, timeout=240)
    assert out["ok"] is True and out["schema"] == 1
    text = commented.read_text()
    assert text.startswith("# my rig config: keep this comment\n")
    assert "# the drafter we serve\ndrafter:  # swapped by hand before\n" in text
    written = yaml.safe_load(text)["drafter"]
    assert written == {"path": out["drafter_path"], "source": str(new.resolve())}
    st = e2e.json("status", cfg=commented)["serving"]
    assert st["drafter_path"] == out["drafter_path"] and st["drafter_digest"] == out["drafter_digest"]
    assert st["differs"] is False and st["uptime_s"] >= 0 and st["endpoint"].endswith("/v1")

    before = commented.read_bytes()
    other = _drafter_copy(e2e, tmp_path, "dflash2-other", 0x02)
    out2 = e2e.json("swap-drafter", str(other), "--no-write", cfg=commented, timeout=240)
    assert out2["ok"] is True and "--no-write: the journal keeps" in out2["kept"]
    assert commented.read_bytes() == before
    st = e2e.json("status", cfg=commented)["serving"]
    assert st["drafter_path"] == out2["drafter_path"] and st["differs"] is True

    p = e2e.cli("up", cfg=commented)  # keeps the journal's drafter: the stack that runs is already it
    assert p.returncode == 0, p.stderr
    assert f"drafter: keeping {out2['drafter_path']}" in p.stderr and "already up" in p.stdout
    p = e2e.cli("status", cfg=commented)
    assert f"NOT the config's drafter ({out['drafter_path']})" in p.stdout
