"""The log reader: line normalisation, prefixes of every vLLM version, wrappers, tracebacks and fault rules."""

from __future__ import annotations

import re

import pytest

from sparkserve.observe.events import classify_fault
from sparkserve.observe.logline import normalise
from sparkserve.observe.logpatterns import ANCHORS, NEEDLES, PATTERNS, FaultKind, Kind
from sparkserve.observe.logs import parse_log

ESC = "\x1b"


def one(line: str):
    recs = normalise(1, line)
    assert len(recs) == 1, recs
    return recs[0]


# --- prefixes ---------------------------------------------------------------------------------------
def test_031_prefix_gives_process_pid_level_time_and_message() -> None:
    r = one("(Worker_TP1 pid=3190) INFO 11-29 16:03:42 [gpu_worker.py:772] Available KV cache memory: 116.41 GiB")
    assert (r.proc.name, r.proc.pid, r.level, r.ts) == ("Worker_TP1", 3190, "INFO", (11, 29, 16, 3, 42))
    assert r.msg == "Available KV cache memory: 116.41 GiB"


def test_old_stream_prefix_on_uvicorn_lines() -> None:
    r = one("(APIServer pid=3003) INFO:     Application startup complete.")
    assert (r.proc.name, r.level, r.msg) == ("APIServer", "INFO", "Application startup complete.")


@pytest.mark.parametrize(
    ("line", "name", "rank"),
    [
        ("(VllmWorker rank=1 pid=12) INFO 10-23 03:54:46 [worker.py:1] hi", "VllmWorker", 1),
        ("(VllmWorker TP0 pid=12) INFO 10-23 03:54:46 [worker.py:1] hi", "VllmWorker TP0", None),
        ("(VllmWorkerProcess pid=12) INFO 10-23 03:54:46 multiproc_worker_utils.py:215] hi", "VllmWorkerProcess", None),
    ],
)
def test_old_worker_prefix_forms(line: str, name: str, rank: int | None) -> None:
    r = one(line)
    assert (r.proc.name, r.proc.rank, r.msg) == (name, rank, "hi")


def test_v0_logger_format_without_bracket() -> None:
    r = one("INFO 10-23 03:54:41 gpu_executor.py:122] # GPU blocks: 27000, # CPU blocks: 2048")
    assert r.procs == () and r.level == "INFO" and r.msg == "# GPU blocks: 27000, # CPU blocks: 2048"


def test_ray_double_prefix_keeps_both_processes_and_the_ip() -> None:
    r = one(
        "(EngineCore_DP0 pid=479) (RayWorkerWrapper pid=223, ip=192.168.141.7) INFO 10-23 03:54:46 "
        "[parallel_state.py:1325] rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 1, EP rank 0"
    )
    assert [p.name for p in r.procs] == ["EngineCore_DP0", "RayWorkerWrapper"]
    assert (r.proc.pid, r.proc.ip) == (223, "192.168.141.7")
    assert r.msg.startswith("rank 1 in world size 2")


def test_ray_033_shape_and_repeated_suffix() -> None:
    r = one(
        "(RayWorkerProc pid=533, ip=10.0.0.2) (Worker_TP1 pid=533) INFO 11-29 16:03:49 [model_runner.py:1163] "
        "Graph capturing finished in 4 secs, took 0.84 GiB [repeated 14x across cluster]"
    )
    assert r.proc.name == "Worker_TP1" and r.repeated == 14
    assert r.msg == "Graph capturing finished in 4 secs, took 0.84 GiB"


@pytest.mark.parametrize(
    "line",
    [
        f"{ESC}[1;36m(APIServer pid=1){ESC}[0;0m INFO 11-29 16:02:11 [entry.py:139] Starting vLLM server on x",
        "^[[1;36m(APIServer pid=1)^[[0;0m INFO 11-29 16:02:11 [entry.py:139] Starting vLLM server on x",
        "[0;36m(APIServer pid=1)[0;0m INFO 11-29 16:02:11 [entry.py:139] Starting vLLM server on x",
        f"(APIServer pid=1) {ESC}[32mINFO{ESC}[0m 11-29 16:02:11 [entry.py:139] Starting vLLM server on x",
    ],
)
def test_ansi_colour_raw_or_pasted_is_stripped(line: str) -> None:
    r = one(line)
    assert (r.proc.name, r.level, r.msg) == ("APIServer", "INFO", "Starting vLLM server on x")
    assert "[0" not in r.text and ESC not in r.text


