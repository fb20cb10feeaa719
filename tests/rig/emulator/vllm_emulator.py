#!/usr/bin/env python3
"""sparkserve engine emulator: a stdlib-only stand-in for vLLM 0.33.0's ``vllm serve`` — NOT vLLM.

It is the one stand-in of the rehearsal rig (there is no GPU here). It behaves like vLLM 0.33.0 where
sparkserve can see it: the ``vllm serve`` command line, multi-node rendezvous over real TCP, boot logs
built only from real vLLM 0.33.0 format strings (see tests/rig/formats_033.py), the OpenAI API with SSE
streaming, ``/metrics`` and on-demand faults. Nothing is computed on a GPU; token text is filler.

Invocation
----------
In the rig image it is installed as ``vllm`` (and ``ray``). As a plain host process (no docker)::

    python3 tests/rig/emulator/vllm_emulator.py serve DIR_WITH_CONFIG_JSON --port 8011 \\
        --speculative-config '{"method":"dflash","model":"DRAFTER_DIR","num_speculative_tokens":7}'
    python3 tests/rig/emulator/vllm_emulator.py --version
    # two ranks on one machine (TP=2 across two "nodes"): start the follower and the head in any order
    ... serve T -tp 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29511 --headless
    ... serve T -tp 2 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29511 --port 8011

Boot takes ~2-4 s; the head logs ``Application startup complete.`` (stderr) when the API is up.

``--speculative-config '{"method":"mtp","num_speculative_tokens":3}'`` (no ``model``) drafts with the target's own
MTP layers, as vLLM 0.33.0 does (``SpeculativeConfig`` takes the target as the draft model; ``MTPSpeculator``
logs ``Capturing model for speculator...``): no drafter directory, no mask line, the ``SSEMU_ACCEPTANCE``
profile cut to K.

Ray executor: ``ray start --head --node-ip-address=IP --port=6379 --block`` on the head, ``ray start
--address=IP:6379 --node-ip-address=IP2 --block`` on the others (both silent), then ``vllm serve …
--distributed-executor-backend ray`` in the head's container: it waits for one GPU per rank and logs every
rank itself, behind Ray's ``(RayWorkerProc pid=N[, ip=X]) `` actor prefix (vllm-facts 1.5, inferred for 0.31+).
vLLM's own lines go to stdout, uvicorn and tqdm lines to stderr, as in real vLLM.

Environment (emulator knobs are ``SSEMU_*``; real vLLM variables keep their meaning)
-------------------------------------------------------------------------------------
* ``SSEMU_BOOT_SECONDS`` (default 2.5): total emulated boot time; larger = slow boot.
* ``SSEMU_TOKEN_RATE`` (default 4000): tokens/s per request stream; 0 = as fast as possible.
* ``SSEMU_ACCEPTANCE`` (default ``0.744,0.545,0.405,0.306,0.237,0.185,0.147``): P(at least p+1 draft
  tokens accepted) per position p; sampled with conditional probabilities r[p]/r[p-1].
* ``ssemu-acceptance.json`` in the drafter directory (the mounted drafter dir), when present, is that
  drafter's own profile and wins over ``SSEMU_ACCEPTANCE``: ``{"per_position": [0.8, 0.6, …]}``, optionally
  ``"steps_per_s": S`` to pace each stream by engine steps (S steps/s, each carrying the accepted drafts +
  1 tokens) instead of by ``SSEMU_TOKEN_RATE`` — so a better profile is faster, as on real hardware — and
  ``"seed": N`` for the drafter's own acceptance draws, and ``"draft_cost": C`` (issue 42): each step then
  takes ``(1 + C × K) / S`` seconds — every drafted token costs a share C of a plain step — so K has a real
  optimum: tok/s ∝ (1 + Σ profile[:K]) / (1 + C × K), the acceptance a position adds against what drafting it
  costs. Where the shape comes from: the card's per-position row (``0.744 · 0.545 · 0.405 · …``, the
  default profile) falls with position, as vLLM's ``spec_decode_num_accepted_tokens_per_pos`` counters show
  for every drafter; and vLLM's speculative-decoding docs say the gain holds for "medium-to-low QPS,
  memory-bound workloads": each step verifies K + 1 tokens per sequence and the drafter runs too, so a longer
  draft costs step time (the card measured K=7 and banks a K=4 cell; "k=5 also boots"). A position whose
  rate is 0 draws nothing (no random number is used for it), so two K that differ only in such positions, at
  ``draft_cost`` 0, produce the same streams: a tie by construction.
* ``SSEMU_DRAFT_COST`` (default 0): the same cost for a drafter whose file does not set one.
* ``SSEMU_SEED`` (default: ``--seed``): seed of the acceptance sampler and filler text.
* ``SSEMU_FIRST_BATCH_S`` (default 0.05): the one-off cost, in seconds, the whole engine pays the first time
  it runs a batch of a size it has not run since boot (every stream stalls; 0 = none). Real vLLM's first
  measured run after a boot is slow: on one H100 (vLLM 0.25.1, the tiny models, 96 prompts × c8 × 256) the
  first of two identical runs after a fresh ``up`` took 22.0 s and the second 17.2 s, whichever client went
  first (issue 41's table; shared/docs/real-vllm-notes.md, "Card protocol beside an independent client",
  1.168 then 1.030). That is ~4-5 s over batch sizes 1..8, ~0.5 s a size; scaled here by about the ratio of
  the emulator's boot to a real one (2.5 s to ~60-200 s) so tests stay fast, and still a visible share of
  a small cell. A warm-up of concurrency × 2 requests (``bench --warmup``) reaches every size first.
* ``SSEMU_EOS_AFTER``: a natural end of sequence after N tokens (``finish_reason: stop``) unless
  ``ignore_eos`` or ``min_tokens`` says otherwise; ``LO-HI``: each request's own length, drawn from
  [LO, HI] (seeded by the engine seed and the request number), so replies end at EOS at different
  lengths, some past ``max_tokens`` (``finish_reason: length``), as sampled thinking-on replies do under
  the model card's protocol (holdout_client.py: no forced length, EOS ends a request; issue 21).
  Unset: every request runs to ``max_tokens``.
* ``SSEMU_DEVICE_MEMORY_GIB`` (default 119.7): the fake device size for ``--gpu-memory-utilization``.
* ``SSEMU_NCCL_TIMEOUT_S`` (default 3): how long a hung collective waits before the NCCL watchdog fires.
* ``SSEMU_FAULTS``: faults, ``;``-separated, each ``name@key=value,key=value``. Also read, one per line,
  from ``ssemu-faults`` in the drafter directory (the node-local, mounted drafter dir), and — while serving —
  from the file ``SSEMU_CONTROL`` names, re-read every 0.2 s (write it to start a fault now, remove it to end):

  - ``crash_boot@rank=R[,phase=init|load|compile|kv|capture][,error=nccl|cuda|key]``: rank R raises at
    boot (default phase init: ``RuntimeError: NCCL error: unhandled system error``) → the real
    ``WorkerProc failed to start.`` / ``EngineCore failed to start.`` / ``RuntimeError: Engine core
    initialization failed. …`` chain on the node(s) where vLLM prints it.
  - ``oom@rank=R``: ``torch.OutOfMemoryError: CUDA out of memory. …`` when rank R allocates the KV cache.
  - ``nccl_timeout@rank=R[,at=request|boot]``: the PyTorch NCCL watchdog line on rank R's node, then
    that rank's worker dies (exit code -6).
  - ``graphs_off@rank=R``: rank R silently captures no CUDA graphs (no ``Graph capturing finished``).
  - ``worker_death@rank=R[,after=N]``: rank R's worker dies (exit code -9) when request N starts.
  - ``engine_kill[@after=N]``: kill -9 of the EngineCore process when request N starts (real vLLM 0.33.0, one
    GPU: the process manager's SIGTERM line, the engine's death, the client's shutdown, the failed output
    handler, each open chat stream's EngineDeadError; issue 43, tests/fixtures/logs/real-0.33.0-gpu).
  - ``stream_error@request=K``: request K (1-based, counted by the head) fails mid-stream with
    vLLM's ``finish_reason == "error"`` path.
  - ``slow_boot@seconds=S``: same as ``SSEMU_BOOT_SECONDS``.
  Serving-time faults (issue 22, what `sparkserve supervise` must catch; see each for its real source):
  - ``wedge@after=N``: every request after the Nth hangs without a token, while ``/health`` answers 200 and
    ``/metrics`` answers (the requests count as running, the generation counter freezes) — real vLLM 0.25.1
    with its EngineCore SIGSTOPped (measured, issue 22; sparkrun#252, dgx-spark-playbooks PR #104).
  - ``accept_collapse@after_s=T``: from T s after the engine started, no draft token is accepted (acceptance
    length 1.0) and nothing is logged — the silent drop of vllm PR #45343 / eugr#377.
  - ``mem_leak@rank=R,path=P[,start_gib=100,mib_s=2048]``: the node holding rank R writes a fake
    /proc/meminfo at P once a second whose MemFree falls by mib_s from start_gib (the UVM leak of
    eugr/spark-vllm-docker#257; `supervise.meminfo_path` reads it).
  - ``worker_death@rank=R,after=N`` above is the rank crash while serving; ``nccl_timeout@rank=R,request=K``
    fires the NCCL watchdog when request K starts (default: the first).
* vLLM variables honoured: ``VLLM_RINGBUFFER_WARNING_INTERVAL`` (60), ``VLLM_ENGINE_READY_TIMEOUT_S``
  (600), ``VLLM_LOG_STATS_INTERVAL`` (10), ``VLLM_LOGGING_PREFIX``, ``VLLM_LOGGING_LEVEL``,
  ``VLLM_DISABLE_LOG_LOGO``, ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``, ``VLLM_USE_V2_MODEL_RUNNER``,
  ``VLLM_USE_FLASHINFER_SAMPLER``, ``VLLM_API_KEY``, ``VLLM_CACHE_ROOT``.

Behaviour copied from real runs (../shared/data/real-vllm-0.25.1/README.md): a dead follower leaves the
head's ``/health`` at 200 while requests hang and ``EngineCore`` logs, at INFO, ``No available shared
memory broadcast block found in N seconds. …`` every ``VLLM_RINGBUFFER_WARNING_INTERVAL`` seconds; a
DFlash (v1) drafter boots with any K; a DFlash2 drafter (``DFlash2DraftModel``) boots with K ≤ block_size − 1
(its card: k=5 boots on the SM121 image) and wedges at boot with a larger K (never ready, no error line).

Process names and pids: real vLLM runs APIServer, EngineCore and one process per worker; the emulator is
one process whose log lines carry those names and stable per-role pids (the APIServer / MainProcess pid
is the real one; the others are offsets of it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import math
import os
import pickle
import random
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# SSEMU_ENGINE=glm53-fork: the model card's vLLM fork (issue 21), as its image behaves where sparkserve can see it:
# the version string of the card's Dockerfile@121cecc base (0.1.dev20051+g487ecf187), the launcher's "v2 dialect"
# (its option list is the image's serve-args.json: --kv-cache-memory <bytes>, no --kv-cache-memory-bytes, no
# autotune flag — canada-quant/vllm-glm53-flash-sm121 scripts/launch_glm53_w4a16_dflash2_sm121.sh@1c142c9), the
# README@00d42fa "Expected boot gates" 1-2 on every rank, and the card's pool for its bytes (kv_pool_line).
# The image says which engine it is with a file (layered test images add files, not ENV): /opt/sparkserve-emu/engine.
ENGINE = os.environ.get("SSEMU_ENGINE") or next(
    (p.read_text().strip() for p in (Path("/opt/sparkserve-emu/engine"), Path(__file__).with_name("engine"))
     if p.is_file()), "")
FORK = ENGINE == "glm53-fork"
VERSION = "0.1.dev20051+g487ecf187" if FORK else "0.33.0"
# The card's measured pool: --kv-cache-memory 8053063680 -> "GPU KV cache size: 366,749 tokens" @262K (README).
# The fork's own pool arithmetic (hybrid mamba + sparse-MLA groups, block 2304 raised to 4608) is not emulated:
# the fork image scales the card's tokens per byte.
CARD_KV_BYTES, CARD_POOL_TOKENS = 8053063680, 366749
EMULATOR_NOTE = "sparkserve engine emulator — not vLLM"
SITE = "/usr/local/lib/python3.12/dist-packages"
PYLIB = "/usr/lib/python3.12"
GiB = 1 << 30
DEFAULT_PROFILE = (0.744, 0.545, 0.405, 0.306, 0.237, 0.185, 0.147)
NCCL_VERSION = "2.28.9"
KV_BLOCK = 16

# Where each message comes from in vLLM 0.33.0 (basename:line as vLLM's formatter prints it).
# tests/rig/formats_033.py holds the format strings and proves them against the real package source.
AT = {
    "logo": "startup.py:38", "nondefault": "startup.py:96", "arch": "model.py:744",
    "maxlen": "model.py:2170", "kvdtype": "cache.py:484", "kvdtype_head": "cache.py:477",
    "dp_infer": "arg_utils.py:2513", "draft_len": "speculative.py:1799", "chunked": "scheduler.py:310",
    "ir": "kernel.py:480", "eager_warn": "vllm.py:1778", "inductor_off": "vllm.py:1802", "eager": "vllm.py:2005",
    "headless": "serve.py:224",
    "engine_cfg": "core.py:139", "dp_leader": "multiproc_executor.py:167", "dist_init": "parallel_state.py:1929",
    "nccl": "pynccl.py:148", "mnnvl": "custom_all_reduce.py:232", "ar": "cuda_communicator.py:353",
    "assigned": "parallel_state.py:2385", "v2": "gpu_worker.py:513", "scratch": "model_runner.py:399",
    "attn": "cuda.py:508", "attn_explicit": "cuda.py:448", "fa": "flash_attn.py:1122",
    "fs": "weight_utils.py:1144", "prefetch": "weight_utils.py:1167", "weights": "default_loader.py:506",
    "aux": "eagle3_utils.py:36", "mask": "qwen3_dflash.py:926", "model_load": "model_runner.py:428",
    "kv_layout": "utils.py:345", "drafter_group": "kv_cache_utils.py:1286",
    "flashinfer": "topk_topp_sampler.py:121", "tc_start": "monitor.py:40", "tc_cache": "backends.py:1125",
    "dynamo": "backends.py:1187", "tc_store": "backends.py:401", "tc_compile": "backends.py:417",
    "tc_load": "backends.py:310", "aot_save": "decorators.py:752", "aot_load": "decorators.py:326",
    "tc_total": "monitor.py:62", "warmup": "monitor.py:91", "kv_reserved": "gpu_worker.py:676",
    "kv_avail": "gpu_worker.py:772", "cg_profiling": "gpu_worker.py:787", "kv_size": "kv_cache_utils.py:1147",
    "spec_capture": "speculator.py:170", "spec_capture_ar": "speculator.py:110",
    "graphs": "model_runner.py:1163", "cg_pool": "gpu_worker.py:1003",
    "jit": "jit_monitor.py:84", "init_engine": "core.py:405", "init_engine_eager": "core.py:412",
    "tasks": "entry.py:135", "chat_fmt": "hf.py:736", "starting": "entry.py:139", "routes": "launcher.py:188",
    "route": "launcher.py:197", "stats": "loggers.py:335", "spec": "metrics.py:120",
    "shm": "shm_broadcast.py:878", "worker_died": "multiproc_executor.py:380",
    "wp_failed_start": "multiproc_executor.py:1057", "wp_hit": "multiproc_executor.py:1189",
    "ec_failed_start": "core.py:1584", "ec_fatal": "core.py:1586", "mp_dead": "core_client.py:839",
    "req_error": "serving.py:203", "parent_exit": "multiproc_executor.py:944",
    "sd_api_trigger": "launcher.py:256", "sd_api_stop": "launcher.py:272", "sd_api_stopped": "launcher.py:281",
    "sd_api_signal": "launcher.py:284", "sd_api_fastapi": "launcher.py:306", "sd_mp_start": "core_client.py:792",
    "sd_mp_stop": "core_client.py:794", "sd_mp_stopped": "core_client.py:796", "sd_mp_clean": "core_client.py:797",
    "sd_mp_done": "core_client.py:799", "sd_ec_signal": "core.py:1525", "sd_ec_start": "core.py:1712",
    "sd_ec_teardown": "core.py:1743", "sd_ec_exit": "core.py:1573", "sd_ex_wait": "multiproc_executor.py:580",
    "sd_ex_done": "multiproc_executor.py:587", "ray_pg": "ray_utils.py:358", "ray_pg_wait": "ray_utils.py:223",
    "ray_died": "ray_executor_v2.py:522",
    # issue 43, seen in the real 0.33.0 run (tests/fixtures/logs/real-0.33.0-gpu/boot-killed.log)
    "pm_sigterm": "utils.py:628", "output_handler": "async_llm.py:943", "stream_gen_error": "serving.py:952",
}
RAY_CLUSTER_FILE = "/tmp/ray/ray_current_cluster"
RAY_PG_WAIT = ("Waiting for creating a placement group of specs for %d seconds. specs=%s. Check `ray status` and "
               "`ray list nodes` to see if you have enough resources, and make sure the IP addresses used by ray "
               "cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are running "
               "on a multi-node.")

SHM_MSG = ("No available shared memory broadcast block found in %d seconds. This typically happens when some "
           "processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
           "quantization).")
KV_RESERVED_MSG = (
    "Initial free memory {free} GiB, reserved {kv} GiB memory for KV Cache as specified by "
    "kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
    "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of KV "
    "cache memory size. If OOM'ed, check the difference of initial free memory between the current run and "
    "the previous run where kv_cache_memory_bytes is suggested and update it correspondingly."
)
CG_PROFILING_MSG = (
    "CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=%.4f "
    "is equivalent to --gpu-memory-utilization=%.4f without CUDA graph memory profiling. To maintain the same "
    "effective KV cache size as before, increase --gpu-memory-utilization to %.4f. To disable, set "
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."
)
PREFETCH_MSG = ("Auto-prefetch is disabled because the filesystem (%s) is not a recognized network FS "
                "(NFS/Lustre). If you want to force prefetching, start vLLM with "
                "--safetensors-load-strategy=prefetch.")
KV_DTYPE_MSG = ("Using %s data type to store kv cache. It reduces the GPU memory footprint and boosts the "
                "performance. Meanwhile, it may cause accuracy drop without a proper scaling factor")
KV_DTYPE_HEAD_MSG = ("Using %s data type to store kv cache. It reduces the GPU memory footprint and boosts the "
                     "performance. Dynamic per-token-head scales will be computed at runtime.")
EAGER_WARN_MSG = ("Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is "
                  "equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                  "--kernel_config.enable_jit_warmup=False")
TOP_USAGE = ("usage: vllm [-h] [-v]\n"
             "            {chat,complete,serve,launch,bench,collect-env,download-kernels,preload,run-batch,"
             "snapshot}\n            ...\n")
SERVE_USAGE = "vllm serve [model_tag] [options]"
ROUTES = [("/health", "GET"), ("/metrics", "GET"), ("/ping", "GET"), ("/ping", "POST"), ("/version", "GET"),
          ("/load", "GET"), ("/v1/models", "GET"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST")]
_FILLER = ("the spark node holds a draft of tokens while the target checks each block and the bonus token "
           "lands after every accepted run of guesses so the stream keeps moving across both ranks")
WORDS = tuple(_FILLER.split(" "))


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


# ============================================================================================ logging


class Log:
    """vLLM 0.31+ log lines: ``{VLLM_LOGGING_PREFIX}(Name pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] msg``.

    Multi-line messages repeat the prefix after ``\\r\\n`` (vLLM's NewLineFormatter). uvicorn and tqdm
    output is unprefixed and goes to stderr.
    """

    LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prefix = os.environ.get("VLLM_LOGGING_PREFIX", "")
        self.min_level = self.LEVELS.get(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(), 20)
        self.once: set[tuple[str, str]] = set()
        self.outer: dict[int, str] = {}  # pid -> Ray's "(RayWorkerProc pid=N, ip=X) " for forwarded actor output

    def line(self, proc: str, pid: int, level: str, where: str, msg: str) -> None:
        if self.LEVELS[level] < self.min_level:
            return
        head = (f"{self.outer.get(pid, '')}{self.prefix}({proc} pid={pid}) {level} {time.strftime('%m-%d %H:%M:%S')}"
                f" [{where}] ")
        text = head + msg.replace("\n", "\r\n" + head) + "\n"
        with self.lock:
            sys.stdout.write(text)
            sys.stdout.flush()

    def info_once(self, proc: str, pid: int, where: str, msg: str, key: str = "") -> None:
        k = (f"{proc}{pid}", key or msg)
        if k not in self.once:
            self.once.add(k)
            self.line(proc, pid, "INFO", where, msg)

    def raw(self, text: str, stream: Any = None) -> None:
        stream = stream or sys.stderr
        with self.lock:
            stream.write(text)
            stream.flush()

    def uvicorn(self, msg: str, level: str = "INFO", stream: Any = None) -> None:
        self.raw(f"{level + ':':<9} {msg}\n", stream or sys.stderr)


def _fmt_interval(s: float) -> str:
    s = int(s)
    return f"{s // 60:02d}:{s % 60:02d}"


def tqdm_text(desc: str, n: int, elapsed: float, completed_style: bool = False) -> str:
    """tqdm's default bar for 0 and n of n, joined by carriage returns as tqdm writes them."""
    rate = n / elapsed if elapsed > 0 else 0.0
    rate_s = f"{rate:5.2f}it/s" if rate >= 1 or rate == 0 else f"{1 / rate:5.2f}s/it"
    if completed_style:
        first = f"{desc}:   0% Completed | 0/{n} [00:00<?, ?it/s]"
        last = f"{desc}: 100% Completed | {n}/{n} [{_fmt_interval(elapsed)}<00:00, {rate_s}]"
        return first + "\n" + last + "\n\n"
    first = f"{desc}:   0%|          | 0/{n} [00:00<?, ?it/s]"
    last = f"{desc}: 100%|██████████| {n}/{n} [{_fmt_interval(elapsed)}<00:00, {rate_s}]"
    return "\r" + first + "\r" + last + "\n"


def traceback_text(frames: list[tuple[str, int, str, str]], exc: str) -> str:
    out = ["Traceback (most recent call last):"]
    for path, line, fn, code in frames:
        out.append(f'  File "{path}", line {line}, in {fn}')
        out.append(f"    {code}")
    out.append(exc)
    return "\n".join(out)


def V(rel: str) -> str:  # noqa: N802  (a path inside the vllm package)
    return f"{SITE}/vllm/{rel}"


# Frames (file, line, function, code) read from vLLM 0.33.0's source.
F_WORKER_MAIN = (V("v1/executor/multiproc_executor.py"), 1023, "worker_main",
                 "worker = WorkerProc(*args, **kwargs)")
F_WP_INIT_DEVICE = (V("v1/executor/multiproc_executor.py"), 780, "__init__", "self.worker.init_device()")
F_WP_LOAD = (V("v1/executor/multiproc_executor.py"), 788, "__init__", "self.worker.load_model()")
FRAMES_NCCL_INIT = [
    F_WORKER_MAIN, F_WP_INIT_DEVICE,
    (V("v1/worker/gpu_worker.py"), 504, "init_device", "init_worker_distributed_environment("),
    (V("v1/worker/gpu_worker.py"), 1723, "init_worker_distributed_environment",
     "ensure_model_parallel_initialized("),
    (V("distributed/parallel_state.py"), 2418, "ensure_model_parallel_initialized", "initialize_model_parallel("),
    (V("distributed/parallel_state.py"), 2175, "initialize_model_parallel", "_TP = init_model_parallel_group("),
    (V("distributed/parallel_state.py"), 1529, "init_model_parallel_group", "return GroupCoordinator("),
    (V("distributed/parallel_state.py"), 554, "__init__", "self.device_communicator = device_comm_cls("),
    (V("distributed/device_communicators/cuda_communicator.py"), 108, "__init__",
     "self.pynccl_comm = PyNcclCommunicator("),
    (V("distributed/device_communicators/pynccl.py"), 180, "__init__",
     "self.comm: ncclComm_t = self.nccl.ncclCommInitRank("),
    (V("distributed/device_communicators/pynccl_wrapper.py"), 498, "ncclCommInitRank", "self.NCCL_CHECK("),
    (V("distributed/device_communicators/pynccl_wrapper.py"), 464, "NCCL_CHECK",
     'raise RuntimeError(f"NCCL error: {error_str}")'),
]
FRAMES_DRAFT_LOAD = [
    F_WORKER_MAIN, F_WP_LOAD,
    (V("v1/worker/gpu_worker.py"), 601, "load_model",
     "self.model_runner.load_model(load_dummy_weights=load_dummy_weights)"),
    (V("v1/worker/gpu/model_runner.py"), 421, "load_model", "self.speculator.load_model(self.model)"),
    (V("v1/worker/gpu/spec_decode/speculator.py"), 233, "load_model",
     "self.model = self.load_draft_model(target_model, target_attn_layer_names)"),
    (V("v1/worker/gpu/spec_decode/dflash/speculator.py"), 244, "load_draft_model",
     "return load_dflash_model(target_model, self.vllm_config)"),
    (V("model_executor/model_loader/base_loader.py"), 88, "load_model", "self.load_weights(model, model_config)"),
    (V("model_executor/model_loader/default_loader.py"), 503, "load_weights",
     "loaded_weights = model.load_weights(self.get_all_weights(model_config, model))"),
]
FRAMES_MASK = FRAMES_DRAFT_LOAD + [
    (V("model_executor/models/qwen3_dflash.py"), 875, "load_weights",
     "mask_embedding = self._read_mask_embedding()"),
    (V("model_executor/models/qwen3_dflash.py"), 919, "_read_mask_embedding", "raise ValueError("),
]
FRAMES_KV_OOM = [
    (V("v1/executor/multiproc_executor.py"), 1177, "worker_busy_loop", "output = func(*args, **kwargs)"),
    (V("v1/worker/gpu_worker.py"), 907, "initialize_from_config", "self.model_runner.initialize_kv_cache("),
    (V("v1/worker/gpu/model_runner.py"), 796, "initialize_kv_cache", "kv_caches_dict = init_kv_cache("),
    (V("v1/worker/gpu/attn_utils.py"), 421, "init_kv_cache", "kv_caches = allocate_kv_cache("),
    (V("v1/worker/utils.py"), 596, "allocate_kv_cache",
     "buf = torch.zeros(buf_size, dtype=torch.int8, device=device)"),
]
FRAMES_ENGINE_START = [
    (V("v1/engine/core.py"), 1555, "run_engine_core",
     "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)"),
    (V("v1/engine/core.py"), 1232, "__init__", "super().__init__("),
]
FRAMES_EC_WORKERS = FRAMES_ENGINE_START + [
    (V("v1/engine/core.py"), 150, "__init__", "self.model_executor = executor_class(vllm_config)"),
    (V("v1/executor/abstract.py"), 120, "__init__", "self._init_executor()"),
    (V("v1/executor/multiproc_executor.py"), 238, "_init_executor",
     "self.workers = WorkerProc.wait_for_ready(unready_workers)"),
    (V("v1/executor/multiproc_executor.py"), 916, "wait_for_ready", "raise e from None"),
]
FRAMES_EC_RPC = FRAMES_ENGINE_START + [
    (V("v1/engine/core.py"), 163, "__init__", "kv_cache_config = self._initialize_kv_caches(vllm_config)"),
    (V("v1/engine/core.py"), 372, "_initialize_kv_caches",
     "self.model_executor.initialize_from_config(kv_cache_configs)"),
    (V("v1/executor/abstract.py"), 131, "initialize_from_config",
     'self.collective_rpc("initialize_from_config", args=(kv_cache_configs,))'),
    (V("v1/executor/multiproc_executor.py"), 525, "collective_rpc", "raise RuntimeError("),
]
FRAMES_EC_FATAL = [
    (V("v1/engine/core.py"), 1570, "run_engine_core", "engine_core.run_busy_loop()"),
    (V("v1/engine/core.py"), 1625, "run_busy_loop", "self._process_input_queue()"),
    (V("v1/engine/core.py"), 1664, "_process_input_queue", "self._handle_client_request(*req)"),
    (V("v1/engine/core.py"), 1779, "_handle_client_request", 'raise RuntimeError("Executor failed.")'),
]
# The API server when its EngineCore is dead (real 0.33.0 run, boot-killed.log; frames as that run printed them)
FRAMES_OUTPUT_HANDLER = [
    (V("v1/engine/async_llm.py"), 880, "output_handler", "outputs = await engine_core.get_output_async()"),
    (V("v1/engine/core_client.py"), 1278, "get_output_async", "raise self._format_exception(outputs) from None"),
]
FRAMES_STREAM_GEN = [
    (V("entrypoints/openai/chat_completion/serving.py"), 575, "chat_completion_stream_generator_raw",
     "async for res in result_generator:"),
    (V("v1/engine/async_llm.py"), 795, "generate", "out = q.get_nowait() or await q.get()"),
    (V("v1/engine/output_processor.py"), 92, "get", "raise output"),
    *FRAMES_OUTPUT_HANDLER,
]
ENGINE_DEAD = ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
               "for the root cause.")
