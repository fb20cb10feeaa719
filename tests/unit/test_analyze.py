"""`logs analyze`: the DESIGN.md JSON contract, checked on the real vLLM 0.25.1 logs and on edge cases."""

from __future__ import annotations

from pathlib import Path

from sparkserve.observe.analyze import analyze, analyze_texts
from sparkserve.observe.logpatterns import Kind
from sparkserve.observe.logs import parse_log
from sparkserve.observe.saved import LogFile, analyze_files

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REAL = LOGS / "real-0.25.1"

# DESIGN.md's keys, plus the one issue 10 added (the line `ready` was decided on, and why) and issue 32's requests
# answered with an error (counted and shown, never faults), and issue 44's pools of failed boots and envelopes
CONTRACT_KEYS = {
    "kv_cache_tokens", "graphs", "cudagraph_mode", "ranks", "spec", "model_runner", "ready", "faults", "ready_evidence",
    "request_errors", "failed_boot_kv_cache_tokens", "envelopes",
}
SPEC_KEYS = {"method", "num_speculative_tokens", "mask_embedding_loaded", "mask_token_id", "mean_acceptance_length"}


def real(*names: str):
    return analyze_files([LogFile(REAL / n) for n in names])


def test_real_025_head_and_follower_read_like_a_careful_engineer_would() -> None:
    a = real("A-head.log", "A-follower.log")
    j = a.to_json()
    assert set(j) == CONTRACT_KEYS and set(j["spec"]) == SPEC_KEYS
    assert j["kv_cache_tokens"] == [1677712]
    assert j["graphs"] == "captured" and j["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert j["ranks"] == {
        "0": {"graphs": "captured", "kv_cache_tokens": 1677712},
        "1": {"graphs": "captured", "kv_cache_tokens": 1677712},
    }
    assert {r: s.mask_token_id for r, s in a.ranks.items()} == {"0": 4, "1": 4}
    spec = j["spec"]
    assert (spec["method"], spec["num_speculative_tokens"], spec["mask_embedding_loaded"], spec["mask_token_id"]) == (
        "dflash",
        7,
        True,
        4,
    )
    assert spec["mean_acceptance_length"] == [1.0] * 5
    assert j["model_runner"] == "v2" and j["ready"] is True
    assert j["faults"] == []  # the follower's c10d stack after SIGINT is a shutdown artefact
    assert {Path(log.file).name for log, _ in a.artefacts} == {"A-follower.log"}
    assert all("TCPStore" in e.text or "c10d" in e.text for _, e in a.artefacts)


def test_real_025_rank_evidence_comes_from_each_nodes_own_log() -> None:
    a = real("A-head.log", "A-follower.log")
    capture_files = {
        r: {Path(log.file).name for log in a.logs for e in log.events if e in s.capture} for r, s in a.ranks.items()
    }
    assert capture_files == {"0": {"A-head.log"}, "1": {"A-follower.log"}}


def test_real_025_rankless_worker_lines_map_to_the_rank_their_pid_later_reveals() -> None:
    a = real("A-head.log", "A-follower.log")
    v2 = sorted((Path(log.file).name, e.rec.proc.name, e.rank) for log, e in a.events(Kind.RUNNER_V2))
    assert v2 == [("A-follower.log", "Worker", "1"), ("A-head.log", "Worker", "0")]


def test_real_025_eager_run_without_mask_file() -> None:
    j = real("B-head.log").to_json()
    assert j["graphs"] == "eager" and j["cudagraph_mode"] == "NONE"
    assert j["ranks"] == {
        "0": {"graphs": "eager", "kv_cache_tokens": 838848},
        "1": {"graphs": "eager", "kv_cache_tokens": 838848},
    }
    assert j["spec"]["mask_embedding_loaded"] is False and j["spec"]["mask_token_id"] is None
    assert (j["spec"]["method"], j["spec"]["num_speculative_tokens"]) == ("dflash", 7)
    assert j["kv_cache_tokens"] == [838848] and j["faults"] == [] and j["ready"] is True