def test_ansi_stripping_leaves_file_info_and_brackets_alone() -> None:
    r = one("(Worker_TP0 pid=1) INFO 11-29 16:02:11 [gpu_worker.py:772] sizes [1, 2, 4] and [dflash_head]")
    assert r.msg == "sizes [1, 2, 4] and [dflash_head]"


def test_carriage_return_bar_updates_keep_the_final_state_and_inherit_the_prefix() -> None:
    recs = normalise(
        7,
        "(Worker_TP0 pid=3301) \rCapturing CUDA graphs (PIECEWISE):   0%|          | 0/7 [00:00<?, ?it/s]"
        "\rCapturing CUDA graphs (PIECEWISE): 100%|##########| 7/7 [00:00<00:00, 39.01it/s]",
    )
    assert len(recs) == 1
    assert recs[0].msg.startswith("Capturing CUDA graphs (PIECEWISE): 100%") and recs[0].proc.name == "Worker_TP0"


def test_pasted_caret_m_is_a_carriage_return() -> None:
    recs = normalise(
        1, "(Worker_TP0 pid=9) ^MLoading safetensors checkpoint shards: 100% Completed | 5/5 [00:15<00:00,  2.97s/it]"
    )
    assert recs[0].msg.startswith("Loading safetensors checkpoint shards: 100%")


def test_glued_bar_and_log_line_are_split() -> None:
    bar = "Capturing CUDA graphs (FULL): 100%|##########| 49/49 [00:02<00:00, 19.96it/s]"
    log = "(Worker_TP0 pid=2513) INFO 11-29 16:03:49 [speculator.py:110] Capturing model for speculator..."
    recs = normalise(3, bar + log)
    assert [r.msg for r in recs] == [bar, "Capturing model for speculator..."]
    assert recs[1].proc.name == "Worker_TP0" and all(r.lineno == 3 for r in recs)
    padded = normalise(4, bar + "    " + "INFO 11-29 16:03:49 [model_runner.py:1] Graph capturing finished in 4 secs")
    assert padded[-1].msg == "Graph capturing finished in 4 secs"


def test_docker_timestamps_compose_and_journald_wrappers() -> None:
    base = "(EngineCore pid=2) INFO 11-29 16:03:45 [kv_cache_utils.py:1147] GPU KV cache size: 1,000 tokens"
    for wrapped, source in [
        (f"2026-11-29T16:03:45.123456789Z {base}", None),
        (f"vllm-head-1  | {base}", "vllm-head-1"),
        (f"vllm-head-1  | 2026-11-29T16:03:45.123456789Z {base}", "vllm-head-1"),
        (f"Nov 29 16:03:45 spark-a vllm-head[2211]: {base}", "vllm-head"),
        (f"2026-11-29T16:03:45+0000 spark-a dockerd[99]: {base}", "dockerd"),
    ]:
        r = one(wrapped)
        assert (r.proc.name, r.msg, r.source) == ("EngineCore", "GPU KV cache size: 1,000 tokens", source), wrapped
        assert r.text == wrapped


def test_a_tqdm_bar_with_a_pipe_is_not_a_compose_column() -> None:
    r = one("Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:06<00:00,  1.62s/it]")
    assert r.source is None and r.msg.startswith("Loading safetensors")


def test_pytorch_c10_and_nccl_library_prefixes() -> None:
    c = one(
        "[rank1]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, Timeout(ms)=600000) ran for 600081 milliseconds"
    )
    assert (c.c10_rank, c.level, c.ts) == (1, "ERROR", (12, 18, 20, 27, 21)) and c.msg.startswith("[Rank 1] Watchdog")
    n = one("07d92dd514d4:142935:143254 [0] transport/net_ib.cc:100 NCCL WARN NET/IB : mlx5_3:1 Got async event")
    assert n.nccl_pid == 142935


def test_json_formatter_line() -> None:
    r = one(
        '{"asctime": "2026-11-29 16:02:43,123", "levelname": "INFO", "name": "vllm.v1.worker.gpu_worker", '
        '"processName": "VllmWorker-1", "process": 3190, "message": "Using V2 Model Runner"}'
    )
    assert (r.json_proc, r.proc.pid, r.level, r.ts, r.msg) == (
        "VllmWorker-1",
        3190,
        "INFO",
        (11, 29, 16, 2, 43),
        "Using V2 Model Runner",
    )


def test_crlf_and_cr_only_files() -> None:
    crlf = "(EngineCore pid=2) INFO 11-29 16:03:45 [k.py:1] GPU KV cache size: 5 tokens\r\n" * 2
    assert [e.line for e in parse_log(crlf, file="x").of(Kind.KV_TOKENS)] == [1, 2]
    cr = "INFO:     Waiting for application startup.\rINFO:     Application startup complete.\r"
    assert [e.line for e in parse_log(cr, file="x").of(Kind.READY)] == [2]


