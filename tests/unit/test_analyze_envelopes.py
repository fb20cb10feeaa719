"""Issue 44: the kinds first contact misread, each read from a public log of that kind (tests/fixtures/logs/public,
CORPUS.md gives each URL) through the envelope stage (sparkserve/observe/envelope.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkserve.observe.analyze import analyze
from sparkserve.observe.envelope import LEARN_LINES, learn, open_log
from sparkserve.observe.logbytes import FileBytes
from sparkserve.observe.logs import parse_log
from sparkserve.observe.reader import LogReader
from sparkserve.observe.saved import LogFile, analyze_files

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "public"


def _json(name: str) -> dict[str, Any]:
    return analyze_files([LogFile(PUBLIC / name)]).to_json()


def _verdict(j: dict[str, Any]) -> dict[str, Any]:
    """The JSON without the file's name and its envelope."""
    out = {k: v for k, v in j.items() if k != "envelopes"}
    for f in out["faults"]:
        f.pop("file")
    if out["ready_evidence"]:
        out["ready_evidence"].pop("file")
    return out


# --- 1. encoding -------------------------------------------------------------------------------------------------

def test_a_utf16_log_gives_the_json_verdict_of_its_utf8_twin() -> None:
    utf16 = _json("derived-utf16le-bom-crlf-vllm-windows-72.log")
    utf8 = _json("vllm-windows-72-illegal-access-message-lines.log")
    assert _verdict(utf16) == _verdict(utf8)
    assert utf16["faults"] and utf16["ready"] is False
    env = utf16["envelopes"][0]
    assert (env["encoding"], env["bom"], env["line_ends"]) == ("utf-16-le", True, "crlf")
    assert utf8["envelopes"][0]["encoding"] == "utf-8"


def test_utf16_without_a_bom_is_read_by_the_shape_of_its_bytes() -> None:
    j = _json("derived-utf16le-nobom-vllm-50557.log")
    assert (j["envelopes"][0]["encoding"], j["envelopes"][0]["bom"]) == ("utf-16-le", False)
    assert _verdict(j) == _verdict(_json("vllm-50557-custom-allreduce-cuda-error-capture.log"))
    big_endian = (PUBLIC / "pytorch-175666-ci-stamp-lone-free-memory.log").read_text().encode("utf-16-be")
    a = analyze([parse_log(big_endian, file="be.log")]).to_json()
    assert a["envelopes"][0]["encoding"] == "utf-16-be" and a["ready"] is False and a["faults"]


def test_latin1_that_is_not_utf8_is_read_as_latin1() -> None:
    # no public Latin-1 log was found: a journald export of a de_DE.ISO-8859-1 host (`Mär`), built here
    lines = [f"M\xe4r 04 10:00:0{i} spark-a vllm[811]: (EngineCore_DP0 pid=90) INFO 03-04 10:00:0{i} [kv_cache_utils"
             f".py:1087] GPU KV cache size: 1,234 tokens" for i in range(3)]
    data = "\n".join(lines).encode("latin-1") + b"\n"
    a = analyze([parse_log(data, file="l1.log")]).to_json()
    assert a["envelopes"][0]["encoding"] == "latin-1" and a["kv_cache_tokens"] == [1234]
    assert a["envelopes"][0]["example"].startswith("Mär 04")


def test_a_plain_utf8_file_is_read_in_place_and_untouched() -> None:
    with (PUBLIC / "dspark-b12x-serving-head.log").open("rb") as f:
        r = LogReader(f)
        assert isinstance(r._src, FileBytes) and r.envelope.plain
    assert open_log(b"INFO 10-23 03:54:46 llm_engine.py:1] x\n").envelope.plain


# --- 2. envelopes the file reveals -------------------------------------------------------------------------------

def test_a_log_table_row_loses_its_pipes_stamp_host_and_closing_pipe() -> None:
    j = _json("qwen3vl-1756-log-table-watchdog-illegal-access.log")
    env = j["envelopes"][0]
    assert env["example"] == "  |   | 2025-11-04 10:07:58.278801 master-0 >> " and env["suffix"] == " |"
    assert env["lines"] == 8
    text = j["faults"][0]["text"]
    assert "illegal memory access" in text and not text.rstrip().endswith("|") and "master-0" not in text


def test_ci_and_service_stamps_are_taken_off_before_the_process_prefix() -> None:
    ci = _json("pytorch-175666-ci-stamp-ray-task-error-frames.log")
    assert ci["envelopes"][0]["prefix"] == "[<w>:<w>:<w>] "
    assert "RayTaskError(ValueError)" in ci["faults"][0]["text"]
    svc = _json("vllm-rocm-5-service-stamp-kv-too-small.log")
    assert svc["envelopes"][0]["example"] == "2026-06-09 14:01:52.982 [Error] (Process) "
    assert svc["ready"] is False and "larger than the available KV cache memory" in svc["faults"][0]["text"]


def test_the_wrapper_is_learnt_not_listed() -> None:
    """A shape no reader was written for: the learner finds it from the lines that hold vLLM's own shapes."""
    lines = [f"<<job 7|step 2>> {i:04d} ~ (EngineCore_DP0 pid=9) INFO 01-02 03:04:0{i} [core.py:1] x{i}"
             for i in range(5)]
    got = learn(lines)
    assert got.prefix is not None and got.example == "<<job 7|step 2>> 0000 ~ "
    assert all(got.prefix.match(s).end() == s.index("(Engine") for s in lines)  # type: ignore[union-attr]
    assert learn(["(EngineCore_DP0 pid=9) INFO 01-02 03:04:05 [core.py:1] x"] * 3).prefix is None
    assert LEARN_LINES >= 1000


