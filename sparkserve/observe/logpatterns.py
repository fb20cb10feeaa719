"""The one table of vLLM log patterns: message regexes keyed by event kind, with their version notes.

Every pattern matches the *message* part of a line (after the ``(name pid=N) LEVEL MM-DD HH:MM:SS
[file:line]`` prefix has been taken off by :mod:`sparkserve.observe.logline`), never a ``[file:line]`` — those
move every release. Each pattern also names literal *needles*: a line that contains none of them is
never tried against the regex, which is what keeps ``logs analyze`` fast on big logs.

Two readers besides the log reader take their lines from here, so a new vLLM wording is added once:
:data:`FATAL` (the rows marked ``fatal``: lines that end a boot for sure, the fast path of
:mod:`sparkserve.deploy.wait`) and :func:`milestone_of` (the rows marked with a :class:`Milestone`: how far a
boot got, which the unified-memory watchdog's phases follow).

Sources: vllm-facts.md (format strings read from the vLLM 0.10.1.1 … 0.33.0 wheels), the real vLLM
0.25.1 logs in the test fixtures, and for V0 the executor's ``# GPU blocks`` line. Third-party lines
(uvicorn, tqdm, NCCL, PyTorch c10) are labelled as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """Event kinds the log reader emits."""

    VERSION = "version"
    ENGINE_CONFIG = "engine_config"
    NON_DEFAULT_ARGS = "non_default_args"
    API_SERVER = "api_server"
    RANK_IDENTITY = "rank_identity"
    RANK_PRESENCE = "rank_presence"
    KV_TOKENS = "kv_tokens"
    GPU_BLOCKS = "gpu_blocks"
    KV_MEMORY = "kv_memory"
    GRAPH_CAPTURED = "graph_captured"
    CAPTURE_BAR = "capture_bar"
    SPECULATOR_CAPTURE = "speculator_capture"
    EAGER = "eager"
    DRAFT_EAGER = "draft_eager"
    CUDAGRAPH_DOWNGRADE = "cudagraph_downgrade"
    CUDAGRAPH_PROFILE = "cudagraph_profile"
    MASK_LOADED = "mask_loaded"
    RUNNER_V2 = "runner_v2"
    RUNNER_V1 = "runner_v1"
    SIGNATURE = "signature"
    RUNNER_V1_FALLBACK = "runner_v1_fallback"
    READY = "ready"
    SPEC_METRICS = "spec_metrics"
    SERVED = "served"
    STOP = "stop"
    FAULT = "fault"
    TRACEBACK_START = "traceback_start"
    BARE_EXCEPTION = "bare_exception"
    NCCL_TRANSPORT = "nccl_transport"
    NCCL_VERSION = "nccl_version"
    NCCL_NOTE = "nccl_note"


class FaultKind(StrEnum):
    """What a fault line says went wrong (the ``kind`` of a ``logs analyze --json`` fault)."""

    ENGINE_DEAD = "engine_dead"
    WORKER_DIED = "worker_died"
    NCCL = "nccl"
    OOM = "oom"
    TIMEOUT = "timeout"
    TRACEBACK = "traceback"
    OTHER = "other"


class Milestone(StrEnum):
    """How far a boot got, in boot order: the line that proves each step (the watchdog's phases follow them)."""

    LOADING = "loading"  # a worker started loading weights
    LOADED = "loaded"  # a worker finished loading (`Model loading took …`)
    CAPTURE = "capture"  # CUDA graph capture ran (or was skipped for eager mode)
    KV_SIZED = "kv_sized"  # the KV pool is sized
    READY = "ready"  # the API server serves


@dataclass(frozen=True)
class LogPattern:
    """One row of the table: the lines of one event kind, how to find them fast, and where they come from."""

    kind: Kind
    needles: tuple[str, ...]
    regex: re.Pattern[str]
    notes: str
    fault: FaultKind | None = None
    fatal: bool = False  # the boot watcher stops at once on this line; other faults are left to the full reader
    milestone: Milestone | None = None


def _p(
    kind: Kind,
    needles: tuple[str, ...],
    regex: str,
    notes: str,
    fault: FaultKind | None = None,
    *,
    fatal: bool = False,
    milestone: Milestone | None = None,
) -> LogPattern:
    return LogPattern(kind, needles, re.compile(regex), notes, fault, fatal, milestone)


#: NCCL's async-event WARN lines that are information, not failure. NVIDIA/nccl's IB async thread: 2.18–2.22 `NET/IB :
#: [%s:%d ]Got async event : %s` for every event (ibv_event_type_str: the non-fatal ones below); 2.23–2.27 `%s:%d Got
#: async error event: %s` (its own "non-fatal" branch) and `%s:%d unknown event type (%d)` for GID change (18) and
#: speed change (20); 2.28+ `%s:%d GID table changed` and `%s:%d Got non-fatal async event: %s(%d)`. Fatal events
#: (`async fatal event`, a catastrophic error, CQ/QP/SRQ errors) stay faults.
NCCL_INFORMATIONAL = (
    r"(?:\S+:\d+ )?Got async event : (?:GID table change|port active|port error|LID change|P_Key change|SM change"
    r"|client reregistration|path migrated|send queue drained|last WQE reached|SRQ limit reached)"
    r"|\S+:\d+ Got async error event: |\S+:\d+ Got non-fatal async event: |\S+:\d+ GID table changed"
    r"|\S+:\d+ unknown event type \((?:18|20)\)"
)

# Order matters only within a kind family: the first matching pattern of a line wins for faults
# (an `Engine core proc … died unexpectedly` is engine_dead, not worker_died).
PATTERNS: tuple[LogPattern, ...] = (
    # --- version and configuration -------------------------------------------------------------
    _p(Kind.VERSION, ("LLM engine (v", "Launching vLLM (v", "vLLM server version", "vLLM API server version"),
       r"LLM engine \(v(?P<version>[^)\s]+)\)|Launching vLLM \(v(?P<v2>[^)\s]+)\) headless"
       r"|vLLM (?:API )?server version (?P<v3>[^\s,]+)",
       "engine config line (all V1), follower `Launching vLLM (v%s) headless …` (0.12+), "
       "`vLLM API server version %s` (0.10–0.14) / `vLLM server version %s, serving model` (0.20+)"),
    _p(Kind.ENGINE_CONFIG, ("LLM engine (v",),
       r"Initializing an? (?:V[01] )?LLM engine \(v[^)]*\) with config: (?P<config>.*)",
       "EngineCore `Initializing a V1 LLM engine (v%s) with config: %s` (V1, all versions); V0 said "
       "`Initializing a V0 LLM engine` / `Initializing an LLM engine`. Holds speculative_config=SpeculativeConfig("
       "method=…, num_spec_tokens=k), enforce_eager=, tensor_parallel_size=, compilation_config (0.10–0.11 JSON "
       "with `\"cudagraph_mode\":[2,1]`; 0.12+ dict repr with `<CUDAGraphMode.X: (2, 1)>`)."),
    _p(Kind.NON_DEFAULT_ARGS, ("non-default args:",),
       r"non-default args: (?P<args>\{.*)",
       "API server (0.10+): dict keyed by argparse dest; the follower does not print it"),
    _p(Kind.API_SERVER, ("Starting vLLM server on", "Starting vLLM API server", "vLLM API server version",
                         "vLLM server version"),
       r"Starting vLLM (?:API )?server|vLLM (?:API )?server version",
       "`Starting vLLM server on %s` (0.20+), `Starting vLLM API server %d on %s` (0.10–0.14): an API server "
       "exists in this log, so its readiness line is expected"),
    # --- ranks --------------------------------------------------------------------------------------
    _p(Kind.RANK_IDENTITY, ("world_size=", "in world size"),
       r"world_size=(?P<world>\d+) rank=(?P<rank>\d+) local_rank=(?P<local>\d+)"
       r"|rank (?P<rank2>\d+) in world size (?P<world2>\d+) is assigned as DP rank (?P<dp>\d+), "
       r"PP rank (?P<pp>\d+), (?:PCP rank \d+, )?TP rank (?P<tp>\d+)",
       "every worker: `world_size=%d rank=%d local_rank=%d …` and `rank %s in world size %s is assigned as "
       "DP rank %s, PP rank %s, [PCP rank %s, ]TP rank %s, …` — in 0.18+ printed under the rank-less "
       "`(Worker pid=N)` name, so the pid is mapped to the rank here"),
    _p(Kind.RANK_PRESENCE, ("Model loading took",),
       r"Model loading took (?P<gib>[\d.]+) GiB (?:memory )?and (?P<secs>[\d.]+) seconds",
       "per-worker: proves a rank exists and finished loading (`Model loading took %.4f GiB and` 0.10–0.11, "
       "`%s GiB and` V2 0.14–0.26, `%s GiB memory and` 0.30+)", milestone=Milestone.LOADED),
    _p(Kind.RANK_PRESENCE, ("Loading weights took", "Loading model from scratch", "Starting to load model"),
       r"Loading weights took|Loading model from scratch|Starting to load model",
       "per-worker loading lines: prove a rank exists and started loading", milestone=Milestone.LOADING),
    # --- KV cache -----------------------------------------------------------------------------------
    _p(Kind.KV_TOKENS, ("KV cache size:",),
       r"(?P<device>\w+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens",
       "EngineCore, once per engine: `%s KV cache size: %s tokens, Maximum concurrency for …` (one line since "
       "0.30); 0.10–0.26 printed `GPU KV cache size: %s tokens` and `Maximum concurrency …` as two lines. "
       "Thousands separators.", milestone=Milestone.KV_SIZED),
    _p(Kind.GPU_BLOCKS, (" blocks: ",),
       r"^# (?P<device>\w+) blocks: (?P<gpu>\d+), # CPU blocks: (?P<cpu>\d+)",
       "V0 executor: `# GPU blocks: %d, # CPU blocks: %d` (later `# %s blocks:` with the device name). "
       "Blocks, not tokens: never reported as kv_cache_tokens."),
    _p(Kind.KV_MEMORY, ("Available KV cache memory:", "memory for KV Cache as specified"),
       r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB"
       r"|reserved (?P<reserved>[\d.]+) GiB memory for KV Cache as specified",
       "worker: `Available KV cache memory: %s GiB` (not printed with --kv-cache-memory-bytes, which prints "
       "`Initial free memory …, reserved %s GiB memory for KV Cache as specified by kv_cache_memory_bytes …`)",
       milestone=Milestone.KV_SIZED),
    # --- CUDA graphs --------------------------------------------------------------------------------
    _p(Kind.GRAPH_CAPTURED, ("Graph capturing finished in",),
       r"Graph capturing finished in (?P<secs>\d+) secs(?:, took (?P<gib>-?[\d.]+) GiB)?",
       "every worker in V2 and 0.10–0.11 (`info`), first local rank in V1 0.12+ (`info_once`); V2 prints it "
       "twice with memory profiling, once with --kv-cache-memory-bytes, never when eager. Old V0: no `took`.",
       milestone=Milestone.CAPTURE),
    _p(Kind.CAPTURE_BAR, ("Capturing ",),
       r"Capturing (?:(?P<which>[\w-]+) )?CUDA graphs?(?: shapes| \((?P<mode>[^)]*)\)|(?=:\s*\d+%))"
       r"(?::\s*(?P<pct>\d+)%)?",
       "tqdm (stderr, global rank 0 only, unprefixed in 0.31+): V2 `Capturing CUDA graphs (PIECEWISE)`/`(FULL)`, "
       "`Capturing dflash2 CUDA graphs (FULL)`; V1 `(mixed prefill-decode, PIECEWISE)`/`(decode, FULL)`; V0 "
       "`Capturing CUDA graph shapes`, 0.8–0.9 `Capturing CUDA graphs: N%`. Per-rank capture is judged from "
       "`Graph capturing finished`; a log whose last bar reaches 100% captured (the finished line may be out of "
       "view)."),
    _p(Kind.GRAPH_CAPTURED, ("cuda graph addresses",),
       r"Registering (?P<addresses>\d+) cuda graph addresses",
       "custom all-reduce, every TP>1 worker right after its capture (0.9+, seen 0.9–0.25): `Registering %d cuda "
       "graph addresses` — the rank captured (phase-neutral: the watchdog's CAPTURE phase starts earlier)"),
    _p(Kind.SPECULATOR_CAPTURE, ("Capturing model for",),
       r"Capturing model for (?:(?P<which>\w+) )?speculator",
       "V2: `Capturing model for speculator...` (EAGLE/MTP), `Capturing model for %s speculator...` (DFlash, DFlash2)",
       milestone=Milestone.CAPTURE),
    _p(Kind.EAGER, ("Cudagraph is disabled under eager mode",),
       r"Cudagraph is disabled under eager mode",
       "--enforce-eager, info_once in the config-building process", milestone=Milestone.CAPTURE),
    # phase-neutral: the watchdog's CAPTURE phase follows only the eager line above
    _p(Kind.EAGER, ("Enforce eager set", "Skipping CUDA graph capture",
                    "Skipping encoder and decoder CUDA graph capture", "fallback to the eager mode"),
       r"Enforce eager set, disabling|Skipping CUDA graph capture"
       r"|Skipping encoder and decoder CUDA graph capture|fallback to the eager mode",
       "`Enforce eager set, disabling torch.compile and CUDAGraphs` (seen in 0.25.1), V1 `Skipping CUDA graph "
       "capture …`, V2 `Skipping encoder and decoder CUDA graph capture …`, V0 CPU `… fallback to the eager mode.`"),
    _p(Kind.DRAFT_EAGER, ("running the draft eagerly", "draft pass eagerly"),
       r"does not support full CUDA graphs; running the draft eagerly|runs the draft pass eagerly",
       "`%s draft attention (%s) does not support full CUDA graphs; running the draft eagerly.` (0.33 warning); "
       "a forked DFlash V2 speculator says `… runs the draft pass eagerly (CUDA graphs for the draft are not "
       "implemented yet)`"),
    _p(Kind.CUDAGRAPH_DOWNGRADE, ("setting cudagraph_mode=", "Cudagraph mode "),
       r"CUDAGraphMode\.(?P<src>\w+) is not supported with .*?; setting cudagraph_mode=(?P<dst>[A-Z_]+)"
       r"|Cudagraph mode (?P<src2>\S+) requires piecewise capture, .*Overriding to (?P<dst2>[A-Z_]+)",
       "`vllm.config.compilation` warnings: `CUDAGraphMode.%s is not supported with %s backend (support: %s); "
       "setting cudagraph_mode=%s[ because …]` (also `… with spec-decode for attention backend …`), and "
       "`Cudagraph mode %s requires piecewise capture, … Overriding to %s.`"),
    _p(Kind.CUDAGRAPH_PROFILE, ("Profiling CUDA graph memory:",),
       r"Profiling CUDA graph memory: (?P<modes>.*)",
       "V1 runner only: `Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=49 (largest=512)`"),
    # --- speculative decoding -----------------------------------------------------------------------
    _p(Kind.SIGNATURE, ("KV cache layout for", "DFLASH2-DRAFTER-GROUP"),
       r"(?P<line>Using \S+ KV cache layout for \S+ backend|DFLASH2-DRAFTER-GROUP: .*?)\.?$",
       "the lines that prove a profile's path (the `signature` gate): vLLM's `Using %s KV cache layout for %s "
       "backend.` (the card: `Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend`) and the card fork's "
       "`DFLASH2-DRAFTER-GROUP: GLM-5-Next fast path engaged with a spec-decode drafter group (drafter_layers=N, "
       "mamba_groups=M, tail_group=B)` (its sha-gated kv_cache_utils.py); canada-quant/vllm-glm53-flash-sm121 "
       "README@00d42fa, 'Expected boot gates' 1 and 2, on every rank's log"),
    _p(Kind.MASK_LOADED, ("Loaded DFlash mask embedding",),
       r"Loaded DFlash mask embedding for (?:mask_token_id|token) (?P<id>\d+) from (?P<src>.+?)\.?$",
       "plain `info`, every worker: `Loaded DFlash mask embedding for mask_token_id %s from %s` (upstream); a "
       "forked DFlash V2 speculator logs `Loaded DFlash mask embedding for token %d from %s.` (info_once, local)"),
    _p(Kind.SPEC_METRICS, ("SpecDecoding metrics:",),
       r"SpecDecoding metrics: .*?Mean acceptance length: (?P<al>[\d.]+)"
       r"(?:.*?Per-position acceptance rate: (?P<pos>[\d., ]+?)(?:, Avg|$))?",
       "API server every VLLM_LOG_STATS_INTERVAL under load; 0.10.2+: `Mean acceptance length` first; 0.10.1.1: "
       "`Draft acceptance rate: %.1f%%, Mean acceptance length: %.2f, …` — both matched"),
    # --- model runner -------------------------------------------------------------------------------
    _p(Kind.RUNNER_V1_FALLBACK, ("using the V1 model runner instead",),
       r"Model Runner V2 (?:does not yet support (?P<what>.*?)|requires Triton); using the V1 model runner instead",
       "0.33 `warning_once` when V2 cannot run the config (`Model Runner V2 does not yet support %s; using the V1 "
       "model runner instead.`, `Model Runner V2 requires Triton; …`)"),
    _p(Kind.RUNNER_V2, ("Using V2 Model Runner",),
       r"Using V2 Model Runner",
       "gpu_worker `info_once` during device init, 0.16+ (first local rank of each node; rank-less `Worker` name)"),
    _p(Kind.RUNNER_V1, ("Starting to load model", "Profiling CUDA graph memory:",
                        "Capturing CUDA graphs (mixed prefill-decode,", "Capturing CUDA graphs (decode, FULL)"),
       r"Starting to load model|Profiling CUDA graph memory:|Capturing CUDA graphs \((?:mixed prefill-decode|decode), ",
       "lines only the V1 runner (gpu_model_runner) prints: `Starting to load model %s...`, `Profiling CUDA graph "
       "memory: …`, V1 capture bars"),
    # --- readiness ----------------------------------------------------------------------------------
    _p(Kind.SERVED, ("Avg prompt throughput:",),
       r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: (?P<gen>[\d.]+) tokens/s",
       "the stats line `[Engine 000: ]Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
       "tokens/s, …` (V0 and V1, every 10 s under load): requests were served when a throughput is above 0. The "
       "uvicorn access lines (`\"POST /v1/chat/completions HTTP/1.1\" 200 OK`) would say so too, but they are the bulk "
       "of a serving log and stay unread (no needle)"),
    _p(Kind.READY, ("Application startup complete.",),
       r"Application startup complete\.",
       "uvicorn (`INFO:     Application startup complete.`), prefixed `(APIServer pid=N)` ≤0.30, bare 0.31+. "
       "vLLM never prints `Uvicorn running on`.", milestone=Milestone.READY),
    # --- deliberate stop (what follows is a shutdown artefact, not a boot fault) ----------------------
    _p(Kind.STOP, ("[shutdown] ", "Shutting down", "terminating worker queues"),
       r"^(?!.*exited unexpectedly)(?:\[shutdown\] |Shutting down$|.*received signal=SIG(?:INT|TERM)"
       r"|Parent process exited, terminating worker queues)",
       "0.25+ `[shutdown] …` chatter (except `engine core exited unexpectedly`, a fault), uvicorn `Shutting down` (the "
       "whole message: Ray's `Shutting down Ray distributed executor.` follows a dead engine core), "
       "`[shutdown] EngineCore: trigger received signal=SIGTERM`, worker `Parent process exited, terminating "
       "worker queues`"),
    # --- NCCL (the library's own lines: `host:pid:tid [dev] NCCL INFO …`, src/debug.cc; no vLLM prefix) ---------
    _p(Kind.NCCL_TRANSPORT, ("NET/IB : Using", "NET/Socket : Using", "Using network "),
       r"NET/(?P<net>IB|Socket) : Using(?P<devices>.*?)(?:; OOB (?P<oob>\S+))?$|Using network (?P<net2>\S+(?: \S+)*)$",
       "NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS INIT,NET: `NET/IB : Using%s %s; OOB %s:%s` (devices ` [%d]%s:%d/RoCE`, "
       "NVIDIA/nccl src/transport/net_ib/init.cc, net_ib.cc before 2.28), `NET/Socket : Using%s` "
       "(src/transport/net_socket.cc) and `Using network %s` (src/init.cc): RDMA, or the TCP fallback that runs "
       "TP=2 several times slower"),
    _p(Kind.NCCL_VERSION, ("NCCL version ", "is using nccl==", "Found nccl from"),
       r"NCCL version (?P<version>\d+\.\d+\.\d+)\S*?(?:\+cuda(?P<cuda>[\d.]+))?$"
       r"|vLLM is using nccl==(?P<v2>[\w.+-]+)"
       r"|Found nccl from (?:library|environment variable VLLM_NCCL_SO_PATH=)\s*(?P<library>\S+)",
       "NCCL's `NCCL version %d.%d.%d%s+cuda%d.%d` (src/init.cc VERSION_STRING: bare at NCCL_DEBUG=WARN/VERSION, "
       "an INFO line at INFO), vLLM's `vLLM is using nccl==%s` (pynccl) and `Found nccl from library %s` / "
       "`Found nccl from environment variable VLLM_NCCL_SO_PATH=%s` (vllm/utils find_nccl_library)"),
    _p(Kind.NCCL_NOTE, ("async event", "async error event", "GID table changed", "unknown event type"),
       r"NET/IB : (?P<what>" + NCCL_INFORMATIONAL + r")",
       "NCCL WARN lines that report, not fail (the async-event thread, src/transport/net_ib…): a GID table change "
       "(an address renewed on a RoCE netdev), port active/error and the other events NCCL itself calls non-fatal"),
    # --- faults (first match wins) ------------------------------------------------------------------
    _p(Kind.FAULT, ("Engine core proc",),
       r"Engine core proc \S+ died unexpectedly",
       "0.10–0.11 `Engine core proc %s died unexpectedly, shutting down client.`", FaultKind.ENGINE_DEAD, fatal=True),
    _p(Kind.FAULT, ("EngineCore failed to start", "EngineCore encountered a fatal error",
                    "Engine core initialization failed"),
       r"EngineCore failed to start|EngineCore encountered a fatal error|Engine core initialization failed",
       "EngineCore `EngineCore failed to start.` / `EngineCore encountered a fatal error.` (logger.exception → "
       "traceback follows); API server `RuntimeError: Engine core initialization failed. See root cause above. …`",
       FaultKind.ENGINE_DEAD, fatal=True),
    _p(Kind.FAULT, ("EngineDeadError", "engine core exited unexpectedly"),
       r"EngineDeadError|engine core exited unexpectedly",
       "`[shutdown] MPClient: engine core exited unexpectedly; starting cleanup`, `EngineDeadError` (relayed: the "
       "cause is logged elsewhere, which ends the boot itself)", FaultKind.ENGINE_DEAD),
    _p(Kind.FAULT, ("CUDA out of memory", "NV_ERR_NO_MEMORY", "CUDA driver error: out of memory"),
       r"CUDA out of memory|NV_ERR_NO_MEMORY|CUDA driver error: out of memory",
       "PyTorch `torch.OutOfMemoryError: CUDA out of memory. …`, `RuntimeError: CUDA driver error: out of memory`; "
       "kernel `NVRM: … NV_ERR_NO_MEMORY` (Spark UMA)",
       FaultKind.OOM, fatal=True),
    _p(Kind.FAULT, ("OutOfMemoryError", "not enough GPU memory"),
       r"OutOfMemoryError|Failed to load model - not enough GPU memory",
       "a bare `OutOfMemoryError`; V1 `Failed to load model - not enough GPU memory …`",
       FaultKind.OOM),
    _p(Kind.FAULT, ("No available memory for the cache blocks", "larger than the available KV cache memory",
                    "can be stored in KV cache"),
       r"No available memory for the cache blocks|larger than the available KV cache memory"
       r"|is larger than the maximum number of tokens that can be stored in KV cache",
       "KV planning ValueErrors — the pool is too small for max_model_len, a sizing error and not an "
       "out-of-memory (real 0.25.1: `ValueError: To serve at least one request with the model's max seq len "
       "(8192), (0.01 GiB KV cache is needed, which is larger than the available KV cache memory (…`; V1 `No "
       "available memory for the cache blocks. …`; V0 `The model's max seq len (%d) is larger than the maximum "
       "number of tokens that can be stored in KV cache (%d). …`)",
       FaultKind.OTHER),
    _p(Kind.FAULT, ("operation timeout: WorkNCCL",),
       r"Watchdog caught collective operation timeout",
       "PyTorch ProcessGroupNCCL watchdog (`[rank0]:[E… ProcessGroupNCCL.cpp:…] [Rank 0] Watchdog caught …`)",
       FaultKind.TIMEOUT, fatal=True),
    _p(Kind.FAULT, ("NCCL WARN", "NCCL error"),
       r"\bNCCL WARN\b(?!.*NET/IB : (?:" + NCCL_INFORMATIONAL + r"))|NCCL error",
       "NCCL library `host:pid:tid [dev] file.cc:line [(func) ]NCCL WARN …` (src/debug.cc; no vLLM prefix) — every "
       "WARN but the informational async events (NCCL_NOTE); vLLM `RuntimeError: NCCL error: …`",
       FaultKind.NCCL, fatal=True),
    _p(Kind.FAULT, ("ibv_",),
       r"\bibv_\w+ failed",
       "RDMA `ibv_modify_qp failed with 110 (Connection timed out)`", FaultKind.NCCL),
    _p(Kind.FAULT, ("RPC call to",),
       r"RPC call to \S+ timed out",
       "mp executor `TimeoutError: RPC call to %s timed out.`", FaultKind.TIMEOUT, fatal=True),
    _p(Kind.FAULT, ("Timed out waiting for engine core", "No available shared memory broadcast block"),
       r"Timed out waiting for engine core processes to start|No available shared memory broadcast block found",
       "API server `TimeoutError: Timed out waiting for engine core processes to start …`; shm ring buffer stall "
       "`No available shared memory broadcast block found in %d seconds …` — logged at INFO, yet the only sign of a "
       "dead follower", FaultKind.TIMEOUT),
    _p(Kind.FAULT, ("Worker proc", "RayWorkerProc rank=", "WorkerProc failed"),
       r"Worker proc \S+ died unexpectedly|RayWorkerProc rank=\d+ died unexpectedly|WorkerProc failed",
       "mp executor `Worker proc %s died unexpectedly[ (exit code: %s)], shutting down executor.` (exit -9 = "
       "OOM killer), worker `WorkerProc failed to start.`/`failed.`, Ray `RayWorkerProc rank=%s died unexpectedly "
       "…`, `RayWorkerProc failed: %s`", FaultKind.WORKER_DIED, fatal=True),
    _p(Kind.FAULT, ("A worker died or was killed", "its worker process has died"),
       r"A worker died or was killed while executing a task|The actor is dead because its worker process has died",
       "Ray: `(raylet) A worker died or was killed while executing a task by an unexpected system error. …` and the "
       "EngineCore's `The actor is dead because its worker process has died. …` — the root cause of the EngineCore "
       "exception that follows", FaultKind.WORKER_DIED, fatal=True),
    _p(Kind.FAULT, ("has been marked dead", "Failed to register worker"),
       r"has been marked dead because the detector has missed too many heartbeats"
       r"|Failed to register worker \S+ to Raylet",
       "Ray: `(raylet) The node with node id: … has been marked dead because the detector has missed too many "
       "heartbeats from it.`; core_worker `Failed to register worker %s to Raylet. IOError: …`",
       FaultKind.WORKER_DIED),
    _p(Kind.FAULT, ("WorkerProc hit an exception", "WorkerProc was terminated", "Worker failed with error"),
       r"WorkerProc hit an exception|WorkerProc was terminated|Worker failed with error",
       "worker `WorkerProc hit an exception.`/`was terminated`, `RuntimeError: Worker failed with error '%s', please "
       "check the stack trace above for the root cause`", FaultKind.WORKER_DIED),
    _p(Kind.FAULT, ("TCPStore", "[c10d]"),
       r"TCPStore.*[Ff]ailed|[Ff]ailed.*TCPStore|^\[c10d\] .*failed",
       "PyTorch c10d `[rankN]:[W… TCPStore.cpp:…] [c10d] recvValue failed …` (+ `Exception raised from …` C++ "
       "stack): the rendezvous store (head) went away. A shutdown artefact when the head was stopped on purpose.",
       FaultKind.OTHER),
    _p(Kind.FAULT, ("Xid",),
       r"NVRM: Xid\b",
       "kernel `NVRM: Xid (PCI:…): N, …` when dmesg is appended to a log", FaultKind.OTHER),
    _p(Kind.TRACEBACK_START, ("Traceback (most recent call last)",),
       r"^Traceback \(most recent call last\):",
       "Python traceback; the fault reported is its root-cause line (the last `XxxError: …` line)"),
    _p(Kind.BARE_EXCEPTION, ("Error: ", "Exception: "),
       r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\w*: \S",
       "an exception line with no log level (stderr, 0.10–0.30 with only the `(name pid=N)` prefix, or none) "
       "outside any traceback in view: the root cause when frames of a traceback whose `Traceback …` line is out "
       "of view precede it, or when a relayed error (`EngineDeadError … See stack trace (above)`) follows it"),
)

#: Literal needles of every pattern, plus the words that make a prefixed line an error line.
LEVEL_NEEDLES: tuple[str, ...] = ("ERROR", "CRITICAL")
NEEDLES: tuple[str, ...] = tuple(sorted({n for p in PATTERNS for n in p.needles} | set(LEVEL_NEEDLES)))

#: Short anchors for the whole-text sweep: every needle contains one of them (a test keeps it so), so a
#: line with no anchor holds no needle. Fewer, shared anchors = fewer passes over a big log; each was
#: chosen to be rare in a serving log's steady state (access lines, stats, SpecDecoding lines).
ANCHORS: tuple[str, ...] = (
    "LLM ", "non-default", "world", "took", "KV cache size:", " blocks: ", "emory", "aptur", "eager", "udagraph",
    "Loaded DFlash", "SpecDecoding metrics:", "odel", "startup complete", "hut",
    "ngine core", "EngineCore ", "EngineDead", "NCCL", "ibv_", "graph addresses", "stored in KV", "marked dead",
    "throughput:",
    "RPC call", "orker", "TCPStore", "c10d", "Xid", "Traceback", "ERR", "CRITICAL", "rror: ", "xception: ",
    "NET/", "network ", "nccl", "event", "GID table", "cache layout for", "DFLASH2-",
)
#: anchor → ((needle, index into PATTERNS), …) for the needles holding that anchor.
NEEDLE_INDEX: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = tuple(
    (a, tuple((n, i) for i, p in enumerate(PATTERNS) for n in p.needles if a in n)) for a in ANCHORS
)

#: An exception line inside a traceback: ``ValueError: …``, ``torch.OutOfMemoryError: …``, ``KeyboardInterrupt``.
#: Also a module-qualified class whose name says nothing of errors (``torch._dynamo.exc.BackendCompilerFailed: …``).
EXCEPTION_LINE = re.compile(
    r"^(?P<exc>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Interrupt|Exit)\w*"
    r"|(?:[a-z_]\w*\.)+[A-Z]\w*(?=:))(?::\s*(?P<msg>.*))?$"
)
#: Root-cause pointers: the real cause was logged earlier (another process or an earlier traceback).
POINTER = re.compile(
    r"[Ss]ee (?:the )?root cause above|[Ss]ee stack trace|check the stack trace above|[Ss]ee the stack trace above"
)
#: ``ERROR`` lines that are not engine faults: a request that failed (a client's 404/400, a stream cut by a dead
#: engine, whose cause is logged on its own) — vLLM's serving_* ``logger.exception`` messages.
NOT_FAULTS = re.compile(
    r"^(?:Error in (?:chat )?completion stream generator|Error in preprocessing prompt inputs"
    r"|Error with model .*|The model `[^`]*` does not exist"
    # fallbacks vLLM logs at ERROR and then goes on: `Cannot use FA version %d is not supported due to %s`
    # (vllm/attention/utils/fa_utils.py get_flash_attn_version: logger.error, then an assert caught by
    # `except (ImportError, AssertionError): return None` — another attention backend is used)
    r"|Cannot use FA version \d+ is not supported due to )"
)
#: A fault line (or the header folded into it) that says the boot itself failed: ``ready`` is false.
BOOT_FAILED = re.compile(
    r"EngineCore failed to start|Engine core initialization failed|WorkerProc failed to start"
    r"|on startup is less than desired GPU memory utilization|To serve at least one request"
    r"|larger than the available KV cache memory|can be stored in KV cache|No available memory for the cache blocks"
    r"|Failed to load model - not enough GPU memory|Timed out waiting for engine core processes to start"
)
#: A fault line that relays a failure logged elsewhere (another process, an earlier traceback) or only reports the
#: death of a process whose cause is printed by that process: never faults[0] while a cause is in view.
RELAYED = re.compile(
    r"EngineDeadError|engine core exited unexpectedly|Engine core proc \S+ died unexpectedly"
    r"|Worker proc \S+ died unexpectedly|RayWorkerProc rank=\d+ died unexpectedly|failed \(engine dead\)"
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

#: CUDAGraphMode values as the 0.10–0.11 JSON config dump prints them (enum value tuples).
CUDAGRAPH_MODE_VALUES: dict[str, str] = {
    "0": "NONE",
    "1": "PIECEWISE",
    "2": "FULL",
    "2,0": "FULL_DECODE_ONLY",
    "2,1": "FULL_AND_PIECEWISE",
}


_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


def _union(rows: tuple[LogPattern, ...]) -> re.Pattern[str]:
    """One regex matching wherever any row's does. Group names are dropped: rows may share them."""
    return re.compile("|".join(f"(?:{_NAMED_GROUP.sub('(?:', p.regex.pattern)})" for p in rows))


#: Lines that end a boot for sure (the rows marked ``fatal``), searched on whole raw lines: the boot
#: watcher's fast path. The full classification (tracebacks, stops, artefacts) is the log reader's.
FATAL: re.Pattern[str] = _union(tuple(p for p in PATTERNS if p.fatal))

#: Milestone → the lines that prove it, in boot order.
MILESTONE_LINES: tuple[tuple[Milestone, re.Pattern[str]], ...] = tuple(
    (m, _union(tuple(p for p in PATTERNS if p.milestone is m))) for m in Milestone
)


def milestone_of(line: str) -> Milestone | None:
    """The furthest boot milestone ``line`` proves (a prefixed raw line or a bare message), or None."""
    for m, regex in reversed(MILESTONE_LINES):
        if regex.search(line):
            return m
    return None

