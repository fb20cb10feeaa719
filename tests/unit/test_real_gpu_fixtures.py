"""sparkserve's verdicts on what the real run against real vLLM 0.25.1 on an H200 saved (issue 13 item 4).

The fixtures are tests/fixtures/logs/real-0.25.1-gpu/ (its README.md: which device call wrote each file, and
the figures); the verdicts are tests/real/verdicts.py, one test per function, plus the saved results'
agreement with each other (bench beside `vllm bench serve` beside /metrics, the gate reports, the swaps).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real"))
import verdicts  # noqa: E402

from sparkserve.measure.metrics import acceptance, counter_delta, parse_metrics  # noqa: E402
from sparkserve.observe.analyze import Analysis, analyze  # noqa: E402
from sparkserve.observe.gate_inputs import Expectations  # noqa: E402
from sparkserve.observe.gates import judge  # noqa: E402
from sparkserve.observe.logs import parse_log  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-0.25.1-gpu"


def _an(name: str) -> Analysis:
    """The analysis `sparkserve logs analyze` makes of a fixture: read as bytes (a lone CR is no newline)."""
    return analyze([parse_log((FIX / name).read_bytes(), file=name)])


def _json(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def _out_json(name: str) -> dict:
    """The JSON stdout of one saved `$ command` / `rc=` / `--- stdout` / `--- stderr` capture."""
    text = (FIX / name).read_text()
    return json.loads(text.split("--- stdout\n", 1)[1].split("\n--- stderr", 1)[0])


# ---- one test per verdict ----------------------------------------------------------------------------------


@pytest.mark.parametrize("log", ["boot1-up.log", "boot2-drafter2.log", "boot-bench.log", "router-replica1.log"])
def test_healthy_boot(log: str) -> None:
    # call 7's `up` boot, the drafter2 boot swap-drafter started, call 6's boot that served both benches;
    # session 7: replica 1 of the fleet, which served behind vllm-router until `down`
    verdicts.healthy_boot(FIX / log)


@pytest.mark.parametrize("log", ["boot-killed.log", "router-replica2-killed.log"])
def test_killed_engine_core(log: str) -> None:
    # call 5's boot killed mid-stream; session 7: replica 2 killed under load behind vllm-router
    verdicts.killed_engine_core(FIX / log)


def test_pool_then_oom() -> None:
    verdicts.pool_then_oom(FIX / "probe-kv-bigger-than-gpu.log")


def test_kv_too_small() -> None:
    verdicts.kv_too_small(FIX / "probe-kv-too-small.log")


def test_validation_error() -> None:
    verdicts.validation_error(FIX / "probe-spec-key-typo.log")


def test_bench_beside_vllm() -> None:
    verdicts.bench_beside_vllm(FIX / "bench.json", FIX / "vllm-bench.json")


def test_killed_stream() -> None:
    verdicts.killed_stream(FIX / "kill-client.json")


# ---- the probes, in detail -----------------------------------------------------------------------------------


def test_oom_probe_fault_is_the_whole_torch_line_and_the_console_tail_was_display_only() -> None:
    a = _an("probe-kv-bigger-than-gpu.log")
    first = a.faults[0][1]
    assert first.line == 93 and first.fault is not None and first.fault.value == "oom"
    msg = first.text.split("[core.py:1231] ", 1)[1]
    assert msg.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 55.88 GiB.")
    assert msg.endswith("#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    # on the device `logs analyze --json` gave the same whole line; the console's "mentation.  See
    # documentation for Memory Management …" was real_scenario.py printing only the text's last 160 characters
    device = _out_json("analyze-kv-bigger-than-gpu.out")
    assert device["faults"][0]["text"] == first.text and device["faults"][0]["kind"] == "oom"
    console = (FIX / "probes-console.txt").read_text()
    tail = console.split("first fault oom: ", 1)[1].splitlines()[0]
    assert tail.startswith("mentation.") and first.text.endswith(tail) and len(tail) == 160


def test_the_oom_probe_printed_pool_is_not_the_stacks_pool() -> None:
    log = FIX / "probe-kv-bigger-than-gpu.log"
    text = log.read_bytes()
    assert b"GPU KV cache size: 234,374,992 tokens" in text
    a = _an(log.name)
    assert a.kv_cache_tokens == [] and a.failed_boot_kv_cache_tokens == [234_374_992]
    assert a.to_json()["kv_cache_tokens"] == [] and _out_json("analyze-kv-bigger-than-gpu.out")["kv_cache_tokens"] == []
    pool = judge({"gpu": parse_log(text, file=log.name)}, Expectations(ranks=("0",))).get("pool")
    assert not pool.ok and pool.observed is None
    assert "234,374,992 tokens belongs to a boot that failed after printing it" in pool.reason


def test_kv_too_small_is_a_sizing_error_not_oom() -> None:
    a = _an("probe-kv-too-small.log")
    first = a.faults[0][1]
    assert first.fault is not None and first.fault.value != "oom"
    assert "ValueError: To serve at least one request with the model's max seq len (8192)" in first.text
    assert "estimated maximum model length is 1632" in first.text
    assert a.kv_cache_tokens == [] and a.failed_boot_kv_cache_tokens == []


def test_spec_key_typo_fault_carries_pydantics_reason() -> None:
    a = _an("probe-spec-key-typo.log")
    assert "num_speculative_token: Unexpected keyword argument" in a.faults[0][1].text
    assert _out_json("analyze-spec-key-typo.out")["faults"][0]["text"] == a.faults[0][1].text


# ---- the saved results agree with each other -----------------------------------------------------------------


def test_metrics_delta_is_both_benches() -> None:
    # call 6 scraped /metrics before sparkserve's bench and after `vllm bench serve`, on one boot
    ours, theirs = _json("bench.json"), _json("vllm-bench.json")
    before = parse_metrics((FIX / "metrics-before.txt").read_text(), model_name="tiny")
    after = parse_metrics((FIX / "metrics-after.txt").read_text(), model_name="tiny")
    d = counter_delta(before, after)
    assert before.boot_id == after.boot_id == ours["boot_id"]
    assert d.drafts == ours["drafts"] + theirs["spec_decode_num_drafts"]
    assert d.draft_tokens == ours["draft_tokens"] + theirs["spec_decode_draft_tokens"]
    assert d.accepted_tokens == ours["accepted_tokens"] + theirs["spec_decode_accepted_tokens"]
    assert d.generation_tokens == ours["output_tokens"] + theirs["total_output_tokens"]
    assert d.request_success == ours["prompts"] + theirs["completed"]
    spec = acceptance(d)
    assert spec.warnings == [] and spec.acceptance_length == pytest.approx(1 + 21 / 20419)


def test_bench_acceptance_beside_vllm_bench() -> None:
    ours, theirs = _json("bench.json"), _json("vllm-bench.json")
    assert ours["acceptance_length"] == pytest.approx(1 + ours["accepted_tokens"] / ours["drafts"], abs=1e-6)
    assert theirs["spec_decode_acceptance_length"] == pytest.approx(
        1 + theirs["spec_decode_accepted_tokens"] / theirs["spec_decode_num_drafts"])
    assert abs(ours["acceptance_length"] - theirs["spec_decode_acceptance_length"]) < 0.01  # random weights: ≈ 1


def test_saved_gate_reports() -> None:
    for name in ("gates.json", "gates-after-swap.json"):
        r = _json(name)
        assert r["ok"] and len(r["gates"]) == 7 and all(g["ok"] for g in r["gates"]), name
    after_kill = _json("gates-after-kill.json")
    assert not after_kill["ok"] and {g["name"] for g in after_kill["gates"] if not g["ok"]} == {"smoke", "faults"}
    faults = next(g for g in after_kill["gates"] if g["name"] == "faults")
    assert "engine core exited unexpectedly" in faults["evidence"][0]["text"]


def test_judging_the_killed_boot_fails_faults_naming_the_line() -> None:
    log = FIX / "boot-killed.log"
    report = judge({"gpu": parse_log(log.read_bytes(), file=log.name)},
                   Expectations(ranks=("0",), mask_file=True, mask_token_id=verdicts.MASK_TOKEN_ID),
                   skip=("smoke", "identity"))
    assert [g.name for g in report.failed()] == ["faults"]
    faults = report.get("faults")
    assert "first on gpu line 199: [shutdown] MPClient: engine core exited unexpectedly" in faults.reason
    assert faults.reason in next(g for g in _json("gates-after-kill.json")["gates"]
                                 if g["name"] == "faults")["reason"]


def test_swaps() -> None:
    ok = (FIX / "swap-drafter.out").read_text()
    assert "rc=0 " in ok and "swapped: tiny now drafts with " in ok
    nomask = (FIX / "swap-drafter-nomask.out").read_text()
    assert "rc=2 " in nomask and "has no mask_embedding.pt" in nomask
    missing = (FIX / "swap-drafter-missing.out").read_text()
    assert "rc=2 " in missing and "lacks 1 tensor its config.json implies: layers.0.mlp.down_proj.weight" in missing
    steps = _json("call7-summary.json")["steps"]
    for refused in ("swap-drafter-nomask", "swap-drafter-missing"):
        assert steps[refused]["ok"] and "stack unchanged: True" in steps[refused]["figure"]


def test_every_down_left_no_process() -> None:
    for call in ("call5", "call6", "call7"):
        down = _json(f"{call}-summary.json")["steps"]["down"]
        assert down["ok"] and "rc=0, processes left: 0 []" in down["figure"], call


def test_judging_the_replica_killed_behind_the_router_fails_faults_naming_the_line() -> None:
    # session 7 (tests/real/part_router.py): the EngineCore of replica 2 killed under load through vllm-router;
    # its log also holds the 3 HTTP 500s the router retried elsewhere: the verdict is the engine's death, once
    log = FIX / "router-replica2-killed.log"
    report = judge({"gpu-b": parse_log(log.read_bytes(), file=log.name)},
                   Expectations(ranks=("0",), mask_file=True, mask_token_id=verdicts.MASK_TOKEN_ID),
                   skip=("smoke", "identity"))
    assert [g.name for g in report.failed()] == ["faults"]
    assert "first on gpu-b line 173: [shutdown] MPClient: engine core exited unexpectedly" in \
        report.get("faults").reason