def test_real_025_follower_alone_has_no_pool_and_no_readiness_of_its_own() -> None:
    j = real("A-follower.log").to_json()
    assert j["kv_cache_tokens"] == [] and j["ready"] is None
    assert j["ranks"] == {"1": {"graphs": "captured", "kv_cache_tokens": None}}
    assert j["faults"] == []  # its own `[shutdown] Executor …` line came first


def test_unknown_stays_null_never_guessed() -> None:
    j = analyze_texts({"empty.log": ""}).to_json()
    assert j == {
        "kv_cache_tokens": [],
        "graphs": "unknown",
        "cudagraph_mode": None,
        "ranks": {},
        "spec": {
            "method": None,
            "num_speculative_tokens": None,
            "mask_embedding_loaded": None,
            "mask_token_id": None,
            "mean_acceptance_length": [],
        },
        "model_runner": None,
        "ready": None,
        "faults": [],
        "ready_evidence": None,
        "request_errors": {"count": 0, "first": None},
        "failed_boot_kv_cache_tokens": [],
        "envelopes": [{"file": "empty.log", "encoding": "utf-8", "bom": False, "line_ends": "none", "prefix": None,
                       "suffix": None, "example": None, "lines": 0}],
    }


def test_kv_tokens_are_distinct_in_order_of_appearance() -> None:
    t = "".join(
        f"(EngineCore pid=1) INFO 11-29 16:03:4{i} [kv_cache_utils.py:1147] GPU KV cache size: {n} tokens, "
        f"Maximum concurrency for 4,096 tokens per request: 1.00x\n"
        for i, n in enumerate(["366,749", "352,118", "366,749"])
    )
    assert analyze_texts({"h": t}).to_json()["kv_cache_tokens"] == [366749, 352118]


def test_old_two_line_kv_form_and_other_devices() -> None:
    t = (
        "(EngineCore_DP0 pid=1) INFO 10-18 09:54:37 [kv_cache_utils.py:1087] GPU KV cache size: 602,112 tokens\n"
        "(EngineCore_DP0 pid=1) INFO 10-18 09:54:37 [kv_cache_utils.py:1091] Maximum concurrency for 40,960 tokens "
        "per request: 14.70x\n"
    )
    assert analyze_texts({"h": t}).to_json()["kv_cache_tokens"] == [602112]
    t2 = "(EngineCore pid=1) INFO 11-29 16:03:43 [k.py:1] GPU + host KV cache size: 9,000 tokens, Maximum x: 1.00x\n"
    assert analyze_texts({"h": t2}).to_json()["kv_cache_tokens"] == [9000]


def test_v0_gpu_blocks_are_not_tokens() -> None:
    j = analyze_files([LogFile(LOGS / "v0-gpu-blocks.log")]).to_json()
    assert j["kv_cache_tokens"] == []


def test_downgrade_sets_the_effective_mode() -> None:
    t = (
        "(APIServer pid=1) WARNING 11-29 16:02:18 [compilation.py:900] CUDAGraphMode.FULL_AND_PIECEWISE is not "
        "supported with FLASHINFER backend (support: AttentionCGSupport.UNIFORM_BATCH); setting "
        "cudagraph_mode=PIECEWISE because attention is compiled piecewise\n"
        "(EngineCore pid=2) INFO 11-29 16:02:27 [core.py:139] Initializing a V1 LLM engine (v0.33.0) with config: "
        "model='m', compilation_config={'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}\n"
    )
    a = analyze_texts({"h": t})
    assert a.cudagraph_mode == "PIECEWISE" and a.configured_cudagraph_mode == "FULL_AND_PIECEWISE"
    t3 = (
        "(Worker_TP0 pid=3) WARNING 11-29 16:02:30 [compilation.py:1] Cudagraph mode FULL_AND_PIECEWISE requires "
        "piecewise capture, but the loaded model provides neither a compiled submodule nor breakable CUDA graphs. "
        "Overriding to FULL_DECODE_ONLY.\n"
    )
    assert analyze_texts({"h": t3}).cudagraph_mode == "FULL_DECODE_ONLY"


