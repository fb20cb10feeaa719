"""The product's verdicts on what the real run saved — for the unit suite once the files are fixtures.

After a real run (tests/real/README.md), copy from results.tar.gz into tests/fixtures/logs/real-0.25.1-gpu/:

    results/logs/boot1-replaced-*.log  → boot1-up.log          (the `up` boot, replaced by swap-drafter)
    results/logs/boot2-down-*.log      → boot2-swap-killed.log (the drafter2 boot whose EngineCore was killed)
    results/probe-kv-bigger-than-gpu.log, probe-kv-too-small.log, probe-spec-key-typo.log (as they are)
    results/metrics-before.txt, metrics-after.txt, bench.json, vllm-bench.json, kill-client.json

and add tests/unit/test_real_gpu_fixtures.py::

    import sys; from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real"))
    import verdicts
    FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-0.25.1-gpu"
    def test_healthy_boot(): verdicts.healthy_boot(FIX / "boot1-up.log")
    ... one test per function below.

Each function asserts what sparkserve must conclude from one real file; they stay true to real vLLM 0.25.1
only if the run showed it (README: the figures and what the run showed).
"""

from __future__ import annotations

import json
from pathlib import Path

from sparkserve.observe.analyze import analyze_texts
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import parse_log

MASK_TOKEN_ID = 4  # gen_models.py: <|mask|>


def healthy_boot(log: Path) -> None:
    """The `up` boot: ready, one pool, graphs captured, the mask loaded, V2 runner, no fault; every log gate
    passes (smoke and identity are live facts, not in a log)."""
    a = analyze_texts({log.name: log.read_text()})
    assert a.ready is True and len(a.kv_cache_tokens) == 1 and a.kv_cache_tokens[0] > 0
    assert a.graphs == "captured" and a.model_runner == "v2"
    assert a.spec.mask_embedding_loaded is True and a.spec.mask_token_id == MASK_TOKEN_ID
    assert [e.text for _, e in a.faults] == []
    report = judge({"gpu": parse_log(log.read_text(), file=log.name)},
                   Expectations(ranks=("0",), mask_file=True, mask_token_id=MASK_TOKEN_ID),
                   skip=("smoke", "identity"))
    assert report.ok, [(g.name, g.reason) for g in report.gates if not g.ok]


def killed_engine_core(log: Path) -> None:
    """The drafter2 boot whose EngineCore got kill -9 while serving: it had come up, and its first fault is
    the engine's death (`engine core exited unexpectedly` / EngineDeadError), not a boot failure."""
    a = analyze_texts({log.name: log.read_text()})
    assert a.ready is True and a.faults
    first = a.faults[0][1]
    assert first.fault is not None and first.fault.value == "engine_dead", first.text
    assert "exited unexpectedly" in first.text or "EngineDeadError" in first.text
    assert len(a.kv_cache_tokens) == 1  # it died serving: its pool stays the stack's


def pool_then_oom(log: Path) -> None:
    """--kv-cache-memory-bytes 300e9: the pool is printed, then CUDA OOM — not the stack's pool."""
    a = analyze_texts({log.name: log.read_text()})
    assert a.ready is False and a.kv_cache_tokens == [] and a.failed_boot_kv_cache_tokens
    assert a.faults[0][1].fault is not None and a.faults[0][1].fault.value == "oom"


def kv_too_small(log: Path) -> None:
    """--max-model-len 8192 with 2 MiB of KV: a sizing ValueError, not an out-of-memory."""
    a = analyze_texts({log.name: log.read_text()})
    assert a.ready is False
    f = a.faults[0][1]
    assert f.fault is not None and f.fault.value != "oom" and "To serve at least one request" in f.text


def validation_error(log: Path) -> None:
    """A misspelt speculative-config key: the fault carries pydantic's reason, not only its header."""
    a = analyze_texts({log.name: log.read_text()})
    assert a.ready is False
    assert a.faults[0][1].text.endswith("1 validation error for SpeculativeConfig: num_speculative_token: "
                                        "Unexpected keyword argument"), a.faults[0][1].text


def bench_beside_vllm(bench: Path, vllm_bench: Path) -> None:
    """sparkserve's smoke cell and `vllm bench serve` on the same server: both complete every request."""
    ours, theirs = json.loads(bench.read_text()), json.loads(vllm_bench.read_text())
    assert ours["ok"] and ours["requests_ok"] == ours["prompts"] and ours["stream_errors"] == 0
    assert theirs["failed"] == 0 and theirs["completed"] == ours["prompts"]
    assert ours["output_tokens"] == theirs["total_output_tokens"]


def killed_stream(kill_client: Path) -> None:
    """The client of a stream whose EngineCore died: HTTP 200 with an error event (real 0.25.1)."""
    got = json.loads(kill_client.read_text())
    assert got["status"] == 200 and got["error_event"] is True
