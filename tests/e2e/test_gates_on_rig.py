"""The production gates on the rig's running stack (`up` runs them; `sparkserve gates` re-runs them): a
healthy stack passes every gate with the smoke cell; each emulator fault mode fails exactly the gate(s) it
should, with the evidence line; `gates --from-log` judges the saved logs of boots that never finished."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
from e2e_support import BOTH_RUNTIMES
from scenario import cluster

pytestmark = pytest.mark.rig

ALL = {"pool", "graphs", "mask", "smoke", "faults", "runner", "signature", "identity"}
E2E_DIR = "/srv/spark/e2e"


def failed(report: dict) -> dict[str, dict]:
    return {g["name"]: g for g in report["gates"] if not g["ok"]}


def evidence_text(gate: dict) -> str:
    return "\n".join(f"{e['node']}:{e['line']}: {e['text']}" for e in gate["evidence"])


def gates_json(e2e, cfg: Path, *args: str, code: int) -> dict:
    report = e2e.json("gates", *args, cfg=cfg, code=code, timeout=120)
    assert {g["name"] for g in report["gates"]} == ALL
    return report


def test_healthy_up_passes_every_gate_with_the_smoke_cell(e2e) -> None:
    cfg = e2e.config({"gates": {"smoke": {"prompts": 20, "max_tokens": 512, "request_timeout_s": 60}}})
    p = e2e.cli("up", cfg=cfg)
    assert p.returncode == 0, p.stderr
    assert "all gates passed" in p.stdout
    report = gates_json(e2e, cfg, code=0)
    assert report["ok"] is True and not failed(report)
    by = {g["name"]: g for g in report["gates"]}
    assert by["smoke"]["observed"]["requests_ok"] == 20 and by["smoke"]["observed"]["stream_errors"] == 0
    assert by["pool"]["observed"] == [e2e.load(cfg).gates.pool_tokens]
    mask = evidence_text(by["mask"])
    assert "node-a" in mask and "node-b" in mask and "mask_token_id 154856" in mask  # every rank prints it
    graphs = evidence_text(by["graphs"])
    assert "node-a" in graphs and "node-b" in graphs and "Graph capturing finished" in graphs
    for g in report["gates"]:
        assert g["evidence"] or g["reason"], g  # every verdict says what it saw or looked for
    assert e2e.cli("down", cfg=cfg).returncode == 0


# Each fault that lets the stack boot: up --no-gates, then `sparkserve gates` → exactly these gates fail.
LIVE_FAULTS = {
    "graphs_off@rank=1": ({"graphs"}, "graphs", "rank 1"),
    # the head logs the failed request at ERROR: an engine fault line, not only a client-side error
    "stream_error@request=2": ({"smoke", "faults"}, "faults", "failed with an internal error during generation"),
    "worker_death@rank=1,after=1": ({"smoke", "faults"}, "faults", "died unexpectedly"),
    "nccl_timeout@rank=1": ({"smoke", "faults"}, "faults", "Watchdog caught collective operation timeout"),
}


@pytest.mark.parametrize("fault", list(LIVE_FAULTS))
def test_each_fault_mode_fails_exactly_its_gates(e2e, fault: str) -> None:
    want, gate, line = LIVE_FAULTS[fault]
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": fault}}, "gates": {"smoke": {"request_timeout_s": 5}}})
    p = e2e.cli("up", "--no-gates", cfg=cfg)
    assert p.returncode == 0, p.stderr
    t0 = time.monotonic()
    report = gates_json(e2e, cfg, code=1)
    assert time.monotonic() - t0 < 60  # a hang is bounded by the smoke deadline
    got = failed(report)
    assert set(got) == want, {k: v["reason"] for k, v in got.items()}
    assert line in got[gate]["reason"] + "\n" + evidence_text(got[gate]), got[gate]
    if "smoke" in want:
        assert any(e["node"] == "node-a" for e in got["smoke"]["evidence"])  # the stream error names its node
    assert e2e.cli("down", cfg=cfg).returncode == 0


def test_rank1_graphs_off_fails_up_naming_rank_1_and_stops_the_stack(e2e) -> None:
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": "graphs_off@rank=1"}}})
    p = e2e.cli("up", cfg=cfg)
    text = e2e.assert_explained(p, code=1, node=None, step="gates", says=("graphs",))
    graphs = next(ln for ln in text.splitlines() if ln.strip().startswith("graphs:"))
    assert "rank 1" in graphs, text
    assert e2e.leftovers() == {}


def test_enforce_eager_fails_graphs(e2e) -> None:
    cfg = e2e.config({"serve": {"enforce_eager": True}})
    assert e2e.cli("up", "--no-gates", cfg=cfg).returncode == 0
    got = failed(gates_json(e2e, cfg, code=1))
    assert set(got) == {"graphs"}, {k: v["reason"] for k, v in got.items()}
    assert "eager" in (got["graphs"]["reason"] + evidence_text(got["graphs"])).lower()
    assert e2e.cli("down", cfg=cfg).returncode == 0


# Faults that end the boot: `up` fails (exit 3, logs saved), then `gates --from-log` on those logs.
BOOT_FAULTS = {
    "crash_boot@rank=1": ("node-b", "NCCL error: unhandled system error"),
    "oom@rank=1": ("node-b", "CUDA out of memory"),
}


def saved_logs(e2e, stderr: str) -> list[str]:
    line = next(ln for ln in stderr.splitlines() if "full logs: " in ln)
    d = Path(line.split("full logs: ", 1)[1].strip())
    files = sorted(d.glob("*.log"))
    assert {f.name.split("-")[0] + "-" + f.name.split("-")[1] for f in files} == {"node-a", "node-b"}
    return [f"{f.name[:6]}={f}" for f in files]


@pytest.mark.parametrize("fault", list(BOOT_FAULTS))
def test_boot_fault_logs_fail_the_faults_gate_offline(e2e, fault: str) -> None:
    node, line = BOOT_FAULTS[fault]
    cfg = e2e.config({"serve": {"env": {"SSEMU_FAULTS": fault}}})
    p = e2e.cli("up", cfg=cfg)
    e2e.assert_explained(p, code=3, node=node, step="boot")
    assert e2e.leftovers() == {}
    args = [a for pair in saved_logs(e2e, p.stderr) for a in ("--from-log", pair)]
    report = gates_json(e2e, cfg, *args, "--skip", "smoke", "--skip", "identity", code=1)
    got = failed(report)
    assert "faults" in got
    ev = [e for e in got["faults"]["evidence"] if line in e["text"]]
    assert ev and ev[0]["node"] == node and isinstance(ev[0]["line"], int)


def test_drafter_without_mask_is_refused_before_boot_and_its_log_fails_mask(e2e, tmp_path) -> None:
    nomask = e2e.rig.models["drafter-nomask"]
    cfg = e2e.config({"drafter": {"path": nomask}})
    p = e2e.cli("up", cfg=cfg)
    e2e.assert_explained(p, code=2, node=None, step="drafter", says=("mask_embedding.pt",))
    assert "starting" not in p.stderr  # refused before any container was started
    assert e2e.leftovers() == {}

    # the same boot, forced past sparkserve (as a hand-run launcher would): the emulator's logs of it
    data = e2e.load(cfg).model_dump(mode="json")
    with cluster(e2e.rig, e2e.docker, overrides={"drafter": {"path": nomask}}, env=data["serve"]["env"]) as c:
        c.wait_ready()
        args = []
        for n in e2e.rig.nodes:
            f = tmp_path / f"{n.name}.log"
            f.write_text(c.text(n.name))
            args += ["--from-log", f"{n.name}={f}"]
    report = gates_json(e2e, cfg, *args, "--skip", "smoke", "--skip", "identity", code=1)
    got = failed(report)
    assert set(got) == {"mask"}, {k: v["reason"] for k, v in got.items()}
    assert "node-a" in got["mask"]["reason"] or "rank 0" in got["mask"]["reason"], got["mask"]


@pytest.fixture
def target_copies(e2e):
    """A private copy of the rig's target on every node (its weights are not in the config fingerprint)."""
    node_path = f"{E2E_DIR}/target-pool"
    for n in e2e.rig.nodes:
        dst = e2e.node_path(n.name, node_path)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(e2e.node_path(n.name, e2e.rig.models["target"]), dst)
    yield node_path
    for n in e2e.rig.nodes:
        shutil.rmtree(e2e.node_path(n.name, E2E_DIR), ignore_errors=True)


