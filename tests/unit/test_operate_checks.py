"""supervise's checks as pure judgements: each must fail on the fact that should fail it."""

from __future__ import annotations

from sparkserve.operate.checks import (
    Band,
    CanaryResult,
    MemFacts,
    MetricsPoint,
    RankFact,
    StallTracker,
    Window,
    fault_line,
    judge_acceptance,
    judge_faults,
    judge_kernel,
    judge_memory,
    judge_progress,
    judge_ranks,
    parse_meminfo,
)

GiB = 1 << 30


def test_a_canary_past_its_deadline_fails_progress_and_a_quick_one_passes() -> None:
    bad = judge_progress(CanaryResult(False, 10.0, 0, "no answer before the deadline"), 10)
    assert bad.ok is False and "no answer before the deadline" in bad.summary
    assert judge_progress(CanaryResult(True, 0.2, 4), 10).ok is True
    assert judge_progress(CanaryResult(True, 0.2, 0), 10).ok is False  # 200 with no token is no progress


def test_running_requests_with_frozen_generation_counter_is_wedged_after_stall_s() -> None:
    s = StallTracker(stall_s=15)
    assert s.add(MetricsPoint(0, 2, 100)).ok is True
    assert s.add(MetricsPoint(10, 2, 100)).ok is True  # frozen for 10 s: watching
    v = s.add(MetricsPoint(16, 2, 100))
    assert v.ok is False and "2 request(s) running" in v.summary and "16.0s" in v.summary


def test_idle_or_progressing_or_restarted_engine_is_not_wedged() -> None:
    s = StallTracker(stall_s=5)
    for t in range(0, 30, 5):
        assert s.add(MetricsPoint(t, 0, 100)).ok is True  # nothing running: frozen counters are idle
    s = StallTracker(stall_s=5)
    for t in range(0, 30, 5):
        assert s.add(MetricsPoint(t, 3, 100 + t)).ok is True
    s = StallTracker(stall_s=5)
    s.add(MetricsPoint(0, 1, 100, boot_id=1.0))
    assert s.add(MetricsPoint(10, 1, 100, boot_id=2.0)).ok is True  # a new process: the stall starts over
    assert s.add(None).ok is None


def test_a_dead_rank_fails_ranks_and_names_its_node() -> None:
    v = judge_ranks([RankFact("a", "r0", True), RankFact("b", "r1", False, 137)], ["a", "b"])
    assert v.ok is False and v.node == "b" and "exit code 137" in v.summary
    assert judge_ranks([RankFact("a", "r0", True)], ["a", "b"]).summary == "b: no rank runs"
    v = judge_ranks([RankFact("a", "r0", True)], ["a", "b"], {"b": "ssh: timed out"})
    assert v.ok is False and "unreachable" in v.summary
    assert judge_ranks([RankFact("a", "r0", True), RankFact("b", "r1", True)], ["a", "b"]).ok is True


def test_boot_log_fault_table_applies_to_serving_logs() -> None:
    nccl = ("[rank1]:[E1201 22:00:01.000000000 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST) ran for 600081 milliseconds before timing out.")
    died = ("(EngineCore pid=12) ERROR 12-01 22:00:01 [multiproc_executor.py:380] Worker proc VllmWorker-1 died "
            "unexpectedly (exit code: -9), shutting down executor.")
    assert fault_line(nccl) == "timeout"
    assert fault_line(died) is not None
    assert fault_line("(APIServer pid=1) INFO 12-01 22:00:01 [loggers.py:335] Engine 000: Avg prompt throughput") \
        is None
    v = judge_faults({"a": ["ok line"], "b": ["fine", nccl]})
    assert v.ok is False and v.node == "b" and "Watchdog caught" in v.summary
    assert judge_faults({"a": ["ok"], "b": []}).ok is True


def test_kernel_xid_and_nv_err_no_memory_fail_kernel() -> None:
    xid = "NVRM: Xid (PCI:000f:01:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
    oom = "NVRM: nvAssertOkFailedNoLog: Assertion failed: NV_ERR_NO_MEMORY returned from pRmApi->Alloc"
    assert judge_kernel({"a": [], "b": [xid]}).node == "b"
    assert judge_kernel({"a": [oom]}).ok is False
    assert judge_kernel({"a": ["usb 1-1: new device"], "b": []}).ok is True
    assert judge_kernel({"a": None, "b": None}).ok is None  # /dev/kmsg not readable anywhere: not judged


def test_memfree_below_the_floor_fails_memory_even_with_memavailable_high() -> None:
    facts = parse_meminfo("MemTotal: 125000000 kB\nMemFree: 2097152 kB\nMemAvailable: 60000000 kB\n")
    assert facts.free == 2 * GiB and facts.available == 60000000 * 1024
    v = judge_memory({"a": MemFacts(50 * GiB), "b": facts}, floor=4 * GiB)
    assert v.ok is False and v.node == "b" and "MemFree 2.00 GiB" in v.summary
    assert judge_memory({"a": MemFacts(50 * GiB)}, floor=4 * GiB).ok is True
    assert judge_memory({"a": MemFacts(None, error="gone")}, floor=4 * GiB).ok is None


def test_acceptance_collapse_against_the_band_is_an_alarm() -> None:
    band = Band(3.5, (0.74, 0.55, 0.4), "bench #3")
    collapsed = Window(400, 1.0, (0.0, 0.0, 0.0))
    v = judge_acceptance(collapsed, band, drop=0.5, min_drafts=50)
    assert v.ok is False and "collapsed" in v.summary and "bench #3" in v.summary
    assert judge_acceptance(Window(400, 3.3, (0.7, 0.5, 0.4)), band, drop=0.5, min_drafts=50).ok is True
    assert judge_acceptance(Window(10, 1.0, (0.0,)), band, drop=0.5, min_drafts=50).ok is None  # too few drafts
    assert judge_acceptance(collapsed, None, drop=0.5, min_drafts=50).ok is True  # no band: nothing to fall from


def test_a_canary_queued_past_its_deadline_while_tokens_flow_is_busy_not_wedged() -> None:
    late = CanaryResult(False, 10.0, 0, "no answer before the deadline")
    assert judge_progress(late, 10, tokens_meanwhile=2048).ok is True
    assert judge_progress(late, 10, tokens_meanwhile=0).ok is False  # frozen counters: wedged
    refused = CanaryResult(False, 0.0, 0, "ConnectError: [Errno 111] Connection refused")
    assert judge_progress(refused, 10, tokens_meanwhile=2048).ok is False  # no API is no API
