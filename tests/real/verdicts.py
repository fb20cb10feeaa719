"""The product's verdicts on what the real run saved — for the unit suite, pointed at the fixtures.

The real run (tests/real/README.md) saved its files under tests/fixtures/logs/real-0.25.1-gpu/ (that
directory's README.md says which device call wrote each one). The ones judged here:

    boot1-up.log           the `up` boot of call 7, replaced by swap-drafter   (results/logs/boot2-replaced-*.log)
    boot2-drafter2.log     the drafter2 boot swap-drafter started, then down  (results/logs/boot3-down-*.log)
    boot-killed.log        call 5's `up` boot whose EngineCore got kill -9   (results/logs/boot1-down-*.log)
    boot-bench.log         call 6's `up` boot that served both benches       (results/logs/boot1-down-*.log)
    probe-kv-bigger-than-gpu.log, probe-kv-too-small.log, probe-spec-key-typo.log (as they are)
    metrics-before.txt, metrics-after.txt, bench.json, vllm-bench.json (call 6), kill-client.json (call 5)
    router-replica1.log          session 7's fleet replica 1, behind vllm-router    (3-router results/logs/boot1-*)
    router-replica2-killed.log   session 7's replica 2, EngineCore killed under load (3-router results/logs/boot2-*)

tests/unit/test_real_gpu_fixtures.py::

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

from sparkserve.observe.analyze import Analysis, analyze
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import parse_log

MASK_TOKEN_ID = 4  # gen_models.py: <|mask|>


def _lines(log: Path) -> list[str]:
    """The log's lines as the product counts them: split on LF only. (vLLM's tqdm bars put a lone CR inside
    a line — `(EngineCore pid=N) \\rLoading safetensors …` — which `Path.read_text()` and `str.splitlines()`
    would turn into extra lines, shifting every line number after it.)"""
    return [x.removesuffix("\r") for x in log.read_bytes().decode("utf-8", "replace").split("\n")]


def _analyze(log: Path) -> Analysis:
    """What `sparkserve logs analyze LOG` concludes: the file read as bytes, as sparkserve reads it."""
    return analyze([parse_log(log.read_bytes(), file=log.name)])


def healthy_boot(log: Path) -> None:
    """The `up` boot: ready, one pool, graphs captured, the mask loaded, V2 runner, no fault; every log gate
    passes (smoke and identity are live facts, not in a log)."""
    a = _analyze(log)
    assert a.ready is True and len(a.kv_cache_tokens) == 1 and a.kv_cache_tokens[0] > 0
    assert a.graphs == "captured" and a.model_runner == "v2"
    assert a.spec.mask_embedding_loaded is True and a.spec.mask_token_id == MASK_TOKEN_ID
    assert [e.text for _, e in a.faults] == []
    report = judge({"gpu": parse_log(log.read_bytes(), file=log.name)},
                   Expectations(ranks=("0",), mask_file=True, mask_token_id=MASK_TOKEN_ID),
                   skip=("smoke", "identity"))
    assert report.ok, [(g.name, g.reason) for g in report.gates if not g.ok]


def killed_engine_core(log: Path) -> None:
    """The boot whose EngineCore got kill -9 while serving (call 5's `up` boot; that call had no time left
    for the swaps, so it was not the drafter2 boot as planned): it had come up, and its first fault is
    the engine's death (`engine core exited unexpectedly` / EngineDeadError), not a boot failure."""
    a = _analyze(log)
    assert a.ready is True and a.faults
    first = a.faults[0][1]
    assert first.fault is not None and first.fault.value == "engine_dead", first.text
    assert "exited unexpectedly" in first.text or "EngineDeadError" in first.text
    assert len(a.kv_cache_tokens) == 1  # it died serving: its pool stays the stack's


def pool_then_oom(log: Path) -> None:
    """--kv-cache-memory-bytes 300e9: the pool is printed, then CUDA OOM — not the stack's pool. The first
    fault is torch's whole one-line message (under EngineCore's ERROR prefix), not a piece of it."""
    lines = _lines(log)
    a = _analyze(log)
    printed = [int(x.split("GPU KV cache size: ")[1].split()[0].replace(",", ""))
               for x in lines if "GPU KV cache size: " in x]
    assert printed, "the probe printed no pool: it did not show pool-then-OOM"
    assert a.ready is False and a.kv_cache_tokens == [] and a.failed_boot_kv_cache_tokens == printed
    first = a.faults[0][1]
    assert first.fault is not None and first.fault.value == "oom", first.text
    assert first.text == lines[first.line - 1], "the fault is not the whole line it names"
    msg = first.text.split("] ", 1)[-1]
    assert msg.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "), first.text


def kv_too_small(log: Path) -> None:
    """--max-model-len 8192 with 2 MiB of KV: a sizing ValueError, not an out-of-memory."""
    a = _analyze(log)
    assert a.ready is False
    f = a.faults[0][1]
    assert f.fault is not None and f.fault.value != "oom" and "To serve at least one request" in f.text


def validation_error(log: Path) -> None:
    """A misspelt speculative-config key: the fault carries pydantic's reason, not only its header."""
    a = _analyze(log)
    assert a.ready is False
    assert a.faults[0][1].text.endswith("1 validation error for SpeculativeConfig: num_speculative_token: "
                                        "Unexpected keyword argument"), a.faults[0][1].text


def bench_beside_vllm(bench: Path, vllm_bench: Path, tolerance: float = 0.15) -> None:
    """sparkserve's smoke cell and `vllm bench serve` on the same server (same prompts, same max tokens,
    same concurrency): both complete every request, count the same output tokens, and their tok/s agree
    within ``tolerance`` of each other."""
    ours, theirs = json.loads(bench.read_text()), json.loads(vllm_bench.read_text())
    assert ours["ok"] and ours["requests_ok"] == ours["prompts"] and ours["stream_errors"] == 0
    assert ours["incomplete"] == 0 and ours["errors"] == []
    assert theirs["failed"] == 0 and theirs["completed"] == theirs["num_prompts"] == ours["prompts"]
    assert theirs["max_concurrency"] == ours["concurrency"]
    assert ours["output_tokens"] == theirs["total_output_tokens"] == ours["prompts"] * ours["max_tokens"]
    a, b = ours["output_tok_s"], theirs["output_throughput"]
    assert abs(a - b) <= tolerance * min(a, b), (a, b)


def killed_stream(kill_client: Path, message: str = "EngineCore encountered an issue") -> None:
    """The client of a stream whose EngineCore died: HTTP 200 with an error event, then `[DONE]`. The event's
    message: 0.25.1 relays the EngineDeadError text; 0.33.0 sends EngineDeadError.CLIENT_MESSAGE, "The server had
    an error while processing your request." (vllm/v1/engine/exceptions.py; the real 0.33.0 run, issue 43)."""
    got = json.loads(kill_client.read_text())
    assert got["status"] == 200 and got["error_event"] is True and got["done"] is True
    assert message in got["error"], got["error"]