FRAMES_API_START = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    (V("entrypoints/cli/main.py"), 117, "main", "args.dispatch_function(args)"),
    (V("entrypoints/cli/serve.py"), 156, "cmd", "uvloop.run(run_server(args))"),
    (V("entrypoints/launchers/api_server/entry.py"), 176, "run_server",
     "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
    (V("entrypoints/launchers/api_server/entry.py"), 190, "run_server_worker",
     "async with build_async_engine_client("),
    (V("entrypoints/launchers/api_server/entry.py"), 60, "build_async_engine_client",
     "async with build_async_engine_client_from_engine_args("),
    (V("entrypoints/launchers/api_server/entry.py"), 94, "build_async_engine_client_from_engine_args",
     "async_llm = AsyncLLM.from_vllm_config("),
    (V("v1/engine/async_llm.py"), 264, "from_vllm_config", "return cls("),
    (V("v1/engine/async_llm.py"), 193, "__init__", "self.engine_core = EngineCoreClient.make_async_mp_client("),
    (V("v1/engine/core_client.py"), 170, "make_async_mp_client", "return AsyncMPClient("),
    (V("v1/engine/core_client.py"), 1163, "__init__", "super().__init__("),
    (V("v1/engine/core_client.py"), 699, "__init__", "with launch_core_engines("),
    (f"{PYLIB}/contextlib.py", 144, "__exit__", "next(self.gen)"),
    (V("v1/engine/utils.py"), 1393, "launch_core_engines", "wait_for_engine_startup("),
]
FRAMES_API_FAILED = FRAMES_API_START + [
    (V("v1/engine/utils.py"), 1473, "wait_for_engine_startup", "raise RuntimeError("),
]
FRAMES_API_TIMEOUT = FRAMES_API_START[:12] + [
    (V("v1/engine/core_client.py"), 764, "__init__", "raise TimeoutError("),
]
FRAMES_HEADLESS = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    (V("entrypoints/cli/main.py"), 117, "main", "args.dispatch_function(args)"),
    (V("entrypoints/cli/serve.py"), 150, "cmd", "run_headless(args)"),
]


# ============================================================================================== CLI


def _serve_args_json() -> dict:
    here = Path(__file__).resolve().parent
    repo = here.parents[2] / "sparkserve" / "data" / "vllm-0.33.0-serve-args.json" if len(here.parents) > 2 else None
    for p in (os.environ.get("SSEMU_SERVE_ARGS"), here / "serve-args.json", Path("/opt/sparkserve-emu/serve-args.json"),
              repo):
        if p and Path(p).is_file():
            return json.loads(Path(p).read_text())
    raise SystemExit("sparkserve engine emulator: vllm-0.33.0-serve-args.json not found (set SSEMU_SERVE_ARGS)")


def human_readable_int(value: str, allow_auto: bool = False) -> int:
    v = value.strip()
    if allow_auto and v in ("auto", "-1"):
        return -1
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", v)
    if not m:
        raise ValueError(value)
    num, suffix = m.groups()
    if suffix in ("K", "M", "G", "T"):
        if "." in num:
            raise ValueError(value)
        return int(num) * 1024 ** ("KMGT".index(suffix) + 1)
    mult = 1000 ** ("kmgt".index(suffix) + 1) if suffix else 1
    return int(float(num) * mult) if "." in num else int(num) * mult


def _type_for(opt: dict):
    dest, t = opt["dest"], opt["type"]
    if dest in ("kv_cache_memory_bytes",) or t == "human_readable_int":
        def hr(v: str) -> int:
            return human_readable_int(v)
        hr.__name__ = "human_readable_int"
        return hr
    if t == "human_readable_int_or_auto":
        def hra(v: str) -> int:
            return human_readable_int(v, allow_auto=True)
        hra.__name__ = "human_readable_int_or_auto"
        return hra
    if t == "int":
        return int
    if t == "float":
        return float
    if t in ("parse_dataclass", "loads") or "valid JSON string" in (opt.get("help") or ""):
        def js(v: str) -> Any:
            if v.lstrip().startswith(("{", "[")) or t in ("parse_dataclass", "loads"):
                return json.loads(v)
            return v
        js.__name__ = t if t in ("parse_dataclass", "loads") else "loads"
        return js
    return None


class _EnableDisable(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        kw["nargs"] = 0
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string != self.option_strings[-1])


def build_serve_parser(spec: dict) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", usage=SERVE_USAGE, add_help=False)
    p.add_argument("-h", "--help", action="store_true", dest="help")
    for opt in spec["options"]:
        kw: dict[str, Any] = {"dest": opt["dest"], "default": opt["default"]}
        action = opt["action"]
        if not opt["option_strings"]:
            p.add_argument(opt["dest"], nargs="?", default=None)
            continue
        if opt["dest"] == "compilation_config":
            kw["default"] = None
        if action == "_StoreTrueAction":
            kw["action"] = "store_true"
            kw["default"] = bool(opt["default"])
        elif action == "EnableDisableAction":
            kw["action"] = _EnableDisable
        else:
            if action == "_AppendAction":
                kw["action"] = "append"
            typ = _type_for(opt)
            if typ:
                kw["type"] = typ
                if isinstance(kw["default"], str) and typ not in (int, float):
                    kw["default"] = None  # argparse would run a string default through the type
            if opt["nargs"] not in (None, 0):
                kw["nargs"] = opt["nargs"]
            if opt["choices"]:
                choices = [c for c in opt["choices"] if c is not None]
                if typ in (int, float):
                    choices = [typ(c) for c in choices]
                kw["choices"] = choices
        p.add_argument(*opt["option_strings"], **kw)
    return p


