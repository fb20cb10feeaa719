"""Issue 26 fabric, on the two-node rig: NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,NET is in every rank's env,
the emulator prints NCCL's own INIT/NET lines (as real NCCL does at INFO), and the faults gate reads the transport:
`Using network IB` passes; the socket fallback (`Using network Socket`) fails it, naming the node."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.rig


def _env(e2e, node: str) -> dict[str, str]:
    (c,) = e2e.managed(node)
    return dict(kv.split("=", 1) for kv in c.attrs["Config"]["Env"])


def test_the_boot_window_shows_ib_and_the_gate_records_it(e2e) -> None:
    cfg = e2e.config()
    p = e2e.cli("up", "--no-gates", cfg=cfg)
    assert p.returncode == 0, p.stderr
    try:
        env = _env(e2e, "node-a")
        assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")
        report = e2e.json("gates", "--skip", "smoke", cfg=cfg, code=0, timeout=120)
        faults = next(g for g in report["gates"] if g["name"] == "faults")
        assert faults["ok"] and faults["observed"]["transport"] == {"node-a": "IB", "node-b": "IB"}
        assert "NCCL over IB/RoCE on node-a, node-b" in faults["reason"]
        ident = next(g for g in report["gates"] if g["name"] == "identity")
        assert ident["observed"]["node-b"]["nccl"]["version"]  # NCCL's own version line, per node
    finally:
        assert e2e.cli("down", cfg=cfg).returncode == 0


def test_the_socket_fallback_fails_the_faults_gate_naming_the_node(e2e) -> None:
    cfg = e2e.config({"serve": {"env": {"NCCL_IB_DISABLE": "1"}}, "fabric": {"nccl_net": None}})
    p = e2e.cli("up", "--no-gates", cfg=cfg)
    assert p.returncode == 0, p.stderr
    try:
        report = e2e.json("gates", "--skip", "smoke", cfg=cfg, code=1, timeout=120)
        faults = next(g for g in report["gates"] if g["name"] == "faults")
        assert not faults["ok"] and faults["observed"]["transport"]["node-b"] == "Socket"
        assert "socket transport on node-a, node-b" in faults["reason"]
        assert any("Using network Socket" in e["text"] for e in faults["evidence"])
    finally:
        assert e2e.cli("down", cfg=cfg).returncode == 0
