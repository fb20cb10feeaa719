"""Issue 26, item 6: the headline (faults[0]) names the cause — each shape by a rule. The lines are built from the
real format strings: vLLM's logger prefix (vllm-facts.md §1), Python's own traceback printing (`Traceback (most
recent call last):`, multiprocessing's `Process <name>:`, threading's `Exception in thread <name>:`), vLLM's
`EngineDeadError` text (vllm/v1/engine/exceptions.py). The real public logs of these shapes are in
tests/fixtures/logs/public (scored by bench/score_logs.py)."""

from __future__ import annotations

from sparkserve.observe.analyze import analyze_texts


def faults(text: str, name: str = "x.log") -> list[dict]:
    return analyze_texts({name: text}).to_json()["faults"]


def pre(proc: str, level: str, ts: str = "11-29 16:02:41", where: str = "core.py:1131") -> str:
    return f"({proc}) {level} {ts} [{where}] "


EC = pre("EngineCore pid=104", "ERROR")
API = pre("APIServer pid=1", "ERROR", where="async_llm.py:699")
DEAD = ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
        "root cause.")
RELAY = [API + "AsyncLLM output_handler failed.", API + "Traceback (most recent call last):",
         API + '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/async_llm.py", line 655, in '
               "output_handler", API + DEAD]


def test_the_first_fault_is_the_earliest_cause_in_file_order_not_the_first_stamp() -> None:
    # the relay is stamped a second earlier than the cause (two processes, two clocks); the cause still leads
    api = pre("APIServer pid=1", "ERROR", ts="11-29 16:02:40", where="async_llm.py:699")
    text = "\n".join([EC + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB.",
                      api + "AsyncLLM output_handler failed.", api + DEAD]) + "\n"
    f = faults(text)
    assert "CUDA out of memory" in f[0]["text"] and any("EngineDeadError" in x["text"] for x in f[1:])


def test_a_traceback_logged_at_warning_is_no_fault() -> None:
    w = pre("APIServer pid=1", "WARNING", where="registry.py:512")
    text = "\n".join([w + "Unable to inspect the model class; falling back", w + "Traceback (most recent call last):",
                      w + '  File "/usr/lib/python3.12/importlib/__init__.py", line 90, in import_module',
                      w + "ModuleNotFoundError: No module named 'flash_attn'"]) + "\n"
    assert faults(text) == []


def test_a_background_threads_traceback_is_no_fault() -> None:
    text = "\n".join([
        "Exception in thread Thread-3 (_report_usage_worker):",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.10/threading.py", line 1016, in _bootstrap_inner',
        "    self.run()",
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='stats.vllm.ai', port=443)",
    ]) + "\n"
    assert faults(text) == []
    # the same traceback in the main thread is a fault
    assert faults("\n".join(text.splitlines()[1:]) + "\n")[0]["text"].startswith("requests.exceptions.ConnectionError")


def test_a_process_header_whose_exception_is_cut_off_is_caught() -> None:
    ec = "(EngineCore_DP0 pid=17374) "
    text = "\n".join([ec + "Process EngineCore_DP0:", ec + "Traceback (most recent call last):",
                      ec + '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
                      ec + "    self.run()"]) + "\n"
    [f] = faults(text)
    assert f["text"] == ec + "Process EngineCore_DP0:" and f["kind"] == "engine_dead"
    assert "died of an uncaught exception" in f["why"]


def test_a_level_less_root_line_before_a_relayed_engine_dead_error_is_caught() -> None:
    text = "\n".join(["(EngineCore pid=112) RuntimeError: CUDA error: an illegal memory access was encountered",
                      *RELAY]) + "\n"
    f = faults(text)
    assert f[0]["text"].endswith("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert "before the relayed error" in f[0]["why"]


def test_a_level_less_root_line_after_frames_whose_header_is_cut_is_caught() -> None:
    text = "\n".join(['  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py", line 244, in x',
                      "    self.model_runner.profile_run()",
                      "ValueError: Free memory on device (3.22/4.0 GiB) on startup is less than desired GPU memory "
                      "utilization (0.9, 3.6 GiB)."]) + "\n"
    [f] = faults(text)
    assert f["text"].startswith("ValueError: Free memory on device") and "after traceback frames" in f["why"]


def test_a_bare_exception_line_with_no_frames_and_no_relay_is_not_a_fault() -> None:
    assert faults("ValueError: this is a line someone printed\nINFO 11-29 16:02:41 [x.py:1] fine\n") == []


def test_a_continuation_of_the_exception_message_is_never_the_headline() -> None:
    ec = pre("EngineCore pid=104", "ERROR", where="core.py:1584")
    text = "\n".join([
        ec + "EngineCore failed to start.", ec + "Traceback (most recent call last):",
        ec + '  File "/usr/local/lib/python3.12/dist-packages/torch/_dynamo/output_graph.py", line 1446, in x',
        ec + "    raise BackendCompilerFailed(self.compiler_fn, e) from e",
        ec + "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
        ec + "CompilationError: at 8:11:",
        ec + "Set TORCH_LOGS=\"+dynamo\" and TORCHDYNAMO_VERBOSE=1 for more information",
    ]) + "\n"
    [f] = faults(text)
    assert f["text"].endswith("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:")
    # logger lines that continue an exception's message outside a traceback in view fold into it
    wk = pre("Worker_PP0 pid=23220", "ERROR", where="multiproc_executor.py:1007")
    text = "\n".join([wk + "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
                      wk + "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/ for more information.",
                      wk + "CUDA kernel errors might be asynchronously reported at some other API call."]) + "\n"
    [f] = faults(text)
    assert f["text"].endswith("torch.AcceleratorError: CUDA error: an illegal memory access was encountered")


def test_an_unnamed_error_its_process_outlived_is_no_fault_but_a_final_one_is() -> None:
    ec = pre("EngineCore pid=7", "ERROR", where="fa_utils.py:273")
    info = pre("EngineCore pid=7", "INFO", where="default_loader.py:506")
    went_on = ec + "Some backend is unavailable; using another\n" + info + "Loading weights took 9.02 seconds\n"
    assert faults(went_on) == []
    assert faults(info + "Loading weights took 9.02 seconds\n" + ec + "Something went wrong\n")
    # vLLM's FA fallback (fa_utils: logger.error, then the assert is caught) is no fault even as the last line
    assert faults(ec + "Cannot use FA version 2 is not supported due to FA2 is only supported on devices with compute "
                       "capability >= 8\n") == []