def normalize_argv(argv: list[str], long_opts: set[str]) -> list[str]:
    """What FlexibleArgumentParser does before parsing: ``--a_b`` → ``--a-b``, ``-O3``, dotted JSON keys."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    for a in argv:
        if a.startswith("--") and not a.startswith("---"):
            key, eq, val = a.partition("=")
            if "." in key:
                base, _, sub = key.partition(".")
                base = base.replace("_", "-")
                if base in long_opts or base in ("-cc", "-sc"):
                    try:
                        v: Any = json.loads(val)
                    except ValueError:
                        v = val
                    dotted.setdefault(base, {})[sub] = v
                    continue
            a = key.replace("_", "-") + eq + val
        elif re.fullmatch(r"-O\d", a):
            out += ["--optimization-level", a[2:]]
            continue
        elif a.startswith("-cc.") or a.startswith("-sc."):
            key, _, val = a.partition("=")
            try:
                v = json.loads(val)
            except ValueError:
                v = val
            dotted.setdefault(key[:3], {})[key[4:]] = v
            continue
        out.append(a)
    for base, d in dotted.items():
        out += [base, json.dumps(d)]
    return out


def parse_serve(argv: list[str]) -> argparse.Namespace:
    spec = _serve_args_json()
    parser = build_serve_parser(spec)
    long_opts = {s for o in spec["options"] for s in o["option_strings"] if s.startswith("--")}
    ns, extra = parser.parse_known_args(normalize_argv(argv, long_opts))
    if extra:
        sys.stderr.write(TOP_USAGE + f"vllm: error: unrecognized arguments: {' '.join(extra)}\n")
        sys.exit(2)
    if not hasattr(ns, "kv_cache_memory_bytes"):  # the fork's dialect: --kv-cache-memory <bytes>
        ns.kv_cache_memory_bytes = getattr(ns, "kv_cache_memory", None)
    ns._spec = spec
    return ns


# ============================================================================================ models


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class _Stub:
    def __init__(self, *a: Any, **k: Any) -> None:
        self.args = a

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _Tensor:
    def __init__(self, shape: tuple) -> None:
        self.shape = shape


def _rebuild_tensor_v2(storage: Any, offset: int, size: tuple, stride: tuple, *rest: Any) -> _Tensor:
    return _Tensor(tuple(size))


class _MaskUnpickler(pickle.Unpickler):
    """Reads torch.save()'s data.pkl without torch: only tensors, dicts and plain values are allowed."""

    ALLOWED = {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict"),
               ("torch._utils", "_rebuild_parameter")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            import collections
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage") or module == "torch" and name in (
                "bfloat16", "float16", "float32"):
            return _Stub
        raise pickle.UnpicklingError(f"Weights only load failed: unsupported global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return _Stub(pid)


def read_mask_embedding(path: Path) -> dict | _Tensor | None:
    """The object torch.load(path, weights_only=True) would return, as plain data (None: no file)."""
    import zipfile

    if not path.is_file():
        return None
    with zipfile.ZipFile(path) as z:
        pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
        return _MaskUnpickler(io.BytesIO(z.read(pkl))).load()


def dir_bytes(path: Path, suffix: str = ".safetensors") -> int:
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.name.endswith(suffix))
    except OSError:
        return 0


def dtype_bytes(kv_cache_dtype: str, model_dtype: str = "bfloat16") -> float:
    d = kv_cache_dtype
    if d == "auto":
        d = model_dtype
    if d in ("float32",):
        return 4
    if d.startswith("fp8") or d.startswith("int8"):
        return 1
    if d in ("bfloat16", "float16", "half"):
        return 2
    return 0.5  # 4-bit and sub-byte formats (nvfp4, int4, turboquant, octave, ultraquant)


