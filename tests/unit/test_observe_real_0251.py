"""The log reader's verdicts on real vLLM 0.25.1 boots that failed (issue 13 item 6).

Each log is the real 0.25.1 head log ``tests/fixtures/logs/real-0.25.1/A-head.log`` cut where the failure
struck, followed by what 0.25.1 prints there: the exception texts are real — pydantic's, produced by 0.25.1's
own ``SpeculativeConfig`` (vllm wheel 0.25.1) — or 0.25.1's format strings filled with the values measured on
the GPU (docs/real-vllm-notes.md: `GPU KV cache size: 234,374,992 tokens` then `CUDA out of memory. Tried to
allocate 55.88 GiB`; `max seq len (8192)` with `estimated maximum model length is 1632`). When the real run
of tests/real has saved its own logs under tests/fixtures/logs/real-0.25.1-gpu/, test_real_gpu_fixtures.py
judges those.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.observe.analyze import analyze_texts
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import parse_log

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-0.25.1"
HEAD = (REAL / "A-head.log").read_text().splitlines()
API, CORE = "(APIServer pid=3003)", "(EngineCore pid=3185)"
SITE = "/usr/local/lib/python3.12/dist-packages"


def _until(needle: str) -> list[str]:
    """A-head.log up to and including the first line holding ``needle``."""
    i = next(i for i, line in enumerate(HEAD) if needle in line)
    return HEAD[: i + 1]


def _traceback(prefix: str, frames: list[tuple[str, int, str, str]], last: list[str]) -> list[str]:
    out = [f"{prefix} Traceback (most recent call last):"]
    for file, line, fn, code in frames:
        out += [f'{prefix}   File "{SITE}/{file}", line {line}, in {fn}', f"{prefix}     {code}"]
    return out + [f"{prefix} {last[0]}"] + [f"{prefix} {x}" for x in last[1:]]


def _engine_failed(exception: list[str], when: str = "11-29 16:37:24") -> list[str]:
    """EngineCore's `logger.exception("EngineCore failed to start.")` (each line under the log prefix), then
    the API server's own traceback ending in `Engine core initialization failed`."""
    p = f"{CORE} ERROR {when} [core.py:1231]"
    core = [f"{p} EngineCore failed to start."] + _traceback(p, [
        ("vllm/v1/engine/core.py", 1221, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)")],
        exception)
    api = _traceback(API, [("vllm/v1/engine/utils.py", 1272, "wait_for_engine_startup",
                            "raise RuntimeError(")],
                     ["RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    return core + api


def _pool_line(tokens: str) -> str:
    line = next(x for x in HEAD if "GPU KV cache size:" in x)
    return line.replace("1,677,712", tokens)


def _oom_after_the_pool() -> str:
    """--kv-cache-memory-bytes 300e9 on a 139.8 GiB H200: the pool is printed, then the allocation fails."""
    lines = _until("Initial free memory")[:-1] + [_pool_line("234,374,992")]
    lines += _engine_failed([
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 55.88 GiB. GPU 0 has a total capacity of "
        "139.80 GiB of which 8.27 GiB is free. Including non-PyTorch memory, this process has 131.52 GiB memory in "
        "use. Of the allocated memory 130.38 GiB is allocated by PyTorch, and 37.66 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"])
    return "\n".join(lines) + "\n"


def _kv_too_small() -> str:
    """--max-model-len 8192 with 2 MiB of KV: 0.25.1's check_enough_kv_cache_memory ValueError."""
    lines = _until("Initial free memory")
    lines += _engine_failed([
        "ValueError: To serve at least one request with the model's max seq len (8192), (0.01 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.00 GiB). Based on the available memory, the "
        "estimated maximum model length is 1632. Try increasing `gpu_memory_utilization` (which also controls CPU "
        "memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."])
    return "\n".join(lines) + "\n"


# str(ValidationError) of 0.25.1's SpeculativeConfig for three different mistakes (generated, not written)
VALIDATION = {
    "typo-key": ["num_speculative_token", "  Unexpected keyword argument [type=unexpected_keyword_argument, "
                 "input_value=7, input_type=int]"],
    "bad-method": ["method", "  Input should be 'ngram', 'medusa', 'mlp_speculator', 'draft_model', 'suffix', "
                   "'custom_class', 'eagle', 'eagle3', 'dflash', 'ngram_gpu' or 'dspark' [type=literal_error, "
                   "input_value='dflsh', input_type=str]"],
    "bad-k": ["num_speculative_tokens", "  Input should be a valid integer, unable to parse string as an integer "
              "[type=int_parsing, input_value='seven', input_type=str]"],
}
REASONS = {
    "typo-key": "num_speculative_token: Unexpected keyword argument",
    "bad-method": "method: Input should be 'ngram', 'medusa', 'mlp_speculator', 'draft_model', 'suffix', "
                  "'custom_class', 'eagle', 'eagle3', 'dflash', 'ngram_gpu' or 'dspark'",
    "bad-k": "num_speculative_tokens: Input should be a valid integer, unable to parse string as an integer",
}


def _validation_error(case: str) -> str:
    """A speculative-config mistake: the API server fails building its config, before any engine starts."""
    lines = _until("non-default args")
    lines += _traceback(API, [("vllm/engine/arg_utils.py", 1751, "create_speculative_config",
                               "return SpeculativeConfig(**self.speculative_config)")],
                        ["pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
                         *VALIDATION[case],
                         f"    For further information visit https://errors.pydantic.dev/2.14/v/{case}"])
    return "\n".join(lines) + "\n"


def test_a_failed_boot_does_not_report_the_pool_it_printed_before_dying() -> None:
    a = analyze_texts({"head.log": _oom_after_the_pool()})
    j = a.to_json()
    assert j["ready"] is False
    assert j["kv_cache_tokens"] == [] and a.failed_boot_kv_cache_tokens == [234374992]
    assert all(r["kv_cache_tokens"] is None for r in j["ranks"].values())
    assert j["faults"][0]["kind"] == "oom" and "Tried to allocate 55.88 GiB" in j["faults"][0]["text"]


def test_the_pool_gate_of_a_failed_boot_says_whose_pool_line_it_saw() -> None:
    log = parse_log(_oom_after_the_pool(), file="head.log")
    report = judge({"gpu": log}, Expectations(ranks=("0",), pool_tokens=None))
    [pool] = [v for v in report.gates if v.name == "pool"]
    assert not pool.ok and "234,374,992 tokens belongs to a boot that failed after printing it" in pool.reason


def test_the_healthy_real_boot_still_reports_its_pool() -> None:
    j = analyze_texts({"head.log": (REAL / "A-head.log").read_text(),
                       "follower.log": (REAL / "A-follower.log").read_text()}).to_json()
    assert j["ready"] is True and j["kv_cache_tokens"] == [1677712]


def test_a_boot_that_died_and_a_later_boot_that_came_up_report_the_later_pool() -> None:
    text = _oom_after_the_pool() + (REAL / "A-head.log").read_text()
    a = analyze_texts({"head.log": text})
    assert (a.ready, a.kv_cache_tokens, a.failed_boot_kv_cache_tokens) == (True, [1677712], [234374992])


def test_a_kv_pool_too_small_for_max_model_len_is_not_an_out_of_memory() -> None:
    j = analyze_texts({"head.log": _kv_too_small()}).to_json()
    assert j["ready"] is False
    f = j["faults"][0]
    assert f["kind"] == "other" and "To serve at least one request with the model's max seq len (8192)" in f["text"]


@pytest.mark.parametrize("case", sorted(VALIDATION))
def test_a_validation_error_fault_carries_its_reason(case: str) -> None:
    j = analyze_texts({"head.log": _validation_error(case)}).to_json()
    f = j["faults"][0]
    assert f["text"].endswith("1 validation error for SpeculativeConfig: " + REASONS[case]), f["text"]
    assert j["ready"] is False


def test_three_different_mistakes_no_longer_read_alike() -> None:
    texts = {analyze_texts({"h.log": _validation_error(c)}).to_json()["faults"][0]["text"] for c in VALIDATION}
    assert len(texts) == 3


def test_a_model_level_validation_error_has_no_location_line() -> None:
    lines = _until("non-default args") + _traceback(API, [], [
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "  Value error, Invalid repository ID or local directory specified: '/models/nope'. [type=value_error, "
        "input_value=ArgsKwargs((), {'model': '/models/nope'}), input_type=ArgsKwargs]",
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"])
    f = analyze_texts({"h.log": "\n".join(lines) + "\n"}).to_json()["faults"][0]
    assert f["text"].endswith("for ModelConfig: Value error, Invalid repository ID or local directory specified: "
                              "'/models/nope'.")
