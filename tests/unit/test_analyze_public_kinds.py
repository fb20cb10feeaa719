"""Issue 32's six kinds of reading, each on real logs other people published (tests/fixtures/logs/public, see its
CORPUS.md for the URLs): ready false on a fatal start-up failure, request errors that are no engine fault, NCCL's
own lines as the watchdog's evidence, the last frame of a cut engine traceback, KV and graphs behind wrappers, and
deaths while serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkserve.observe.analyze import analyze_texts
from sparkserve.observe.saved import LogFile, analyze_files

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "public"


def public(name: str) -> dict[str, Any]:
    return analyze_files([LogFile(PUBLIC / name)]).to_json()


def text_of(name: str, keep: Any = lambda line: True) -> str:
    return "".join(x for x in (PUBLIC / name).read_text().splitlines(keepends=True) if keep(x))


# --- 1: ready is false when the log shows a fatal start-up failure -------------------------------------------


def test_an_attention_backend_value_error_is_a_failed_boot() -> None:
    j = public("vllm-31480-worker-no-valid-attention-backend.log")
    assert j["ready"] is False and "No valid attention backend found" in j["faults"][0]["text"]
    assert j["ready_evidence"]["why"] == "the boot failed before the API server got ready"


def test_a_fault_under_start_up_frames_is_a_failed_boot_oom_and_ray_actor_death() -> None:
    oom = public("club3090-60-enginecore-failed-cuda-oom.log")  # CUDA OOM repacking weights, no header in view
    assert (oom["ready"], oom["faults"][0]["kind"]) == (False, "oom")
    assert "gptq_marlin_repack" in oom["ready_evidence"]["why"]
    ray = public("gpustack-2415-ray-actor-dead-0.8.5.log")  # the actor died while EngineCoreProc was built
    assert ray["ready"] is False and "The actor is dead" in ray["faults"][0]["text"]


def test_the_same_fault_with_its_start_up_frames_out_of_view_says_nothing_of_ready() -> None:
    only_fault = text_of("gpustack-2415-ray-actor-dead-0.8.5.log", lambda x: "The actor is dead" in x)
    j = analyze_texts({"x.log": only_fault}).to_json()
    assert j["ready"] is None and j["faults"][0]["kind"] == "worker_died"


# --- 2: a request answered with an error is no engine fault ----------------------------------------------------


def test_a_prompt_over_the_context_length_is_a_request_error_not_a_fault() -> None:
    j = public("specreason-4-max-context-request-error.log")
    assert j["faults"] == [] and j["request_errors"]["count"] == 1
    assert "maximum context length is 8192 tokens" in j["request_errors"]["first"]["text"]
    assert j["ready"] is True  # the API server was answering requests


def test_a_requests_preprocessing_traceback_after_startup_is_no_fault() -> None:
    j = public("vllm-21391-preprocessing-error-after-startup.log")
    assert j["faults"] == [] and j["ready"] is True and j["request_errors"]["count"] == 1
    for name in ("vllm-20409-max-context-preprocessing-traceback.log",
                 "vllm-16375-completion-preprocessing-traceback.log"):
        assert public(name)["faults"] == [], name


def test_a_full_request_traceback_ending_in_the_context_length_error_is_one_request_error() -> None:
    # the thread's header and frames, closed by the exception line vLLM prints (issue 20409's own title)
    head = text_of("vllm-20409-max-context-preprocessing-traceback.log")
    exc = ("ERROR 07-03 03:19:15 [serving_chat.py:200] ValueError: This model's maximum context length is 16384 "
           "tokens. However, you requested 122946 tokens (112946 in the messages, 10000 in the completion).\n")
    j = analyze_texts({"x.log": head + exc}).to_json()
    assert j["faults"] == [] and j["request_errors"]["count"] >= 1


# --- 3: NCCL's own lines are evidence; the watchdog is the fault ------------------------------------------------


def test_net_ib_warn_lines_before_a_watchdog_timeout_are_its_evidence() -> None:
    nccl = text_of("nccl-1405-net-ib-completion-error.log")
    watchdog = text_of("vllm-23448-dp-watchdog-timeout-multinode.log")
    f = analyze_texts({"x.log": nccl + watchdog}).to_json()["faults"]
    assert "Watchdog caught collective operation timeout" in f[0]["text"]
    assert any("NET/IB : Got completion from peer" in x["text"] for x in f[1:])
    alone = public("nccl-1405-net-ib-completion-error.log")["faults"]  # with no watchdog, NCCL's line is the fault
    assert alone[0]["kind"] == "nccl" and "Got completion from peer" in alone[0]["text"]


def test_a_worker_death_reported_before_the_watchdog_that_killed_it_is_not_the_headline() -> None:
    f = public("vllm-6042-pipe-column-worker-died-watchdog.log")["faults"]
    assert "Watchdog caught collective operation timeout" in f[0]["text"]
    assert public("vllm-5484-ray-watchdog-pasted-ansi.log")["faults"][0]["kind"] == "timeout"


# --- 4: the exception, not the frame; a cut engine traceback is still a fault ----------------------------------


def test_the_last_frame_of_a_cut_enginecore_traceback_is_the_fault() -> None:
    j = public("vllm-49101-enginecore-init-frames-cut.log")
    f0 = j["faults"][0]
    assert f0["kind"] == "traceback" and f0["text"].endswith('core.py", line 133, in __init__')
    assert f0["why"].startswith("the last frame of an engine traceback whose exception line is cut off")
    assert j["ready"] is False  # the frames are EngineCoreProc's constructor: start-up
    rocm = public("kyuz0-strix-36-rocm-enginecore-frames-cut.log")
    assert rocm["ready"] is False and 'decorators.py", line 379' in rocm["faults"][0]["text"]


def test_a_cut_traceback_whose_exception_line_is_in_view_is_that_lines_fault() -> None:
    j = public("club3090-60-enginecore-failed-cuda-oom.log")
    assert [f["kind"] for f in j["faults"]][:1] == ["oom"]
    assert not any(f["why"].startswith("the last frame") for f in j["faults"])


def test_frames_that_say_neither_start_up_nor_serving_leave_ready_unknown() -> None:
    j = public("vllm-18730-enginecore-inductor-frames-cut.log")
    assert j["faults"][0]["text"].endswith('simd.py", line 1219, in codegen_node') and j["ready"] is None


def test_an_error_message_cut_above_its_exception_is_one_fault_then_the_relay() -> None:
    f = public("aeon7-17-spark-process-enginecore-output-handler.log")["faults"]
    assert "CUDA kernel errors might be asynchronously reported" in f[0]["text"]
    assert not any("For debugging consider passing" in x["text"] for x in f)  # the same message, folded
    assert "AsyncLLM output_handler failed" in f[1]["text"]


# --- 5: KV and graphs behind prefixes ------------------------------------------------------------------------


def test_a_timestamp_and_pipe_column_is_taken_off_kv_ranks_and_graphs_survive() -> None:
    compose = text_of("spark-vllm-docker-200-compose-spec-downgrade-kv.log")
    piped = "".join(f"2026-04-29 12:01:07,123 | {x.split(' | ', 1)[1]}" for x in compose.splitlines(keepends=True))
    j = analyze_texts({"x.log": piped}).to_json()
    assert j["kv_cache_tokens"] == [1253392] and j["cudagraph_mode"] == "PIECEWISE"
    workers = text_of("vllm-50576-a100-capture-pool-memory-tilelang.log", lambda x: x.startswith("(Worker"))
    j = analyze_texts({"x.log": "".join(f"2026-08-07T23:22:57.1Z | {x}" for x in workers.splitlines(True))}).to_json()
    assert j["ranks"] == {"0": {"graphs": "captured", "kv_cache_tokens": None}}


def test_a_journald_month_in_another_locale_is_a_journald_prefix() -> None:
    j = public("1cat-237-journald-localized-month-tp4.log")
    assert j["kv_cache_tokens"] == [215401]
    assert j["ranks"] == {"0": {"graphs": "unknown", "kv_cache_tokens": 215401}}  # `(Worker_TP0 pid=…)` read


def test_cuda_graph_pool_memory_says_the_rank_captured() -> None:
    pool = text_of("vllm-50576-a100-capture-pool-memory-tilelang.log", lambda x: "CUDA graph pool memory" in x)
    j = analyze_texts({"x.log": pool}).to_json()
    assert j["graphs"] == "captured" and j["ranks"]["0"]["graphs"] == "captured"


def test_kv_behind_compose_columns_on_a_dgx_spark() -> None:
    assert public("spark-vllm-docker-200-compose-spec-downgrade-kv.log")["kv_cache_tokens"] == [1253392]


# --- 6: deaths while serving are faults though boot succeeded ---------------------------------------------------


def test_a_traceback_through_the_busy_loop_is_a_death_while_serving() -> None:
    j = public("vllm-metal-111-enginecore-busy-loop-cut.log")
    assert j["faults"][0]["text"].endswith('core.py", line 487, in step_with_batch_queue')
    assert j["ready"] is None and j["ready_evidence"]["why"].startswith("the engine died while serving")


def test_an_output_handler_death_after_startup_is_a_fault_and_ready_stays_true() -> None:
    startup = text_of("vllm-21391-preprocessing-error-after-startup.log", lambda x: "startup complete" in x)
    j = analyze_texts({"x.log": startup + text_of("aeon7-17-spark-process-enginecore-output-handler.log")}).to_json()
    assert j["ready"] is True and "CUDA kernel errors" in j["faults"][0]["text"]
    assert any("AsyncLLM output_handler failed" in f["text"] for f in j["faults"])


def test_a_traceback_logged_at_warning_through_start_up_code_says_nothing_of_ready() -> None:
    # logger.warning(…, exc_info=True) through the weight loader was survived; a later unnamed ERROR is no boot failure
    w = "(Worker_TP0 pid=5) WARNING 11-29 16:02:41 [default_loader.py:9] "
    t = "".join([w + "Unable to use the fast loader; falling back\n", w + "Traceback (most recent call last):\n",
                 w + '  File "/vllm/model_executor/model_loader/default_loader.py", line 9, in load_weights\n',
                 w + "ImportError: no fast loader\n",
                 "(EngineCore pid=4) ERROR 11-29 16:09:41 [core.py:1] something else went wrong\n"])
    j = analyze_texts({"x.log": t}).to_json()
    assert j["ready"] is None and j["faults"][0]["text"].endswith("something else went wrong")


def test_the_busy_loop_code_line_says_serving_when_its_frame_is_cut_off() -> None:
    # vllm#16692's EngineCore lines alone: `run_engine_core` → `engine_core.run_busy_loop()`, then the excerpt ends
    t = text_of("vllm-16692-ray-worker-died-0.8.4.log", lambda x: "[core.py:387]" in x)
    j = analyze_texts({"x.log": t}).to_json()
    assert "EngineCore hit an exception" in j["faults"][0]["text"]
    assert j["ready"] is None and j["ready_evidence"]["why"].startswith("the engine died while serving")
