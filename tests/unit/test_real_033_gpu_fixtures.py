"""sparkserve's verdicts on what the real run against real vLLM 0.33.0 on an H100 saved (issue 43).

The fixtures are tests/fixtures/logs/real-0.33.0-gpu/ (its README.md: which device call wrote each file); the
verdicts are tests/real/verdicts.py, as for the 0.25.1 lane (tests/unit/test_real_gpu_fixtures.py), plus what
0.33 does its own way: the killed stream's message, the process manager's line before the engine's death, the
acceptance length that /metrics, sparkserve's bench and `vllm bench serve` agree on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real"))
import verdicts  # noqa: E402

from sparkserve.measure.metrics import acceptance, counter_delta, parse_metrics  # noqa: E402
from sparkserve.observe.analyze import analyze  # noqa: E402
from sparkserve.observe.gate_inputs import Expectations  # noqa: E402
from sparkserve.observe.gates import judge  # noqa: E402
from sparkserve.observe.logs import parse_log  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-0.33.0-gpu"


def _json(name: str) -> dict:
    return json.loads((FIX / name).read_text())


@pytest.mark.parametrize("log", ["boot1-up.log", "boot-overhead-up.log"])
def test_healthy_boot(log: str) -> None:
    # the scenario's `up` boot (served both benches, then replaced by swap-drafter); a `sparkserve up` of the
    # overhead pairs (warm compile cache)
    verdicts.healthy_boot(FIX / log)


def test_killed_engine_core_names_the_engines_death_although_a_shutdown_line_comes_first() -> None:
    # real 0.33.0 prints `[shutdown] Process manager: send sigterm to process EngineCore` before `engine core exited
    # unexpectedly`; read as a deliberate stop, it hid the fault (the run's gates said only "engine not running")
    verdicts.killed_engine_core(FIX / "boot-killed.log")
    text = (FIX / "boot-killed.log").read_text()
    assert text.index("[shutdown] Process manager: send sigterm") < text.index("engine core exited unexpectedly")
    report = judge({"gpu": parse_log((FIX / "boot-killed.log").read_bytes(), file="boot-killed.log")},
                   Expectations(ranks=("0",), mask_file=True, mask_token_id=verdicts.MASK_TOKEN_ID),
                   skip=("smoke", "identity"))
    faults = next(g for g in report.gates if g.name == "faults")
    assert not faults.ok and "engine_dead" in faults.reason, faults.reason


def test_a_deliberate_sigterm_is_no_fault() -> None:
    # the bare `vllm serve` of the overhead pairs, stopped by SIGTERM: the same process manager line, after the
    # EngineCore's own `trigger received signal=SIGTERM`, then `force killing remaining process` — no fault
    a = analyze([parse_log((FIX / "boot-bare-sigterm.log").read_bytes(), file="boot-bare-sigterm.log")])
    assert a.ready is True and [e.text for _, e in a.faults] == []


def test_the_failing_probes() -> None:
    verdicts.pool_then_oom(FIX / "probe-kv-bigger-than-gpu.log")
    verdicts.kv_too_small(FIX / "probe-kv-too-small.log")
    verdicts.validation_error(FIX / "probe-spec-key-typo.log")


def test_the_killed_stream_gets_033s_client_message() -> None:
    verdicts.killed_stream(FIX / "kill-client.json", "The server had an error while processing your request.")


def test_bench_beside_vllm_bench_serve_and_the_acceptance_length_of_metrics() -> None:
    verdicts.bench_beside_vllm(FIX / "bench.json", FIX / "vllm-bench.json")
    ours, theirs = _json("bench.json"), _json("vllm-bench.json")
    assert abs(ours["acceptance_length"] - theirs["spec_decode_acceptance_length"]) <= 0.01 * theirs[
        "spec_decode_acceptance_length"]  # the 1 %
    before = parse_metrics((FIX / "metrics-before.txt").read_text())
    after = parse_metrics((FIX / "metrics-after.txt").read_text())
    al = acceptance(counter_delta(before, after)).acceptance_length  # the two benches' drafts, from /metrics
    assert al is not None and abs(al - ours["acceptance_length"]) <= 0.01 * al, (al, ours["acceptance_length"])


def test_the_gates_and_swaps_of_the_run() -> None:
    assert _json("gates.json")["ok"] and _json("gates-after-swap.json")["ok"]
    assert len(_json("gates.json")["gates"]) == 8
    for name in ("swap-drafter-nomask.out", "swap-drafter-missing.out"):
        assert "rc=2 " in (FIX / name).read_text()
    after_kill = _json("gates-after-kill.json")
    assert not after_kill["ok"] and not next(g for g in after_kill["gates"] if g["name"] == "faults")["ok"]