def test_continuation_lines_of_a_multiline_message_keep_their_prefix() -> None:
    text = "\r\n".join(
        f"(APIServer pid=2101) INFO 11-29 16:02:11 [startup.py:38] {x}"
        for x in ["", "   version 0.33.0", "   model   /m"]
    )
    recs = [normalise(i, x)[0] for i, x in enumerate(text.split("\n"), 1)]
    assert [r.proc.name for r in recs] == ["APIServer"] * 3 and recs[1].msg == "   version 0.33.0"


def test_hard_wrapped_engine_config_is_joined() -> None:
    line = (
        "(EngineCore pid=2377) INFO 11-29 16:02:27 [core.py:139] Initializing a V1 LLM engine (v0.33.0) with "
        "config: model='/m', speculative_config=SpeculativeConfig(method='dflash', model='/d', num_spec_tokens=7), "
        "tensor_parallel_size=2, compilation_config={'cudagraph_mode': <CUDAGraphMode.FULL: (2, 0)>}"
    )
    wrapped = "\n".join(line[i : i + 80] for i in range(0, len(line), 80))
    ev = parse_log(wrapped + "\n", file="x").of(Kind.ENGINE_CONFIG)
    assert (
        len(ev) == 1 and "num_spec_tokens=7" in ev[0].data["config"] and "CUDAGraphMode.FULL:" in ev[0].data["config"]
    )


# --- the pattern table ------------------------------------------------------------------------------
def test_every_needle_holds_an_anchor_so_the_sweep_cannot_miss_a_line() -> None:
    assert [n for n in NEEDLES if not any(a in n for a in ANCHORS)] == []


def test_every_pattern_documents_its_versions() -> None:
    assert all(p.notes and p.needles for p in PATTERNS)


@pytest.mark.parametrize(
    ("msg", "kind"),
    [
        ("EngineCore failed to start.", FaultKind.ENGINE_DEAD),
        ("EngineCore encountered a fatal error.", FaultKind.ENGINE_DEAD),
        ("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup", FaultKind.ENGINE_DEAD),
        (
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {'EngineCore': 1}",
            FaultKind.ENGINE_DEAD,
        ),
        (
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
            FaultKind.ENGINE_DEAD,
        ),
        ("Engine core proc EngineCore_0 died unexpectedly, shutting down client.", FaultKind.ENGINE_DEAD),
        ("Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.", FaultKind.WORKER_DIED),
        ("Worker proc VllmWorker-1 died unexpectedly, shutting down executor.", FaultKind.WORKER_DIED),
        ("RayWorkerProc rank=1 died unexpectedly, shutting down executor.", FaultKind.WORKER_DIED),
        ("WorkerProc failed to start.", FaultKind.WORKER_DIED),
        ("WorkerProc hit an exception.", FaultKind.WORKER_DIED),
        (
            "RuntimeError: Worker failed with error 'CUDA out of memory.', please check the stack trace above for the "
            "root cause",
            FaultKind.WORKER_DIED,
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB.", FaultKind.OOM),
        ("NVRM: … NV_ERR_NO_MEMORY", FaultKind.OOM),
        ("Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization", FaultKind.OOM),
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
            FaultKind.OTHER,  # a KV sizing error, not an out-of-memory (issue 13 item 6)
        ),
        (
            "ValueError: To serve at least one request with the model's max seq len (8192), (0.01 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (0.00 GiB). ",
            FaultKind.OTHER,
        ),
        (
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST)",
            FaultKind.TIMEOUT,
        ),
        ("TimeoutError: RPC call to sample_tokens timed out.", FaultKind.TIMEOUT),
        (
            "TimeoutError: Timed out waiting for engine core processes to start. This is often caused by slow weight",
            FaultKind.TIMEOUT,
        ),
        (
            "No available shared memory broadcast block found in 60 seconds. This typically happens when some "
            "processes are hanging",
            FaultKind.TIMEOUT,
        ),
        ("transport/net_ib.cc:100 NCCL WARN NET/IB : mlx5_3:1 Got async event : local catastrophic error",
         FaultKind.NCCL),
        ("RuntimeError: NCCL error: unhandled system error", FaultKind.NCCL),
        ("ibv_modify_qp failed with 110 (Connection timed out)", FaultKind.NCCL),
        ("[c10d] recvValue failed on SocketImpl(fd=31): Failed to recv, got 0 bytes.", FaultKind.OTHER),
        ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", FaultKind.OTHER),
    ],
)
def test_fault_kinds_from_the_real_strings(msg: str, kind: FaultKind) -> None:
    assert classify_fault(msg) is kind


