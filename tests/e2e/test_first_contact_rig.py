"""A new user's first contact, on the rig (issue 24): `up` and `gates` narrate the gates, `doctor` knows its own
running stack, `status` piped keeps every ID whole and shows this boot's verdict, `swap-drafter` to the drafter
serving is a no-op that says so, `down` is in the history and the gates' smoke runs are not bench rows, `logs`
after `down` points at the saved logs, and `bundle` packs a bug report (tests/unit/test_bundle.py checks the
redaction in depth)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.rig


def test_first_contact_journey(e2e, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    started = datetime.now(UTC).isoformat(timespec="microseconds")  # the journal's own time format (UTC, isoformat)
    cfg = e2e.config()
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    err = p.stderr
    assert "the gates decide whether it serves" in err and "serving glm" not in err.split("gates:")[0]
    for gate in ("pool", "graphs", "mask", "smoke", "faults"):
        assert f"gate {gate}: ok" in err, err
    assert "gates: smoke 3/3 requests ok" in err and err.index("gate pool") < err.index("settle")

    # doctor on its own healthy stack: its head's ports and containers are its own, not a FAIL
    d = e2e.json("doctor", cfg=cfg)
    assert d["ok"] is True, d
    ports = [c for c in d["checks"] if c["name"].startswith("port ")]
    assert ports and all(c["status"] == "ok" for c in ports), ports
    api = next(c for c in ports if c["name"].endswith(f":{e2e.load(cfg).serve.port}"))
    assert "this config's running stack" in api["detail"], api
    assert not [c for c in d["checks"] if c["name"] == "containers" and "another config" in c["detail"]]

    # status piped (not a terminal), at 80 columns: every name and ID whole, the verdict of this boot
    env = e2e.env() | {"COLUMNS": "80"}
    import subprocess

    from e2e_support import SPARKSERVE

    st = subprocess.run([str(SPARKSERVE), "status", "-c", str(cfg)], capture_output=True, text=True, env=env,
                        timeout=120)
    assert st.returncode == 0, st.stderr
    doc = e2e.json("status", cfg=cfg)
    for cs in doc["nodes"].values():
        for c in cs:
            assert c["name"] in st.stdout and c["id"] in st.stdout
    assert "…" not in st.stdout and "gates passed for this boot" in st.stdout
    assert doc["gates_this_boot"] == "passed"
    assert sum("/v1" in ln for ln in st.stdout.splitlines()) == 1, st.stdout
    assert "fingerprint" not in st.stdout

    # `gates` narrates: the smoke cell's start and end, then the reading, before the table
    g = e2e.cli("gates", cfg=cfg)
    assert g.returncode == 0, g.stderr
    assert "gates: smoke cell, 3 requests" in g.stderr and "gates: reading every rank's log" in g.stderr

    # swap-drafter to the drafter serving: nothing restarts, and it says so
    same = tmp_path / "same-drafter"
    shutil.copytree(e2e.node_path("node-a", e2e.rig.models["drafter"]), same)
    before = e2e.running_ids()
    s = e2e.cli("swap-drafter", str(same), cfg=cfg)
    assert s.returncode == 0, s.stderr
    assert "nothing to do" in s.stdout and "is the drafter serving now" in s.stdout, s.stdout
    assert e2e.running_ids() == before, "a no-op swap must not restart anything"
    assert "drafter.path is now" not in s.stdout  # no restart, no rewrite: the ids above prove it, not a clock

    # a bundle for a bug report, while it runs
    out = tmp_path / "report.tar.gz"
    b = e2e.cli("bundle", "-o", str(out), cfg=cfg)
    assert b.returncode == 0, b.stderr
    with tarfile.open(out) as tf:
        names = tf.getnames()
        gates_doc = json.loads(tf.extractfile(next(n for n in names if n.endswith("gates.json"))).read())  # type: ignore[union-attr]
    assert gates_doc.get("ok") is True, gates_doc
    assert any(n.endswith("doctor.json") for n in names) and any(n.endswith("config.yaml") for n in names)

    # down, then history and logs
    dn = e2e.cli("down", cfg=cfg)
    assert dn.returncode == 0, dn.stderr
    h = json.loads(e2e.cli("history", "--json", cfg=None).stdout)["entries"]
    h = [e for e in h if e["time"] >= started]  # the e2e journal is the session's: earlier tests' bench rows
    kinds = [e["kind"] for e in h]
    assert "down" in kinds and "smoke" in kinds, kinds
    assert not [e for e in h if e["kind"] == "bench"], "the gates' smoke runs are not `bench` rows"
    lg = e2e.cli("logs", cfg=cfg)
    assert lg.returncode == 0
    assert "no sparkserve container runs" in lg.stderr and "the last saved logs are in" in lg.stderr, lg.stderr
    saved = dn.stdout.split("logs in ")[-1].strip()
    assert saved and saved in lg.stderr, (dn.stdout, lg.stderr)
    assert e2e.leftovers() == {}
