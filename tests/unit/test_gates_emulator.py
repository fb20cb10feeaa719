"""The gates judge what the engine emulator (tests/rig/emulator, speaks vLLM 0.33) writes, booted as two plain
host processes on 127.0.0.1 (no docker, no ssh): a healthy boot passes the log gates, and each fault mode fails
exactly the gate it should, with its evidence — the same logs `sparkserve gates --from-log` reads."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import GateReport
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import parse_log

REPO = Path(__file__).resolve().parents[2]
EMU = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
sys.path.insert(0, str(REPO / "tests" / "helpers"))
import tiny_models  # noqa: E402

NODES = ("spark-a", "spark-b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("models")
    tiny_models.write_target(base / "target")
    tiny_models.write_drafter(base / "drafter")
    tiny_models.write_drafter(base / "drafter-nomask", tiny_models.DrafterSpec(mask_file=None))
    return base


def boot(models: Path, out: Path, *, faults: str = "", drafter: str = "drafter", extra: tuple[str, ...] = ()) -> dict:
    """Start follower and head, wait until the head is ready (or a rank has died), stop both with SIGKILL (no
    shutdown chatter: like the live gates, judge the logs since start), return node → parsed log."""
    assert EMU.is_file(), f"the engine emulator is missing: {EMU}"
    out.mkdir(parents=True)
    spec = {"method": "dflash", "model": str(models / drafter), "num_speculative_tokens": 7}
    cc = {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32]}
    argv = [
        sys.executable,
        str(EMU),
        "serve",
        str(models / "target"),
        "-tp",
        "2",
        "--nnodes",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--kv-cache-memory-bytes",
        "8G",
        "--max-model-len",
        "262144",
        "--enable-expert-parallel",
        "--compilation-config",
        json.dumps(cc),
        "--speculative-config",
        json.dumps(spec),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SSEMU_", "VLLM_"))}
    env.update(SSEMU_FAULTS=faults, SSEMU_BOOT_SECONDS="1", SSEMU_NCCL_TIMEOUT_S="1")
    files = {n: out / f"{n}.log" for n in NODES}
    procs = []
    with files["spark-b"].open("wb") as fb, files["spark-a"].open("wb") as fa:
        procs.append(
            subprocess.Popen(
                [*argv, "--node-rank", "1", "--headless"],
                stdout=fb,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        procs.append(
            subprocess.Popen(
                [*argv, "--node-rank", "0", "--port", str(free_port())],
                stdout=fa,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if b"Application startup complete" in files["spark-a"].read_bytes():
                    break
                if any(p.poll() is not None for p in procs):
                    time.sleep(2)  # let the other side write its consequence lines
                    break
                time.sleep(0.2)
            else:
                pytest.fail("emulator neither got ready nor died in 90 s")
            time.sleep(1.5)  # the boot's trailing lines (e.g. the watchdog after a hung collective)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
    return {n: parse_log(f.read_bytes(), file=str(f), node=n) for n, f in files.items()}


def expect(**kw) -> Expectations:
    base = Expectations(
        ranks=("0", "1"),
        pool_tokens=None,
        mask_file=True,
        mask_token_id=154856,
        nodes=NODES,
        node_ranks={"spark-a": ("0",), "spark-b": ("1",)},
    )
    return Expectations(**{**base.__dict__, **kw})


def log_gates(logs: dict, e: Expectations | None = None) -> GateReport:
    return judge(logs, e or expect(), skip=["smoke", "identity"])


def failed(r: GateReport) -> set[str]:
    return {g.name for g in r.failed()}


def test_healthy_emulator_boot_passes_every_log_gate(models: Path, tmp_path: Path) -> None:
    r = log_gates(boot(models, tmp_path / "run"))
    assert r.ok, [(g.name, g.reason) for g in r.failed()]
    assert r.get("pool").observed and len(r.get("pool").observed) == 1


def test_emulator_rank1_graphs_off_fails_graphs_naming_rank_1(models: Path, tmp_path: Path) -> None:
    r = log_gates(boot(models, tmp_path / "run", faults="graphs_off@rank=1"))
    assert failed(r) == {"graphs"}
    assert "rank 1 graphs off" in r.get("graphs").reason and "rank 0" not in r.get("graphs").reason


def test_emulator_enforce_eager_fails_graphs(models: Path, tmp_path: Path) -> None:
    r = log_gates(boot(models, tmp_path / "run", extra=("--enforce-eager",)))
    assert failed(r) == {"graphs"}


def test_emulator_drafter_without_mask_file_fails_mask(models: Path, tmp_path: Path) -> None:
    r = log_gates(boot(models, tmp_path / "run", drafter="drafter-nomask"), expect(mask_file=False))
    assert failed(r) == {"mask"}
    assert "has no mask_embedding.pt" in r.get("mask").reason


def test_emulator_oom_on_rank1_fails_faults_with_the_root_cause_first(models: Path, tmp_path: Path) -> None:
    r = log_gates(boot(models, tmp_path / "run", faults="oom@rank=1"))
    assert "faults" in failed(r)
    f = r.get("faults")
    assert f.observed["faults"][0] == {**f.observed["faults"][0], "node": "spark-b", "kind": "oom"}
    assert "CUDA out of memory" in f.evidence[0].text


def test_emulator_nccl_watchdog_on_rank1_fails_faults(models: Path, tmp_path: Path) -> None:
    r = log_gates(boot(models, tmp_path / "run", faults="nccl_timeout@rank=1,at=boot"))
    assert "faults" in failed(r)
    f = r.get("faults")
    assert f.observed["faults"][0]["kind"] == "timeout" and "Watchdog caught collective" in f.evidence[0].text
