"""The pattern table's fault rows and the message rules the fault reader applies.

Start-up faults (the engine core, out of memory, KV planning, attention selection), process faults (timeouts,
worker and Ray deaths, the rendezvous store, the kernel), tracebacks, and the regexes that decide what a fault line
means: a relay, a boot that failed, a request that failed (never an engine fault), a peer lost. NCCL's rows are in
:mod:`sparkserve.observe.patterns_nccl`; the table is assembled in :mod:`sparkserve.observe.logpatterns` (order
matters within the fault rows: the first matching row of a line wins).
"""

from __future__ import annotations

import re

from sparkserve.observe.logrows import FaultKind, Kind, LogPattern, row

STARTUP_FAULTS: tuple[LogPattern, ...] = (
    row(Kind.FAULT, ("Engine core proc",),
       r"Engine core proc \S+ died unexpectedly",
       "0.10–0.11 `Engine core proc %s died unexpectedly, shutting down client.`", FaultKind.ENGINE_DEAD, fatal=True),
    row(Kind.FAULT, ("EngineCore failed to start", "EngineCore encountered a fatal error",
                    "Engine core initialization failed"),
       r"EngineCore failed to start|EngineCore encountered a fatal error|Engine core initialization failed",
       "EngineCore `EngineCore failed to start.` / `EngineCore encountered a fatal error.` (logger.exception → "
       "traceback follows); API server `RuntimeError: Engine core initialization failed. See root cause above. …`",
       FaultKind.ENGINE_DEAD, fatal=True),
    row(Kind.FAULT, ("EngineDeadError", "engine core exited unexpectedly"),
       r"EngineDeadError|engine core exited unexpectedly",
       "`[shutdown] MPClient: engine core exited unexpectedly; starting cleanup`, `EngineDeadError` (relayed: the "
       "cause is logged elsewhere, which ends the boot itself)", FaultKind.ENGINE_DEAD),
    row(Kind.FAULT, ("CUDA out of memory", "NV_ERR_NO_MEMORY", "CUDA driver error: out of memory"),
       r"CUDA out of memory|NV_ERR_NO_MEMORY|CUDA driver error: out of memory",
       "PyTorch `torch.OutOfMemoryError: CUDA out of memory. …`, `RuntimeError: CUDA driver error: out of memory`; "
       "kernel `NVRM: … NV_ERR_NO_MEMORY` (Spark UMA)",
       FaultKind.OOM, fatal=True),
    row(Kind.FAULT, ("OutOfMemoryError", "not enough GPU memory"),
       r"OutOfMemoryError|Failed to load model - not enough GPU memory",
       "a bare `OutOfMemoryError`; V1 `Failed to load model - not enough GPU memory …`",
       FaultKind.OOM),
    row(Kind.FAULT, ("No available memory for the cache blocks", "larger than the available KV cache memory",
                    "can be stored in KV cache"),
       r"No available memory for the cache blocks|larger than the available KV cache memory"
       r"|is larger than the maximum number of tokens that can be stored in KV cache",
       "KV planning ValueErrors — the pool is too small for max_model_len, a sizing error and not an "
       "out-of-memory (real 0.25.1: `ValueError: To serve at least one request with the model's max seq len "
       "(8192), (0.01 GiB KV cache is needed, which is larger than the available KV cache memory (…`; V1 `No "
       "available memory for the cache blocks. …`; V0 `The model's max seq len (%d) is larger than the maximum "
       "number of tokens that can be stored in KV cache (%d). …`)",
       FaultKind.OTHER),
    row(Kind.FAULT,
        ("Error: No valid attention backend", "Error: Selected backend", "Error: Invalid attention backend"),
        r"No valid attention backend found|Selected backend \S+ is not valid for this configuration"
        r"|Invalid attention backend",
        "attention selection at model construction (issue 32, kind 1): `ValueError: No valid attention backend found "
        "for %s with %s. Reasons: …` (0.13+ selector), `Selected backend %s is not valid for this configuration. "
        "Reason: …`, older `Invalid attention backend for %s` — the boot ends (needles: the exception line)",
        FaultKind.OTHER),
)