def test_changed_kv_size_fails_pool_against_the_banked_value(e2e, target_copies) -> None:
    """GMU-sized KV cache: same config, image and drafter (same fingerprint), bigger weights on disk →
    a smaller pool. Only the banked value can tell."""
    cfg = e2e.config({"model": {"target": target_copies},
                      "serve": {"kv_cache_memory_bytes": None, "gpu_memory_utilization": 0.5},
                      "gates": {"pool_tokens": None}})
    first = e2e.json("up", cfg=cfg)
    banked = gates_json(e2e, cfg, "--bank", code=0)
    pool = next(g for g in banked["gates"] if g["name"] == "pool")["observed"][0]
    assert e2e.cli("down", cfg=cfg).returncode == 0

    for n in e2e.rig.nodes:  # 1 GiB more weights on every node (sparse: costs no disk)
        with open(e2e.node_path(n.name, target_copies) / "pad.safetensors", "wb") as f:
            header = json.dumps({"pad": {"dtype": "U8", "shape": [2**30], "data_offsets": [0, 2**30]}}).encode()
            f.write(len(header).to_bytes(8, "little") + header)  # a real safetensors file: one extra tensor
            f.truncate(8 + len(header) + 2**30)
    again = e2e.json("up", "--no-gates", cfg=cfg)
    assert again["fingerprint"] == first["fingerprint"]
    got = failed(gates_json(e2e, cfg, code=1))
    assert set(got) == {"pool"}, {k: v["reason"] for k, v in got.items()}
    assert got["pool"]["expected"]["banked"] == pool and got["pool"]["observed"][0] < pool
    assert "banked pool" in got["pool"]["reason"] and "KV cache size:" in evidence_text(got["pool"])
    assert e2e.cli("down", cfg=cfg).returncode == 0


