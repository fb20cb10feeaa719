"""The one pattern table also drives the boot watcher: its fatal fast path and the watchdog's phases.

Before the table drove them, `deploy/wait.py` kept its own ``FATAL`` regex and `deploy/watchdog.py` its own
phase regexes. Those are kept here, verbatim, as the reference: every line they matched (their example lines
and every line of every fixture log) must still be matched, and give the same phase.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkserve.deploy.watchdog import Phase, phase_of_line
from sparkserve.observe.logline import strip_ansi
from sparkserve.observe.logpatterns import FATAL, PATTERNS, FaultKind, Kind, Milestone, milestone_of

NCCL_NOTE = next(p.regex for p in PATTERNS if p.kind is Kind.NCCL_NOTE)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# --- the regexes the table replaced (reference only) ----------------------------------------------
OLD_FATAL = re.compile(
    r"EngineCore failed to start\.|EngineCore encountered a fatal error\.|died unexpectedly|"
    r"Engine core initialization failed|Watchdog caught collective operation timeout|CUDA out of memory|"
    r"\bNCCL WARN\b|NCCL error|WorkerProc failed|RPC call to \S+ timed out|NV_ERR_NO_MEMORY"
)
_OLD_MODEL_LOADED = re.compile(r"Model loading took [\d.]+ GiB (?:memory )?and")
_OLD_KV_SIZED = re.compile(r"KV cache size: [\d,]+ tokens|reserved [\d.]+ GiB memory for KV Cache|"
                           r"Available KV cache memory: ")
_OLD_CAPTURE = re.compile(r"Graph capturing finished|Capturing model for|Cudagraph is disabled under eager mode")
_OLD_LOADING = re.compile(r"Loading model from scratch|Starting to load model|Loading weights took")
_OLD_READY = re.compile(r"Application startup complete\.")


def old_phase_of_line(line: str, current: Phase) -> Phase:
    order = list(Phase)
    nxt = current
    if _OLD_READY.search(line):
        nxt = Phase.SERVING
    elif _OLD_KV_SIZED.search(line):
        nxt = Phase.KV_READY
    elif _OLD_CAPTURE.search(line):
        nxt = Phase.CAPTURE
    elif _OLD_MODEL_LOADED.search(line):
        nxt = Phase.PROFILE
    elif _OLD_LOADING.search(line):
        nxt = Phase.LOAD
    return nxt if order.index(nxt) > order.index(current) else current


# --- fatal lines ------------------------------------------------------------------------------------
FATAL_LINES = [
    "(EngineCore_DP0 pid=577) ERROR 01-15 08:11:34 [core.py:708] EngineCore failed to start.",
    "(EngineCore pid=2377) ERROR 11-29 16:08:50 [core.py:936] EngineCore encountered a fatal error.",
    "(EngineCore_0 pid=12) ERROR 10-02 11:00:01 [core_client.py:564] Engine core proc EngineCore_0 died "
    "unexpectedly, shutting down client.",
    "(EngineCore pid=2377) ERROR 11-29 16:08:50 [multiproc_executor.py:380] Worker proc VllmWorker-0 died "
    "unexpectedly (exit code: -9), shutting down executor.",
    "(EngineCore_DP0 pid=577) ERROR 01-15 08:11:34 [multiproc_executor.py:149] Worker proc VllmWorker-1 died "
    "unexpectedly, shutting down executor.",
    "(EngineCore pid=2377) ERROR 11-29 16:40:12 [ray_executor_v2.py:388] RayWorkerProc rank=1 died unexpectedly, "
    "shutting down executor.",
    "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "[rank0]:[E1129 16:08:50.123456 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
    "(Worker_TP1 pid=3190) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "spark-b:3190:3312 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion with error 12",
    "(Worker_TP0 pid=3189) RuntimeError: NCCL error: unhandled system error",
    "(Worker_TP0 pid=3189) ERROR 11-29 16:02:41 [multiproc_executor.py:702] WorkerProc failed to start.",
    "(EngineCore pid=2377) ERROR 11-29 16:40:12 [ray_executor_v2.py:401] RayWorkerProc failed: actor died",
    "(EngineCore pid=2377) TimeoutError: RPC call to sample_tokens timed out.",
    "NVRM: nvAssertFailedNoLog: Assertion failed: NV_ERR_NO_MEMORY @ mem_mgr.c:123",
]


@pytest.mark.parametrize("line", FATAL_LINES)
def test_every_fatal_example_of_the_old_fast_path_is_fatal(line: str) -> None:
    assert OLD_FATAL.search(line), "the example must be one the old regex matched"
    assert FATAL.search(line)


@pytest.mark.parametrize("line", FATAL_LINES)
def test_a_fatal_line_is_also_a_fault_of_the_full_reader(line: str) -> None:
    from sparkserve.observe.events import classify_fault

    assert classify_fault(line) not in (None, FaultKind.OTHER)


def test_fatal_is_exactly_the_rows_marked_fatal() -> None:
    fatal = [p for p in PATTERNS if p.fatal]
    assert fatal and all(p.kind is Kind.FAULT for p in fatal)
    assert "EngineDeadError" not in FATAL.pattern and "shared memory broadcast" not in FATAL.pattern


def test_non_fatal_lines_do_not_stop_a_boot() -> None:
    for line in (
        "(APIServer pid=1) INFO 11-29 16:02:41 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s",
        "(EngineCore pid=2377) INFO 11-29 16:02:41 [shm_broadcast.py:466] No available shared memory broadcast "
        "block found in 60 seconds. This typically happens when some processes are hanging.",
        "(Worker_TP0 pid=3189) INFO 11-29 16:02:41 [gpu_model_runner.py:2602] Model loading took 10.2 GiB and "
        "21.0 seconds",
    ):
        assert not FATAL.search(line) and not OLD_FATAL.search(line)


# --- phases -----------------------------------------------------------------------------------------
PHASE_LINES = [
    ("(Worker_TP0 pid=3189) INFO 11-29 16:01:02 [gpu_model_runner.py:2338] Starting to load model /models/t...",
     Phase.LOAD, Milestone.LOADING),
    ("(Worker pid=3189) INFO 11-29 16:01:02 [base_loader.py:47] Loading weights took 12.34 seconds",
     Phase.LOAD, Milestone.LOADING),
    ("INFO 10-23 03:54:46 model_runner.py:123] Loading model from scratch...", Phase.LOAD, Milestone.LOADING),
    ("(Worker_TP0 pid=3189) INFO 11-29 16:02:00 [gpu_model_runner.py:2602] Model loading took 10.2184 GiB and "
     "21.074 seconds", Phase.PROFILE, Milestone.LOADED),
    ("(Worker_TP1 pid=3190) INFO 11-29 16:02:00 [gpu_model_runner.py:2602] Model loading took 10.2 GiB memory and "
     "21.0 seconds", Phase.PROFILE, Milestone.LOADED),
    ("(Worker_TP0 pid=3189) INFO 11-29 16:02:30 [gpu_model_runner.py:3480] Graph capturing finished in 14 secs, "
     "took 0.52 GiB", Phase.CAPTURE, Milestone.CAPTURE),
    ("(Worker_TP0 pid=3189) INFO 11-29 16:02:20 [model_runner.py:901] Capturing model for dflash2 speculator...",
     Phase.CAPTURE, Milestone.CAPTURE),
    ("(EngineCore pid=2377) INFO 11-29 16:01:00 [config.py:1234] Cudagraph is disabled under eager mode",
     Phase.CAPTURE, Milestone.CAPTURE),
    ("(Worker_TP0 pid=3189) INFO 11-29 16:02:10 [gpu_worker.py:298] Available KV cache memory: 28.37 GiB",
     Phase.KV_READY, Milestone.KV_SIZED),
    ("(Worker_TP0 pid=3189) INFO 11-29 16:02:10 [gpu_worker.py:280] Initial free memory 100.0 GiB, reserved 30.00 "
     "GiB memory for KV Cache as specified by kv_cache_memory_bytes config", Phase.KV_READY, Milestone.KV_SIZED),
    ("(EngineCore pid=2377) INFO 11-29 16:02:11 [kv_cache_utils.py:1087] GPU KV cache size: 366,749 tokens",
     Phase.KV_READY, Milestone.KV_SIZED),
    ("(APIServer pid=1) INFO:     Application startup complete.", Phase.SERVING, Milestone.READY),
    ("INFO:     Application startup complete.", Phase.SERVING, Milestone.READY),
]


@pytest.mark.parametrize(("line", "phase", "milestone"), PHASE_LINES)
def test_every_phase_example_moves_the_watchdog_as_before(line: str, phase: Phase, milestone: Milestone) -> None:
    assert old_phase_of_line(line, Phase.START) is phase, "the example must be one the old regexes placed"
    assert phase_of_line(line, Phase.START) is phase
    assert milestone_of(line) is milestone


def test_phases_only_move_forward() -> None:
    assert phase_of_line(PHASE_LINES[0][0], Phase.KV_READY) is Phase.KV_READY
    assert phase_of_line("(APIServer pid=1) INFO 11-29 16:00:00 [api_server.py:1] hello", Phase.LOAD) is Phase.LOAD


def _fixture_lines() -> list[str]:
    lines: list[str] = []
    for p in sorted(LOGS.rglob("*.log")):
        lines += p.read_bytes().decode("utf-8", "replace").splitlines()
    return lines


def test_on_every_fixture_line_the_table_matches_whatever_the_old_regexes_matched() -> None:
    lines = _fixture_lines()
    assert len(lines) > 1000
    missed_fatal = [x for x in lines if OLD_FATAL.search(x) and not FATAL.search(x)]
    # on purpose (issue 26): NCCL's informational async events (a GID table change) no longer end a boot
    assert [x for x in missed_fatal if not NCCL_NOTE.search(x)] == []
    moved = [x for x in lines for cur in Phase if old_phase_of_line(x, cur) is not phase_of_line(x, cur)]
    assert moved == []


def test_the_boot_walks_the_same_phases_through_a_whole_fixture_log() -> None:
    for p in sorted(LOGS.rglob("*.log")):
        old = new = Phase.START
        for line in p.read_bytes().decode("utf-8", "replace").splitlines():
            old, new = old_phase_of_line(line, old), phase_of_line(line, new)
            assert old is new, (p.name, line)


def test_fatal_and_milestone_rows_match_anywhere_in_a_raw_line() -> None:
    # FATAL and milestone_of search whole raw lines (prefix included): a `^` anchor would never match there
    rows = [p for p in PATTERNS if p.fatal or p.milestone is not None]
    assert rows and not [p.regex.pattern for p in rows if p.regex.pattern.startswith("^")]


def test_every_row_matches_only_lines_holding_one_of_its_needles() -> None:
    # the prefilter reads a line only when a needle hits: a row whose regex matches without one would go unseen
    lines = [strip_ansi(x) for x in _fixture_lines()]
    assert any("Registering" in x for x in lines) and any("(raylet)" in x for x in lines)  # the public corpus
    leaks = [
        (p.kind.value, x) for p in PATTERNS for x in lines if p.regex.search(x) and not any(n in x for n in p.needles)
    ]
    assert leaks == []