PROCESS_FAULTS: tuple[LogPattern, ...] = (
    row(Kind.FAULT, ("RPC call to",),
       r"RPC call to \S+ timed out",
       "mp executor `TimeoutError: RPC call to %s timed out.`", FaultKind.TIMEOUT, fatal=True),
    row(Kind.FAULT, ("Timed out waiting for engine core", "No available shared memory broadcast block"),
       r"Timed out waiting for engine core processes to start|No available shared memory broadcast block found",
       "API server `TimeoutError: Timed out waiting for engine core processes to start …`; shm ring buffer stall "
       "`No available shared memory broadcast block found in %d seconds …` — logged at INFO, yet the only sign of a "
       "dead follower", FaultKind.TIMEOUT),
    row(Kind.FAULT, ("Worker proc", "RayWorkerProc rank=", "WorkerProc failed", "died, exit code"),
       r"Worker proc \S+ died unexpectedly|RayWorkerProc rank=\d+ died unexpectedly|WorkerProc failed"
       r"|Worker \S+ pid \d+ died, exit code",
       "mp executor `Worker proc %s died unexpectedly[ (exit code: %s)], shutting down executor.` (exit -9 = "
       "OOM killer), worker `WorkerProc failed to start.`/`failed.`, Ray `RayWorkerProc rank=%s died unexpectedly "
       "…`, `RayWorkerProc failed: %s`; V0 multiproc_worker_utils `Worker %s pid %s died, exit code: %s` (the "
       "parent reports the death; the worker logs its cause)", FaultKind.WORKER_DIED, fatal=True),
    row(Kind.FAULT, ("Failed: Cuda error",),
       r"Failed: Cuda error \S+:\d+",
       "custom all-reduce's CUDACHECK (csrc/custom_all_reduce.cuh): `Failed: Cuda error %s:%d '%s'` printed to stdout "
       "with no prefix, then exit(EXIT_FAILURE) — each rank that hits it dies (vllm#50557: several ranks during "
       "capture, then `Worker proc … died unexpectedly`)", FaultKind.OTHER, fatal=True),
    row(Kind.FAULT, ("A worker died or was killed", "its worker process has died"),
       r"A worker died or was killed while executing a task|The actor is dead because its worker process has died",
       "Ray: `(raylet) A worker died or was killed while executing a task by an unexpected system error. …` and the "
       "EngineCore's `The actor is dead because its worker process has died. …` — the root cause of the EngineCore "
       "exception that follows", FaultKind.WORKER_DIED, fatal=True),
    row(Kind.FAULT, ("has been marked dead", "Failed to register worker"),
       r"has been marked dead because the detector has missed too many heartbeats"
       r"|Failed to register worker \S+ to Raylet",
       "Ray: `(raylet) The node with node id: … has been marked dead because the detector has missed too many "
       "heartbeats from it.`; core_worker `Failed to register worker %s to Raylet. IOError: …`",
       FaultKind.WORKER_DIED),
    row(Kind.FAULT, ("WorkerProc hit an exception", "WorkerProc was terminated", "Worker failed with error"),
       r"WorkerProc hit an exception|WorkerProc was terminated|Worker failed with error",
       "worker `WorkerProc hit an exception.`/`was terminated`, `RuntimeError: Worker failed with error '%s', please "
       "check the stack trace above for the root cause`", FaultKind.WORKER_DIED),
    row(Kind.FAULT, ("TCPStore", "[c10d]"),
       r"TCPStore.*[Ff]ailed|[Ff]ailed.*TCPStore|^\[c10d\] .*failed",
       "PyTorch c10d `[rankN]:[W… TCPStore.cpp:…] [c10d] recvValue failed …` (+ `Exception raised from …` C++ "
       "stack): the rendezvous store (head) went away. A shutdown artefact when the head was stopped on purpose.",
       FaultKind.OTHER),
    row(Kind.FAULT, ("Xid",),
       r"NVRM: Xid\b",
       "kernel `NVRM: Xid (PCI:…): N, …` when dmesg is appended to a log", FaultKind.OTHER),
    row(Kind.TRACEBACK_START, ("Traceback (most recent call last)",),
       r"^Traceback \(most recent call last\):",
       "Python traceback; the fault reported is its root-cause line (the last `XxxError: …` line)"),
    row(Kind.BARE_EXCEPTION, ("Error: ", "Exception: ", "Error): "),
       r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\w*(?:\([\w.]+\))?: \S",
       "an exception line with no log level (stderr, 0.10–0.30 with only the `(name pid=N)` prefix, or none) "
       "outside any traceback in view: the root cause when frames of a traceback whose `Traceback …` line is out "
       "of view precede it, or when a relayed error (`EngineDeadError … See stack trace (above)`) follows it"),
    # --- where a process was: traceback frames (read for start-up vs serving, and for a cut traceback) -------
    row(Kind.FRAME, ('File "', "engine_core.run_busy_loop()", "engine_core = EngineCoreProc("),
        r'^\s*File "(?P<path>[^"]+)", line (?P<lineno>\d+), in (?P<func>\S+)\s*$'
        r"|^\s*(?P<code>engine_core(?:\.run_busy_loop\(\)| = EngineCoreProc\())",
        "a Python traceback frame line, logger-prefixed (logger.exception) or raw stderr, and the two code lines of "
        "V1 `run_engine_core` that say which way it went (`engine_core = EngineCoreProc(…)`: start-up; "
        "`engine_core.run_busy_loop()`: serving); :func:`frame_phase` says which (issue 32, kinds 1, 4 and 6)"),
)