@pytest.mark.parametrize(
    "msg",
    [
        "Custom collectives are disabled because this multi-node group does not have MNNVL-capable GPUs on every rank.",
        "vLLM is using nccl==2.27.5",
        "transport/net_ib.cc:100 NCCL WARN NET/IB : mlx5_3:1 Got async event : GID table change",  # information
        "Engine 000: Avg prompt throughput: 4012.6 tokens/s, Running: 32 reqs, GPU KV cache usage: 3.1%",
        "[shutdown] Executor: waiting for worker exit count=1",
        "Triton kernel JIT compilation during inference: _topk_topp_kernel.",
    ],
)
def test_healthy_lines_are_not_faults(msg: str) -> None:
    assert classify_fault(msg) is None


def test_info_shm_stall_is_a_fault_even_at_info_level() -> None:
    text = (
        "(EngineCore pid=9) INFO 11-29 16:06:30 [shm_broadcast.py:111] No available shared memory broadcast block "
        "found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming "
        "work (e.g. compilation, weight/kv cache quantization).\n"
    ) * 3
    log = parse_log(text, file="head.log")
    assert [(f.fault, f.line) for f in log.faults] == [(FaultKind.TIMEOUT, 1)]  # three stalls, reported once


# --- tracebacks and the fault rules ----------------------------------------------------------------------
P = "(EngineCore pid=7) ERROR 11-29 16:08:50 [core.py:1586] "


def tb(*lines: str, prefix: str = P) -> str:
    return "".join(prefix + x + "\n" for x in lines)


def test_traceback_is_one_fault_its_root_cause_line_with_the_header_folded_in() -> None:
    text = tb(
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        '  File "core.py", line 1, in run',
        '    raise TimeoutError(f"RPC call to {method} timed out.")',
        "TimeoutError: RPC call to sample_tokens timed out.",
    )
    log = parse_log(text, file="h")
    assert [(f.fault, f.line) for f in log.faults] == [(FaultKind.TIMEOUT, 5)]
    assert log.faults[0].text.endswith("TimeoutError: RPC call to sample_tokens timed out.")
    assert log.faults[0].sort_line == 0  # ordered where the incident began


def test_pointer_root_yields_to_an_earlier_exception_of_the_same_traceback() -> None:
    text = tb(
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "ValueError: mask_embedding.pt mask_token_id does not match dflash_config.mask_token_id (4). Got 5.",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "b.py", line 2, in g',
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    )
    log = parse_log(text, file="h")
    assert len(log.faults) == 1 and log.faults[0].line == 3 and log.faults[0].fault is FaultKind.TRACEBACK


def test_a_lone_pointer_traceback_keeps_its_kind() -> None:
    text = (
        'Traceback (most recent call last):\n  File "/usr/local/bin/vllm", line 10, in <module>\n'
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore': 1}\n"
    )
    assert [f.fault for f in parse_log(text, file="h").faults] == [FaultKind.ENGINE_DEAD]


def test_lines_inside_a_traceback_are_not_separate_faults() -> None:
    text = tb(
        "Traceback (most recent call last):",
        '  File "executor.py", line 509, in get_response',
        '    raise TimeoutError(f"RPC call to {method} timed out.")',
        "    # NCCL WARN in a comment",
        "AssertionError",
    )
    log = parse_log(text, file="h")
    assert [(f.fault, f.line) for f in log.faults] == [(FaultKind.TRACEBACK, 5)]


def test_interleaved_streams_do_not_break_a_traceback() -> None:
    w = "(Worker_TP1 pid=8) ERROR 11-29 16:08:50 [multiproc_executor.py:1189] "
    text = (
        tb("WorkerProc hit an exception.", "Traceback (most recent call last):", prefix=w)
        + "(APIServer pid=1) INFO 11-29 16:08:50 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s\n"
        + tb(
            '  File "m.py", line 3, in x',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            prefix=w,
        )
    )
    log = parse_log(text, file="h")
    assert [(f.fault, f.line) for f in log.faults] == [(FaultKind.OOM, 5)]


def test_faults_after_a_deliberate_stop_are_shutdown_artefacts() -> None:
    text = (
        "(APIServer pid=1) INFO 11-29 16:20:02 [launcher.py:100] [shutdown] API server: shutdown triggered\n"
        "[rank1]:[W1129 16:20:03.098 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=31): Failed to recv\n"
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nKeyboardInterrupt\n'
    )
    log = parse_log(text, file="h")
    assert log.faults == [] and log.stop is not None and log.stop.line == 1
    assert [a.line for a in log.artefacts] == [2]


