"""The pattern table's rows for a boot's progress and a server's life: version and configuration, ranks, the KV
pool, CUDA graphs, speculative decoding, the model runner, readiness and a deliberate stop.

Each row matches a vLLM *message* (prefixes taken off by :mod:`sparkserve.observe.logline`); its notes name the
real format string and the versions it was read from (vllm-facts.md: the 0.10.1.1 … 0.33.0 wheels). The table is
assembled in :mod:`sparkserve.observe.logpatterns`.
"""

from __future__ import annotations

from sparkserve.observe.logrows import Kind, LogPattern, Milestone, row

BOOT_ROWS: tuple[LogPattern, ...] = (
    # --- version and configuration -------------------------------------------------------------
    row(Kind.VERSION, ("LLM engine (v", "Launching vLLM (v", "vLLM server version", "vLLM API server version"),
       r"LLM engine \(v(?P<version>[^)\s]+)\)|Launching vLLM \(v(?P<v2>[^)\s]+)\) headless"
       r"|vLLM (?:API )?server version (?P<v3>[^\s,]+)",
       "engine config line (all V1), follower `Launching vLLM (v%s) headless …` (0.12+), "
       "`vLLM API server version %s` (0.10–0.14) / `vLLM server version %s, serving model` (0.20+)"),
    row(Kind.ENGINE_CONFIG, ("LLM engine (v",),
       r"Initializing an? (?:V[01] )?LLM engine \(v[^)]*\) with config: (?P<config>.*)",
       "EngineCore `Initializing a V1 LLM engine (v%s) with config: %s` (V1, all versions); V0 said "
       "`Initializing a V0 LLM engine` / `Initializing an LLM engine`. Holds speculative_config=SpeculativeConfig("
       "method=…, num_spec_tokens=k), enforce_eager=, tensor_parallel_size=, compilation_config (0.10–0.11 JSON "
       "with `\"cudagraph_mode\":[2,1]`; 0.12+ dict repr with `<CUDAGraphMode.X: (2, 1)>`)."),
    row(Kind.NON_DEFAULT_ARGS, ("non-default args:",),
       r"non-default args: (?P<args>\{.*)",
       "API server (0.10+): dict keyed by argparse dest; the follower does not print it"),
    row(Kind.API_SERVER, ("Starting vLLM server on", "Starting vLLM API server", "vLLM API server version",
                         "vLLM server version"),
       r"Starting vLLM (?:API )?server|vLLM (?:API )?server version",
       "`Starting vLLM server on %s` (0.20+), `Starting vLLM API server %d on %s` (0.10–0.14): an API server "
       "exists in this log, so its readiness line is expected"),
    # --- ranks --------------------------------------------------------------------------------------
    row(Kind.RANK_IDENTITY, ("world_size=", "in world size"),
       r"world_size=(?P<world>\d+) rank=(?P<rank>\d+) local_rank=(?P<local>\d+)"
       r"|rank (?P<rank2>\d+) in world size (?P<world2>\d+) is assigned as DP rank (?P<dp>\d+), "
       r"PP rank (?P<pp>\d+), (?:PCP rank \d+, )?TP rank (?P<tp>\d+)",
       "every worker: `world_size=%d rank=%d local_rank=%d …` and `rank %s in world size %s is assigned as "
       "DP rank %s, PP rank %s, [PCP rank %s, ]TP rank %s, …` — in 0.18+ printed under the rank-less "
       "`(Worker pid=N)` name, so the pid is mapped to the rank here"),
    row(Kind.RANK_PRESENCE, ("Model loading took",),
       r"Model loading took (?P<gib>[\d.]+) GiB (?:memory )?and (?P<secs>[\d.]+) seconds",
       "per-worker: proves a rank exists and finished loading (`Model loading took %.4f GiB and` 0.10–0.11, "
       "`%s GiB and` V2 0.14–0.26, `%s GiB memory and` 0.30+)", milestone=Milestone.LOADED),
    row(Kind.RANK_PRESENCE, ("Loading weights took", "Loading model from scratch", "Starting to load model"),
       r"Loading weights took|Loading model from scratch|Starting to load model",
       "per-worker loading lines: prove a rank exists and started loading", milestone=Milestone.LOADING),
    # --- KV cache -----------------------------------------------------------------------------------
    row(Kind.KV_TOKENS, ("KV cache size:",),
       r"(?P<device>\w+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens",
       "EngineCore, once per engine: `%s KV cache size: %s tokens, Maximum concurrency for …` (one line since "
       "0.30); 0.10–0.26 printed `GPU KV cache size: %s tokens` and `Maximum concurrency …` as two lines. "
       "Thousands separators.", milestone=Milestone.KV_SIZED),
    row(Kind.GPU_BLOCKS, (" blocks: ",),
       r"^# (?P<device>\w+) blocks: (?P<gpu>\d+), # CPU blocks: (?P<cpu>\d+)",
       "V0 executor: `# GPU blocks: %d, # CPU blocks: %d` (later `# %s blocks:` with the device name). "
       "Blocks, not tokens: never reported as kv_cache_tokens."),
    row(Kind.KV_MEMORY, ("Available KV cache memory:", "memory for KV Cache as specified"),
       r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB"
       r"|reserved (?P<reserved>[\d.]+) GiB memory for KV Cache as specified",
       "worker: `Available KV cache memory: %s GiB` (not printed with --kv-cache-memory-bytes, which prints "
       "`Initial free memory …, reserved %s GiB memory for KV Cache as specified by kv_cache_memory_bytes …`)",
       milestone=Milestone.KV_SIZED),
    # --- CUDA graphs --------------------------------------------------------------------------------
    row(Kind.GRAPH_CAPTURED, ("Graph capturing finished in",),
       r"Graph capturing finished in (?P<secs>\d+) secs(?:, took (?P<gib>-?[\d.]+) GiB)?",
       "every worker in V2 and 0.10–0.11 (`info`), first local rank in V1 0.12+ (`info_once`); V2 prints it "
       "twice with memory profiling, once with --kv-cache-memory-bytes, never when eager. Old V0: no `took`.",
       milestone=Milestone.CAPTURE),
    row(Kind.CAPTURE_BAR, ("Capturing ",),
       r"Capturing (?:(?P<which>[\w-]+) )?CUDA graphs?(?: shapes| \((?P<mode>[^)]*)\)|(?=:\s*\d+%))"
       r"(?::\s*(?P<pct>\d+)%)?",
       "tqdm (stderr, global rank 0 only, unprefixed in 0.31+): V2 `Capturing CUDA graphs (PIECEWISE)`/`(FULL)`, "
       "`Capturing dflash2 CUDA graphs (FULL)`; V1 `(mixed prefill-decode, PIECEWISE)`/`(decode, FULL)`; V0 "
       "`Capturing CUDA graph shapes`, 0.8–0.9 `Capturing CUDA graphs: N%`. Per-rank capture is judged from "
       "`Graph capturing finished`; a log whose last bar reaches 100% captured (the finished line may be out of "
       "view)."),
    row(Kind.GRAPH_CAPTURED, ("cuda graph addresses",),
       r"Registering (?P<addresses>\d+) cuda graph addresses",
       "custom all-reduce, every TP>1 worker right after its capture (0.9+, seen 0.9–0.25): `Registering %d cuda "
       "graph addresses` — the rank captured (phase-neutral: the watchdog's CAPTURE phase starts earlier)"),
    row(Kind.GRAPH_CAPTURED, ("CUDA graph pool memory:",),
        r"CUDA graph pool memory: (?P<pool_gib>-?[\d.]+) GiB \(actual\)",
        "gpu_worker, every worker right after its capture when CUDA graph memory is profiled (0.21+, seen 0.26–0.28): "
        "`CUDA graph pool memory: %.2f GiB (actual), %.2f GiB (estimated), difference: …` — the rank captured "
        "(the actual figure may be negative on unified memory: still a capture; phase-neutral like the row above)"),
    row(Kind.SPECULATOR_CAPTURE, ("Capturing model for",),
       r"Capturing model for (?:(?P<which>\w+) )?speculator",
       "V2: `Capturing model for speculator...` (EAGLE/MTP), `Capturing model for %s speculator...` (DFlash, DFlash2)",
       milestone=Milestone.CAPTURE),
    row(Kind.EAGER, ("Cudagraph is disabled under eager mode",),
       r"Cudagraph is disabled under eager mode",
       "--enforce-eager, info_once in the config-building process", milestone=Milestone.CAPTURE),
    # phase-neutral: the watchdog's CAPTURE phase follows only the eager line above
    row(Kind.EAGER, ("Enforce eager set", "Skipping CUDA graph capture",
                    "Skipping encoder and decoder CUDA graph capture", "fallback to the eager mode"),
       r"Enforce eager set, disabling|Skipping CUDA graph capture"
       r"|Skipping encoder and decoder CUDA graph capture|fallback to the eager mode",
       "`Enforce eager set, disabling torch.compile and CUDAGraphs` (seen in 0.25.1), V1 `Skipping CUDA graph "
       "capture …`, V2 `Skipping encoder and decoder CUDA graph capture …`, V0 CPU `… fallback to the eager mode.`"),
    row(Kind.DRAFT_EAGER, ("running the draft eagerly", "draft pass eagerly"),
       r"does not support full CUDA graphs; running the draft eagerly|runs the draft pass eagerly",
       "`%s draft attention (%s) does not support full CUDA graphs; running the draft eagerly.` (0.33 warning); "
       "a forked DFlash V2 speculator says `… runs the draft pass eagerly (CUDA graphs for the draft are not "
       "implemented yet)`"),
    row(Kind.CUDAGRAPH_DOWNGRADE, ("setting cudagraph_mode=", "Cudagraph mode "),
       r"CUDAGraphMode\.(?P<src>\w+) is not supported with .*?; setting cudagraph_mode=(?P<dst>[A-Z_]+)"
       r"|Cudagraph mode (?P<src2>\S+) requires piecewise capture, .*Overriding to (?P<dst2>[A-Z_]+)",
       "`vllm.config.compilation` warnings: `CUDAGraphMode.%s is not supported with %s backend (support: %s); "
       "setting cudagraph_mode=%s[ because …]` (also `… with spec-decode for attention backend …`), and "
       "`Cudagraph mode %s requires piecewise capture, … Overriding to %s.`"),
    row(Kind.CUDAGRAPH_PROFILE, ("Profiling CUDA graph memory:",),
       r"Profiling CUDA graph memory: (?P<modes>.*)",
       "V1 runner only: `Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=49 (largest=512)`"),
    # --- speculative decoding -----------------------------------------------------------------------
    row(Kind.SIGNATURE, ("KV cache layout for", "DFLASH2-DRAFTER-GROUP"),
       r"(?P<line>Using \S+ KV cache layout for \S+ backend|DFLASH2-DRAFTER-GROUP: .*?)\.?$",
       "the lines that prove a profile's path (the `signature` gate): vLLM's `Using %s KV cache layout for %s "
       "backend.` (the card: `Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend`) and the card fork's "
       "`DFLASH2-DRAFTER-GROUP: GLM-5-Next fast path engaged with a spec-decode drafter group (drafter_layers=N, "
       "mamba_groups=M, tail_group=B)` (its sha-gated kv_cache_utils.py); canada-quant/vllm-glm53-flash-sm121 "
       "README@00d42fa, 'Expected boot gates' 1 and 2, on every rank's log"),
    row(Kind.MASK_LOADED, ("Loaded DFlash mask embedding",),
       r"Loaded DFlash mask embedding for (?:mask_token_id|token) (?P<id>\d+) from (?P<src>.+?)\.?$",
       "plain `info`, every worker: `Loaded DFlash mask embedding for mask_token_id %s from %s` (upstream); a "
       "forked DFlash V2 speculator logs `Loaded DFlash mask embedding for token %d from %s.` (info_once, local)"),
    row(Kind.SPEC_METRICS, ("SpecDecoding metrics:",),
       r"SpecDecoding metrics: .*?Mean acceptance length: (?P<al>[\d.]+)"
       r"(?:.*?Per-position acceptance rate: (?P<pos>[\d., ]+?)(?:, Avg|$))?",
       "API server every VLLM_LOG_STATS_INTERVAL under load; 0.10.2+: `Mean acceptance length` first; 0.10.1.1: "
       "`Draft acceptance rate: %.1f%%, Mean acceptance length: %.2f, …` — both matched"),
    # --- model runner -------------------------------------------------------------------------------
    row(Kind.RUNNER_V1_FALLBACK, ("using the V1 model runner instead",),
       r"Model Runner V2 (?:does not yet support (?P<what>.*?)|requires Triton); using the V1 model runner instead",
       "0.33 `warning_once` when V2 cannot run the config (`Model Runner V2 does not yet support %s; using the V1 "
       "model runner instead.`, `Model Runner V2 requires Triton; …`)"),
    row(Kind.RUNNER_V2, ("Using V2 Model Runner",),
       r"Using V2 Model Runner",
       "gpu_worker `info_once` during device init, 0.16+ (first local rank of each node; rank-less `Worker` name)"),
    row(Kind.RUNNER_V1, ("Starting to load model", "Profiling CUDA graph memory:",
                        "Capturing CUDA graphs (mixed prefill-decode,", "Capturing CUDA graphs (decode, FULL)"),
       r"Starting to load model|Profiling CUDA graph memory:|Capturing CUDA graphs \((?:mixed prefill-decode|decode), ",
       "lines only the V1 runner (gpu_model_runner) prints: `Starting to load model %s...`, `Profiling CUDA graph "
       "memory: …`, V1 capture bars"),
    # --- readiness ----------------------------------------------------------------------------------
    row(Kind.SERVED, ("Avg prompt throughput:",),
       r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: (?P<gen>[\d.]+) tokens/s",
       "the stats line `[Engine 000: ]Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
       "tokens/s, …` (V0 and V1, every 10 s under load): requests were served when a throughput is above 0. The "
       "uvicorn access lines (`\"POST /v1/chat/completions HTTP/1.1\" 200 OK`) would say so too, but they are the bulk "
       "of a serving log and stay unread (no needle)"),
    row(Kind.READY, ("Application startup complete.",),
       r"Application startup complete\.",
       "uvicorn (`INFO:     Application startup complete.`), prefixed `(APIServer pid=N)` ≤0.30, bare 0.31+. "
       "vLLM never prints `Uvicorn running on`.", milestone=Milestone.READY),
    # --- deliberate stop (what follows is a shutdown artefact, not a boot fault) ----------------------
    row(Kind.STOP, ("[shutdown] ", "Shutting down", "terminating worker queues"),
       r"^(?!.*(?:exited unexpectedly|\[shutdown\] Process manager: ))(?:\[shutdown\] |Shutting down$"
       r"|.*received signal=SIG(?:INT|TERM)|Parent process exited, terminating worker queues)",
       "0.25+ `[shutdown] …` chatter (except `engine core exited unexpectedly`, a fault, and the process manager's "
       "`[shutdown] Process manager: send sigterm to process EngineCore`: real 0.33.0 prints it first when its "
       "EngineCore is killed, just before `engine core exited unexpectedly` (tests/fixtures/logs/real-0.33.0-gpu/"
       "boot-killed.log), while a deliberate stop prints it only after `trigger received signal` / `API server: "
       "shutdown triggered`), uvicorn `Shutting down` (the "
       "whole message: Ray's `Shutting down Ray distributed executor.` follows a dead engine core), "
       "`[shutdown] EngineCore: trigger received signal=SIGTERM`, worker `Parent process exited, terminating "
       "worker queues`"),
)