#: An exception line inside a traceback: ``ValueError: …``, ``torch.OutOfMemoryError: …``, ``KeyboardInterrupt``.
#: Also a module-qualified class whose name says nothing of errors (``torch._dynamo.exc.BackendCompilerFailed: …``),
#: and Ray's wrapper naming the cause it carries (``ray.exceptions.RayTaskError(ValueError): ray::…``).
EXCEPTION_LINE = re.compile(
    r"^(?P<exc>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Interrupt|Exit)\w*(?:\((?:[\w.]+)\))?"
    r"|(?:[a-z_]\w*\.)+[A-Z]\w*(?=:))(?::\s*(?P<msg>.*))?$"
)
#: Root-cause pointers: the real cause was logged earlier (another process or an earlier traceback).
POINTER = re.compile(
    r"[Ss]ee (?:the )?root cause above|[Ss]ee stack trace|check the stack trace above|[Ss]ee the stack trace above"
)
#: ``ERROR`` lines of a request the API server answered with an error, the server going on (issue 32, kind 2): a
#: client's wrong model name, a prompt over the context length (serving_chat/serving_completion's
#: ``ValueError: This model's maximum context length is %d tokens. However, you requested …``, with or without its
#: traceback), a 400 Bad Request, a stream cut by a dead engine (whose cause is logged on its own) — vLLM's serving_*
#: ``logger.exception`` messages. Counted and shown (``request_errors``), never an engine fault.
REQUEST_ERROR = re.compile(
    r"^(?:Error in (?:chat )?completion stream generator|Error in preprocessing prompt inputs"
    r"|Error with model .*|The model `[^`]*` does not exist"
    r"|(?:[\w.]*Error: )?This model's maximum context length is \d+ tokens"
    r"|(?:[\w.]*Error: )?.*\b400\b.*\bBad Request\b)"
)
#: ``ERROR`` lines that are not engine faults: a request that failed (:data:`REQUEST_ERROR`), and fallbacks vLLM logs
#: at ERROR and then goes on: `Cannot use FA version %d is not supported due to %s` (vllm/attention/utils/
#: fa_utils.py get_flash_attn_version: logger.error, then an assert caught by `except (ImportError, AssertionError):
#: return None` — another attention backend is used).
NOT_FAULTS = re.compile(REQUEST_ERROR.pattern + r"|^Cannot use FA version \d+ is not supported due to ")
#: A fault line (or the header folded into it) that says the boot itself failed: ``ready`` is false.
BOOT_FAILED = re.compile(
    r"EngineCore failed to start|Engine core initialization failed|WorkerProc failed to start"
    r"|on startup is less than desired GPU memory utilization|To serve at least one request"
    r"|larger than the available KV cache memory|can be stored in KV cache|No available memory for the cache blocks"
    r"|Failed to load model - not enough GPU memory|Timed out waiting for engine core processes to start"
    r"|No valid attention backend found|is not valid for this configuration|Invalid attention backend"
)
#: A fault line that relays a failure logged elsewhere (another process, an earlier traceback) or only reports the
#: death of a process whose cause is printed by that process: never faults[0] while a cause is in view.
RELAYED = re.compile(
    r"EngineDeadError|engine core exited unexpectedly|Engine core proc \S+ died unexpectedly"
    r"|Worker proc \S+ died unexpectedly|RayWorkerProc rank=\d+ died unexpectedly|failed \(engine dead\)"
    r"|Worker \S+ pid \d+ died, exit code"
    r"|AsyncLLM output_handler failed|MQLLMEngine is already dead|Worker failed with error"
    r"|^(?:EngineCore failed to start|EngineCore encountered a fatal error|WorkerProc failed to start"
    r"|WorkerProc hit an exception|WorkerProc failed)\.?$"
)
#: Python's own headers before a traceback: multiprocessing's `Process <name>:` (BaseProcess._bootstrap prints it
#: to stderr when the process dies of an uncaught exception) and threading's `Exception in thread <name>:` (the
#: default excepthook: a background thread died; the process goes on).
PROCESS_HEADER = re.compile(r"^Process (?P<name>[\w.-]+):$")
THREAD_HEADER = re.compile(r"^Exception in thread (?P<name>.+?):$")
#: A fault line that says the engine died while it was serving (requests were in flight): it had come up.
DIED_SERVING = re.compile(
    r"AsyncLLM output_handler failed|EngineDeadError|Engine iteration timed out|failed \(engine dead\)"
)
#: A line where a rank reports that it lost its peer (the rendezvous store or a socket to another rank went away):
#: a consequence of a failure elsewhere, never the cause, whatever its time stamp (issue 26, A6). PyTorch c10d
#: (`[rank1]:[W… TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(…): Failed to recv, got 0 bytes.
#: Connection was likely closed. Did the remote server shutdown or crash?`, `sendBytes failed`, ProcessGroupNCCL's
#: `Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early)`), Gloo
#: `Connection closed by peer`, a reset connection to the master, NCCL's socket `Connection closed by remote peer`.
PEER_LOST = re.compile(
    r"recvValue failed|sendBytes failed|Did the remote server shutdown or crash\?"
    r"|TCPStore server has shut down|Connection closed by (?:remote )?peer|Connection reset by peer"
)

