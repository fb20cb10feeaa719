"""The vocabulary of the log pattern table: event kinds, fault kinds, boot milestones and the row type.

The table itself is assembled in :mod:`sparkserve.observe.logpatterns` from its families
(:mod:`~sparkserve.observe.patterns_boot`, :mod:`~sparkserve.observe.patterns_nccl`,
:mod:`~sparkserve.observe.patterns_faults`); every module that reads logs imports it from there.
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
    FRAME = "frame"  # a traceback frame line that says where a process was (start-up or serving code)
    REQUEST_ERROR = "request_error"  # a request the API server answered with an error: no engine fault


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


def row(
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