def test_spec_from_non_default_args_when_the_engine_dump_is_missing() -> None:
    t = (
        "(APIServer pid=1) INFO 11-29 16:02:11 [startup.py:96] non-default args: {'model': 'm', 'speculative_config': "
        "{'method': 'dflash', 'model': '/d', 'num_speculative_tokens': 15}}\n"
    )
    s = analyze_texts({"h": t}).to_json()["spec"]
    assert (s["method"], s["num_speculative_tokens"]) == ("dflash", 15)


def test_engine_dump_wins_over_the_requested_args() -> None:
    t = (
        "(APIServer pid=1) INFO 11-29 16:02:11 [startup.py:96] non-default args: {'speculative_config': "
        "{'model': '/models/dflash-b8', 'num_speculative_tokens': 7}}\n"
        "(EngineCore pid=2) INFO 11-29 16:02:27 [core.py:139] Initializing a V1 LLM engine (v0.33.0) with config: "
        "model='m', speculative_config=SpeculativeConfig(method='dflash', model='/models/dflash-b8', "
        "num_spec_tokens=7)\n"
    )
    s = analyze_texts({"h": t}).to_json()["spec"]
    assert (s["method"], s["num_speculative_tokens"]) == ("dflash", 7)


def test_mask_loaded_on_one_rank_only_is_not_loaded() -> None:
    head = (LOGS / "v0.33-head.log").read_bytes()
    follower = (LOGS / "v0.33-follower-nomask.log").read_bytes()
    j = analyze([parse_log(head, file="h"), parse_log(follower, file="f")]).to_json()
    assert j["spec"]["mask_embedding_loaded"] is False and j["spec"]["mask_token_id"] == 154856


def test_mask_unknown_while_no_rank_finished_loading() -> None:
    t = (
        "(EngineCore pid=2) INFO 11-29 16:02:27 [core.py:139] Initializing a V1 LLM engine (v0.33.0) with config: "
        "model='m', speculative_config=SpeculativeConfig(method='dflash', model='/d', num_spec_tokens=7)\n"
        "(Worker_TP0 pid=3) INFO 11-29 16:02:44 [model_runner.py:399] Loading model from scratch...\n"
    )
    assert analyze_texts({"h": t}).to_json()["spec"]["mask_embedding_loaded"] is None


def test_rank_without_capture_makes_graphs_partial_and_is_named() -> None:
    a = analyze(
        [
            parse_log((LOGS / "v0.33-head.log").read_bytes(), file="h", node="spark-a"),
            parse_log((LOGS / "v0.33-follower-rank1-nographs.log").read_bytes(), file="f", node="spark-b"),
        ]
    )
    assert a.graphs == "partial"
    assert {r: s.graphs for r, s in a.ranks.items()} == {"0": "captured", "1": "unknown"}
    assert a.ranks["1"].nodes == {"spark-b"}


def test_cross_file_stop_turns_the_followers_lost_store_into_artefacts() -> None:
    h = parse_log((LOGS / "shutdown-0.33-head.log").read_bytes(), file="head.log")
    f = parse_log((LOGS / "shutdown-0.33-follower.log").read_bytes(), file="follower.log")
    assert len(f.faults) == 2  # alone, the follower cannot know the head was stopped on purpose
    both = analyze([h, f])
    assert both.faults == [] and len(both.artefacts) >= 2


def test_a_follower_fault_before_the_heads_stop_stays_a_fault() -> None:
    h = parse_log((LOGS / "shutdown-0.33-head.log").read_bytes(), file="head.log")
    f = parse_log((LOGS / "fault-watchdog-0.33-follower.log").read_bytes(), file="follower.log")
    j = analyze([h, f]).to_json()
    assert [(x["file"], x["kind"]) for x in j["faults"]] == [("follower.log", "timeout")]


