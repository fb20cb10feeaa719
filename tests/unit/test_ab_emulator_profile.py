"""The engine emulator takes its acceptance profile from the drafter directory (``ssemu-acceptance.json``), as
an A/B campaign needs: per-position acceptance as given, streams paced by engine steps (tok/s ∝ acceptance
length), the drafter's own seed; without the file it keeps ``SSEMU_ACCEPTANCE`` / the default. Run as a plain
process on 127.0.0.1 (no docker). Also: a request's output chunks are its engine steps, so tokens / chunks is
the acceptance length the counters give."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sparkserve.measure.prompts import builtin_prompts
from sparkserve.measure.records import Cell
from sparkserve.measure.run import run_cell, run_cell_outcomes_async

REPO = Path(__file__).parents[2]
EMULATOR = REPO / "tests" / "rig" / "emulator" / "vllm_emulator.py"
TINY = REPO / "tests" / "helpers" / "tiny_models.py"
MODEL = "tiny"
PROFILE = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]  # acceptance length 5.2
DEFAULT = [0.744, 0.545, 0.405, 0.306, 0.237, 0.185, 0.147]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, str(TINY), "target", str(root / "target")], check=True, capture_output=True)
    subprocess.run([sys.executable, str(TINY), "drafter", str(root / "drafter")], check=True, capture_output=True)
    return root


@pytest.fixture
def serve(models: Path, tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[bytes]] = []

    def start(profile: dict | str | None, k: int = 7) -> tuple[str, subprocess.Popen[bytes], Path]:
        drafter = tmp_path / f"drafter-{len(procs)}"
        shutil.copytree(models / "drafter", drafter)
        if profile is not None:
            text = profile if isinstance(profile, str) else json.dumps(profile)
            (drafter / "ssemu-acceptance.json").write_text(text)
        port = free_port()
        log = tmp_path / f"emu-{port}.log"
        spec = json.dumps({"method": "dflash", "model": str(drafter), "num_speculative_tokens": k})
        argv = [sys.executable, str(EMULATOR), "serve", str(models / "target"), "--served-model-name", MODEL,
                "--host", "127.0.0.1", "--port", str(port), "--speculative-config", spec, "--seed", "3"]
        env = {**os.environ, "SSEMU_BOOT_SECONDS": "0.3", "SSEMU_TOKEN_RATE": "0"}
        env.pop("SSEMU_ACCEPTANCE", None)
        with log.open("wb") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        return url, p, log

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def test_the_drafter_dirs_profile_is_served_and_paced_by_engine_steps(serve) -> None:
    import asyncio

    url, _, _ = serve({"per_position": PROFILE, "steps_per_s": 400, "seed": 5})
    r, outcomes = asyncio.run(run_cell_outcomes_async(url, MODEL, Cell("t", 8, 1, 256), builtin_prompts()))
    assert r.ok, r.refused
    n = r.drafts
    assert n is not None and n > 300
    for p, (got, want) in enumerate(zip(r.per_position_acceptance, PROFILE, strict=True)):
        assert abs(got - want) <= 4 * (want * (1 - want) / n) ** 0.5, (p, got, want)
    al = r.acceptance_length
    assert al == pytest.approx(1 + sum(PROFILE), rel=0.08)
    # one output chunk per engine step: the requests' own ratio tracks the counters' acceptance length (a bit
    # under it: each request's last step is cut at max_tokens, while the counters keep what was accepted)
    ratio = sum(o.completion_tokens for o in outcomes) / sum(o.chunks for o in outcomes)
    assert al * 0.94 <= ratio <= al
    # paced by steps: each stream makes ~400 steps/s, so its tok/s is ~400 × acceptance length
    assert r.output_tok_s == pytest.approx(400 * al, rel=0.25)


def test_without_the_file_the_default_profile_stays_and_a_wrong_file_fails_the_boot(serve) -> None:
    url, _, _ = serve(None)
    r = run_cell(url, MODEL, Cell("t", 8, 2, 256), builtin_prompts())
    assert r.acceptance_length == pytest.approx(1 + sum(DEFAULT), rel=0.1)
    _, p, log = serve('{"per_position": [1.5]}')
    deadline = time.monotonic() + 20
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.returncode not in (None, 0), "the emulator served a profile outside [0, 1]"
    assert "ssemu-acceptance.json: per_position must be" in log.read_text()


# issue 42: K has a real optimum in the emulator (acceptance falling with position against a drafting cost per
# drafted token), and a planted tie (positions never accepted, drafting free) gives the very same streams
PLANTED = [0.9, 0.85, 0.8, 0.05, 0.02, 0.01, 0.0]  # tok/s ∝ AL / (1 + 0.15 K): K=3 2.45, K=4 2.25, K=5 2.07


def test_a_drafting_cost_per_token_gives_k_an_optimum(serve) -> None:
    got = {}
    for k in (3, 5):
        url, _, _ = serve({"per_position": PLANTED, "steps_per_s": 400, "draft_cost": 0.15, "seed": 5}, k=k)
        got[k] = run_cell(url, MODEL, Cell("t", 6, 1, 256), builtin_prompts())
    a3, a5 = (got[k].acceptance_length for k in (3, 5))
    assert a3 == pytest.approx(1 + sum(PLANTED[:3]), rel=0.06) and a5 == pytest.approx(1 + sum(PLANTED[:5]), rel=0.06)
    assert a5 > a3  # the longer draft accepts more per step …
    # … but pays 0.15 of a step per drafted token: K=3 is faster (predicted 2.448 / 2.069 = 1.18)
    assert got[3].output_tok_s / got[5].output_tok_s == pytest.approx(1.18, rel=0.08)
    assert got[3].per_position_acceptance[2] > 0.7 and got[5].per_position_acceptance[3] < 0.12


def test_positions_never_accepted_and_free_drafting_make_a_tie_by_construction(serve) -> None:
    import asyncio

    tie = [0.9, 0.85, 0.8, 0.0, 0.0, 0.0, 0.0]
    runs = {}
    for k in (3, 4):
        url, _, _ = serve({"per_position": tie, "steps_per_s": 400, "seed": 5}, k=k)
        runs[k] = asyncio.run(run_cell_outcomes_async(url, MODEL, Cell("t", 6, 1, 128), builtin_prompts()))
    (r3, o3), (r4, o4) = runs[3], runs[4]
    assert [o.chunks for o in o3] == [o.chunks for o in o4]  # step for step the same streams
    assert r3.accepted_tokens == r4.accepted_tokens and r3.drafts == r4.drafts
    assert r4.per_position_acceptance[3] == 0.0
