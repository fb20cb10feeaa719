"""The bench against the engine emulator (tests/rig/emulator) run as plain processes on 127.0.0.1.

No docker, no ssh: the emulator speaks vLLM 0.33's OpenAI API, SSE stream and /metrics, with a
per-position acceptance profile (SSEMU_ACCEPTANCE), a seed and faults (SSEMU_FAULTS).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sparkserve.measure.prompts import builtin_prompts
from sparkserve.measure.records import NOT_SENT, STALLED, Cell
from sparkserve.measure.run import run_cell

REPO = Path(__file__).parents[2]
EMULATOR = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
TINY = REPO / "tests" / "helpers" / "tiny_models.py"
MODEL = "glm-5.3-flash"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, str(TINY), "target", str(root / "target")], check=True, capture_output=True)
    subprocess.run([sys.executable, str(TINY), "drafter", str(root / "drafter")], check=True, capture_output=True)
    return root / "target", root / "drafter"


@dataclass
class Emu:
    url: str
    procs: list[subprocess.Popen[bytes]]  # followers first, the head last


StartEmu = Callable[..., Emu]


def _wait_ready(url: str, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is not None:
                pytest.fail(f"emulator exited {p.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"emulator not ready in 90 s:\n{logs[-1].read_text()[-3000:]}")


@pytest.fixture
def emulator(models: tuple[Path, Path], tmp_path: Path) -> Iterator[StartEmu]:
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str] | None = None, *, nodes: int = 1) -> Emu:
        target, drafter = models
        spec = json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 7})
        port, master = free_port(), free_port()
        e = {**os.environ, "SSEMU_BOOT_SECONDS": "0.3", "SSEMU_TOKEN_RATE": "0", **(env or {})}
        base = [sys.executable, str(EMULATOR), "serve", str(target), "--served-model-name", MODEL,
                "--speculative-config", spec, "--seed", "3"]
        if nodes > 1:
            base += ["-tp", str(nodes), "--nnodes", str(nodes), "--master-addr", "127.0.0.1",
                     "--master-port", str(master)]
        ranks = [[*base, "--node-rank", str(r), "--headless"] for r in range(nodes - 1, 0, -1)]
        head = [*base, "--host", "127.0.0.1", "--port", str(port)] + (["--node-rank", "0"] if nodes > 1 else [])
        procs, logs = [], []
        for i, argv in enumerate([*ranks, head]):
            log = tmp_path / f"emu-{port}-{i}.log"
            with log.open("wb") as f:
                procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=e))
            logs.append(log)
        started.extend(procs)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, procs, logs)
        return Emu(url, procs)

    yield start
    for p in started:
        if p.poll() is None:
            p.terminate()
    for p in started:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


PROFILES = {
    "default": (0.744, 0.545, 0.405, 0.306, 0.237, 0.185, 0.147),
    "strong": (0.92, 0.81, 0.66, 0.52, 0.40, 0.27, 0.15),
}


@pytest.mark.parametrize("name", list(PROFILES))
def test_bench_on_the_emulator_reports_the_acceptance_profile_it_was_given(emulator: StartEmu, name: str) -> None:
    profile = PROFILES[name]
    emu = emulator({"SSEMU_ACCEPTANCE": ",".join(map(str, profile))})
    r = run_cell(emu.url, MODEL, Cell("t", prompts=24, concurrency=4, max_tokens=512), builtin_prompts())
    assert r.ok, r.refused
    assert r.requests_ok == 24 and r.output_tokens == 24 * 512
    n = r.drafts
    assert n is not None and n > 2000
    assert r.draft_tokens == 7 * n
    # each position: a binomial proportion over n drafts
    for p, (got, want) in enumerate(zip(r.per_position_acceptance, profile, strict=True)):
        se = (want * (1 - want) / n) ** 0.5
        assert abs(got - want) <= 4 * se, f"position {p}: measured {got:.4f}, given {want} (±{4 * se:.4f})"
    # mean acceptance length: accepted per draft a has E[a] = Σ r, E[a²] = Σ (2p + 1) r[p]
    mean = sum(profile)
    var = sum((2 * p + 1) * x for p, x in enumerate(profile)) - mean**2
    assert r.acceptance_length is not None and r.accepted_tokens is not None
    assert abs(r.acceptance_length - (1 + mean)) <= 4 * (var / n) ** 0.5
    assert r.acceptance_rate == pytest.approx(r.accepted_tokens / r.draft_tokens)
    assert r.warnings == []  # non-increasing, and Σ per-position = AL − 1


def test_bench_counts_the_emulators_mid_stream_error(emulator: StartEmu) -> None:
    emu = emulator({"SSEMU_FAULTS": "stream_error@request=3"})
    r = run_cell(emu.url, MODEL, Cell("t", prompts=5, concurrency=1, max_tokens=64), builtin_prompts())
    assert r.stream_errors == 1 and r.error_kinds == {"error_event": 1}
    assert r.errors[0].request == 2  # the emulator counts from 1, the bench from 0
    assert not r.ok and r.refused[0].startswith("1 of 5 requests failed")


def test_dead_follower_hang_is_a_stream_error_naming_the_node(emulator: StartEmu) -> None:
    emu = emulator(nodes=2)
    follower = emu.procs[0]
    ok = run_cell(emu.url, MODEL, Cell("t", prompts=2, concurrency=1, max_tokens=32), builtin_prompts())
    assert ok.ok, ok.refused
    follower.send_signal(signal.SIGKILL)
    follower.wait(timeout=10)
    assert httpx.get(emu.url + "/health", timeout=5).status_code == 200  # /health does not see it
    t0 = time.monotonic()
    r = run_cell(emu.url, MODEL, Cell("smoke", prompts=20, concurrency=1, max_tokens=512), builtin_prompts(),
                 node="spark-a", stall_timeout_s=2.0)
    assert time.monotonic() - t0 < 30  # bounded, not stuck
    assert r.error_kinds == {STALLED: 1, NOT_SENT: 19}
    assert "spark-a" in r.errors[0].detail and emu.url in r.errors[0].detail
    assert not r.ok


def test_server_killed_mid_cell_gives_a_refused_result_not_a_crash(emulator: StartEmu) -> None:
    emu = emulator({"SSEMU_TOKEN_RATE": "2000"})
    head = emu.procs[-1]
    threading.Timer(1.0, head.kill).start()
    r = run_cell(emu.url, MODEL, Cell("smoke", prompts=20, concurrency=1, max_tokens=512), builtin_prompts(),
                 node="spark-a", stall_timeout_s=2.0)
    assert 1 <= r.requests_ok < 20
    assert r.stream_errors == 20 - r.requests_ok and set(r.error_kinds) == {"transport"}
    assert all("spark-a" in e.detail for e in r.errors)
    assert any(x.startswith("/metrics unreadable after the cell") for x in r.refused)


def test_the_first_run_after_a_boot_pays_the_warm_up_unless_the_bench_warms_up_first(emulator: StartEmu) -> None:
    # the emulator stalls the engine on each batch size's first run (SSEMU_FIRST_BATCH_S, issue 41: real vLLM's
    # first measured run after a boot paid ~4 s on an H100); here 4 sizes × 0.2 s on a ~1 s cell, paced by the
    # emulator's clock (1,000 tok/s a stream) so a busy shared CPU's hiccups stay small beside it
    cell = Cell("t", prompts=16, concurrency=4, max_tokens=256)
    env = {"SSEMU_TOKEN_RATE": "1000", "SSEMU_FIRST_BATCH_S": "0.2"}
    cold = emulator(env)
    first, second = (run_cell(cold.url, MODEL, cell, builtin_prompts()) for _ in range(2))
    assert first.ok and second.ok, (first.refused, second.refused)
    assert first.output_tok_s < 0.75 * second.output_tok_s  # without a warm-up the first run reads low
    assert first.warmup is not None and first.warmup.requests == 0
    warm = emulator(env)
    a, b = (run_cell(warm.url, MODEL, cell, builtin_prompts(), warmup=8) for _ in range(2))
    assert a.ok and b.ok, (a.refused, b.refused)  # the warm-up's requests and tokens are not the cell's
    assert a.warmup is not None and a.warmup.requests == 8 and a.warmup.requests_ok == 8 and a.warmup.errors == 0
    assert a.warmup.concurrency == 4 and a.warmup.output_tokens == 8 * 256
    assert a.output_tokens == 16 * 256 and a.requests_ok == 16
    # the warmed first run pays none of the four first-batch stalls (0.8 s; a cold first run pays them all): it
    # is not slower than the run after it by half of them. (A two-sided 10 % band on tok/s failed under a loaded
    # 2-core --quick run with the warmed run the *faster*, 3,950 against 3,499 tok/s: the next run's CPU noise,
    # not the property.)
    assert a.duration_s - b.duration_s < 0.5 * 4 * 0.2, (a.duration_s, b.duration_s)
    # latency as vLLM defines it, from the stream
    lat = a.latency
    assert lat is not None and lat.streamed and lat.note is None
    assert lat.ttft and lat.tpot and lat.itl and lat.e2e.n == 16 and lat.ttft.n == 16 and lat.tpot.n == 16
    assert lat.itl.n > 16 * 20  # one gap per chunk after the first: 256 tokens in ~256 / AL chunks
    assert lat.ttft.median_ms < lat.e2e.median_ms  # type: ignore[operator]
    # TPOT: (E2E − TTFT) / 255 per request, the first token excluded: under E2E / 255, and the emulator's pace
    # (1,000 tok/s a stream: 1 ms) since it serves with TCP_NODELAY as uvicorn does
    assert 0 < lat.tpot.mean_ms < lat.e2e.mean_ms / 255  # type: ignore[operator]
    assert 0.8 < lat.tpot.median_ms < 2.0  # type: ignore[operator]
    assert lat.ttft.median_ms < 20  # type: ignore[operator]  # no delayed-ACK wait before the first token
    assert a.output_len_mean == 256 and a.output_len_p50 == 256
    assert a.requests_per_s == pytest.approx(16 / a.duration_s, rel=1e-3)