def test_faults_are_ordered_by_time_across_files() -> None:
    head = "(EngineCore pid=2) ERROR 11-29 16:13:50 [core.py:1586] EngineCore encountered a fatal error.\n"
    follower = "(Worker_TP1_EP1 pid=3) ERROR 11-29 16:08:50 [multiproc_executor.py:1189] WorkerProc hit an exception.\n"
    j = analyze_texts({"head.log": head, "follower.log": follower}).to_json()
    assert [(f["file"], f["kind"]) for f in j["faults"]] == [
        ("follower.log", "worker_died"),
        ("head.log", "engine_dead"),
    ]


def test_faults_carry_file_line_kind_and_the_whole_line() -> None:
    j = analyze_files([LogFile(LOGS / "fault-worker-oom-0.33-head.log")]).to_json()
    f0 = j["faults"][0]
    assert set(f0) == {"file", "line", "kind", "text", "why"}
    assert f0["kind"] == "oom" and f0["file"].endswith("fault-worker-oom-0.33-head.log")
    lines = (LOGS / "fault-worker-oom-0.33-head.log").read_text().splitlines()
    assert lines[f0["line"] - 1] == f0["text"]
    assert "torch.OutOfMemoryError: CUDA out of memory" in f0["text"]


def test_ready_is_false_when_an_api_server_never_got_ready() -> None:
    j = analyze_files([LogFile(LOGS / "fault-init-mask-mismatch-0.33-head.log")]).to_json()
    assert j["ready"] is False


def test_v1_runner_capture_line_once_per_node_stands_for_its_ranks() -> None:
    a = analyze_files([LogFile(LOGS / "v0.18-docker-timestamps.log")])
    assert a.model_runner == "v1" and a.graphs == "captured"


def test_single_rank_engine_is_rank_0() -> None:
    j = analyze_files([LogFile(LOGS / "v0-gpu-blocks.log")]).to_json()
    assert j["ranks"] == {"0": {"graphs": "captured", "kv_cache_tokens": None}}


def test_one_file_holding_both_nodes_with_name_columns() -> None:
    # what `sparkserve logs > both.log` saves: each line prefixed `<node> | `, the two nodes interleaved
    head = [f"spark-a | {x}" for x in (LOGS / "v0.33-head.log").read_text().splitlines()]
    follower = [f"spark-b | {x}" for x in (LOGS / "v0.33-follower.log").read_text().splitlines()]
    mixed = [x for pair in zip(head, follower, strict=False) for x in pair] + head[len(follower) :]
    j = analyze_texts({"both.log": "\n".join(mixed) + "\n"}).to_json()
    assert j["ranks"] == {
        "0": {"graphs": "captured", "kv_cache_tokens": 366749},
        "1": {"graphs": "captured", "kv_cache_tokens": 366749},
    }
    assert j["spec"]["mask_embedding_loaded"] is True and j["faults"] == []


def test_within_one_second_the_cause_comes_before_its_consequences() -> None:
    # the head relays the follower's error in the same second; file order alone would put the relay first
    head = (
        "(EngineCore pid=2) ERROR 11-29 17:41:29 [core.py:1584] RuntimeError: Worker failed with error 'CUDA out of "
        "memory.', please check the stack trace above for the root cause\n"
    )
    follower = (
        "(Worker_TP1_EP1 pid=3) ERROR 11-29 17:41:29 [multiproc_executor.py:1189] torch.OutOfMemoryError: CUDA out "
        "of memory. Tried to allocate 1.00 GiB.\n"
        "[rank1]:[W1129 17:41:29.286 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=31): Failed to recv\n"
    )
    j = analyze_texts({"head.log": head, "follower.log": follower}).to_json()
    assert [(f["file"], f["kind"]) for f in j["faults"]] == [
        ("follower.log", "oom"),
        ("head.log", "worker_died"),
        ("follower.log", "other"),
    ]