def test_journald_with_a_localised_month_and_compose_columns_are_found_in_the_file() -> None:
    j = _json("1cat-237-journald-localized-month-tp4.log")
    assert j["envelopes"][0]["example"].startswith("авг 18 ") and j["kv_cache_tokens"] == [215401]
    c = _json("spark-vllm-docker-200-compose-spec-downgrade-kv.log")
    assert c["envelopes"][0]["example"] == "vllm_gb10_server  | " and c["kv_cache_tokens"] == [1253392]


# --- 3. capture seen only in bars ----------------------------------------------------------------------------------

def test_bars_that_reach_100_percent_are_graphs_captured_a_bar_still_running_is_not() -> None:
    text = (PUBLIC / "gpustack-3878-piecewise-bars-then-full-started.log").read_text()
    grep = "\n".join(x for x in text.splitlines() if "PIECEWISE" in x) + "\n"  # `grep PIECEWISE`: no other line
    assert analyze([parse_log(grep, file="grep.log")]).graphs == "captured"
    assert _json("gpustack-3878-piecewise-bars-then-full-started.log")["graphs"] == "unknown"  # FULL at 16 %
    assert _json("vllm-33756-mojibake-capture-bars-no-prefix.log")["graphs"] == "unknown"  # FULL at 17 %
    assert _json("vllm-13661-v0-capture-bar-only.log")["graphs"] == "captured"


# --- 4. start-up failures in one line -----------------------------------------------------------------------------

def test_a_lone_value_error_line_with_a_ci_prefix_is_a_failed_boot() -> None:
    j = _json("pytorch-175666-ci-stamp-lone-free-memory.log")
    assert j["ready"] is False and "Free memory on device" in j["faults"][0]["text"]
    assert j["faults"][0]["why"] == "an exception line with no log level that says the boot failed"
    q = _json("vllm-33297-ci-stamp-quoted-ansi-free-memory.log")
    assert q["ready"] is False and "Free memory on device" in q["faults"][0]["text"]


def test_custom_allreduce_cuda_errors_during_capture_are_the_fault_and_the_boot_failed() -> None:
    j = _json("vllm-50557-custom-allreduce-cuda-error-capture.log")
    assert j["faults"][0]["text"].startswith("Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455")
    assert "Worker proc VllmWorker-2 died unexpectedly" in j["faults"][1]["text"]
    assert j["ready"] is False and "CUDA graph capture was under way" in j["ready_evidence"]["why"]


# --- 5. an INFO wait is not a fault during a boot -------------------------------------------------------------------

def test_a_shm_broadcast_wait_during_a_boot_is_slowness_while_serving_it_stays_a_fault() -> None:
    for name in ("club3090-75-shm-wait-during-compile.log", "club3090-142-shm-wait-during-warmup.log"):
        j = _json(name)
        assert j["faults"] == [] and j["ready"] is None, name
    dead = analyze_files([LogFile(PUBLIC.parent / "fault-dead-follower-0.33-head.log")]).to_json()
    assert "No available shared memory broadcast block" in dead["faults"][0]["text"] and dead["ready"] is True
    # read beside a head that got ready, a follower's wait (its log has no readiness line) is a fault again
    boot = (PUBLIC / "club3090-75-shm-wait-during-compile.log").read_text()
    head = "(APIServer pid=1) INFO:     Application startup complete.\n"
    both = analyze([parse_log(head, file="head.log"), parse_log(boot, file="follower.log")]).to_json()
    assert "No available shared memory broadcast block" in both["faults"][0]["text"]


# --- 6. a pool printed, then a failure ----------------------------------------------------------------------------

def test_the_pool_of_a_failed_boot_is_reported_in_every_envelope() -> None:
    for name in ("kvcached-215-pool-then-enginecore-failed.log", "derived-mixed-crlf-kvcached-215.log"):
        j = _json(name)
        assert (j["kv_cache_tokens"], j["failed_boot_kv_cache_tokens"], j["ready"]) == ([], [317136], False), name
    assert _json("derived-mixed-crlf-kvcached-215.log")["envelopes"][0]["line_ends"] == "mixed"


def test_a_pool_then_a_type_error_under_start_up_frames_is_a_failed_boots_pool() -> None:
    """No `EngineCore failed to start.` header in view: the traceback's start-up frames decide (issue 44, kind 6)."""
    lines = [
        "(EngineCore pid=316) INFO 08-21 18:37:44 [kv_cache_utils.py:1087] GPU KV cache size: 123,456 tokens",
        "(EngineCore pid=316) Process EngineCore:",
        "(EngineCore pid=316) Traceback (most recent call last):",
        '(EngineCore pid=316)   File "/x/vllm/v1/engine/core.py", line 144, in __init__',
        "(EngineCore pid=316)     kv_cache_config = self._initialize_kv_caches(vllm_config)",
        "(EngineCore pid=316) TypeError: unsupported operand type(s) for +: 'int' and 'NoneType'",
    ]
    for ends in ("\n", "\r\n", "mixed"):
        text = "".join(x + ("\r\n" if ends == "mixed" and i % 2 else "\n" if ends == "mixed" else ends)
                       for i, x in enumerate(lines))
        j = analyze([parse_log(text.encode(), file="t.log")]).to_json()
        assert (j["kv_cache_tokens"], j["failed_boot_kv_cache_tokens"], j["ready"]) == ([], [123456], False), ends