def test_a_stop_after_a_fault_is_not_deliberate_and_hides_nothing() -> None:
    text = (
        "(EngineCore pid=2) ERROR 11-29 16:08:50 [multiproc_executor.py:380] Worker proc VllmWorker-1 died "
        "unexpectedly (exit code: -9), shutting down executor.\n"
        "(EngineCore pid=2) INFO 11-29 16:08:50 [multiproc_executor.py:426] [shutdown] Executor: waiting for "
        "worker exit count=1\n"
        "(APIServer pid=1) WARNING 11-29 16:08:51 [core_client.py:839] [shutdown] MPClient: engine core exited "
        "unexpectedly; starting cleanup\n"
    )
    log = parse_log(text, file="h")
    assert log.stop is None
    assert [f.fault for f in log.faults] == [FaultKind.WORKER_DIED, FaultKind.ENGINE_DEAD]


def test_keyboard_interrupt_traceback_is_a_stop_not_a_fault() -> None:
    log = parse_log('Traceback (most recent call last):\n  File "x", line 1\nKeyboardInterrupt\n', file="h")
    assert log.faults == [] and log.stop is not None


def test_error_level_lines_are_faults_of_kind_other() -> None:
    log = parse_log("(APIServer pid=1) ERROR 11-29 16:08:51 [serving.py:1] Something broke badly\n", file="h")
    assert [(f.fault, f.line) for f in log.faults] == [(FaultKind.OTHER, 1)]


def test_unprefixed_fault_inherits_the_nearest_earlier_timestamp() -> None:
    text = (
        "(EngineCore pid=2) INFO 11-29 16:08:40 [core.py:1] hello\n"
        "spark-b:3190:3305 [0] transport/net_ib.cc:1011 NCCL WARN ibv_modify_qp failed with 110\n"
    )
    log = parse_log(text, file="h")
    assert log.faults[0].ts == (11, 29, 16, 8, 40)


def test_fault_text_is_the_line_as_written_without_colour() -> None:
    line = f"{ESC}[1;36m(EngineCore_0 pid=2){ESC}[0;0m ERROR 08-20 10:00:00 [core.py:1] EngineCore failed to start."
    log = parse_log(line + "\n", file="h")
    assert log.faults[0].text == "(EngineCore_0 pid=2) ERROR 08-20 10:00:00 [core.py:1] EngineCore failed to start."


def test_candidates_only_cost_what_they_hold() -> None:
    # a line with no anchor never reaches the regexes: the parse of a boring line yields no events
    text = 'INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n' * 1000
    assert parse_log(text, file="h").events == []


def test_bytes_and_str_inputs_agree_and_bad_utf8_is_replaced() -> None:
    # issue 44: a byte that is no UTF-8 in a file with no UTF-8 at all is Latin-1 (ÿ); among UTF-8 text it is replaced
    raw = b"(EngineCore pid=2) INFO 11-29 16:03:45 [k.py:1] GPU KV cache size: 1,234 tokens \xff\n"
    a = parse_log(raw, file="h").of(Kind.KV_TOKENS)
    b = parse_log(raw.decode("latin-1"), file="h").of(Kind.KV_TOKENS)
    assert a[0].data["tokens"] == b[0].data["tokens"] == "1,234" and a[0].text.endswith("ÿ")
    utf8 = "Capturing CUDA graphs: 100%|██████████| 35/35\n".encode() * 3 + raw
    c = parse_log(utf8, file="h").of(Kind.KV_TOKENS)
    assert c[0].data["tokens"] == "1,234" and "\ufffd" in c[0].text


def test_regexes_are_precompiled() -> None:
    assert all(isinstance(p.regex, re.Pattern) for p in PATTERNS)


def test_only_the_first_stats_line_with_work_becomes_an_event() -> None:
    """`Avg prompt throughput` repeats every 10 s for as long as the engine serves (half a serving log): the
    first line that shows work proves requests were served, and the rest are not classified at all."""
    line = ("(APIServer pid=1) INFO 11-29 17:5{i}:01 [loggers.py:123] Engine 000: Avg prompt throughput: {p} tokens/s, "
            "Avg generation throughput: {g} tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%")
    text = "\n".join([line.format(i=0, p="0.0", g="0.0"), line.format(i=1, p="12.5", g="80.1")]
                     + [line.format(i=2, p="9.0", g="70.0")] * 500) + "\n"
    served = [e for e in parse_log(text, file="head.log").events if e.kind is Kind.SERVED]
    assert [(e.rec.lineno, e.data["prompt"]) for e in served] == [(1, "0.0"), (2, "12.5")]
