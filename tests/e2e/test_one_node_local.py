"""A one-node stack on this machine (``local: true``) with ``runtime: process`` — the shape of a single GPU box
running vLLM from a venv (and of the real-engine run, tests/real): the emulator as a local host process, no
SSH, no docker, no rendezvous flags. up → gates → bench → status → logs → down, and nothing left running."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest
import rig as riglib
from e2e_support import FAST_ENV, MARKER_ENV, PREFIX, SMALL_SMOKE, free_port

pytestmark = pytest.mark.rig

KV_BYTES, KV_DTYPE, MAX_LEN = 8 * 2**30, "fp8_e4m3", 262144


def marked_pids(rank_ids: set[str]) -> list[int]:
    """Live processes on this machine that carry one of these ranks' markers."""
    want = {f"{MARKER_ENV}={r}".encode() for r in rank_ids}
    out = []
    for d in Path("/proc").iterdir():
        try:
            env = set((d / "environ").read_bytes().split(b"\0"))
            alive = (d / "stat").read_text().rsplit(") ", 1)[1][0] not in "ZX"
        except (OSError, IndexError):
            continue
        if alive and env & want:
            out.append(int(d.name))
    return out


@pytest.fixture
def solo(e2e, tmp_path: Path) -> Path:
    """A one-node config: this machine, the emulator as ``serve.vllm``, the rig's tiny models copied here."""
    models = tmp_path / "models"
    src = e2e.node_path("node-a", e2e.rig.models["target"]).parent
    for name in ("target", "drafter"):
        shutil.copytree(src / name, models / name)
    launcher = tmp_path / "bin" / "vllm"  # what a venv's bin/vllm is to a real install
    launcher.parent.mkdir()
    launcher.write_text(f"#!/bin/sh\nexport PYTHONUNBUFFERED=1 SSEMU_SERVE_ARGS={riglib.SERVE_ARGS_JSON}\n"
                        f'exec {sys.executable} {riglib.EMU_DIR / "vllm_emulator.py"} "$@"\n')
    launcher.chmod(0o755)
    host = "127.0.0.1"
    data = {
        "nodes": [{"name": "solo", "host": "localhost", "fabric_ip": host, "local": True, "gpus": 1}],
        "runtime": "process",
        "process": {"run_dir": str(tmp_path / "run")},
        "image": {"ref": "unused-by-runtime-process"},
        "model": {"target": str(models / "target"), "served_name": "tiny"},
        "drafter": {"path": str(models / "drafter")},
        "serve": {"tensor_parallel_size": 1, "host": host, "port": free_port(host), "vllm": str(launcher.parent.parent),
                  "max_model_len": MAX_LEN, "kv_cache_dtype": KV_DTYPE, "kv_cache_memory_bytes": "8GiB",
                  "gpu_memory_utilization": 0.1, "env": dict(FAST_ENV), "ready_timeout_s": 60},
        "container": {"name_prefix": PREFIX, "stop_timeout_s": 3},
        "gates": {"pool_tokens": riglib.pool_tokens_for(models, KV_BYTES, KV_DTYPE, 1, MAX_LEN),
                  "mask_token_id": 154856, "smoke": dict(SMALL_SMOKE)},
        "watchdog": {"memory_floor_bytes": "1GiB"},
    }
    return e2e.config(data=data)


@pytest.mark.parametrize("e2e", ["process"], indirect=True)
def test_one_local_node_serves_gates_benches_and_down_leaves_no_process(e2e, solo: Path, tmp_path: Path) -> None:
    plan = e2e.json("plan", cfg=solo)
    (spec,) = plan["plan"]["specs"]
    argv = spec["process_argv"]
    assert argv[:2] == [str(tmp_path), "serve"] and "--nnodes" not in argv and "--headless" not in argv

    p = e2e.cli("up", cfg=solo)
    assert p.returncode == 0, p.stderr
    assert "all gates passed" in p.stdout and "Traceback" not in p.stderr
    c = e2e.load(solo)
    api = f"http://{c.serve.host}:{c.serve.port}"
    assert httpx.get(f"{api}/v1/models", timeout=5).status_code == 200

    st = e2e.json("status", cfg=solo)
    assert st["ok"] is True and [x["status"] for x in st["nodes"]["solo"]] == ["running"]
    ids = _full_ids(tmp_path)
    assert len(ids) == 1 and len(marked_pids(ids)) == 1  # the engine, in its own session
    bench = e2e.json("bench", "--protocol", "forced", "--cell", "smoke", cfg=solo, timeout=120)
    assert bench["requests_ok"] == bench["prompts"] and bench["stream_errors"] == 0
    logs = e2e.cli("logs", cfg=solo)
    assert logs.returncode == 0 and "solo | " in logs.stdout and "Application startup complete." in logs.stdout

    p = e2e.cli("down", cfg=solo)
    assert p.returncode == 0, p.stderr
    assert marked_pids(ids) == []
    assert not list((tmp_path / "run").rglob("*.json"))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{api}/v1/models", timeout=2)


def _full_ids(tmp_path: Path) -> set[str]:
    """The rank ids the run dir's manifests name."""
    import json

    return {json.loads(p.read_text())["id"] for p in (tmp_path / "run").rglob("rank*.json")}


def test_marked_pids_finds_a_process_by_its_marker() -> None:
    """The leftover check above can fail: it sees a process that carries a marker."""
    import subprocess

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                         env={**os.environ, MARKER_ENV: "feedfacefeedface-r0"})
    try:
        assert marked_pids({"feedfacefeedface-r0"}) == [p.pid]
    finally:
        p.kill()
        p.wait()
    assert marked_pids({"feedfacefeedface-r0"}) == []