def kv_heads_per_rank(cfg: dict, tp: int) -> int:
    heads = int(cfg.get("num_key_value_heads") or cfg.get("num_attention_heads") or 1)
    return max(1, heads // tp)


def head_dim(cfg: dict) -> int:
    if cfg.get("head_dim"):
        return int(cfg["head_dim"])
    return int(cfg.get("hidden_size", 128)) // max(1, int(cfg.get("num_attention_heads") or 1))


@dataclass
class KVPlan:
    num_blocks: int
    tokens: int
    max_concurrency: float
    bytes_per_token: float


def kv_cache_plan(target: dict, drafter: dict | None, *, kv_bytes: int, kv_cache_dtype: str, tp: int,
                  max_model_len: int) -> KVPlan:
    """Deterministic pool size: blocks of 16 tokens holding K and V of every target and drafter layer.

    Matches the real 0.25.1 capture: 4-layer target + 1-layer drafter, 2 KV heads of 64 over TP=2,
    1 GiB → 1,677,712 tokens with fp8 and 838,848 with bf16.
    """
    mdtype = str(target.get("torch_dtype") or target.get("dtype") or "bfloat16")
    b = dtype_bytes(kv_cache_dtype, mdtype)
    per_token = 0.0
    for cfg in (target, drafter or {}):
        if not cfg:
            continue
        per_token += 2 * int(cfg.get("num_hidden_layers", 0)) * kv_heads_per_rank(cfg, tp) * head_dim(cfg) * b
    per_block = per_token * KV_BLOCK
    blocks = int(kv_bytes // per_block) if per_block > 0 else 0
    tokens = blocks * KV_BLOCK
    return KVPlan(blocks, tokens, tokens / max(1, max_model_len), per_token)


# ============================================================================================= faults


@dataclass
class Fault:
    name: str
    params: dict[str, str] = field(default_factory=dict)

    def int(self, key: str, default: int | None = None) -> int | None:
        v = self.params.get(key)
        return int(v) if v is not None and v.lstrip("-").isdigit() else default


def parse_faults(text: str) -> list[Fault]:
    out = []
    for item in re.split(r"[;\n]", text):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        name, _, rest = item.partition("@")
        params = {}
        for kv in rest.split(","):
            if "=" in kv:
                k, v = kv.split("=", 1)
                params[k.strip()] = v.strip()
        out.append(Fault(name.strip(), params))
    return out


class Faults:
    def __init__(self, faults: list[Fault]) -> None:
        self.faults = faults

    def get(self, name: str) -> Fault | None:
        return next((f for f in self.faults if f.name == name), None)

    def for_rank(self, name: str, rank: int) -> Fault | None:
        for f in self.faults:
            if f.name == name and f.int("rank", 0) == rank:
                return f
        return None


# ========================================================================================= rendezvous


class Peer:
    """One TCP connection carrying newline-delimited JSON messages."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("r", encoding="utf-8", newline="\n")
        self.wlock = threading.Lock()
        self.alive = True

    def send(self, **msg: Any) -> bool:
        data = (json.dumps(msg) + "\n").encode()
        with self.wlock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.alive = False
                return False

    def recv(self) -> dict | None:
        try:
            line = self.rfile.readline()
        except (OSError, ValueError):
            line = ""
        if not line:
            self.alive = False
            return None
        return json.loads(line)

    def close(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


class BootFailure(Exception):
    """A rank failed at boot. ``rpc``: inside a collective RPC (after WorkerProc init)."""

    def __init__(self, rank: int, proc: str, exc_line: str, frames: list, rpc: bool, short: str) -> None:
        super().__init__(short)
        self.rank, self.proc, self.exc_line, self.frames, self.rpc, self.short = (
            rank, proc, exc_line, frames, rpc, short)


class Wedged(Exception):
    pass


# ============================================================================================= engine


@dataclass
class Req:
    rid: str
    prompt_tokens: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    temperature: float
    seed: int
    thinking: bool
    index: int


PROFILE_FILE = "ssemu-acceptance.json"


def drafter_profile(drafter: Path | None) -> dict | None:
    """The drafter directory's own acceptance profile (``ssemu-acceptance.json``), or None when it has none.
    A file that is there but wrong is an error at boot, never silently today's default profile."""
    if drafter is None or not (drafter / PROFILE_FILE).is_file():
        return None
    d = json.loads((drafter / PROFILE_FILE).read_text())
    pp = d.get("per_position") if isinstance(d, dict) else None
    if not isinstance(pp, list) or not pp or not all(isinstance(x, int | float) and 0 <= x <= 1 for x in pp):
        raise ValueError(f"{drafter / PROFILE_FILE}: per_position must be a non-empty list of rates in [0, 1]")
    return d


class SpecCounters:
    def __init__(self, k: int) -> None:
        self.k = k
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted = 0
        self.per_pos = [0] * k


class Engine:
    """Token generation with speculative-decoding acceptance and vLLM's counters."""

    def __init__(self, emu: Emulator) -> None:
        self.emu = emu
        self.k = emu.k
        prof = os.environ.get("SSEMU_ACCEPTANCE")
        base = [float(x) for x in prof.split(",")] if prof else list(DEFAULT_PROFILE)
        own = drafter_profile(emu.drafter_path)
        if own is not None:
            base = own["per_position"]
        self.step_rate = float(own.get("steps_per_s") or 0.0) if own is not None else 0.0
        cost = own.get("draft_cost") if own is not None else None
        self.draft_cost = float(cost) if cost is not None else env_float("SSEMU_DRAFT_COST", 0.0)
        # one engine step: the plain step plus the drafting and verification of K tokens (module docstring)
        self.step_s = (1.0 + self.draft_cost * self.k) / self.step_rate if self.step_rate > 0 else 0.0
        self.profile = self._fit(base, self.k)
        self.seed = int(os.environ.get("SSEMU_SEED", emu.args.seed or 0))
        if own is not None and own.get("seed") is not None:
            self.seed = int(own["seed"])  # two drafters with one profile still draw independently, as real ones do
        self.rate = env_float("SSEMU_TOKEN_RATE", 4000.0)
        eos = os.environ.get("SSEMU_EOS_AFTER")
        self.eos_after = int(eos) if eos and eos.isdigit() else None
        lo, dash, hi = (eos or "").partition("-")
        self.eos_range = (int(lo), int(hi)) if dash and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi) \
            else None
        self.lock = threading.Lock()
        self.total = SpecCounters(self.k)
        self.interval = SpecCounters(self.k)
        self.log_stats = not emu.args.disable_log_stats
        self.prompt_tokens = 0
        self.gen_tokens = 0
        self.iv_prompt = 0
        self.iv_gen = 0
        self.iv_start = time.monotonic()
        self.success = {r: 0 for r in ("stop", "length", "abort", "error", "repetition")}
        self.running = 0
        self.waiting = 0
        self.requests = 0
        self.hist: dict[str, list[float]] = {"prompt": [], "gen": [], "ttft": [], "e2e": [], "itl": []}
        self.created = time.time()
        # the first run of each batch size stalls the engine (SSEMU_FIRST_BATCH_S; issue 41, see the docstring)
        self.first_batch_s = env_float("SSEMU_FIRST_BATCH_S", 0.05)
        self.warm_sizes: set[int] = set()
        self.stall_until = 0.0

    def enter(self, prompt_tokens: int) -> None:
        """A request joins the running batch; a batch size never run since boot stalls the whole engine."""
        with self.lock:
            self.running += 1
            self.prompt_tokens += prompt_tokens
            self.iv_prompt += prompt_tokens
            if self.first_batch_s > 0 and self.running not in self.warm_sizes:
                self.warm_sizes.add(self.running)
                self.stall_until = max(self.stall_until, time.monotonic()) + self.first_batch_s

    def stalled(self) -> float:
        """Wait out an engine stall (a first-seen batch size); the seconds waited."""
        wait = self.stall_until - time.monotonic()
        if wait <= 0:
            return 0.0
        time.sleep(wait)
        return wait

    @staticmethod
    def _fit(base: list[float], k: int) -> list[float]:
        if k <= len(base):
            return base[:k]
        out = list(base)
        ratio = (base[-1] / base[-2]) if len(base) > 1 and base[-2] > 0 else 0.5
        while len(out) < k:
            out.append(out[-1] * ratio)
        return out

    def draw_accepted(self, rng: random.Random) -> int:
        """Accepted draft tokens in one step: P(a >= p+1) = profile[p] (prefix acceptance)."""
        collapse = self.emu.faults.get("accept_collapse")
        if collapse is not None and time.time() - self.created >= float(collapse.params.get("after_s", "0")):
            return 0
        prev = 1.0
        for p, r in enumerate(self.profile):
            cond = r / prev if prev > 0 else 0.0
            if cond <= 0.0 or rng.random() >= cond:  # a position never accepted draws no number (a planted tie)
                return p
            prev = r
        return self.k

    def count_step(self, accepted: int) -> None:
        if not self.log_stats or self.k == 0:
            return
        with self.lock:
            for c in (self.total, self.interval):
                c.drafts += 1
                c.draft_tokens += self.k
                c.accepted += accepted
                for p in range(accepted):
                    c.per_pos[p] += 1

    def stats_snapshot(self) -> tuple:
        with self.lock:
            iv = self.interval
            self.interval = SpecCounters(self.k)
            prompt, gen = self.iv_prompt, self.iv_gen
            self.iv_prompt = self.iv_gen = 0
            dt = time.monotonic() - self.iv_start
            self.iv_start = time.monotonic()
            return iv, prompt, gen, dt, self.running, self.waiting


class Emulator:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.log = Log()
        a = args
        self.model = a.model_tag or a.model
        self.served = (a.served_model_name or [self.model])[0]
        self.tp = a.tensor_parallel_size or 1
        self.pp = a.pipeline_parallel_size or 1
        self.world = self.tp * self.pp
        self.nnodes = a.nnodes or 1
        self.node_rank = a.node_rank or 0
        self.local_world = max(1, self.world // self.nnodes)
        self.ray = a.distributed_executor_backend == "ray" and not a.headless
        if self.ray:  # the driver shows every rank: Ray forwards each actor's output to it
            self.nnodes, self.node_rank, self.local_world = 1, 0, self.world
        self.ranks = [self.node_rank * self.local_world + i for i in range(self.local_world)]
        self.ep = bool(a.enable_expert_parallel)
        self.headless = bool(a.headless)
        self.pid = os.getpid()
        self.pid_engine = self.pid + 182
        base = self.pid + (298 if not self.headless else 174)
        self.worker_pids = {r: base + 41 * i for i, r in enumerate(self.ranks)}
        self.ray_ips: dict[int, str] = {}
        self.worker_names = {r: "Worker" for r in self.ranks}
        self.target_cfg = read_json(Path(self.model) / "config.json")
        self.spec = self._spec_config()
        # method mtp without a model drafts with the target's own MTP layers: vLLM's SpeculativeConfig takes the
        # target model as the draft model (vllm/config/speculative.py, __post_init__); no drafter directory
        self.mtp = self.spec.get("method") == "mtp"
        if self.mtp and not self.spec.get("model"):
            self.spec["model"] = self.model
        self.drafter_path = Path(self.spec.get("model") or "") if self.spec and not self.mtp else None
        self.drafter_cfg = read_json(self.drafter_path / "config.json") if self.drafter_path else {}
        self.k = int(self.spec.get("num_speculative_tokens") or 0) if self.spec else 0
        self.eager = bool(a.enforce_eager)
        self.comp = self._compilation()
        self.cg_mode = "NONE" if self.eager else str(self.comp.get("cudagraph_mode") or "FULL_AND_PIECEWISE").upper()
        self.graphs = self.cg_mode != "NONE"
        self.compile = not self.eager and self.comp.get("mode") not in (0, "NONE", "none")
        self.kv_dtype = a.kv_cache_dtype or "auto"
        self.max_model_len = self._max_model_len()
        self.max_batched = a.max_num_batched_tokens or 8192
        self.faults = Faults(self._faults())
        self.boot_faults = list(self.faults.faults)
        if os.environ.get("SSEMU_CONTROL"):
            threading.Thread(target=self.control_loop, daemon=True).start()
        self.boot_seconds = env_float("SSEMU_BOOT_SECONDS", 2.5)
        slow = self.faults.get("slow_boot")
        if slow:
            self.boot_seconds = float(slow.params.get("seconds", self.boot_seconds))
        self.ring_interval = int(env_float("VLLM_RINGBUFFER_WARNING_INTERVAL", 60))
        self.ready_timeout = env_float("VLLM_ENGINE_READY_TIMEOUT_S", 600)
        self.device_gib = env_float("SSEMU_DEVICE_MEMORY_GIB", 119.7)
        self.t0 = time.monotonic()
        self.peers: list[Peer] = []
        self.head_peer: Peer | None = None
        self.dead_followers: set[int] = set()
        self.engine_dead = False
        self.stop_event = threading.Event()
        self.ready = False
        self.kv_plan: KVPlan | None = None
        self.engine: Engine | None = None
        self.request_counter = 0
        self.request_lock = threading.Lock()
        self.hung = 0
        self.hung_lock = threading.Lock()
        self.worker_dead = False
        self.collective_hung = False
        self.compile_seconds = 0.0
        self.acks: dict[int, int] = {}
        self.ack_cond = threading.Condition()

    # ---------------------------------------------------------------- config facts

    def _spec_config(self) -> dict:
        sc = self.args.speculative_config
        if isinstance(sc, str):
            try:
                sc = json.loads(sc)
            except ValueError:
                sc = None
        if not sc and (self.args.spec_method or self.args.spec_model):
            sc = {"method": self.args.spec_method, "model": self.args.spec_model,
                  "num_speculative_tokens": self.args.spec_tokens}
        return dict(sc) if isinstance(sc, dict) else {}

    def _compilation(self) -> dict:
        c = self.args.compilation_config
        d = dict(c) if isinstance(c, dict) else {}
        if self.args.cudagraph_capture_sizes:
            d["cudagraph_capture_sizes"] = self.args.cudagraph_capture_sizes
        lvl = str(self.args.optimization_level)
        if lvl == "0" and "cudagraph_mode" not in d:
            d["cudagraph_mode"] = "NONE"
            d["mode"] = 0
        elif lvl == "1" and "cudagraph_mode" not in d:
            d["cudagraph_mode"] = "PIECEWISE"
        return d

    def _max_model_len(self) -> int:
        derived = int(self.target_cfg.get("max_position_embeddings") or 32768)
        v = self.args.max_model_len
        return derived if v in (None, -1) else int(v)

    def _faults(self) -> list[Fault]:
        text = os.environ.get("SSEMU_FAULTS", "")
        if self.drafter_path:
            f = self.drafter_path / "ssemu-faults"
            if f.is_file():
                text += "\n" + f.read_text()
        return parse_faults(text)

    @property
    def arch(self) -> str:
        return (self.target_cfg.get("architectures") or ["Qwen3ForCausalLM"])[0]

    @property
    def draft_arch(self) -> str:
        return (self.drafter_cfg.get("architectures") or ["DFlashDraftModel"])[0]

    @property
    def dflash2(self) -> bool:
        return self.draft_arch.startswith("DFlash2")

    @property
    def dflash_config(self) -> dict:
        return self.drafter_cfg.get("dflash_config") or {}

    @property
    def mask_token_id(self) -> int | None:
        v = self.dflash_config.get("mask_token_id", self.drafter_cfg.get("mask_token_id"))
        return int(v) if v is not None else None

    @property
    def block_size(self) -> int | None:
        v = self.dflash_config.get("block_size", self.drafter_cfg.get("block_size"))
        return int(v) if v is not None else None

    def capture_sizes(self) -> list[int]:
        sizes = self.comp.get("cudagraph_capture_sizes")
        if not sizes:
            mx = min((self.args.max_num_seqs or 256) * (1 + self.k) * 2, 512, self.max_batched)
            sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, mx + 1, 16)] if s <= mx]
        return sorted({int(s) for s in sizes if int(s) <= self.max_batched})

    def wname(self, rank: int) -> str:
        return self.worker_names[rank]

    def final_name(self, rank: int) -> str:
        tp_rank = rank % self.tp
        n = "Worker"
        if self.pp > 1:
            n += f"_PP{rank // self.tp}"
        if self.tp > 1:
            n += f"_TP{tp_rank}"
        if self.ep:
            n += f"_EP{tp_rank}"
        return n

    # ---------------------------------------------------------------- line helpers

    def api(self, level: str, key: str, msg: str) -> None:
        self.log.line("APIServer", self.pid, level, AT[key], msg)

    def main(self, level: str, key: str, msg: str) -> None:
        self.log.line("MainProcess", self.pid, level, AT[key], msg)

    def core(self, level: str, key: str, msg: str) -> None:
        self.log.line("EngineCore", self.pid_engine, level, AT[key], msg)

    def wproc(self, rank: int) -> tuple[str, int]:
        """The process a rank's worker lines come from. A world of one runs its worker inside the EngineCore
        process (no worker process, no Worker prefix): the real vLLM 0.33.0 run on one GPU (issue 43,
        tests/fixtures/logs/real-0.33.0-gpu/boot1-up.log) logs `Using V2 Model Runner`, the mask line, the KV and
        graph lines as `(EngineCore pid=N)`."""
        if self.world == 1 and not self.ray:
            return "EngineCore", self.pid_engine
        return self.wname(rank), self.worker_pids[rank]

    def wk(self, rank: int, level: str, key: str, msg: str) -> None:
        self.log.line(*self.wproc(rank), level, AT[key], msg)

    def wk_once(self, rank: int, key: str, msg: str, dedupe: str = "") -> None:
        if self.ray or rank == self.ranks[0]:  # info_once, scope "local": the node's first local rank
            self.log.info_once(*self.wproc(rank), AT[key], msg, dedupe or msg)

    def bar(self, rank: int, text: str) -> None:
        if rank == 0:  # progress bars: global rank 0 only
            outer = self.log.outer.get(self.worker_pids[rank], "")
            if outer:  # Ray prefixes every line it forwards
                text = "".join(outer + ln if ln.strip("\r") else ln for ln in text.splitlines(keepends=True))
            self.log.raw(text)

    def pause(self, frac: float) -> None:
        time.sleep(max(0.0, self.boot_seconds * frac))

    # ---------------------------------------------------------------- pre-engine config lines

    def non_default_args(self) -> dict:
        a, out = self.args, {}
        for opt in a._spec["options"]:
            dest = opt["dest"]
            if dest == "help" or not hasattr(a, dest):
                continue
            val = getattr(a, dest)
            default = opt["default"]
            if dest == "compilation_config":
                if val is not None:
                    out[dest] = _Repr(compilation_repr(self.comp, resolved=None))
                continue
            if dest == "model":
                if a.model_tag:
                    out["model"] = a.model_tag
                elif val != default:
                    out["model"] = val
                continue
            if val is None:
                continue
            if isinstance(default, str) and not isinstance(val, str) and val is not None:
                with contextlib.suppress(ValueError, TypeError):
                    default = type(val)(default)
            if val != default:
                out[dest] = val
        return out

    def config_lines(self, emit) -> None:
        """Lines the API server (head) or the main process (follower) prints while building the config."""
        emit("INFO", "arch", f"Resolved architecture: {self.arch}")
        emit("INFO", "maxlen", f"Using max model len {self.max_model_len}")
        if self.kv_dtype != "auto" and self.kv_dtype.startswith(("fp8", "int8", "int4", "nvfp4")):
            key = "kvdtype_head" if self.kv_dtype.endswith("per_token_head") else "kvdtype"
            emit("INFO", key, (KV_DTYPE_HEAD_MSG if key == "kvdtype_head" else KV_DTYPE_MSG) % self.kv_dtype)
        if self.nnodes > 1:
            emit("INFO", "dp_infer", f"Inferred data_parallel_rank 0 from node_rank {self.node_rank}")
        if self.spec and not self.mtp:  # mtp: the target's own layers, no second model config
            emit("INFO", "arch", f"Resolved architecture: {self.draft_arch}")
            dlen = int(self.drafter_cfg.get("max_position_embeddings") or 32768)
            emit("INFO", "maxlen", f"Using max model len {dlen}")
            res = min(dlen, self.max_model_len)
            if res != dlen:
                emit("INFO", "draft_len", f"Overriding draft model max model len from {dlen} to {res}")
        emit("INFO", "chunked", f"Chunked prefill is enabled with max_num_batched_tokens={self.max_batched}.")
        if self.eager:
            emit("WARNING", "eager_warn", EAGER_WARN_MSG)
            emit("WARNING", "inductor_off", "Inductor compilation was disabled by user settings, optimizations "
                                            "settings that are only active during inductor compilation will be "
                                            "ignored.")
        emit("INFO", "ir", "Final IR op priority after setting platform defaults: "
                           "IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], "
                           "gelu_and_mul_sparse=['native'])")
        if self.eager:
            emit("INFO", "eager", "Cudagraph is disabled under eager mode")

    def config_errors(self) -> str | None:
        """Config-time ValueErrors vLLM raises before any engine process starts (exception line)."""
        sc = self.spec
        if self.kv_dtype not in KV_CACHE_DTYPES:
            return f"ValueError: Invalid kv_cache_dtype: {self.kv_dtype!r}. Valid values are: {KV_CACHE_DTYPES}"
        # vllm/config/model.py _get_and_verify_max_len (0.33.0): a max_model_len beyond the config's length is a
        # ValueError unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (then a warning); before this the emulator only warned
        derived = self.target_cfg.get("max_position_embeddings")
        if (isinstance(derived, int) and self.max_model_len > derived
                and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() not in ("1", "true")):
            return (f"ValueError: User-specified max_model_len ({self.max_model_len}) is greater than the derived "
                    f"max_model_len (max_position_embeddings={derived} or model_max_length=None in model's "
                    "config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                    "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative "
                    "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model "
                    "uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA "
                    "array out-of-bounds error.")
        if sc:
            if "tensor_parallel_size" in sc:
                return ("ValueError: 'tensor_parallel_size' is not a valid argument in the speculative_config. "
                        "Please pass 'draft_tensor_parallel_size' instead.")
            if not sc.get("num_speculative_tokens"):
                return ("ValueError: A speculative model was provided, but `num_speculative_tokens` was not "
                        "provided")
            if self.dflash2 and os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "0":
                return "ValueError: Model Runner V1 does not support: DFlash candidate-head drafts"
        return None

    def engine_config_repr(self) -> str:
        a = self.args
        spec = "None"
        if self.spec:
            spec = (f"SpeculativeConfig(method={self.spec.get('method')!r}, model={self.spec.get('model')!r}, "
                    f"num_spec_tokens={self.k})")
        dtype = self.target_cfg.get("torch_dtype", "bfloat16")
        return (
            f"model={self.model!r}, speculative_config={spec}, tokenizer={self.model!r}, "
            "skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, "
            f"trust_remote_code={bool(a.trust_remote_code)}, dtype=torch.{dtype}, max_seq_len={self.max_model_len}, "
            f"download_dir=None, load_format={a.load_format or 'auto'}, tensor_parallel_size={self.tp}, "
            f"pipeline_parallel_size={self.pp}, data_parallel_size=1, decode_context_parallel_size=1, "
            f"dcp_comm_backend=ag_rs, disable_custom_all_reduce={self.nnodes > 1}, quantization=None, "
            f"quantization_config=None, enforce_eager={self.eager}, "
            "aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None), "
            f"kv_cache_dtype={self.kv_dtype}, device_config=cuda, structured_outputs_config="
            "StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, "
            "disable_additional_properties=False, reasoning_parser='', reasoning_parser_plugin='', "
            "enable_in_reasoning=False), observability_config=ObservabilityConfig("
            "show_hidden_metrics_for_version=None, otlp_traces_endpoint=None, collect_detailed_traces=None, "
            "per_request_spec_decode_metrics='none', kv_cache_metrics=False, kv_cache_metrics_sample=0.01, "
            "custom_histogram_buckets=None, cudagraph_metrics=False, enable_layerwise_nvtx_tracing=False, "
            "enable_mfu_metrics=False, enable_mm_processor_stats=False, enable_logging_iteration_details=False, "
            f"jit_monitor_mode='warn', jit_monitor_verbose=False), seed={a.seed or 0}, "
            f"served_model_name={self.served}, enable_prefix_caching=True, enable_chunked_prefill=True, "
            f"pooler_config=None, compilation_config={compilation_repr(self.comp, resolved=self)}, "
            "kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native'], "
            "fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native']), enable_flashinfer_autotune=True, "
            "enable_rocm_segmented_attn_autotune=False, enable_cutedsl_warmup=True, "
            f"enable_jit_warmup={not self.eager}, monokernel=False, moe_backend='auto', "
            "sparse_indexer_topk_backend='auto', linear_backend='auto', linear_backend_per_quant=None)"
        )

    # ---------------------------------------------------------------- per-phase worker lines

    def phase(self, name: str, rank: int) -> Any:
        """Run one boot phase for one local rank. Raises BootFailure / Wedged."""
        return getattr(self, f"ph_{name}")(rank)

    def nccl_init_lines(self, rank: int, local: int) -> None:
        """What NCCL itself prints while the communicator is set up, at NCCL_DEBUG=INFO (sparkserve's default, with
        NCCL_DEBUG_SUBSYS=INIT,NET): its version, the transport and `Using network …`. Formats from NVIDIA/nccl:
        src/debug.cc (`%s:%d:%d ` host/pid/tid, `[%d] NCCL INFO %s`), src/init.cc (`NCCL version %d.%d.%d+cuda%d.%d`,
        `Using network %s`), src/transport/net_ib/init.cc (`NET/IB : Using%s %s; OOB %s:%s`, a device as
        ` [%d]%s:%d/RoCE`), src/transport/net_socket.cc (`NET/Socket : Using%s`, an interface as ` [%d]%s:%s`).
        NCCL_NET=Socket (or NCCL_IB_DISABLE=1 without NCCL_NET=IB) takes the socket fallback."""
        if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
            return
        pid = self.worker_pids[rank]
        head = f"{os.uname().nodename}:{pid}:{pid + 9} [{local}] NCCL INFO "
        iface = os.environ.get("NCCL_SOCKET_IFNAME") or "eth0"
        ip = os.environ.get("VLLM_HOST_IP") or "127.0.0.1"
        net = os.environ.get("NCCL_NET", "")
        socket_net = net == "Socket" or (os.environ.get("NCCL_IB_DISABLE") == "1" and net != "IB")
        lines = [f"NCCL version {NCCL_VERSION}+cuda13.0"]
        if socket_net:
            lines += [f"NET/Socket : Using [0]{iface}:{ip}<0>", "Using network Socket"]
        else:
            hcas = [h for h in os.environ.get("NCCL_IB_HCA", "").split(",") if h] or ["mlx5_0"]
            devs = "".join(f" [{i}]{h}:1/RoCE" for i, h in enumerate(hcas))
            lines += [f"NET/IB : Using{devs} [RO]; OOB {iface}:{ip}<0>", "Using network IB"]
        self.log.raw("".join(head + ln + "\n" for ln in lines), sys.stdout)

    def _crash(self, rank: int, phase: str) -> None:
        f = self.faults.for_rank("crash_boot", rank)
        if not f or f.params.get("phase", "init") != phase:
            return
        err = f.params.get("error", "nccl" if phase == "init" else "cuda")
        if err == "nccl":
            exc, frames = "RuntimeError: NCCL error: unhandled system error", FRAMES_NCCL_INIT
        elif err == "key":
            exc, frames = "KeyError: 'conv_kernel_size'", FRAMES_DRAFT_LOAD
        else:
            exc = "RuntimeError: CUDA error: an illegal memory access was encountered"
            frames = FRAMES_NCCL_INIT[:3] if phase == "init" else FRAMES_DRAFT_LOAD[:4]
        rpc = phase not in ("init", "load")
        if rpc:
            frames = [FRAMES_KV_OOM[0]]
        raise BootFailure(rank, self.wname(rank), exc, frames, rpc, exc.split(": ", 1)[1])

    def ph_init(self, rank: int) -> None:
        local = self.ranks.index(rank)
        if self.nnodes > 1:
            method = f"tcp://{self.args.master_addr}:{self.args.master_port}"
        elif self.ray:
            method = f"tcp://{os.environ.get('VLLM_HOST_IP') or '127.0.0.1'}:{29500 + self.pid % 400}"
        else:
            method = f"tcp://127.0.0.1:{self.args.master_port + 7000 + self.pid % 1000}"
        self.wk(rank, "INFO", "dist_init", f"world_size={self.world} rank={rank} local_rank={local} "
                                           f"distributed_init_method={method} backend=nccl")
        self.pause(0.05)
        self._crash(rank, "init")
        if rank == 0:
            self.log.info_once(self.wname(rank), self.worker_pids[rank], AT["nccl"],
                               f"vLLM is using nccl=={NCCL_VERSION}")
        if self.nnodes > 1:
            self.nccl_init_lines(rank, local)
        if self.nnodes > 1 or len(set(self.ray_ips.values())) > 1:
            self.wk(rank, "WARNING", "mnnvl", "Custom collectives are disabled because this multi-node group does "
                                              "not have MNNVL-capable GPUs on every rank.")
        if rank == 0:
            self.wk(rank, "INFO", "ar", "Using ['PYNCCL'] all-reduce backends (in dispatch order) for group "
                                        "'tp:0' out of potential backends: ['FLASHINFER_PCIE_IPC', 'FLASHINFER', "
                                        "'NCCL_SYMM_MEM', 'QUICK_REDUCE', 'AITER_CUSTOM', 'CUSTOM', 'SYMM_MEM', "
                                        "'PYNCCL'].")
        tp_rank = rank % self.tp
        ep = f"ETP rank 0, EP rank {tp_rank}" if self.ep else f"ETP rank {tp_rank}, EP rank N/A"
        self.wk_once(rank, "assigned", f"rank {rank} in world size {self.world} is assigned as DP rank 0, PP rank "
                                       f"{rank // self.tp}, PCP rank 0, TP rank {tp_rank}, {ep}, EPLB rank N/A")
        self.wk_once(rank, "v2", "Using V2 Model Runner")
        self.worker_names[rank] = self.final_name(rank)

    def ph_load(self, rank: int) -> None:
        self.wk_once(rank, "scratch", "Loading model from scratch...")
        ab = self.args.attention_backend
        if ab and ab.lower() != "auto":
            self.wk_once(rank, "attn_explicit", f"Using {ab.upper()} backend.")
        else:
            self.wk_once(rank, "attn", "Using FLASH_ATTN attention backend out of potential backends: "
                                       "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].")
        self.wk_once(rank, "fa", "Using FlashAttention version 2")
        fs = fs_type(self.model)
        t_bytes = dir_bytes(Path(self.model))
        ram = mem_available_gib()
        self.wk_once(rank, "fs", f"Filesystem type for checkpoints: {fs}. Checkpoint size: {t_bytes / GiB:.2f} GiB. "
                                 f"Available RAM: {ram:.2f} GiB.")
        self.wk_once(rank, "prefetch", PREFETCH_MSG % fs)
        t = time.monotonic()
        self.pause(0.08)
        self.bar(rank, tqdm_text("Loading safetensors checkpoint shards", 1, time.monotonic() - t, True))
        self.wk_once(rank, "weights", f"Loading weights took {time.monotonic() - t:.2f} seconds", "weights-target")
        d_bytes = 0
        if self.spec and self.drafter_path:
            self._crash(rank, "load")
            self.drafter_checks(rank)
            aux = self.aux_layers()
            self.wk(rank, "INFO", "aux", f"Using Eagle3 auxiliary layers from config: {aux}")
            self.log.info_once(self.wname(rank), self.worker_pids[rank], AT["ir"],
                               "Final IR op priority after setting platform defaults: IrOpPriorityConfig("
                               "rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])")
            d_bytes = dir_bytes(self.drafter_path)
            self.wk_once(rank, "fs", f"Filesystem type for checkpoints: {fs_type(str(self.drafter_path))}. "
                                     f"Checkpoint size: {d_bytes / GiB:.2f} GiB. Available RAM: {ram:.2f} GiB.")
            t2 = time.monotonic()
            self.pause(0.04)
            self.bar(rank, tqdm_text("Loading safetensors checkpoint shards", 1, time.monotonic() - t2, True))
            self.mask_line(rank)
            self.wk_once(rank, "weights", f"Loading weights took {time.monotonic() - t2:.2f} seconds",
                         "weights-drafter")
        if FORK:  # the card's boot gates 1 and 2, on every rank (README@00d42fa "Expected boot gates")
            self.wk(rank, "INFO", "kv_layout", "Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend.")
            if self.spec and self.dflash2:
                layers = int(self.drafter_cfg.get("num_hidden_layers") or 0)
                self.wk(rank, "INFO", "drafter_group", "DFLASH2-DRAFTER-GROUP: GLM-5-Next fast path engaged with a "
                        f"spec-decode drafter group (drafter_layers={layers}, mamba_groups=4, tail_group=True)")
        gib = round((t_bytes + d_bytes) / self.tp / GiB, 2)
        self.wk(rank, "INFO", "model_load",
                f"Model loading took {gib} GiB memory and {time.monotonic() - t:.6f} seconds")
        if os.environ.get("VLLM_USE_FLASHINFER_SAMPLER") == "0":
            self.wk_once(rank, "flashinfer",
                         "FlashInfer top-p/top-k sampling disabled via VLLM_USE_FLASHINFER_SAMPLER=0.")

    def aux_layers(self) -> tuple:
        top = self.drafter_cfg.get("eagle_aux_hidden_state_layer_ids")
        if top:
            return tuple(top)
        ids = self.dflash_config.get("target_layer_ids") or self.drafter_cfg.get("target_layer_ids") or []
        return tuple(int(i) + 1 for i in ids)

    def drafter_checks(self, rank: int) -> None:
        dc = self.dflash_config
        if self.dflash2:
            for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
                if key not in dc:
                    raise BootFailure(rank, self.wname(rank), f"KeyError: '{key}'", FRAMES_DRAFT_LOAD, False,
                                      repr(key))
            h = int(self.drafter_cfg.get("hidden_size", 0))
            g = int(dc["conv_group_size"])
            if g <= 0 or h % g:
                msg = f"conv_group_size={g} must divide hidden_size={h}."
                raise BootFailure(rank, self.wname(rank), f"ValueError: {msg}", FRAMES_DRAFT_LOAD, False, msg)

    def mask_line(self, rank: int) -> None:
        mid = self.mask_token_id
        if mid is None or not self.drafter_path:
            return
        import zipfile

        try:
            state = read_mask_embedding(self.drafter_path / "mask_embedding.pt")
        except (zipfile.BadZipFile, pickle.UnpicklingError, StopIteration, OSError) as e:
            msg = f"Weights only load failed. {e}"
            raise BootFailure(rank, self.wname(rank), f"_pickle.UnpicklingError: {msg}", FRAMES_MASK[:-1], False,
                              msg) from None
        if state is None:
            return
        if isinstance(state, dict):
            got = state.get("mask_token_id", mid)
            if got != mid:
                msg = (f"mask_embedding.pt mask_token_id does not match dflash_config.mask_token_id ({mid}). "
                       f"Got {state.get('mask_token_id')}.")
                raise BootFailure(rank, self.wname(rank), f"ValueError: {msg}", FRAMES_MASK, False, msg)
        self.wk(rank, "INFO", "mask", f"Loaded DFlash mask embedding for mask_token_id {mid} from mask_embedding.pt")

    def _cache_hash(self) -> str:
        blob = json.dumps([self.model, self.tp, self.kv_dtype, self.comp, self.spec, self.max_model_len],
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def ph_compile(self, rank: int) -> None:
        root = Path(os.environ.get("VLLM_CACHE_ROOT", os.path.expanduser("~/.cache/vllm")))
        h = self._cache_hash()
        tags = ["backbone"] + (["dflash_head"] if self.spec else [])
        t_all = time.monotonic()
        for tag in tags:
            p = f"[{tag}] "
            d = root / "torch_compile_cache" / h / f"rank_{rank}_0" / tag
            hit = (d / "emulator-compiled").is_file()
            t = time.monotonic()
            self.wk(rank, "INFO", "tc_start", f"{p}Starting torch.compile")
            self.wk(rank, "INFO", "tc_cache", f"{p}Using cache directory: {d} for vLLM's torch.compile")
            self.pause(0.06 if not hit else 0.02)
            self.wk(rank, "INFO", "dynamo", f"{p}Dynamo bytecode transform time: {time.monotonic() - t:.2f} s")
            aot = root / "torch_compile_cache" / "torch_aot_compile" / hashlib.sha256(
                f"{h}{tag}".encode()).hexdigest() / f"rank_{rank}_0" / "model"
            if hit:
                t2 = time.monotonic()
                self.pause(0.02)
                self.wk(rank, "INFO", "tc_load", f"{p}Directly load the compiled graph(s) for compile range "
                                                 f"(1, {self.max_batched}) from the cache, took "
                                                 f"{time.monotonic() - t2:.3f} s")
            else:
                if tag == "backbone":  # the real capture logs the cache store for the backbone only
                    self.wk(rank, "INFO", "tc_store", f"{p}Cache the graph of compile range (1, "
                                                      f"{self.max_batched}) for later use")
                t2 = time.monotonic()
                self.pause(0.08)
                self.wk(rank, "INFO", "tc_compile", f"{p}Compiling a graph for compile range (1, {self.max_batched})"
                                                    f" takes {time.monotonic() - t2:.2f} s")
                with contextlib.suppress(OSError):
                    d.mkdir(parents=True, exist_ok=True)
                    (d / "emulator-compiled").write_text("compiled by the sparkserve engine emulator\n")
                self.wk(rank, "INFO", "aot_save", f"{p}saved AOT compiled function to {aot}")
            self.wk(rank, "INFO", "tc_total", f"{p}torch.compile took {time.monotonic() - t:.2f} s in total")
            t3 = time.monotonic()
            self.pause(0.02)
            self.wk(rank, "INFO", "warmup", f"{p}Initial profiling/warmup run took {time.monotonic() - t3:.2f} s")
        self.compile_seconds = max(self.compile_seconds, time.monotonic() - t_all)
        self._crash(rank, "compile")

    def weights_gib(self) -> float:
        d = dir_bytes(self.drafter_path) if self.drafter_path else 0
        return (dir_bytes(Path(self.model)) + d) / self.tp / GiB

    def ph_kv(self, rank: int) -> int:
        """Returns this rank's KV bytes (the EngineCore takes the minimum over all ranks)."""
        total = self.device_gib * GiB
        free = total - 1.39 * GiB
        kvb = self.args.kv_cache_memory_bytes
        self._crash(rank, "kv")
        if kvb:
            self.wk(rank, "INFO", "kv_reserved", KV_RESERVED_MSG.format(free=round(free / GiB, 2),
                                                                        kv=round(kvb / GiB, 2)))
            avail = int(kvb)
        else:
            gmu = float(self.args.gpu_memory_utilization or 0.92)
            cg = 0.12 * GiB if self.graphs and not self.graphs_off(rank) else 0.0
            avail = int(gmu * total - (total - free) - self.weights_gib() * GiB - 0.5 * GiB - cg)
            if self.graphs and not self.graphs_off(rank):
                self.capture_lines(rank, profile_only=True)
            self.wk_once(rank, "kv_avail", f"Available KV cache memory: {round(max(avail, 0) / GiB, 2)} GiB")
            if cg:
                eq = gmu - cg / total
                self.wk(rank, "INFO", "cg_profiling", CG_PROFILING_MSG % (gmu, eq, gmu + cg / total))
        return avail

    def kv_allocate(self, rank: int) -> None:
        if self.faults.for_rank("oom", rank):
            need = self.kv_plan.num_blocks * KV_BLOCK * self.kv_plan.bytes_per_token if self.kv_plan else GiB
            total = self.device_gib
            msg = (f"CUDA out of memory. Tried to allocate {need / GiB:.2f} GiB. GPU 0 has a total capacity of "
                   f"{total:.2f} GiB of which {min(need / GiB * 0.4, 1.07):.2f} GiB is free. Including non-PyTorch "
                   f"memory, this process has {total - 1.4:.2f} GiB memory in use. Of the allocated memory "
                   f"{total - 3.1:.2f} GiB is allocated by PyTorch, and 412.00 MiB is reserved by PyTorch but "
                   "unallocated. If reserved but unallocated memory is large try setting "
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
                   "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
            raise BootFailure(rank, self.wname(rank), f"torch.OutOfMemoryError: {msg}", FRAMES_KV_OOM, True, msg)

    def graphs_off(self, rank: int) -> bool:
        return self.faults.for_rank("graphs_off", rank) is not None

    def k_rule_wedge(self) -> bool:
        bs = self.block_size
        return bool(self.spec and self.dflash2 and bs is not None and self.k > bs - 1)

    def capture_lines(self, rank: int, profile_only: bool = False) -> None:
        t = time.monotonic()
        sizes = self.capture_sizes()
        decode = [s for s in sizes if self.k and s % (1 + self.k) == 0] or sizes
        mode = self.cg_mode
        if mode in ("PIECEWISE", "FULL_AND_PIECEWISE"):
            self.bar(rank, tqdm_text("Capturing CUDA graphs (PIECEWISE)", len(sizes), 0.18))
        if mode in ("FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"):
            n = len(decode) if mode != "FULL" else len(sizes)
            self.bar(rank, tqdm_text("Capturing CUDA graphs (FULL)", 2 if profile_only else n, 0.06))
        if self.spec:
            name = "DFlash2" if self.dflash2 else "DFlash"
            if self.mtp:  # vLLM 0.33.0 MTPSpeculator (a TargetDependentARSpeculator) names no method; its bar is
                # the EAGLE/MTP-style decode capture (vllm-facts.md 2.4)
                self.wk(rank, "INFO", "spec_capture_ar", "Capturing model for speculator...")
                self.bar(rank, tqdm_text("Capturing decode CUDA graphs (FULL)", len(decode), 0.03))
            else:
                self.wk(rank, "INFO", "spec_capture", f"Capturing model for {name} speculator...")
            if self.k_rule_wedge() and not profile_only:
                raise Wedged()
            if not self.mtp:
                self.bar(rank, tqdm_text(f"Capturing {name.lower()} CUDA graphs (FULL)", len(decode), 0.03))
        self.pause(0.1)
        secs = max(1, round(time.monotonic() - t))
        self.wk(rank, "INFO", "graphs", f"Graph capturing finished in {secs:.0f} secs, took 0.12 GiB")

    def ph_capture(self, rank: int) -> None:
        self.kv_allocate(rank)
        self._crash(rank, "capture")
        if self.graphs_off(rank):
            self.pause(0.1)
            return
        self.capture_lines(rank)
        if not self.args.kv_cache_memory_bytes:
            self.wk(rank, "INFO", "cg_pool", "CUDA graph pool memory: 0.12 GiB (actual), 0.12 GiB (estimated), "
                                             "difference: 0.0 GiB (0.0%).")

    def ph_warmup(self, rank: int) -> None:
        if not self.graphs:
            self.kv_allocate(rank)
            if self.k_rule_wedge():
                raise Wedged()
        self.pause(0.05)
        self.wk(rank, "INFO", "jit", "Kernel JIT monitor activated; monitored JIT compilations during inference "
                                     "will use mode=warn.")

    def phases(self) -> list[str]:
        ph = ["init", "load"]
        if self.compile:
            ph.append("compile")
        ph.append("kv")
        if self.graphs:
            ph.append("capture")
        ph.append("warmup")
        return ph

    # ---------------------------------------------------------------- failure output

    def worker_failure_lines(self, f: BootFailure) -> None:
        msg = "WorkerProc hit an exception." if f.rpc else "WorkerProc failed to start."
        key = "wp_hit" if f.rpc else "wp_failed_start"
        self.log.line(f.proc, self.worker_pids.get(f.rank, self.pid), "ERROR", AT[key],
                      msg + "\n" + traceback_text(f.frames, f.exc_line))

    def engine_failed_lines(self, f: BootFailure | None, rpc_msg: str | None) -> None:
        if rpc_msg is not None:
            exc = (f"RuntimeError: Worker failed with error '{rpc_msg}', please check the stack trace above for "
                   "the root cause")
            frames = FRAMES_EC_RPC
        else:
            exc = ("Exception: WorkerProc initialization failed due to an exception in a background process. "
                   "See stack trace for root cause.")
            frames = FRAMES_EC_WORKERS
        self.core("ERROR", "ec_failed_start", "EngineCore failed to start.\n" + traceback_text(frames, exc))
        self.api_exit_failed()

    def api_exit_failed(self) -> None:
        text = traceback_text(FRAMES_API_FAILED, "RuntimeError: Engine core initialization failed. See root cause "
                                                 "above. Failed core proc(s): {'EngineCore': 1}")
        self.log.raw(text + "\n")
        self.close_peers()
        sys.stdout.flush()
        os._exit(1)

    def api_exit_timeout(self) -> None:
        exc = ("TimeoutError: Timed out waiting for engine core processes to start. This is often caused by slow "
               f"weight loading for large models. Waited {int(self.ready_timeout)}s (configured by "
               "VLLM_ENGINE_READY_TIMEOUT_S). To increase the timeout, set the environment variable: "
               "VLLM_ENGINE_READY_TIMEOUT_S=<seconds>")
        self.log.raw(traceback_text(FRAMES_API_TIMEOUT, exc) + "\n")
        self.close_peers()
        os._exit(1)

    def close_peers(self) -> None:
        for p in self.peers:
            p.close()

    # ---------------------------------------------------------------- head

    def stall(self, until, what: str, shm: bool) -> None:
        """Wait until ``until()`` is true; log the shm line like EngineCore; API timeout at the ready limit."""
        last = time.monotonic()
        while not until():
            time.sleep(0.05)
            now = time.monotonic()
            if shm and now - last >= self.ring_interval:
                self.core("INFO", "shm", SHM_MSG % self.ring_interval)
                last = now
            if now - self.t0 > self.ready_timeout:
                self.api_exit_timeout()

    def run_head(self) -> int:
        a = self.args
        if os.environ.get("VLLM_DISABLE_LOG_LOGO") == "1":
            self.api("INFO", "logo", f"vLLM server version {VERSION}, serving model {self.model}")
        else:
            logo = ("\n       █     █     █▄   ▄█\n"
                    f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {VERSION}\n"
                    f"  █▄█▀ █     █     █     █  model   {self.model}\n"
                    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n")
            self.api("INFO", "logo", logo)
        self.api("INFO", "nondefault", f"non-default args: {redact(self.non_default_args())}")
        self.config_lines(lambda lvl, key, msg: self.api(lvl, key, msg))
        err = self.config_errors()
        if err:
            self.log.raw(traceback_text(FRAMES_API_START[:3], err) + "\n")
            return 1
        self.pause(0.05)
        self.core("INFO", "engine_cfg", f"Initializing a V1 LLM engine (v{VERSION}) with config: "
                                        f"{self.engine_config_repr()}")
        if self.nnodes > 1:
            self.core("INFO", "dp_leader", f"DP group leader: node_rank=0, node_rank_within_dp=0, "
                                           f"master_addr={a.master_addr}, mq_connect_ip={a.master_addr} (local), "
                                           f"world_size={self.world}, local_world_size={self.local_world}")
            self.accept_followers()
        if self.ray:
            self.ray_placement()
        kv_min: int | None = None
        for ph in self.phases():
            for p in self.peers:
                p.send(op="phase", name=ph)
            try:
                results = [self.phase(ph, r) for r in self.ranks]
            except BootFailure as f:
                self.worker_failure_lines(f)
                self.engine_failed_lines(f, f.short if f.rpc else None)
                return 1
            except Wedged:
                self.stall(lambda: False, "wedge", shm=True)
                return 1
            if ph == "kv":
                kv_min = min(int(x) for x in results)
            remote = self.wait_followers(ph)
            if ph == "kv":
                for m in remote:
                    if m.get("kv") is not None:
                        kv_min = min(kv_min or m["kv"], int(m["kv"]))
                self.kv_pool_line(kv_min or 0)
        self.core("INFO", "init_engine_eager" if not self.compile else "init_engine",
                  f"init engine (profile, create kv cache, warmup model) took {time.monotonic() - self.t0:.2f} s"
                  + (f" (compilation: {self.compile_seconds:.2f} s)" if self.compile else ""))
        self.core("INFO", "ir", "Final IR op priority after setting platform defaults: IrOpPriorityConfig("
                                "rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])")
        return self.serve_api()

    def kv_pool_line(self, kv_bytes: int) -> None:
        if kv_bytes <= 0:
            msg = ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                   "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
                   "despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for "
                   "more details.")
            self.core("ERROR", "ec_failed_start", "EngineCore failed to start.\n" + traceback_text(
                FRAMES_ENGINE_START + [(V("v1/engine/core.py"), 163, "__init__",
                                        "kv_cache_config = self._initialize_kv_caches(vllm_config)")],
                f"ValueError: {msg}"))
            self.api_exit_failed()
        self.kv_plan = kv_cache_plan(self.target_cfg, self.drafter_cfg if self.spec else None, kv_bytes=kv_bytes,
                                     kv_cache_dtype=self.kv_dtype, tp=self.tp, max_model_len=self.max_model_len)
        p = self.kv_plan
        if FORK:  # the card's tokens per byte (see CARD_POOL_TOKENS)
            tokens = kv_bytes * CARD_POOL_TOKENS // CARD_KV_BYTES
            p = self.kv_plan = KVPlan(max(1, tokens // KV_BLOCK), tokens, tokens / max(1, self.max_model_len),
                                      CARD_KV_BYTES / CARD_POOL_TOKENS)
        self.core("INFO", "kv_size", f"GPU KV cache size: {p.tokens:,} tokens, Maximum concurrency for "
                                     f"{self.max_model_len:,} tokens per request: {p.max_concurrency:.2f}x")

    def accept_followers(self) -> None:
        a = self.args
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((a.master_addr, a.master_port))
        except OSError as e:
            exc = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                   f"network address. port: {a.master_port}, useIpv6: false, code: -98, name: EADDRINUSE, message: "
                   f"address already in use ({e.strerror})")
            f = BootFailure(0, "Worker", exc, FRAMES_NCCL_INIT[:4], False, exc)
            self.worker_failure_lines(f)
            self.engine_failed_lines(f, None)
        srv.listen(16)
        srv.settimeout(0.2)
        need = self.nnodes - 1
        got: dict[int, Peer] = {}
        while len(got) < need:
            if time.monotonic() - self.t0 > self.ready_timeout:
                self.api_exit_timeout()
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = Peer(conn)
            hello = peer.recv()
            if not hello or hello.get("op") != "hello":
                peer.close()
                continue
            peer.rank = int(hello["node_rank"])  # type: ignore[attr-defined]
            got[peer.rank] = peer  # type: ignore[attr-defined]
        srv.close()
        self.peers = [got[r] for r in sorted(got)]

    def wait_followers(self, ph: str) -> list[dict]:
        """Barrier at the end of a boot phase. A follower that fails or vanishes makes the head wait like the
        real one: inside an RPC (after WorkerProc init) its failure comes back as the RPC's error; before, the
        head's own rank 0 waits on the peer until torch's watchdog (SSEMU_PEER_TIMEOUT_S here, 600 s for real)
        takes it down."""
        rpc = ph not in ("init", "load")
        out: list[dict] = []
        for p in self.peers:
            box: dict[str, Any] = {}

            def reader(p: Peer = p, box: dict = box) -> None:
                while True:
                    m = p.recv()
                    if m is None or m.get("name") == ph:
                        box["m"] = m
                        return

            threading.Thread(target=reader, daemon=True).start()
            self.stall(lambda box=box: "m" in box, ph, rpc)
            m = box["m"]
            if m is not None and m.get("op") == "done":
                out.append(m)
                continue
            if m is not None and m.get("rpc"):
                self.engine_failed_lines(None, m.get("error", ""))
            if rpc:  # the RPC never returns: EngineCore waits on the response queue
                self.stall(lambda: False, ph, True)
            deadline = time.monotonic() + env_float("SSEMU_PEER_TIMEOUT_S", 10.0)
            self.stall(lambda d=deadline: time.monotonic() > d, ph, False)
            self.watchdog_line(self.ranks[0])
            self.engine_failed_lines(None, None)
        return out

    # ---------------------------------------------------------------- ray (driver side)

    def ray_placement(self) -> None:
        """Join the local Ray cluster (``ray start --head`` wrote its address), wait for one GPU per rank,
        place rank 0 on this node and the others on the joined nodes, as a placement group would."""
        addr = os.environ.get("RAY_ADDRESS", "auto")
        if addr in ("", "auto"):
            try:
                addr = Path(RAY_CLUSTER_FILE).read_text().strip()
            except OSError:
                exc = ("ConnectionError: Could not find any running Ray instance. Please specify the one to "
                       "connect to by setting `--address` flag or `RAY_ADDRESS` environment variable.")
                self.core("ERROR", "ec_failed_start", "EngineCore failed to start.\n" +
                          traceback_text(FRAMES_EC_WORKERS[:4], exc))
                self.api_exit_failed()
        host, _, port = addr.rpartition(":")
        s = socket.create_connection((host, int(port)), timeout=10)
        s.settimeout(None)
        self.ray_peer = Peer(s)
        self.ray_peer.send(op="driver")
        self.ray_nodes: list[dict] = []
        self.core("INFO", "ray_pg", "No current placement group found. Creating a new placement group.")
        t0, warn_at, interval = time.monotonic(), 10.0, 10.0
        while True:
            m = self.ray_peer.recv()
            if m is None:
                self.api_exit_timeout()
            nodes = [n for n in m.get("nodes", []) if n.get("alive")]
            if sum(int(n.get("gpus") or 0) for n in nodes) >= self.world:
                self.ray_nodes = nodes
                break
            waited = time.monotonic() - t0
            if waited >= warn_at:
                specs = [{"GPU": 1.0, f"node:{host}": 0.001}] + [{"GPU": 1.0}] * (self.world - 1)
                self.core("INFO", "ray_pg_wait", RAY_PG_WAIT % (int(waited), specs))
                interval *= 2
                warn_at += interval
        slots = [n["ip"] for n in nodes for _ in range(int(n.get("gpus") or 0))]
        head_first = sorted(slots, key=lambda ip: ip != host)
        for r in self.ranks:
            self.ray_ips[r] = head_first[r]
            pid = self.worker_pids[r]
            self.log.outer[pid] = (f"(RayWorkerProc pid={pid}) " if head_first[r] == host
                                   else f"(RayWorkerProc pid={pid}, ip={head_first[r]}) ")
        threading.Thread(target=self._ray_reader, daemon=True).start()

    def _ray_reader(self) -> None:
        while True:
            m = self.ray_peer.recv()
            if m is None:
                return
            alive = {n["ip"] for n in m.get("nodes", []) if n.get("alive")}
            self.ray_alive = alive

    def ray_watch(self) -> None:
        """A node that leaves the cluster takes its rank's actor with it: the executor notices and fails."""
        while not self.stop_event.wait(0.2):
            alive = getattr(self, "ray_alive", None)
            if alive is None:
                continue
            dead = [r for r, ip in self.ray_ips.items() if ip not in alive]
            if dead and not self.worker_dead:
                self.worker_dead = True
                self.core("ERROR", "ray_died", f"RayWorkerProc rank={dead} died unexpectedly, shutting down executor.")
                self.core("ERROR", "ec_fatal", "EngineCore encountered a fatal error.\n" +
                          traceback_text(FRAMES_EC_FATAL, "RuntimeError: Executor failed."))
                self.engine_died()
                return

    # ---------------------------------------------------------------- follower

    def run_follower(self) -> int:
        a = self.args
        self.config_lines(lambda lvl, key, msg: self.main(lvl, key, msg))
        err = self.config_errors()
        if err:
            self.log.raw(traceback_text(FRAMES_HEADLESS, err) + "\n")
            return 1
        self.main("INFO", "headless", f"Launching vLLM (v{VERSION}) headless multiproc executor, with head node "
                                      f"address {a.master_addr}:{a.master_port} for torch.distributed process group.")
        peer = self.connect_head()
        self.head_peer = peer
        peer.send(op="hello", node_rank=self.node_rank, pid=self.pid)
        while True:
            m = peer.recv()
            if m is None:
                return self.head_lost()
            if m.get("op") == "phase":
                ph = m["name"]
                try:
                    res = [self.phase(ph, r) for r in self.ranks]
                except BootFailure as f:
                    self.worker_failure_lines(f)
                    peer.send(op="fail", name=ph, rpc=f.rpc, error=f.short)
                    if not f.rpc:
                        exc = ("Exception: WorkerProc initialization failed due to an exception in a background "
                               "process. See stack trace for root cause.")
                        self.log.raw(traceback_text(FRAMES_HEADLESS, exc) + "\n")
                        peer.close()
                        return 1
                    continue
                except Wedged:
                    while True:
                        time.sleep(3600)
                peer.send(op="done", name=ph, kv=(min(res) if ph == "kv" else None))
                if ph == "warmup":
                    self.ready = True
                    threading.Thread(target=self.follower_faults_after_boot, daemon=True).start()
            elif m.get("op") == "req":
                self.follower_request(int(m["n"]), peer)
            elif m.get("op") == "shutdown":
                self.follower_shutdown_lines()
                return 0

    def connect_head(self) -> Peer:
        a = self.args
        while True:
            try:
                s = socket.create_connection((a.master_addr, a.master_port), timeout=5)
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return Peer(s)
            except OSError:
                time.sleep(0.2)

    def follower_request(self, n: int, peer: Peer) -> None:
        for r in self.ranks:
            f = self.faults.for_rank("worker_death", r)
            if f and n >= (f.int("after", 1) or 1):
                self.local_worker_died(r, -9)
            f = self.faults.for_rank("nccl_timeout", r)
            if f and f.params.get("at", "request") == "request" and n >= (f.int("request", 1) or 1):
                self.nccl_watchdog(r)
        peer.send(op="ack", n=n)

    def control_loop(self) -> None:
        """``SSEMU_CONTROL``: a control file whose faults (the ``SSEMU_FAULTS`` syntax) are added to the boot's
        while the engine runs — written: the fault starts now; removed: it ends (a test's "fault at time T")."""
        path, seen = Path(os.environ["SSEMU_CONTROL"]), None
        while True:
            try:
                text = path.read_text()
            except OSError:
                text = ""
            if text != seen:
                seen = text
                self.faults = Faults(self.boot_faults + parse_faults(text))
            time.sleep(0.2)

    def memory_leak(self) -> None:
        """``mem_leak``: this node's fake /proc/meminfo, MemFree falling once a second (a UVM leak)."""
        while True:  # the fault may come later, through SSEMU_CONTROL
            f = next((self.faults.for_rank("mem_leak", r) for r in self.ranks if self.faults.for_rank("mem_leak", r)),
                     None)
            if f is not None and f.params.get("path"):
                break
            if self.stop_event.wait(0.5):
                return
        path = Path(f.params["path"])
        start = float(f.params.get("start_gib", "100")) * GiB
        step = float(f.params.get("mib_s", "2048")) * (1 << 20)
        total = int(self.device_gib * GiB)

        def write(free: float) -> None:
            kb = int(max(free, 0) // 1024)
            text = (f"MemTotal:       {total // 1024} kB\nMemFree:        {kb} kB\n"
                    f"MemAvailable:   {kb + (8 << 20)} kB\nCached:         {8 << 20} kB\n")
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            with contextlib.suppress(OSError):
                tmp.write_text(text)
                os.replace(tmp, path)

        free = start
        while not self.stop_event.is_set() and any(self.faults.for_rank("mem_leak", r) for r in self.ranks):
            write(free)
            free -= step
            self.stop_event.wait(1.0)
        write(start)  # the leak ended (its process stops, or the fault was lifted): the memory comes back

    def follower_faults_after_boot(self) -> None:
        threading.Thread(target=self.memory_leak, daemon=True).start()
        for r in self.ranks:
            f = self.faults.for_rank("nccl_timeout", r)
            if f and f.params.get("at") == "boot":
                self.nccl_watchdog(r)

    def watchdog_line(self, rank: int) -> None:
        ts = time.strftime("%m%d %H:%M:%S") + f".{int(time.time() * 1e9) % 10**9:09d}"
        self.log.raw(f"[rank{rank}]:[E{ts} ProcessGroupNCCL.cpp:629] [Rank {rank}] Watchdog caught collective "
                     "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1, "
                     "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n")

    def nccl_watchdog(self, rank: int) -> None:
        """A collective that never completes: the watchdog fires and takes the worker down (SIGABRT)."""
        self.collective_hung = True
        time.sleep(env_float("SSEMU_NCCL_TIMEOUT_S", 3.0))
        self.watchdog_line(rank)
        self.local_worker_died(rank, -6)

    def local_worker_died(self, rank: int, code: int) -> None:
        """One of this node's workers died: the executor owning it logs and shuts down."""
        if self.headless:
            self.main("ERROR", "worker_died", f"Worker proc VllmWorker-{rank} died unexpectedly (exit code: "
                                              f"{code}), shutting down executor.")
            if self.head_peer:
                self.head_peer.close()
            sys.stdout.flush()
            os._exit(1)
        self.worker_dead = True
        with self.ack_cond:
            self.ack_cond.notify_all()
        self.core("ERROR", "worker_died", f"Worker proc VllmWorker-{rank} died unexpectedly (exit code: {code}), "
                                          "shutting down executor.")
        self.core("ERROR", "ec_fatal", "EngineCore encountered a fatal error.\n" +
                  traceback_text(FRAMES_EC_FATAL, "RuntimeError: Executor failed."))
        self.engine_died()

    def engine_killed(self) -> None:
        """``engine_kill``: kill -9 of the EngineCore process (one node). Real 0.33.0 (issue 43, boot-killed.log):
        the API server's process manager logs its SIGTERM to the dead process first, then the engine's death."""
        self.api("INFO", "pm_sigterm", "[shutdown] Process manager: send sigterm to process EngineCore")
        self.engine_died()

    def engine_died(self) -> None:
        self.engine_dead = True
        self.api("WARNING", "mp_dead", "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")
        # the monitor thread then shuts the client down and the output handler fails (core_client.py
        # monitor_engine_cores → MPClient.shutdown; async_llm.py output_handler), as the real 0.33.0 run logged
        self.api("INFO", "sd_mp_start", "[shutdown] MPClient: start timeout=default")
        self.api("INFO", "sd_mp_stop", "[shutdown] MPClient: stopping engine manager")
        self.api("INFO", "sd_mp_stopped", "[shutdown] MPClient: engine manager stopped")
        self.api("INFO", "sd_mp_clean", "[shutdown] MPClient: cleaning up background resources")
        self.api("INFO", "sd_mp_done", "[shutdown] MPClient: complete")
        self.api("ERROR", "output_handler", "AsyncLLM output_handler failed.\n" +
                 traceback_text(FRAMES_OUTPUT_HANDLER, ENGINE_DEAD))
        self.close_peers()
        if os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH") != "1":
            def _exit() -> None:
                time.sleep(3.0)
                self.log.uvicorn("Shutting down")
                self.log.uvicorn("Waiting for application shutdown.")
                self.log.uvicorn("Application shutdown complete.")
                self.log.uvicorn(f"Finished server process [{self.pid}]")
                os._exit(1)
            threading.Thread(target=_exit, daemon=True).start()

    def head_lost(self) -> int:
        """The head went away: torch's c10d store heartbeat complains every second (as captured)."""
        rank = self.ranks[0]
        port = self.args.master_port
        fd, lport = 31, 36000 + self.pid % 1000
        first = True
        while not self.stop_event.is_set():
            ts = time.strftime("%m%d %H:%M:%S") + f".{int(time.time() * 1e9) % 10**9:09d}"
            if first:
                self.log.raw(f"[rank{rank}]:[W{ts} TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd={fd}, "
                             f"addr=[localhost]:{lport}, remote=[{self.args.master_addr}]:{port}): Failed to recv, "
                             "got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?\n")
                self.log.raw(f"[rank{rank}]:[W{ts} ProcessGroupNCCL.cpp:1826] [PG ID 0 PG GUID 0 Rank {rank}] "
                             'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut '
                             "down too early), with error: Failed to recv, got 0 bytes. Connection was likely closed. "
                             "Did the remote server shutdown or crash?\n")
                first = False
            else:
                self.log.raw(f"[rank{rank}]:[W{ts} TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd={fd}, "
                             f"addr=[localhost]:{lport}, remote=[{self.args.master_addr}]:{port}): Broken pipe\n")
                self.log.raw(f"[rank{rank}]:[W{ts} ProcessGroupNCCL.cpp:1826] [PG ID 0 PG GUID 0 Rank {rank}] "
                             'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut '
                             "down too early), with error: Broken pipe\n")
            self.stop_event.wait(env_float("SSEMU_STORE_RETRY_S", 1.0))
        self.follower_shutdown_lines()
        return 0

    def follower_shutdown_lines(self) -> None:
        self.main("INFO", "sd_ex_wait", f"[shutdown] Executor: waiting for worker exit count={len(self.ranks)}")
        for r in self.ranks:
            self.log.info_once(self.wname(r), self.worker_pids[r], AT["parent_exit"],
                               "Parent process exited, terminating worker queues")
        self.main("INFO", "sd_ex_done", "[shutdown] Executor: all workers exited gracefully")

    # ---------------------------------------------------------------- API server

    def serve_api(self) -> int:
        a = self.args
        self.engine = Engine(self)
        host = a.host or "0.0.0.0"
        self.api("INFO", "tasks", "Supported tasks: ['generate']")
        self.api("INFO", "chat_fmt", "Detected the chat template content format to be 'string'. You can set "
                                     "`--chat-template-content-format` to override this.")
        self.api("INFO", "starting", f"Starting vLLM server on http://{host}:{a.port}")
        self.api("INFO", "routes", "Available routes are:")
        for path, meth in ROUTES:
            self.api("INFO", "route", f"Route: {path}, Methods: {meth}")
        try:
            server_cls, handler_cls = _http_classes()
            server = server_cls((a.host or "", a.port), handler_cls)
        except OSError as e:
            self.log.raw(traceback_text(FRAMES_API_START[:4], f"OSError: [Errno {e.errno}] {e.strerror}") + "\n")
            return 1
        server.emu = self
        self.log.uvicorn(f"Started server process [{self.pid}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        self.ready = True
        threading.Thread(target=self.stats_loop, daemon=True).start()
        threading.Thread(target=self.memory_leak, daemon=True).start()
        threading.Thread(target=self.watch_followers, daemon=True).start()
        threading.Thread(target=self.hang_logger, daemon=True).start()
        if self.ray:
            threading.Thread(target=self.ray_watch, daemon=True).start()
        for r in self.ranks:
            f = self.faults.for_rank("nccl_timeout", r)
            if f and f.params.get("at") == "boot":
                threading.Thread(target=self.nccl_watchdog, args=(r,), daemon=True).start()
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        self.stop_event.wait()
        self.head_shutdown_lines()
        server.shutdown()
        return 0  # followers are not told: they find the store gone, as real ones do

    def head_shutdown_lines(self) -> None:
        self.api("INFO", "sd_api_trigger", "[shutdown] API server: shutdown triggered")
        self.api("INFO", "sd_api_stop", "[shutdown] API server: stopping engine client mode=abort timeout=0s")
        self.api("INFO", "sd_mp_start", "[shutdown] MPClient: start timeout=0")
        self.api("INFO", "sd_mp_stop", "[shutdown] MPClient: stopping engine manager")
        self.core("INFO", "sd_ec_signal", "[shutdown] EngineCore: trigger received signal=SIGTERM")
        self.core("INFO", "sd_ec_start", "[shutdown] EngineCore: start mode=abort timeout=0s")
        self.core("INFO", "sd_ec_teardown", "[shutdown] EngineCore: request processing complete; starting resource "
                                            "teardown")
        self.core("INFO", "sd_ec_exit", "[shutdown] EngineCore: exiting busy loop")
        for r in self.ranks:
            self.log.line(self.wname(r), self.worker_pids[r], "INFO", AT["parent_exit"],
                          "Parent process exited, terminating worker queues")
        self.core("INFO", "sd_ex_wait", f"[shutdown] Executor: waiting for worker exit count={len(self.ranks)}")
        self.core("INFO", "sd_ex_done", "[shutdown] Executor: all workers exited gracefully")
        self.api("INFO", "sd_mp_stopped", "[shutdown] MPClient: engine manager stopped")
        self.api("INFO", "sd_mp_clean", "[shutdown] MPClient: cleaning up background resources")
        self.api("INFO", "sd_mp_done", "[shutdown] MPClient: complete")
        self.api("INFO", "sd_api_stopped", "[shutdown] API server: engine client stopped")
        self.api("INFO", "sd_api_signal", "[shutdown] API server: signalling HTTP server shutdown")
        self.api("INFO", "sd_api_fastapi", "[shutdown] API server: shutting down FastAPI HTTP server")
        self.log.uvicorn("Shutting down")
        self.log.uvicorn("Waiting for application shutdown.")
        self.log.uvicorn("Application shutdown complete.")

    def watch_followers(self) -> None:
        """Followers ack every request (the collective of its first step); a closed connection = dead."""
        def reader(p: Peer) -> None:
            rank = getattr(p, "rank", -1)
            while True:
                m = p.recv()
                if m is None:
                    break
                if m.get("op") == "ack":
                    with self.ack_cond:
                        self.acks[rank] = max(self.acks.get(rank, 0), int(m["n"]))
                        self.ack_cond.notify_all()
            with self.ack_cond:
                self.dead_followers.add(rank)
                self.ack_cond.notify_all()

        for p in self.peers:
            threading.Thread(target=reader, args=(p,), daemon=True).start()

    def wait_collective(self, n: int) -> None:
        """Every rank takes part in request n's first step; a dead or hung peer hangs it (forever)."""
        with self.ack_cond:
            while True:
                if self.dead_followers or self.collective_hung or self.worker_dead:
                    break
                if all(self.acks.get(getattr(p, "rank", -1), 0) >= n for p in self.peers):
                    return
                self.ack_cond.wait(0.2)
        self.hang_forever()

    def hang_logger(self) -> None:
        last = time.monotonic()
        while not self.stop_event.is_set():
            time.sleep(0.1)
            with self.hung_lock:
                hung = self.hung
            if hung <= 0:
                last = time.monotonic()
                continue
            if time.monotonic() - last >= self.ring_interval:
                self.core("INFO", "shm", SHM_MSG % self.ring_interval)
                last = time.monotonic()

    def stats_loop(self) -> None:
        interval = env_float("VLLM_LOG_STATS_INTERVAL", 10.0)
        eng = self.engine
        assert eng is not None
        while not self.stop_event.wait(interval):
            iv, prompt, gen, dt, running, waiting = eng.stats_snapshot()
            if self.args.disable_log_stats or self.engine_dead:
                continue
            idle = prompt == 0 and gen == 0 and running == 0 and waiting == 0
            if idle:
                continue  # vLLM logs at DEBUG when idle
            dt = max(dt, 1e-6)
            usage = 0.0
            if self.kv_plan and self.kv_plan.tokens:
                usage = min(100.0, running * 100 * 512 / self.kv_plan.tokens)
            self.api("INFO", "stats", f"Engine 000: Avg prompt throughput: {prompt / dt:.1f} tokens/s, Avg "
                                      f"generation throughput: {gen / dt:.1f} tokens/s, Running: {running} reqs, "
                                      f"Waiting: {waiting} reqs, GPU KV cache usage: {usage:.1f}%, Prefix cache hit "
                                      "rate: 0.0%")
            if iv.drafts:
                rates = ", ".join(f"{x / iv.drafts:.3f}" for x in iv.per_pos)
                mal = 1 + iv.accepted / iv.drafts
                self.api("INFO", "spec", f"SpecDecoding metrics: Mean acceptance length: {mal:.2f}"
                                         f", Accepted throughput: {iv.accepted / dt:.2f} tokens/s, Drafted throughput: "
                                         f"{iv.draft_tokens / dt:.2f} tokens/s, Accepted: {iv.accepted} tokens, "
                                         f"Drafted: {iv.draft_tokens} tokens, Per-position acceptance rate: {rates}, "
                                         f"Avg Draft acceptance rate: {iv.accepted / iv.draft_tokens * 100:.1f}%")

    # ---------------------------------------------------------------- requests

    def begin_request(self) -> int:
        with self.request_lock:
            self.request_counter += 1
            n = self.request_counter
        f = self.faults.get("engine_kill")
        if f and n >= (f.int("after", 1) or 1) and not self.engine_dead:
            self.engine_killed()  # in this request's thread: every line is out before its stream fails
        for r in self.ranks:
            f = self.faults.for_rank("worker_death", r)
            if f and n >= (f.int("after", 1) or 1) and not self.worker_dead:
                self.worker_dead = True
                threading.Thread(target=self.local_worker_died, args=(r, -9), daemon=True).start()
            f = self.faults.for_rank("nccl_timeout", r)
            if f and f.params.get("at", "request") == "request" and n >= (f.int("request", 1) or 1) \
                    and not self.collective_hung:
                self.collective_hung = True
                threading.Thread(target=self.nccl_watchdog, args=(r,), daemon=True).start()
        for p in self.peers:
            if p.alive:
                p.send(op="req", n=n)
        return n

    def cluster_ok(self) -> bool:
        return not self.dead_followers and not self.collective_hung and not self.worker_dead

    def hang_forever(self) -> None:
        with self.hung_lock:
            self.hung += 1
        try:
            while not self.stop_event.is_set():
                if self.engine_dead:
                    raise EngineDead()
                time.sleep(0.2)
        finally:
            with self.hung_lock:
                self.hung -= 1
        raise EngineDead()


class EngineDead(Exception):
    pass


class _Repr:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def redact(d: dict) -> dict:
    return {k: ("***" if k in ("api_key", "hf_token", "watermark_config") else v) for k, v in d.items()}


KV_CACHE_DTYPES = (
    "auto", "bfloat16", "float16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head",
    "int4_per_token_head", "int8_per_token_head", "nvfp4", "nvfp4_4over6", "nvfp4_ds_mla", "octave_k3v3",
    "octave_k3v3_compact", "octave_k3v4", "turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k3v4_nc",
    "turboquant_k8v4", "ultraquant_4bit",
)
CG_ENUM = {"NONE": "<CUDAGraphMode.NONE: 0>", "PIECEWISE": "<CUDAGraphMode.PIECEWISE: 1>",
           "FULL": "<CUDAGraphMode.FULL: 2>", "FULL_DECODE_ONLY": "<CUDAGraphMode.FULL_DECODE_ONLY: (2, 0)>",
           "FULL_AND_PIECEWISE": "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>"}
COMP_DEFAULTS = [
    ("mode", "None"), ("debug_dump_path", "None"), ("cache_dir", "''"), ("compile_cache_save_format", "'binary'"),
    ("backend", "'inductor'"), ("custom_ops", "[]"), ("ir_enable_torch_wrap", "None"), ("splitting_ops", "None"),
    ("compile_mm_encoder", "False"), ("cudagraph_mm_encoder", "False"), ("encoder_cudagraph_token_budgets", "[]"),
    ("encoder_cudagraph_max_vision_items_per_batch", "0"), ("encoder_cudagraph_max_frames_per_batch", "None"),
    ("cudagraph_decoder_replay", "True"), ("decoder_replay_cudagraph_capture_sizes", "[]"),
    ("decoder_replay_trim_threshold", "768"), ("compile_sizes", "None"), ("compile_ranges_endpoints", "None"),
    ("inductor_compile_config", "{'enable_auto_functionalized_v2': False}"), ("inductor_passes", "{}"),
    ("cudagraph_mode", "None"), ("cudagraph_num_of_warmups", "0"), ("cudagraph_capture_sizes", "None"),
    ("cudagraph_copy_inputs", "False"), ("cudagraph_specialize_lora", "True"),
    ("use_inductor_graph_partition", "None"), ("pass_config", "{}"), ("max_cudagraph_capture_size", "None"),
    ("dynamic_shapes_config", "{'type': <DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, "
                              "'assume_32_bit_indexing': False}"),
    ("local_cache_dir", "None"), ("fast_moe_cold_start", "None"), ("static_all_moe_layers", "[]"),
]


def compilation_repr(comp: dict, resolved: Emulator | None) -> str:
    """CompilationConfig as vLLM 0.33 prints it: as parsed (non-default args) or resolved (engine config)."""
    vals = dict(COMP_DEFAULTS)
    for k, v in comp.items():
        if k == "cudagraph_mode":
            vals[k] = CG_ENUM.get(str(v).upper(), repr(v))
        elif True:
            vals[k] = repr(v)
    if resolved is not None:
        e = resolved
        sizes = e.capture_sizes() if e.graphs else []
        vals["mode"] = "<CompilationMode.VLLM_COMPILE: 3>" if e.compile else "<CompilationMode.NONE: 0>"
        vals["custom_ops"] = "['none']" if e.compile else "['all']"
        vals["cudagraph_mode"] = CG_ENUM[e.cg_mode]
        vals["cudagraph_capture_sizes"] = repr(sizes)
        vals["max_cudagraph_capture_size"] = repr(max(sizes) if sizes else 0)
        vals["compile_sizes"] = "[]"
        vals["compile_ranges_endpoints"] = repr([e.max_batched])
        vals["cudagraph_num_of_warmups"] = "1" if e.graphs else "0"
        vals["use_inductor_graph_partition"] = "False"
        vals["ir_enable_torch_wrap"] = repr(e.compile)
    return "{" + ", ".join(f"'{k}': {v}" for k, v in vals.items()) + "}"


def fs_type(path: str) -> str:
    """Filesystem type of ``path`` from /proc/self/mountinfo, upper-cased as vLLM prints it."""
    try:
        best, typ = "", "unknown"
        real = os.path.realpath(path)
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            mnt = left.split()[4]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, typ = mnt, right.split()[0]
        return typ.upper()
    except OSError:
        return "UNKNOWN"


def mem_available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GiB
    except OSError:
        pass
    return 0.0


# ================================================================================================ HTTP


@functools.cache
def _http_classes() -> tuple[type, type]:
    """The API server's classes, made on first use: http.server (with the http.client, email and ssl it
    imports) is a fifth of the emulator's start-up, and a headless follower serves no HTTP."""
    import uuid
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class _Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128
        emu: Emulator

        def get_request(self) -> tuple[socket.socket, Any]:
            """TCP_NODELAY on every accepted connection, as real vLLM's server has it: uvicorn runs on asyncio,
            whose socket transports set it (CPython asyncio/selector_events.py, ``_SelectorSocketTransport``:
            ``base_events._set_nodelay``). Without it Nagle holds each small SSE chunk until the previous one is
            acknowledged, and the client's delayed ACK (~40 ms on Linux) shows up as TTFT and bursts of ITL 0
            (issue 41: the latency figures read the stream's timing)."""
            conn, addr = super().get_request()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn, addr


    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""
        server: _Server

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def handle(self) -> None:
            """A client that resets its keep-alive connection ends it quietly, as uvicorn does (socketserver would
            print a traceback no vLLM format produces)."""
            try:
                super().handle()
            except ConnectionError:
                self.close_connection = True

        def access(self, code: int) -> None:
            if self.server.emu.args.disable_uvicorn_access_log:
                return
            phrase = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
                      500: "Internal Server Error", 503: "Service Unavailable"}.get(code, "")
            host, port = self.client_address[:2]
            self.server.emu.log.uvicorn(f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}',
                                        stream=sys.stdout)

        def send_json(self, code: int, obj: Any, content_type: str = "application/json") -> None:
            body = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
            self.access(code)
            self.send_response(code)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def error_json(self, code: int, message: str, typ: str, param: str | None = None) -> None:
            self.send_json(code, {"error": {"message": message, "type": typ, "param": param, "code": code}})

        def do_GET(self) -> None:  # noqa: N802
            emu = self.server.emu
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/ping"):
                if emu.engine_dead:
                    self.access(503)
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self.send_json(200, b"", "application/json")
            elif path == "/version":
                self.send_json(200, {"version": VERSION})
            elif path == "/load":
                self.send_json(200, {"server_load": emu.engine.running if emu.engine else 0})
            elif path == "/metrics":
                self.send_json(200, metrics_text(emu).encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/v1/models":
                if not self.authorized():
                    return
                self.send_json(200, {"object": "list", "data": [{
                    "id": emu.served, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                    "root": emu.model, "parent": None, "max_model_len": emu.max_model_len,
                    "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                    "created": int(time.time()), "allow_create_engine": False, "allow_sampling": True,
                                    "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                    "allow_fine_tuning": False, "organization": "*", "group": None,
                                    "is_blocking": False}]}]})
            else:
                self.send_json(404, {"detail": "Not Found"})

        def authorized(self) -> bool:
            keys = list(self.server.emu.args.api_key or [])
            if os.environ.get("VLLM_API_KEY"):
                keys.append(os.environ["VLLM_API_KEY"])
            if not keys:
                return True
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Bearer ") and auth[7:] in keys:
                return True
            self.send_json(401, {"error": "Unauthorized"})
            return False

        def do_POST(self) -> None:  # noqa: N802
            emu = self.server.emu
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path == "/ping":
                self.send_json(200 if not emu.engine_dead else 503, b"")
                return
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self.send_json(404, {"detail": "Not Found"})
                return
            if not self.authorized():
                return
            try:
                body = json.loads(raw or b"{}")
                assert isinstance(body, dict)
            except (ValueError, AssertionError):
                self.error_json(400, "Expecting value: line 1 column 1 (char 0)", "BadRequestError")
                return
            if emu.engine_dead:
                self.error_json(500, "The server had an error while processing your request.", "InternalServerError")
                return
            model = body.get("model")
            if model not in (None, emu.served) and model not in (emu.args.served_model_name or []):
                self.error_json(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
                return
            chat = path.endswith("chat/completions")
            try:
                req = self.make_request(body, chat)
            except ValueError as e:
                self.error_json(400, str(e), "BadRequestError")
                return
            stream = bool(body.get("stream"))
            usage_opt = bool((body.get("stream_options") or {}).get("include_usage"))
            n = emu.begin_request()
            req.index = n
            try:
                if stream:
                    self.stream(req, chat, usage_opt, n)
                else:
                    self.complete(req, chat, n)
            except (BrokenPipeError, ConnectionResetError):
                with emu.engine.lock:
                    emu.engine.success["abort"] += 1

        def make_request(self, body: dict, chat: bool) -> Req:
            emu = self.server.emu
            if chat:
                msgs = body.get("messages")
                if not isinstance(msgs, list) or not msgs:
                    raise ValueError("messages must be a non-empty list")
                text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
                prompt_tokens = count_tokens(text) + 4 * len(msgs) + 2
            else:
                p = body.get("prompt")
                if p is None:
                    raise ValueError("prompt is required")
                if isinstance(p, list) and p and isinstance(p[0], int):
                    prompt_tokens = len(p)
                else:
                    prompt_tokens = count_tokens(p if isinstance(p, str) else " ".join(map(str, p)))
            mt = body.get("max_completion_tokens", body.get("max_tokens"))
            max_tokens = int(mt) if mt is not None else max(1, emu.max_model_len - prompt_tokens)
            if max_tokens < 1:
                raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
            if prompt_tokens + max_tokens > emu.max_model_len:
                raise ValueError(f"This model's maximum context length is {emu.max_model_len} tokens. However, you "
                                 f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                                 f"{max_tokens} in the completion). Please reduce the length of the messages or "
                                 "completion.")
            temp = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
            top_p = float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0)
            if not 0 < top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
            if temp < 0:
                raise ValueError(f"temperature must be non-negative, got {temp}.")
            ctk = body.get("chat_template_kwargs") or {}
            seed = body.get("seed")
            return Req(
                rid=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                prompt_tokens=prompt_tokens, max_tokens=max_tokens, min_tokens=int(body.get("min_tokens") or 0),
                ignore_eos=bool(body.get("ignore_eos")), temperature=temp,
                seed=int(seed) if seed is not None else -1, thinking=bool(ctk.get("enable_thinking", False)) and chat,
                index=0,
            )

        # generation ---------------------------------------------------------------------------------------

        def steps(self, req: Req, n: int):
            """Yields lists of token strings, one list per engine step (accepted drafts + the bonus token)."""
            emu = self.server.emu
            eng = emu.engine
            assert eng is not None
            rng = random.Random(eng.seed * 1_000_003 + (req.seed if req.seed >= 0 else n))
            words = random.Random(req.seed if req.temperature > 0 and req.seed >= 0 else req.prompt_tokens)
            limit = req.max_tokens
            stop_at = None
            eos_at = eng.eos_after
            if eng.eos_range is not None:  # a per-request natural length (issue 21: the card's EOS-ended replies)
                eos_at = random.Random(eng.seed * 7919 + n).randint(*eng.eos_range)
            if eos_at is not None and not req.ignore_eos:
                stop_at = max(eos_at, req.min_tokens)
            produced = 0
            steps = 0
            emu.wait_collective(n)
            t0 = time.monotonic()
            eng.enter(req.prompt_tokens)
            try:
                wedge = emu.faults.get("wedge")
                if wedge is not None and n > (wedge.int("after", 0) or 0):
                    while not emu.stop_event.is_set():  # a stopped EngineCore: no token, no log line, no error
                        time.sleep(0.2)
                    raise EngineDead()
                while produced < limit and (stop_at is None or produced < stop_at):
                    if not emu.cluster_ok():
                        emu.hang_forever()
                    if emu.engine_dead:
                        raise EngineDead()
                    t0 += eng.stalled()  # the pace resumes after the stall: no burst to catch up
                    a = eng.draw_accepted(rng) if eng.k else 0
                    eng.count_step(a)
                    cap = limit - produced if stop_at is None else min(limit, stop_at) - produced
                    k = min(a + 1, cap)
                    toks = []
                    for _ in range(k):
                        i = produced + len(toks)
                        if req.thinking and i == 0:
                            toks.append("<think>")
                        elif req.thinking and i == 8:
                            toks.append("</think>\n\n")
                        else:
                            toks.append(" " + WORDS[words.randrange(len(WORDS))])
                    produced += k
                    with eng.lock:
                        eng.gen_tokens += k
                        eng.iv_gen += k
                    steps += 1
                    if eng.step_rate > 0:
                        wait = t0 + steps * eng.step_s - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)
                    elif eng.rate > 0:
                        wait = t0 + produced / eng.rate - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)
                    yield toks
            finally:
                with eng.lock:
                    eng.running -= 1

        def finish_reason(self, req: Req, produced: int) -> str:
            eng = self.server.emu.engine
            if (eng.eos_after is not None or eng.eos_range is not None) and not req.ignore_eos \
                    and produced < req.max_tokens:
                return "stop"
            return "length"

        def record(self, req: Req, produced: int, reason: str, t0: float, ttft: float | None) -> None:
            eng = self.server.emu.engine
            with eng.lock:
                eng.success[reason] += 1
                eng.hist["prompt"].append(req.prompt_tokens)
                eng.hist["gen"].append(produced)
                eng.hist["e2e"].append(time.monotonic() - t0)
                if ttft is not None:
                    eng.hist["ttft"].append(ttft)

        def stream_error_at(self, n: int) -> bool:
            f = self.server.emu.faults.get("stream_error")
            return bool(f) and f.int("request", 1) == n

        def complete(self, req: Req, chat: bool, n: int) -> None:
            emu = self.server.emu
            t0 = time.monotonic()
            parts: list[str] = []
            ttft = None
            try:
                for toks in self.steps(req, n):
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    parts += toks
                    if self.stream_error_at(n) and len(parts) >= min(4, req.max_tokens):
                        emu.api("ERROR", "req_error",
                                f"Request {req.rid} failed with an internal error during generation")
                        self.record(req, len(parts), "error", t0, ttft)
                        self.error_json(500, "Internal server error", "InternalServerError")
                        return
            except EngineDead:
                self.error_json(500, "The server had an error while processing your request.", "InternalServerError")
                return
            produced = len(parts)
            reason = self.finish_reason(req, produced)
            self.record(req, produced, reason, t0, ttft)
            text = "".join(parts)
            created = int(time.time())
            usage = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + produced,
                     "completion_tokens": produced, "prompt_tokens_details": None}
            if chat:
                content, reasoning = split_thinking(text) if req.thinking else (text, None)
                obj = {"id": req.rid, "object": "chat.completion", "created": created, "model": emu.served,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None,
                                                            "annotations": None, "audio": None, "function_call": None,
                                                            "tool_calls": [], "reasoning_content": reasoning},
                                    "logprobs": None, "finish_reason": reason, "stop_reason": None}],
                       "service_tier": None, "system_fingerprint": None, "usage": usage, "prompt_logprobs": None,
                       "kv_transfer_params": None}
            else:
                obj = {"id": req.rid, "object": "text_completion", "created": created, "model": emu.served,
                       "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                                    "stop_reason": None, "prompt_logprobs": None}],
                       "service_tier": None, "system_fingerprint": None, "usage": usage, "kv_transfer_params": None}
            self.send_json(200, obj)

        def chunk(self, data: str) -> None:
            b = data.encode()
            self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")

        def stream(self, req: Req, chat: bool, include_usage: bool, n: int) -> None:
            emu = self.server.emu
            self.access(200)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            created = int(time.time())
            base = {"id": req.rid, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created, "model": emu.served}
            t0 = time.monotonic()
            ttft = None
            produced = 0
            first = True
            try:
                for toks in self.steps(req, n):
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    if chat and first:
                        self.chunk("data: " + json.dumps({**base, "choices": [{"index": 0, "delta": {
                            "role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]},
                            separators=(",", ":")) + "\n\n")
                    first = False
                    produced += len(toks)
                    if self.stream_error_at(n) and produced >= min(4, req.max_tokens):
                        emu.api("ERROR", "req_error",
                                f"Request {req.rid} failed with an internal error during generation")
                        self.record(req, produced, "error", t0, ttft)
                        err = {"message": "Internal server error", "type": "InternalServerError", "param": None,
                               "code": 500}
                        self.chunk("data: " + json.dumps({"error": err}, separators=(",", ":")) + "\n\n")
                        self.chunk("data: [DONE]\n\n")
                        self.wfile.write(b"0\r\n\r\n")
                        return
                    text = "".join(toks)
                    if chat:
                        choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
                    else:
                        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None,
                                  "stop_reason": None}
                    self.chunk("data: " + json.dumps({**base, "choices": [choice]}, separators=(",", ":")) + "\n\n")
            except EngineDead:
                if chat:  # entrypoints/openai/chat_completion/serving.py: logger.exception (real 0.33.0 run)
                    emu.api("ERROR", "stream_gen_error", "Error in chat completion stream generator.\n" +
                            traceback_text(FRAMES_STREAM_GEN, ENGINE_DEAD))
                err = {"message": "The server had an error while processing your request.",
                       "type": "InternalServerError", "param": None, "code": 500}
                self.chunk("data: " + json.dumps({"error": err}, separators=(",", ":")) + "\n\n")
                self.chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                return
            reason = self.finish_reason(req, produced)
            self.record(req, produced, reason, t0, ttft)
            if chat:
                last = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": reason,
                        "stop_reason": None}
            else:
                last = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason, "stop_reason": None}
            self.chunk("data: " + json.dumps({**base, "choices": [last]}, separators=(",", ":")) + "\n\n")
            if include_usage:
                usage = {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + produced,
                         "completion_tokens": produced}
                self.chunk("data: " + json.dumps({**base, "choices": [], "usage": usage}, separators=(",", ":"))
                           + "\n\n")
            self.chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return _Server, _Handler


def split_thinking(text: str) -> tuple[str, str | None]:
    if "</think>" in text:
        head, _, tail = text.partition("</think>")
        return tail.lstrip("\n"), head.replace("<think>", "").strip()
    return text, None


def count_tokens(text: str) -> int:
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


# ============================================================================================= metrics


def go_float(d: float) -> str:
    """prometheus_client's floatToGoString."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _labels(**kw: str) -> str:
    if not kw:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(kw.items())) + "}"


BUCKETS = {
    "tokens": [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
               50000.0, 100000.0, 200000.0, 500000.0],
    "ttft": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0, 160.0, 640.0, 2560.0],
    "e2e": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0],
}


def metrics_text(emu: Emulator) -> str:
    eng = emu.engine
    assert eng is not None
    base = {"engine": "0", "model_name": emu.served}
    lines: list[str] = []
    created = eng.created

    def fam(name: str, typ: str, help_: str, samples: list[tuple[str, dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {typ}")
        for suffix, labels, v in samples:
            lines.append(f"{name}{suffix}{_labels(**labels)} {go_float(v)}")

    def counter(name: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        fam(f"{name}_total", "counter", help_, [("", lab, v) for lab, v in samples])
        fam(f"{name}_created", "gauge", help_, [("", lab, created) for lab, _ in samples])

    def histogram(name: str, help_: str, values: list[float], buckets: list[float]) -> None:
        samples = []
        for b in buckets:
            samples.append(("_bucket", {**base, "le": go_float(b)}, sum(1 for v in values if v <= b)))
        samples.append(("_bucket", {**base, "le": "+Inf"}, len(values)))
        samples.append(("_count", base, len(values)))
        samples.append(("_sum", base, float(sum(values))))
        fam(name, "histogram", help_, samples)
        fam(f"{name}_created", "gauge", help_, [("", base, created)])

    pid = os.getpid()
    fam("python_info", "gauge", "Python platform information", [("", {
        "implementation": "CPython", "major": str(sys.version_info[0]), "minor": str(sys.version_info[1]),
        "patchlevel": str(sys.version_info[2]), "version": ".".join(map(str, sys.version_info[:3]))}, 1.0)])
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
        vms = int(stat[20])
        cpu = (int(stat[11]) + int(stat[12])) / ticks
        boot = float(next(x for x in Path("/proc/stat").read_text().splitlines() if x.startswith("btime")).split()[1])
        start = boot + int(stat[19]) / ticks
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, IndexError, StopIteration, ValueError):
        rss = vms = fds = 0
        cpu = 0.0
        start = emu.t0
    fam("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", [("", {}, vms)])
    fam("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", [("", {}, rss)])
    fam("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
        [("", {}, start)])
    fam("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", [("", {}, cpu)])
    fam("process_open_fds", "gauge", "Number of open file descriptors.", [("", {}, fds)])
    with eng.lock:
        t = eng.total
        k = eng.k
        if emu.spec:
            counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [(base, t.drafts)])
            counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [(base, t.draft_tokens)])
            counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [(base, t.accepted)])
            counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                    [({**base, "position": str(p)}, t.per_pos[p]) for p in range(k)])
        fam("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
            [("", base, eng.running)])
        fam("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
            [("", base, eng.waiting)])
        usage = 0.0
        if emu.kv_plan and emu.kv_plan.tokens:
            usage = min(1.0, eng.running * 512 / emu.kv_plan.tokens)
        fam("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [("", base, usage)])
        counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                [(base, eng.prompt_tokens)])
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", [(base, 0)])
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(base, 0)])
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(base, eng.prompt_tokens)])
        counter("vllm:generation_tokens", "Number of generation tokens processed.", [(base, eng.gen_tokens)])
        counter("vllm:request_success", "Count of successfully processed requests.",
                [({**base, "finished_reason": r}, v) for r, v in eng.success.items()])
        histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", eng.hist["prompt"],
                  BUCKETS["tokens"])
        histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", eng.hist["gen"],
                  BUCKETS["tokens"])
        histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                  eng.hist["ttft"], BUCKETS["ttft"])
        histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                  eng.hist["e2e"], BUCKETS["e2e"])
    if emu.kv_plan:
        p = emu.kv_plan
        info = {"block_size": str(KV_BLOCK), "cache_dtype": emu.kv_dtype, "engine": "0",
                "gpu_memory_utilization": str(emu.args.gpu_memory_utilization),
                "kv_cache_max_concurrency": repr(p.max_concurrency),
                "kv_cache_memory_bytes": str(emu.args.kv_cache_memory_bytes),
                "kv_cache_size_tokens": str(p.tokens), "num_gpu_blocks": str(p.num_blocks)}
        fam("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", [("", info, 1.0)])
    return "\n".join(lines) + "\n"


# ================================================================================================ ray


def ray_main(argv: list[str]) -> int:
    """A minimal ``ray start --head|--address=… --block`` (not Ray): the cluster membership a vLLM driver needs.

    The head listens on ``--node-ip-address:--port`` and writes /tmp/ray/ray_current_cluster; other nodes join
    it and stay connected while they run; a driver (``vllm serve --distributed-executor-backend ray`` in the
    head's container) gets the live node list pushed on every change. It prints nothing of Ray's own.
    """
    ap = argparse.ArgumentParser(prog="ray")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("start")
    st.add_argument("--head", action="store_true")
    st.add_argument("--address")
    st.add_argument("--port", type=int, default=6379)
    st.add_argument("--node-ip-address", default="127.0.0.1")
    st.add_argument("--num-gpus", type=int, default=1)
    st.add_argument("--block", action="store_true")
    sub.add_parser("stop")
    a, _ = ap.parse_known_args(argv)
    if a.cmd != "start":
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if a.head:
        _RayHead(a.node_ip_address, a.port, a.num_gpus).start()
    elif a.address:
        host, _, port = a.address.rpartition(":")
        while not stop.is_set():
            try:
                s = socket.create_connection((host, int(port)), timeout=5)
                s.settimeout(None)
                Peer(s).send(op="join", ip=a.node_ip_address, gpus=a.num_gpus)
                break
            except OSError:
                stop.wait(0.5)
    if a.block:
        stop.wait()
    return 0


class _RayHead:
    def __init__(self, ip: str, port: int, gpus: int) -> None:
        self.nodes: list[dict] = [{"ip": ip, "gpus": gpus, "alive": True}]
        self.drivers: list[Peer] = []
        self.lock = threading.Lock()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind((ip, port))
        self.srv.listen(64)
        Path(RAY_CLUSTER_FILE).parent.mkdir(parents=True, exist_ok=True)
        Path(RAY_CLUSTER_FILE).write_text(f"{ip}:{port}\n")

    def start(self) -> None:
        threading.Thread(target=self.accept, daemon=True).start()

    def push(self) -> None:
        with self.lock:
            for d in list(self.drivers):
                if not d.send(op="nodes", nodes=self.nodes):
                    self.drivers.remove(d)

    def accept(self) -> None:
        while True:
            conn, _ = self.srv.accept()
            threading.Thread(target=self.serve, args=(Peer(conn),), daemon=True).start()

    def serve(self, peer: Peer) -> None:
        m = peer.recv()
        if not m:
            return
        if m.get("op") == "driver":
            with self.lock:
                self.drivers.append(peer)
            self.push()
            while peer.recv() is not None:
                pass
            return
        node = {"ip": m.get("ip"), "gpus": int(m.get("gpus") or 1), "alive": True}
        with self.lock:
            self.nodes.append(node)
        self.push()
        while peer.recv() is not None:
            pass
        node["alive"] = False
        self.push()


# =============================================================================================== main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = os.environ.pop("SSEMU_PROG", "") or Path(sys.argv[0]).name
    if prog == "ray":
        return ray_main(argv)
    if argv[:1] in (["--version"], ["-v"]):
        print(f"{VERSION} ({EMULATOR_NOTE})")
        return 0
    if not argv or argv[0] != "serve":
        sys.stderr.write(TOP_USAGE + ("vllm: error: the following arguments are required: subparser\n" if not argv
                                      else f"vllm: error: argument subparser: invalid choice: '{argv[0]}' (choose from "
                                           "chat, complete, serve, launch, bench, collect-env, download-kernels, "
                                           "preload, run-batch, snapshot)\n"))
        return 2
    args = parse_serve(argv[1:])
    if args.help:
        print(f"usage: {SERVE_USAGE}\n\nsparkserve engine emulator ({EMULATOR_NOTE}): accepts every vLLM "
              f"{VERSION} `vllm serve` option.")
        return 0
    emu = Emulator(args)

    def on_signal(signum: int, frame: Any) -> None:
        if not emu.ready:
            os._exit(0)
        if emu.headless:
            def bye() -> None:
                emu.follower_shutdown_lines()
                sys.stdout.flush()
                os._exit(0)
            threading.Thread(target=bye, daemon=True).start()
        else:
            emu.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = emu.run_follower() if emu.headless else emu.run_head()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