@BOTH_RUNTIMES
def test_killed_follower_fails_gates_and_status_while_health_stays_200(e2e) -> None:
    cfg = e2e.config({"gates": {"smoke": {"request_timeout_s": 4}}})
    assert e2e.cli("up", "--no-gates", cfg=cfg).returncode == 0
    c = e2e.load(cfg)
    api = f"http://{c.serve.host}:{c.serve.port}"
    e2e.kill_rank("node-b")  # docker kill of its container, or SIGKILL of its engine process
    time.sleep(1)
    assert httpx.get(f"{api}/health", timeout=5).status_code == 200  # real vLLM: still 200

    st = e2e.cli("status", "--json", cfg=cfg)
    assert st.returncode == 1 and '"status": "exited"' in st.stdout
    got = failed(gates_json(e2e, cfg, code=1))
    assert "faults" in got and "engine container on node-b is not running" in evidence_text(got["faults"])

    t0 = time.monotonic()  # a request to the head would hang: bench checks every rank first and names the dead one
    b = e2e.cli("bench", "--protocol", "forced", "--cell", "smoke", "--request-timeout", "4", "--stall-timeout", "4",
                "--json", cfg=cfg)
    assert time.monotonic() - t0 < 30
    assert b.returncode == 3
    assert "node-b" in b.stdout + b.stderr and "cannot serve a request" in b.stdout + b.stderr
    assert e2e.cli("down", cfg=cfg).returncode == 0
    assert e2e.leftovers() == {}

