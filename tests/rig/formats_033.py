# ruff: noqa: E501  (a table of vLLM's own long format strings, kept one per line)
"""vLLM 0.33.0's log formats, as the emulator must print them — and a checker for any log text.

Every entry is a real 0.33.0 format string (commit 4ba787ec9) with the file and line its logger call has in
the wheel; ``tests/rig/test_formats_table.py`` proves each one against the installed vLLM package source
(``tests/rig/tools/vllm_formats.py`` reads it with ``ast``). Sources: vllm-facts.md, assembled-boot-log-0.33.txt
and the package itself. Third-party lines vLLM's processes also write (uvicorn, tqdm, PyTorch c10d/NCCL,
Python's own traceback printer) are matched by the regexes at the end, taken from the real 0.25.1 captures.

    bad = unmatched_lines(stdout_text, stderr_text)   # [] when every line comes from a known format
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fmt:
    key: str
    path: str  # inside the vllm package
    line: int  # the logger call's first line (what the [file:line] prefix shows)
    level: str
    fmt: str  # %-style or f-string ({} holes) message format; a regex when ``regex`` is set
    verify: str = "call"  # call: a logger call with exactly this literal | literal | fragments (see test)
    fragments: tuple[str, ...] = ()
    exc: bool = False  # logger.exception(): the message is followed by a traceback
    regex: bool = False

    @property
    def where(self) -> str:
        return f"{self.path.rsplit('/', 1)[-1]}:{self.line}"


FORMATS: list[Fmt] = [
    Fmt('nondefault', 'entrypoints/common/startup.py', 96, 'INFO',
        'non-default args: %s'),
    Fmt('arch', 'config/model.py', 744, 'INFO',
        'Resolved architecture: %s'),
    Fmt('maxlen', 'config/model.py', 2170, 'INFO',
        'Using max model len %s'),
    Fmt('kvdtype', 'config/cache.py', 484, 'INFO',
        'Using %s data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a proper scaling factor'),
    Fmt('kvdtype_head', 'config/cache.py', 477, 'INFO',
        'Using %s data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. Dynamic per-token-head scales will be computed at runtime.'),
    Fmt('dp_infer', 'engine/arg_utils.py', 2513, 'INFO',
        'Inferred data_parallel_rank %d from node_rank %d'),
    Fmt('draft_len', 'config/speculative.py', 1799, 'INFO',
        'Overriding draft model max model len from %d to %d'),
    Fmt('chunked', 'config/scheduler.py', 310, 'INFO',
        'Chunked prefill is enabled with max_num_batched_tokens=%d.'),
    Fmt('ir', 'config/kernel.py', 480, 'INFO',
        'Final IR op priority after setting platform defaults: %s'),
    Fmt('eager_warn', 'config/vllm.py', 1778, 'WARNING',
        'Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False'),
    Fmt('inductor_off', 'config/vllm.py', 1802, 'WARNING',
        'Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.'),
    Fmt('eager', 'config/vllm.py', 2005, 'INFO',
        'Cudagraph is disabled under eager mode'),
    Fmt('headless', 'entrypoints/cli/serve.py', 224, 'INFO',
        'Launching vLLM (v%s) headless multiproc executor, with head node address %s for torch.distributed process group.'),
    Fmt('engine_cfg', 'v1/engine/core.py', 139, 'INFO',
        'Initializing a V1 LLM engine (v%s) with config: %s'),
    Fmt('dp_leader', 'v1/executor/multiproc_executor.py', 167, 'INFO',
        'DP group leader: node_rank=%d, node_rank_within_dp=%d, master_addr=%s, mq_connect_ip=%s (local), world_size=%d, local_world_size=%d'),
    Fmt('dist_init', 'distributed/parallel_state.py', 1929, 'INFO',
        'world_size=%d rank=%d local_rank=%d distributed_init_method=%s backend=%s'),
    Fmt('nccl', 'distributed/device_communicators/pynccl.py', 148, 'INFO',
        'vLLM is using nccl==%s'),
    Fmt('mnnvl', 'distributed/device_communicators/custom_all_reduce.py', 232, 'WARNING',
        'Custom collectives are disabled because this multi-node group does not have MNNVL-capable GPUs on every rank.'),
    Fmt('ar', 'distributed/device_communicators/cuda_communicator.py', 353, 'INFO',
        "Using %s all-reduce backends (in dispatch order) for group '%s' out of potential backends: %s."),
    Fmt('assigned', 'distributed/parallel_state.py', 2385, 'INFO',
        'rank %s in world size %s is assigned as DP rank %s, PP rank %s, PCP rank %s, TP rank %s, ETP rank %s, EP rank %s, EPLB rank %s'),
    Fmt('v2', 'v1/worker/gpu_worker.py', 513, 'INFO',
        'Using V2 Model Runner'),
    Fmt('scratch', 'v1/worker/gpu/model_runner.py', 399, 'INFO',
        'Loading model from scratch...'),
    Fmt('attn', 'platforms/cuda.py', 508, 'INFO',
        'Using %s attention backend out of potential backends: %s.'),
    Fmt('attn_explicit', 'platforms/cuda.py', 448, 'INFO',
        'Using %s backend.'),
    Fmt('fa', 'v1/attention/backends/flash_attn.py', 1122, 'INFO',
        'Using FlashAttention version %s'),
    Fmt('fs', 'model_executor/model_loader/weight_utils.py', 1144, 'INFO',
        'Filesystem type for checkpoints: %s. Checkpoint size: %.2f GiB. Available RAM: %.2f GiB.'),
    Fmt('prefetch', 'model_executor/model_loader/weight_utils.py', 1167, 'INFO',
        'Auto-prefetch is disabled because the filesystem (%s) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.'),
    Fmt('weights', 'model_executor/model_loader/default_loader.py', 506, 'INFO',
        'Loading weights took %.2f seconds'),
    Fmt('aux', 'v1/worker/gpu/spec_decode/eagle/eagle3_utils.py', 36, 'INFO',
        'Using Eagle3 auxiliary layers from config: %s'),
    Fmt('mask', 'model_executor/models/qwen3_dflash.py', 926, 'INFO',
        'Loaded DFlash mask embedding for mask_token_id %s from %s'),
    Fmt('model_load', 'v1/worker/gpu/model_runner.py', 428, 'INFO',
        'Model loading took %s GiB memory and %.6f seconds'),
    Fmt('flashinfer', 'v1/sample/ops/topk_topp_sampler.py', 121, 'INFO',
        'FlashInfer top-p/top-k sampling disabled via VLLM_USE_FLASHINFER_SAMPLER=0.'),
    Fmt('tc_start', 'compilation/monitor.py', 40, 'INFO',
        '%sStarting torch.compile'),
    Fmt('tc_cache', 'compilation/backends.py', 1125, 'INFO',
        "%sUsing cache directory: %s for vLLM's torch.compile"),
    Fmt('dynamo', 'compilation/backends.py', 1187, 'INFO',
        '%sDynamo bytecode transform time: %.2f s'),
    Fmt('tc_store', 'compilation/backends.py', 401, 'INFO',
        '%sCache the graph of compile range %s for later use'),
    Fmt('tc_compile', 'compilation/backends.py', 417, 'INFO',
        '%sCompiling a graph for compile range %s takes %.2f s'),
    Fmt('tc_load', 'compilation/backends.py', 310, 'INFO',
        '%sDirectly load the compiled graph(s) for compile range %s from the cache, took %.3f s'),
    Fmt('aot_save', 'compilation/decorators.py', 752, 'INFO',
        '%ssaved AOT compiled function to %s'),
    Fmt('aot_load', 'compilation/decorators.py', 326, 'INFO',
        '%sDirectly load AOT compilation from path %s'),
    Fmt('warmup', 'compilation/monitor.py', 91, 'INFO',
        '%sInitial profiling/warmup run took %.2f s'),
    Fmt('kv_avail', 'v1/worker/gpu_worker.py', 772, 'INFO',
        'Available KV cache memory: %s GiB'),
    Fmt('cg_profiling', 'v1/worker/gpu_worker.py', 787, 'INFO',
        'CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=%.4f is equivalent to --gpu-memory-utilization=%.4f without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase --gpu-memory-utilization to %.4f. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.'),
    Fmt('kv_size', 'v1/core/kv_cache_utils.py', 1147, 'INFO',
        '%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx'),
    Fmt('spec_capture', 'v1/worker/gpu/spec_decode/dflash/speculator.py', 170, 'INFO',
        'Capturing model for %s speculator...'),
    Fmt('spec_capture_ar', 'v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py', 110, 'INFO',
        'Capturing model for speculator...'),
    Fmt('graphs', 'v1/worker/gpu/model_runner.py', 1163, 'INFO',
        'Graph capturing finished in %.0f secs, took %.2f GiB'),
    Fmt('cg_pool', 'v1/worker/gpu_worker.py', 1003, 'INFO',
        'CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: %s GiB (%.1f%%).'),
    Fmt('jit', 'utils/jit_monitor.py', 84, 'INFO',
        'Kernel JIT monitor activated; monitored JIT compilations during inference will use mode=%s.'),
    Fmt('init_engine', 'v1/engine/core.py', 405, 'INFO',
        'init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)'),
    Fmt('init_engine_eager', 'v1/engine/core.py', 412, 'INFO',
        'init engine (profile, create kv cache, warmup model) took %.2f s'),
    Fmt('tasks', 'entrypoints/launchers/api_server/entry.py', 135, 'INFO',
        'Supported tasks: %s'),
    Fmt('chat_fmt', 'renderers/hf.py', 736, 'INFO',
        "Detected the chat template content format to be '%s'. You can set `--chat-template-content-format` to override this."),
    Fmt('starting', 'entrypoints/launchers/api_server/entry.py', 139, 'INFO',
        'Starting vLLM server on %s'),
    Fmt('routes', 'entrypoints/launchers/launcher.py', 188, 'INFO',
        'Available routes are:'),
    Fmt('route', 'entrypoints/launchers/launcher.py', 197, 'INFO',
        'Route: %s, Methods: %s'),
    Fmt('worker_died', 'v1/executor/multiproc_executor.py', 380, 'ERROR',
        'Worker proc %s died unexpectedly (exit code: %s), shutting down executor.'),
    Fmt('wp_failed_start', 'v1/executor/multiproc_executor.py', 1057, 'ERROR',
        'WorkerProc failed to start.'),
    Fmt('wp_hit', 'v1/executor/multiproc_executor.py', 1189, 'ERROR',
        'WorkerProc hit an exception.'),
    Fmt('ec_failed_start', 'v1/engine/core.py', 1584, 'ERROR',
        'EngineCore failed to start.'),
    Fmt('ec_fatal', 'v1/engine/core.py', 1586, 'ERROR',
        'EngineCore encountered a fatal error.'),
    Fmt('mp_dead', 'v1/engine/core_client.py', 839, 'WARNING',
        '[shutdown] MPClient: engine core exited unexpectedly; starting cleanup'),
    # issue 43: seen in the real 0.33.0 run (tests/fixtures/logs/real-0.33.0-gpu/boot-killed.log: kill -9 of the
    # EngineCore; boot-bare-sigterm.log: a deliberate SIGTERM), each a logger call of the wheel at this file:line
    Fmt('pm_sigterm', 'v1/utils.py', 628, 'INFO',
        '[shutdown] Process manager: send sigterm to process %s'),
    Fmt('pm_force', 'v1/utils.py', 648, 'WARNING',
        '[shutdown] Process manager: force killing remaining processes count=%d'),
    Fmt('pm_force_one', 'v1/utils.py', 653, 'WARNING',
        '[shutdown] Process manager: force killing remaining process %s pid %d'),
    Fmt('output_handler', 'v1/engine/async_llm.py', 943, 'ERROR',
        'AsyncLLM output_handler failed.'),
    Fmt('stream_gen_error', 'entrypoints/openai/chat_completion/serving.py', 952, 'ERROR',
        'Error in chat completion stream generator.'),
    Fmt('req_error', 'entrypoints/generate/base/serving.py', 203, 'ERROR',
        'Request %s failed with an internal error during generation'),
    Fmt('parent_exit', 'v1/executor/multiproc_executor.py', 944, 'INFO',
        'Parent process exited, terminating worker queues'),
    Fmt('sd_api_trigger', 'entrypoints/launchers/launcher.py', 256, 'INFO',
        '[shutdown] API server: shutdown triggered'),
    Fmt('sd_api_stop', 'entrypoints/launchers/launcher.py', 272, 'INFO',
        '[shutdown] API server: stopping engine client mode=%s timeout=%ss'),
    Fmt('sd_api_stopped', 'entrypoints/launchers/launcher.py', 281, 'INFO',
        '[shutdown] API server: engine client stopped'),
    Fmt('sd_api_signal', 'entrypoints/launchers/launcher.py', 284, 'INFO',
        '[shutdown] API server: signalling HTTP server shutdown'),
    Fmt('sd_api_fastapi', 'entrypoints/launchers/launcher.py', 306, 'INFO',
        '[shutdown] API server: shutting down FastAPI HTTP server'),
    Fmt('sd_mp_start', 'v1/engine/core_client.py', 792, 'INFO',
        '[shutdown] MPClient: start timeout=%s'),
    Fmt('sd_mp_stop', 'v1/engine/core_client.py', 794, 'INFO',
        '[shutdown] MPClient: stopping engine manager'),
    Fmt('sd_mp_stopped', 'v1/engine/core_client.py', 796, 'INFO',
        '[shutdown] MPClient: engine manager stopped'),
    Fmt('sd_mp_clean', 'v1/engine/core_client.py', 797, 'INFO',
        '[shutdown] MPClient: cleaning up background resources'),
    Fmt('sd_mp_done', 'v1/engine/core_client.py', 799, 'INFO',
        '[shutdown] MPClient: complete'),
    Fmt('sd_ec_signal', 'v1/engine/core.py', 1525, 'INFO',
        '[shutdown] EngineCore: trigger received signal=%s'),
    Fmt('sd_ec_start', 'v1/engine/core.py', 1712, 'INFO',
        '[shutdown] EngineCore: start mode=%s timeout=%ds'),
    Fmt('sd_ec_teardown', 'v1/engine/core.py', 1743, 'INFO',
        '[shutdown] EngineCore: request processing complete; starting resource teardown'),
    Fmt('sd_ec_exit', 'v1/engine/core.py', 1573, 'INFO',
        '[shutdown] EngineCore: exiting busy loop'),
    Fmt('sd_ex_wait', 'v1/executor/multiproc_executor.py', 580, 'INFO',
        '[shutdown] Executor: waiting for worker exit count=%d'),
    Fmt('sd_ex_done', 'v1/executor/multiproc_executor.py', 587, 'INFO',
        '[shutdown] Executor: all workers exited gracefully'),
    # Ray executor (the EngineCore is the Ray driver)
    Fmt('ray_pg', 'v1/executor/ray_utils.py', 358, 'INFO',
        'No current placement group found. Creating a new placement group.'),
    Fmt('ray_pg_wait', 'v1/executor/ray_utils.py', 223, 'INFO',
        'Waiting for creating a placement group of specs for %d seconds. specs=%s. Check `ray status` and `ray list nodes` to see if you have enough resources, and make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are running on a multi-node.'),
    Fmt('ray_died', 'v1/executor/ray_executor_v2.py', 522, 'ERROR',
        'RayWorkerProc rank=%s died unexpectedly, shutting down executor.'),
    # messages built outside the logger call (verified by their literal pieces in the file)
    Fmt("logo", "entrypoints/common/startup.py", 38, "INFO",
        "\n {7}█     █     █▄   ▄█\n ▄▄ ▄█ █     █     █ ▀▄▀ █  version (\\S+)\n  █▄█▀ █     █     █     █  model   (.+)"
        "\n   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n", verify="fragments", regex=True,
        fragments=("█     █     █▄   ▄█", "█     █     █ ▀▄▀ █", "  version ", "█     █     █     █", "  model   ",
                   "▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀")),
    Fmt("logo_plain", "entrypoints/common/startup.py", 38, "INFO", "vLLM server version %s, serving model %s",
        verify="fragments"),
    Fmt("tc_total", "compilation/monitor.py", 62, "INFO", "%storch.compile took %.2f s in total", verify="fragments"),
    Fmt("kv_reserved", "v1/worker/gpu_worker.py", 676, "INFO",
        "Initial free memory {} GiB, reserved {} GiB memory for KV Cache as specified by kv_cache_memory_bytes "
        "config and skipped memory profiling. This does not respect the gpu_memory_utilization config. Only use "
        "kv_cache_memory_bytes config when you want manual control of KV cache memory size. If OOM'ed, check the "
        "difference of initial free memory between the current run and the previous run where "
        "kv_cache_memory_bytes is suggested and update it correspondingly.", verify="fragments"),
    Fmt("stats", "v1/metrics/loggers.py", 335, "INFO",
        "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d "
        "reqs, Waiting: %d reqs, %s KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%", verify="fragments",
        fragments=("Engine {:03d}: ", "Avg prompt throughput: %.1f tokens/s", "Avg generation throughput: %.1f tokens/s",
                   "Running: %d reqs", "Waiting: %d reqs", "%s KV cache usage: %.1f%%", "Prefix cache hit rate: %.1f%%")),
    Fmt("spec", "v1/spec_decode/metrics.py", 120, "INFO",
        "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, Drafted throughput: "
        "%.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: %s, Avg Draft "
        "acceptance rate: %.1f%%", verify="literal"),
    Fmt("shm", "distributed/device_communicators/shm_broadcast.py", 878, "INFO",
        "No available shared memory broadcast block found in %d seconds. This typically happens when some processes "
        "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).",
        verify="fragments"),
]

# logger.exception() records: the message, then "\n" + a Python traceback (every line carries the prefix)
EXC_KEYS = {"wp_failed_start", "wp_hit", "ec_failed_start", "ec_fatal", "output_handler", "stream_gen_error"}
FORMATS = [Fmt(**{**f.__dict__, "exc": True}) if f.key in EXC_KEYS else f for f in FORMATS]

# The last line of a traceback: exceptions vLLM (or torch, for the OOM and the TCPStore) raises.
EXCEPTIONS: list[tuple[str, str]] = [
    (r"RuntimeError: NCCL error: .+", "distributed/device_communicators/pynccl_wrapper.py"),
    (r"ValueError: mask_embedding\.pt mask_token_id does not match dflash_config\.mask_token_id \(-?\d+\)\. Got .+\.",
     "model_executor/models/qwen3_dflash.py"),
    (r"ValueError: conv_group_size=\d+ must divide hidden_size=\d+\.", "model_executor/models/qwen3_dflash2.py"),
    (r"KeyError: '\w+'", ""),
    (r"RuntimeError: CUDA error: an illegal memory access was encountered", ""),
    (r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate [\d.]+ [GM]iB\. GPU \d+ has a total capacity of .+",
     ""),
    (r"RuntimeError: Worker failed with error '.*', please check the stack trace above for the root cause",
     "v1/executor/multiproc_executor.py"),
    (r"Exception: WorkerProc initialization failed due to an exception in a background process\. See stack trace "
     r"for root cause\.", "v1/executor/multiproc_executor.py"),
    (r"RuntimeError: Executor failed\.", "v1/engine/core.py"),
    (r"vllm\.v1\.engine\.exceptions\.EngineDeadError: EngineCore encountered an issue\. See stack trace \(above\) "
     r"for the root cause\.", "v1/engine/exceptions.py"),  # real 0.33.0: boot-killed.log
    (r"RuntimeError: Engine core initialization failed\. See root cause above\. Failed core proc\(s\): \{.*\}",
     "v1/engine/utils.py"),
    (r"TimeoutError: Timed out waiting for engine core processes to start\. This is often caused by slow weight "
     r"loading for large models\. Waited \d+s \(configured by VLLM_ENGINE_READY_TIMEOUT_S\)\. To increase the "
     r"timeout, set the environment variable: VLLM_ENGINE_READY_TIMEOUT_S=<seconds>", "v1/engine/core_client.py"),
    (r"ValueError: No available memory for the cache blocks\. .+", "v1/core/kv_cache_planning.py"),
    (r"ValueError: Model Runner V1 does not support: .+", "config/vllm.py"),
    (r"ValueError: Invalid kv_cache_dtype: .+", ""),
    (r"ValueError: 'tensor_parallel_size' is not a valid argument in the speculative_config\. Please pass "
     r"'draft_tensor_parallel_size' instead\.", "config/speculative.py"),
    (r"ValueError: A speculative model was provided, but `num_speculative_tokens` was not provided", ""),
    (r"torch\.distributed\.DistNetworkError: The server socket has failed to listen on any local network address\..*",
     ""),
    (r"_pickle\.UnpicklingError: Weights only load failed\..*", ""),
    (r"OSError: \[Errno \d+\] .+", ""),
    (r"ConnectionError: Could not find any running Ray instance\. .+", ""),  # Ray's own text
]

# Lines vLLM's processes write that are not vLLM log records (no prefix in 0.31+).
UVICORN = re.compile(
    r"^(?:INFO|WARNING|ERROR):\s{2,5}(?:Started server process \[\d+\]|Waiting for application startup\.|"
    r"Application startup complete\.|Shutting down|Waiting for application shutdown\.|Application shutdown complete\.|"
    r"Finished server process \[\d+\]|[\d.]+:\d+ - \"(?:GET|POST|HEAD) \S+ HTTP/1\.[01]\" \d{3}(?: [A-Za-z ]+)?)$")
TQDM = re.compile(
    r"^(?:Loading safetensors checkpoint shards|Capturing CUDA graphs \((?:PIECEWISE|FULL)\)|"
    r"Capturing (?:dflash|dflash2) CUDA graphs \(FULL\)): +\d+%(?:\|[ █▏▎▍▌▋▊▉]{10}\| | Completed \| )\d+/\d+ "
    r"\[\d\d:\d\d<(?:\?|\d\d:\d\d), (?:\?|[ \d.]+)(?:it/s|s/it)\]$")
TORCH = [  # PyTorch C++ (c10d, ProcessGroupNCCL): seen in the real captures / vllm-facts.md
    re.compile(r"^\[rank\d+\]:\[E\d{4} \d\d:\d\d:\d\d\.\d+ ProcessGroupNCCL\.cpp:\d+\] \[Rank \d+\] Watchdog caught "
               r"collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=\w+, NumelIn=\d+, NumelOut=\d+, "
               r"Timeout\(ms\)=\d+\) ran for \d+ milliseconds before timing out\.$"),
    re.compile(r"^\[rank\d+\]:\[W\d{4} \d\d:\d\d:\d\d\.\d+ TCPStore\.cpp:\d+\] \[c10d\] recvValue failed on "
               r"SocketImpl\(fd=\d+, addr=\[\S+\]:\d+, remote=\[\S+\]:\d+\): Failed to recv, got 0 bytes\. Connection "
               r"was likely closed\. Did the remote server shutdown or crash\?$"),
    re.compile(r"^\[rank\d+\]:\[W\d{4} \d\d:\d\d:\d\d\.\d+ TCPStore\.cpp:\d+\] \[c10d\] sendBytes failed on "
               r"SocketImpl\(fd=\d+, addr=\[\S+\]:\d+, remote=\[\S+\]:\d+\): Broken pipe$"),
    re.compile(r"^\[rank\d+\]:\[W\d{4} \d\d:\d\d:\d\d\.\d+ ProcessGroupNCCL\.cpp:\d+\] \[PG ID \d+ PG GUID \d+ Rank "
               r"\d+\] Failed to check the \"should dump\" flag on TCPStore, \(maybe TCPStore server has shut down too "
               r"early\), with error: .+$"),
]
NCCL = [  # the NCCL library at NCCL_DEBUG=INFO (NVIDIA/nccl src/debug.cc `%s:%d:%d ` + `[%d] NCCL INFO %s`)
    re.compile(r"^[\w.-]+:\d+:\d+ \[\d+\] NCCL INFO (?:NCCL version \d+\.\d+\.\d+\S*\+cuda[\d.]+"  # src/init.cc
               r"|NET/IB : Using(?: \[\d+\]\w+:\d+/(?:RoCE|IB))+ (?:\[RO\])?; OOB \S+:\S+"  # transport/net_ib
               r"|NET/Socket : Using(?: \[\d+\]\S+:\S+)+"  # transport/net_socket.cc
               r"|Using network (?:IB|Socket))$"),  # src/init.cc
]
#: Lines only the card's fork prints (``0.1.dev20051+g487ecf187``, the emulator's fork dialect): vLLM 0.33.0 has
#: no such log call, so they are not in FORMATS and the 0.33 checker rejects them. Source: the card README's
#: "Expected boot gates" 1 and 2 (README@00d42fa, summed up in /work/shared/docs/card-stack.md), and its
#: Dockerfile's check that the ``DFLASH2-DRAFTER-GROUP`` marker is in ``vllm/v1/core/kv_cache_utils.py``. The
#: README quotes the messages without the ``[file:line]`` prefix, so the line numbers below are the emulator's
#: placeholders: nothing in sparkserve reads them (``observe/logpatterns.py`` matches the message only).
FORK_FORMATS: list[Fmt] = [
    Fmt('kv_layout', 'v1/attention/backends/utils.py', 345, 'INFO',
        'Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend.', verify="card"),
    Fmt('drafter_group', 'v1/core/kv_cache_utils.py', 1286, 'INFO',
        'DFLASH2-DRAFTER-GROUP: GLM-5-Next fast path engaged with a spec-decode drafter group (drafter_layers=%d, '
        'mamba_groups=4, tail_group=True)', verify="card"),
]

PREFIX = re.compile(
    r"^(?P<pfx>.*?)\((?P<proc>[A-Za-z_]\w*) pid=(?P<pid>\d+)\) (?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) \[(?P<file>[^\]:]+):(?P<line>\d+)\] (?P<msg>.*)$")
PROCESS = re.compile(r"^(?:APIServer|EngineCore|MainProcess|Worker(?:_PP\d+)?(?:_TP\d+)?(?:_EP\d+)?)$")
RAY_PREFIX = re.compile(r"^\(RayWorkerProc pid=\d+(?:, ip=[\d.]+)?\) ")
TB_FILE = re.compile(r'^  File "[^"]+", line \d+, in [\w<>]+$')
TB_CODE = re.compile(r"^    \S.*$")
TB_CARET = re.compile(r"^ +[~^]+$")  # Python 3.11+ marks the failing expression under a frame's code line (real 0.33 run)


def fmt_regex(f: Fmt) -> re.Pattern[str]:
    if f.regex:
        return re.compile(f.fmt, re.S)
    out = []
    for part in re.split(r"(%%|%0?\d*(?:\.\d+)?[sdfr]|\{\})", f.fmt):
        if part == "%%":
            out.append("%")
        elif part == "{}" or part in ("%s", "%r"):
            out.append("(.*?)")
        elif re.fullmatch(r"%0?\d*d", part):
            out.append(r"(-?\d+)")
        elif m := re.fullmatch(r"%\.(\d+)f", part):
            out.append(r"(-?\d+)" if m.group(1) == "0" else rf"(-?\d+\.\d{{{m.group(1)}}}|nan)")
        elif part == "%f":
            out.append(r"(-?\d+\.\d{6})")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out) + ("(?:\n.*)?" if f.exc else ""), re.S)


_COMPILED = [(f, fmt_regex(f)) for f in FORMATS]
_EXC = [re.compile(rf"^{rx}$") for rx, _ in EXCEPTIONS]


def traceback_ok(lines: list[str]) -> bool:
    """A Python traceback as printed: header, File/code pairs, and a known exception line."""
    if not lines or lines[0] != "Traceback (most recent call last):":
        return False
    body, last = [ln for ln in lines[1:-1] if not TB_CARET.match(ln)], lines[-1]
    for i, ln in enumerate(body):
        if not (TB_FILE.match(ln) if i % 2 == 0 else TB_CODE.match(ln)):
            return False
    return any(rx.match(last) for rx in _EXC)


def match_record(proc: str, level: str, where: str, msg: str) -> Fmt | None:
    """The format a vLLM record came from (None: no 0.33 format produces it)."""
    if not PROCESS.match(proc):
        return None
    for f, rx in _COMPILED:
        if f.where != where or f.level != level:
            continue
        m = rx.fullmatch(msg)
        if not m:
            continue
        if f.exc:
            head, _, tb = msg.partition("\n")
            if not traceback_ok(tb.split("\n")):
                continue
        return f
    return None


@dataclass
class Record:
    stream: str  # stdout | stderr
    text: str  # the record as written (continuations joined with \n)
    kind: str = ""  # vllm | uvicorn | tqdm | torch | traceback | blank
    fmt: Fmt | None = None
    proc: str = ""
    pid: int = 0
    extra: dict = field(default_factory=dict)


def records(text: str, stream: str) -> Iterator[Record]:
    """Split a stream into records: vLLM records (``\r\n`` continuations joined), tracebacks, single lines."""
    raw = text.split("\n")
    if raw and raw[-1] == "":
        raw.pop()
    i = 0
    while i < len(raw):
        group = [raw[i]]
        while group[-1].endswith("\r") and i + 1 < len(raw):
            i += 1
            group.append(raw[i])
        first = group[0].rstrip("\r")
        m = PREFIX.match(first)
        if m and not first.startswith("\r"):
            head = first[: m.start("msg")]
            msgs = [m.group("msg")]
            for g in group[1:]:
                g = g.rstrip("\r")
                msgs.append(g[len(head):] if g.startswith(head) else "\x00" + g)
            yield Record(stream, "\n".join(msgs), "vllm", proc=m.group("proc"), pid=int(m.group("pid")),
                         extra={"lvl": m.group("lvl"), "where": f"{m.group('file')}:{m.group('line')}"})
        elif first == "Traceback (most recent call last):":
            block = [first]
            while i + 1 < len(raw) and raw[i + 1].startswith("  "):
                i += 1
                block.append(raw[i])
            if i + 1 < len(raw):
                i += 1
                block.append(raw[i])
            yield Record(stream, "\n".join(block), "traceback")
        else:
            yield Record(stream, "\n".join(group), "line")
        i += 1


def classify(rec: Record, prev: Record | None) -> bool:
    """Fill in the record's kind/format; False when no known format produces it."""
    if rec.kind == "vllm":
        if any(p.startswith("\x00") for p in rec.text.split("\n")):
            return False
        rec.fmt = match_record(rec.proc, rec.extra["lvl"], rec.extra["where"], rec.text)
        return rec.fmt is not None
    if rec.kind == "traceback":
        return traceback_ok(rec.text.split("\n"))
    ln = rec.text
    if UVICORN.match(ln):
        rec.kind = "uvicorn"
        return True
    if any(rx.match(ln) for rx in TORCH):
        rec.kind = "torch"
        return True
    if any(rx.match(ln) for rx in NCCL):
        rec.kind = "nccl"
        return True
    segs = [RAY_PREFIX.sub("", s) for s in ln.split("\r") if s]
    if segs and all(TQDM.match(s) for s in segs):
        rec.kind = "tqdm"
        return True
    if RAY_PREFIX.sub("", ln) == "" and prev is not None and prev.kind == "tqdm":  # tqdm's newline after bars
        rec.kind = "blank"
        return True
    return False


def check(stdout: str, stderr: str = "") -> tuple[list[Record], list[str]]:
    """All records of both streams, and the lines no known format produces."""
    out: list[Record] = []
    bad: list[str] = []
    for stream, text in (("stdout", stdout), ("stderr", stderr)):
        prev = None
        for rec in records(text, stream):
            if not classify(rec, prev):
                bad.append(f"{stream}: {rec.text[:300]!r}")
            out.append(rec)
            prev = rec
    return out, bad


def unmatched_lines(stdout: str, stderr: str = "") -> list[str]:
    return check(stdout, stderr)[1]
