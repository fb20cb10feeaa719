"""`logs analyze` semantics on real logs other people published (tests/fixtures/logs/public, see its CORPUS.md):
when `ready` is true/false/null and why, which ERROR lines are engine faults, the root cause under Ray, CUDA
graphs seen only through their bars or `Registering … cuda graph addresses`, and a fault after a shutdown line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkserve.observe.analyze import analyze_texts
from sparkserve.observe.saved import LogFile, analyze_files

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "public"


def public(name: str) -> dict[str, Any]:
    return analyze_files([LogFile(PUBLIC / name)]).to_json()


def lines_of(name: str, keep: Any = lambda line: True) -> str:
    """Part of a public log (its own lines, in order): an excerpt of the excerpt."""
    return "".join(x for x in (PUBLIC / name).read_text().splitlines(keepends=True) if keep(x))


# --- ready ---------------------------------------------------------------------------------------------------


def test_engine_core_failed_to_start_means_not_ready_and_says_so() -> None:
    j = public("vllm-38529-ray-vgpu-segfault.log")
    assert j["ready"] is False
    assert "EngineCore failed to start" in j["ready_evidence"]["text"]
    assert j["ready_evidence"]["why"] == "the boot failed before the API server got ready"


def test_a_follower_whose_worker_failed_to_start_is_not_ready() -> None:
    # DGX Spark follower: `WorkerProc failed to start.` + `ValueError: Unsupported mxfp4_backend …`
    j = public("dspark-phasec-banked-worker.log")
    assert j["ready"] is False
    assert "Unsupported mxfp4_backend" in j["faults"][0]["text"]
    assert "WorkerProc failed to start" in j["faults"][0]["why"]  # the header logger.exception wrote


def test_a_kv_cache_too_small_for_max_len_is_a_failed_boot_v0_and_v1() -> None:
    v1 = public("tpu-inference-223-kv-too-small.log")
    v0 = public("vllm-10517-v0-kv-too-small-29k.log")
    # a pool too small for max_model_len is a sizing error, not an out-of-memory (issue 13 item 6)
    assert (v1["ready"], v1["faults"][0]["kind"]) == (False, "other")
    assert (v0["ready"], v0["faults"][0]["kind"], v0["kv_cache_tokens"]) == (False, "other", [])  # V0: blocks only


def test_served_requests_mean_ready_though_the_startup_line_is_out_of_view() -> None:
    # the serving part of a real DGX Spark head log, after `Application startup complete.`
    after = lines_of("dspark-b12x-serving-head.log", lambda x: "Avg prompt throughput" in x)
    j = analyze_texts({"head.log": after}).to_json()
    assert j["ready"] is True and j["ready_evidence"]["why"] == "requests were served"
    assert "Avg prompt throughput: 3.5 tokens/s" in j["ready_evidence"]["text"]
    idle = lines_of("vllm-5082-v0.4-404-generate.log")  # throughput 0.0 and a client's 404s: nothing served
    assert analyze_texts({"x.log": idle}).to_json()["ready"] is None


def test_an_engine_that_died_while_serving_leaves_ready_unknown_not_false() -> None:
    j = public("vllm-41834-sm120-compose-output-handler.log")  # APIServer lines, no startup line in view
    assert j["ready"] is None
    assert j["ready_evidence"]["why"].startswith("the engine died while serving")


# --- which ERROR lines are faults -----------------------------------------------------------------------------


def test_a_failed_request_is_no_engine_fault_the_dead_engine_is() -> None:
    j = public("vllm-41834-sm120-compose-output-handler.log")
    assert not any("Error in chat completion stream generator" in f["text"] for f in j["faults"])
    assert "EngineDeadError" in j["faults"][0]["text"]
    assert "AsyncLLM output_handler failed" in j["faults"][0]["why"]


def test_traceback_lines_logged_at_error_are_one_fault_its_exception_line() -> None:
    # logger.exception prefixes every frame with ERROR; the header is cut off in the excerpt
    j = public("vllm-25837-free-memory-less-than-gmu.log")
    assert j["faults"][0]["text"].endswith(
        "ValueError: Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 3.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    assert j["faults"][0]["why"] == "an ERROR line that no pattern row names"
    assert not any(f["text"].split("] ", 1)[-1].startswith((" ", "^")) for f in j["faults"])
    assert public("club3090-60-enginecore-failed-cuda-oom.log")["faults"][0]["kind"] == "oom"


def test_a_shm_stall_the_engine_outlived_during_boot_is_no_fault() -> None:
    # DGX Spark head: the stall is logged while the follower autotunes, then the API server comes up and serves
    j = public("dspark-prepared-final-head.log")
    assert j["ready"] is True and j["faults"] == []


def test_the_api_servers_own_fatal_traceback_is_caught() -> None:
    j = public("vllm-27508-gptoss-h100-engine-init-failed.log")
    assert j["faults"][0]["kind"] == "engine_dead"
    assert "Engine core initialization failed" in j["faults"][0]["text"] and j["ready"] is False


# --- root cause under Ray ------------------------------------------------------------------------------------


def test_a_ray_worker_death_is_the_root_cause_over_the_enginecore_error_it_causes() -> None:
    for name in ("vllm-38529-ray-vgpu-segfault.log", "vllm-16692-ray-worker-died-0.8.4.log"):
        f0 = public(name)["faults"][0]
        assert "A worker died or was killed while executing a task" in f0["text"], name
        assert f0["kind"] == "worker_died"


def test_a_ray_worker_death_after_a_stamped_line_of_the_same_second_still_comes_first() -> None:
    # the raylet line carries no stamp of its own: it takes the INFO line's, the same second as the EngineCore's
    stamped = "INFO 04-16 11:53:49 [core.py:1] init engine\n"
    raylet = lines_of("vllm-16692-ray-worker-died-0.8.4.log", lambda x: "(raylet)" in x)
    enginecore = lines_of("vllm-16692-ray-worker-died-0.8.4.log", lambda x: "EngineCore hit an exception" in x)
    faults = analyze_texts({"h.log": enginecore + stamped + raylet}).to_json()["faults"]
    assert ["A worker died or was killed" in f["text"] for f in faults] == [True, False]


# --- a fault after an orderly shutdown line ---------------------------------------------------------------


def test_the_engine_dying_after_rays_executor_shutdown_line_is_still_a_fault() -> None:
    j = public("gpustack-2738-ray-output-handler-after-shutdown.log")
    assert "EngineDeadError" in j["faults"][0]["text"]
    assert "AsyncLLM output_handler failed" in j["faults"][0]["why"]


# --- CUDA graphs -------------------------------------------------------------------------------------------


def test_a_capture_bar_at_100_percent_is_captured_without_the_finished_line() -> None:
    assert public("vllm-13661-v0-capture-bar-only.log")["graphs"] == "captured"  # V0 `shapes` bar
    assert public("vllm-25848-decode-full-100-registering-ep4.log")["graphs"] == "captured"  # `decode, FULL`
    assert public("vllm-46389-capture-bars-full-incomplete.log")["graphs"] == "unknown"  # FULL cut at 51 %


def test_registering_cuda_graph_addresses_says_the_rank_captured() -> None:
    text = lines_of("club3090-552-registering-tp2.log", lambda x: "Graph capturing finished" not in x)
    j = analyze_texts({"x.log": text}).to_json()
    assert j["graphs"] == "captured"
    assert {r: s["graphs"] for r, s in j["ranks"].items()} == {"0": "captured", "1": "captured"}