#: Exceptions that mean a deliberate stop, not a fault.
STOP_EXCEPTIONS = frozenset({"KeyboardInterrupt", "SystemExit"})

#: Traceback frames that run only while a boot is under way (vLLM V1 engine core and workers, 0.8–0.33): the
#: EngineCore constructor and the executor/worker set-up it calls, model construction and weight loading, attention
#: selection, KV sizing and CUDA graph capture. A fault under such a frame, with no sign of readiness, is a failed boot.
STARTUP_FRAME = re.compile(
    r'/engine/core\.py", line \d+, in __init__$|/model_executor/models/[^"]+", line \d+, in (?:__init__|<lambda>)$'
    r'|/model_loader/|, in (?:load_model|load_weights|process_weights_after_loading|initialize_model'
    r'|_initialize_kv_caches|initialize_kv_cache|initialize_from_config|determine_available_memory|profile_run'
    r'|capture_model|compile_or_warm_up_model|init_device|_init_executor|init_worker_distributed_environment'
    r'|init_distributed_environment|ensure_model_parallel_initialized|get_attn_backend|_cached_get_attn_backend'
    r'|gptq_marlin_repack|wait_for_engine_startup)$|engine_core = EngineCoreProc\('
)
#: Traceback frames that run only while an engine serves: the engine core's busy loop and step, the API server's
#: output handler (issue 32, kind 6: a death under them came after a healthy start).
SERVING_FRAME = re.compile(
    r", in (?:run_busy_loop|_process_engine_step|step_with_batch_queue|output_handler|run_engine_loop|engine_step)$"
    r"|engine_core\.run_busy_loop\(\)"
)


def frame_phase(frame: str) -> str | None:
    """``startup`` / ``serving`` for a traceback frame line (its message), or None when the frame says neither."""
    frame = frame.rstrip()
    if SERVING_FRAME.search(frame):
        return "serving"
    return "startup" if STARTUP_FRAME.search(frame) else None
