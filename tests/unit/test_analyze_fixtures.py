"""Every fixture of the corpus (tests/fixtures/logs/CORPUS.md) read as a careful engineer would read it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkserve.observe.logline import strip_ansi
from sparkserve.observe.saved import LogFile, analyze_files

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# file, kv_cache_tokens, graphs, cudagraph_mode, per-rank graphs,
# (method, k, mask loaded, mask id), model_runner, ready, [(fault line, kind), …]
EXPECTED = [
    (
        "fault-dead-follower-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [(57, "timeout")],
    ),
    (
        "fault-engine-start-timeout-0.33-head.log",
        [],  # the boot failed after printing its pool (366749): not the stack's pool (issue 13 item 6)
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        False,
        [(44, "timeout")],
    ),
    (
        "fault-init-mask-mismatch-0.33-head.log",
        [],
        "unknown",
        "FULL_AND_PIECEWISE",
        {"0": "unknown"},
        ("dflash", 7, None, None),
        "v2",
        False,
        [(32, "traceback"), (33, "engine_dead"), (39, "engine_dead")],
    ),
    (
        "fault-nccl-0.33-follower.log",
        [],
        "captured",
        None,
        {"1": "captured"},
        (None, None, True, 154856),
        "v2",
        None,
        [(21, "nccl"), (26, "nccl")],  # line 20, NCCL's `Got async event : GID table change`, is information
    ),
    (
        "fault-rpc-timeout-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [(62, "timeout")],
    ),
    (
        "fault-watchdog-0.33-follower.log",
        [],
        "captured",
        None,
        {"1": "captured"},
        (None, None, True, 154856),
        "v2",
        None,
        [(19, "timeout")],
    ),
    (
        "fault-worker-oom-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [(63, "oom"), (70, "worker_died"), (71, "engine_dead"), (76, "engine_dead")],
    ),
    (
        "glued-tqdm-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [],
    ),
    (
        "json-0.33.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured", "1": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [],
    ),
    (
        "ray-0.20-head.log",
        [905216],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured", "1": "captured"},
        (None, None, None, None),
        None,
        None,
        [],
    ),
    (
        "ray-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured", "1": "captured"},
        ("dflash", 7, False, None),
        None,
        None,
        [(7, "worker_died")],
    ),
    (
        "shutdown-0.33-follower.log",
        [],
        "captured",
        None,
        {"1": "captured"},
        (None, None, True, 154856),
        "v2",
        None,
        [(19, "other"), (24, "other")],
    ),
    (
        "shutdown-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [],
    ),
    ("v0-gpu-blocks.log", [], "captured", None, {"0": "captured"}, (None, None, None, None), None, True, []),
    (
        "v0.10.1-tp2-ansi.log",
        [1234560],
        "captured",
        "PIECEWISE",
        {"0": "captured", "1": "captured"},
        ("eagle3", 3, None, None),
        "v1",
        True,
        [],
    ),
    (
        "v0.11-tp2-pasted-ansi.log",
        [602112],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured", "1": "captured"},
        (None, None, None, None),
        "v1",
        True,
        [],
    ),
    (
        "v0.14-oom-at-capture.log",
        [],  # the boot failed after printing its pool (301056): not the stack's pool (issue 13 item 6)
        "unknown",
        "FULL_AND_PIECEWISE",
        {"0": "unknown", "1": "unknown"},
        (None, None, None, None),
        "v1",
        False,
        [(14, "oom"), (15, "worker_died"), (19, "worker_died"), (22, "engine_dead")],
    ),
    (
        "v0.18-docker-timestamps.log",
        [905216],
        "captured",
        "FULL_DECODE_ONLY",
        {"0": "captured", "1": "captured"},
        (None, None, None, None),
        "v1",
        True,
        [],
    ),
    (
        "v0.22-compose.log",
        [905216],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured", "1": "captured"},
        (None, None, None, None),
        "v2",
        True,
        [],
    ),
    (
        "v0.26-journald.log",
        [1677712],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 4),
        "v2",
        True,
        [],
    ),
    (
        "v0.30-crlf.log",
        [512000],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured", "1": "captured"},
        (None, None, None, None),
        "v2",
        True,
        [],
    ),
    ("v0.31-follower.log", [], "captured", None, {"1": "captured"}, (None, None, None, None), "v2", None, []),
    (
        "v0.31-head.log",
        [905216],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        (None, None, None, None),
        "v2",
        True,
        [],
    ),
    ("v0.33-follower-eager.log", [], "eager", "NONE", {"1": "eager"}, (None, None, True, 154856), "v2", None, []),
    ("v0.33-follower-nomask.log", [], "captured", None, {"1": "captured"}, (None, None, False, None), "v2", None, []),
    (
        "v0.33-follower-rank1-nographs.log",
        [],
        "unknown",
        None,
        {"1": "unknown"},
        (None, None, True, 154856),
        "v2",
        None,
        [],
    ),
    ("v0.33-follower.log", [], "captured", None, {"1": "captured"}, (None, None, True, 154856), "v2", None, []),
    ("v0.33-head-eager.log", [366749], "eager", "NONE", {"0": "eager"}, ("dflash", 7, True, 154856), "v2", True, []),
    (
        "v0.33-head-nomask.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, False, None),
        "v2",
        True,
        [],
    ),
    (
        "v0.33-head-pool-changed.log",
        [352118],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [],
    ),
    (
        "v0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [],
    ),
    (
        "v1-fallback-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v1",
        True,
        [],
    ),
    (
        "wrapped-config-0.33-head.log",
        [366749],
        "captured",
        "FULL_AND_PIECEWISE",
        {"0": "captured"},
        ("dflash", 7, True, 154856),
        "v2",
        True,
        [],
    ),
]


@pytest.mark.parametrize(
    ("name", "kv", "graphs", "mode", "ranks", "spec", "runner", "ready", "faults"),
    EXPECTED,
    ids=[e[0] for e in EXPECTED],
)
def test_fixture_reads_as_expected(name, kv, graphs, mode, ranks, spec, runner, ready, faults) -> None:
    j = analyze_files([LogFile(LOGS / name)]).to_json()
    assert j["kv_cache_tokens"] == kv
    assert (j["graphs"], j["cudagraph_mode"]) == (graphs, mode)
    assert {r: s["graphs"] for r, s in j["ranks"].items()} == ranks
    s = j["spec"]
    assert (s["method"], s["num_speculative_tokens"], s["mask_embedding_loaded"], s["mask_token_id"]) == spec
    assert (j["model_runner"], j["ready"]) == (runner, ready)
    assert [(f["line"], f["kind"]) for f in j["faults"]] == faults


def test_every_fixture_is_in_the_table_and_the_corpus_index() -> None:
    files = {p.name for p in LOGS.glob("*.log")}
    assert files == {e[0] for e in EXPECTED}
    corpus = (LOGS / "CORPUS.md").read_text()
    assert [f for f in sorted(files) if f not in corpus] == []


@pytest.mark.parametrize("name", [e[0] for e in EXPECTED])
def test_every_fixture_answers_the_exact_contract(name: str) -> None:
    j = json.loads(json.dumps(analyze_files([LogFile(LOGS / name)]).to_json()))
    assert list(j) == [
        "kv_cache_tokens",
        "graphs",
        "cudagraph_mode",
        "ranks",
        "spec",
        "model_runner",
        "ready",
        "faults",
        "ready_evidence",  # added by issue 10: the line `ready` was decided on, and why
        "request_errors",  # added by issue 32: requests answered with an error (count, first), never faults
        "failed_boot_kv_cache_tokens",  # added by issue 44: the pools of boots that died after printing them
        "envelopes",  # added by issue 44: per file, the encoding and the wrapper its lines were read out of
    ]
    assert list(j["request_errors"]) == ["count", "first"]
    assert list(j["spec"]) == [
        "method",
        "num_speculative_tokens",
        "mask_embedding_loaded",
        "mask_token_id",
        "mean_acceptance_length",
    ]
    assert j["graphs"] in {"captured", "eager", "partial", "unknown"}
    assert j["model_runner"] in {"v1", "v2", None}
    for r in j["ranks"].values():
        assert list(r) == ["graphs", "kv_cache_tokens"]
    for f in j["faults"]:
        assert list(f) == ["file", "line", "kind", "text", "why"] and f["why"]
        assert f["kind"] in {"engine_dead", "worker_died", "nccl", "oom", "timeout", "traceback", "other"}


@pytest.mark.parametrize("name", [e[0] for e in EXPECTED if e[8]])
def test_fault_lines_point_at_the_line_in_the_file(name: str) -> None:
    lines = (LOGS / name).read_bytes().decode().split("\n")
    for f in analyze_files([LogFile(LOGS / name)]).to_json()["faults"]:
        assert strip_ansi(lines[f["line"] - 1]).rstrip("\r") == f["text"]


def test_hard_wrapped_copy_reads_like_the_original_and_keeps_file_line_numbers() -> None:
    wrapped = analyze_files([LogFile(LOGS / "wrapped-config-0.33-head.log")])
    plain = analyze_files([LogFile(LOGS / "v0.33-head.log")]).to_json()
    w = wrapped.to_json()
    evidence = [j.pop("ready_evidence") for j in (w, plain)]
    assert [j.pop("envelopes")[0]["prefix"] for j in (w, plain)] == [None, None]  # a wrap is no envelope
    assert w == plain  # everything but where the evidence sits: the wrap moves line numbers
    assert [e["text"] for e in evidence] == ["INFO:     Application startup complete."] * 2
    kv = [e for log in wrapped.logs for e in log.events if e.kind.value == "kv_tokens"][0]
    lines = (LOGS / "wrapped-config-0.33-head.log").read_text().split("\n")
    assert kv.text.startswith(lines[kv.line - 1])


def test_glued_bars_do_not_hide_the_log_lines_behind_them() -> None:
    a = analyze_files([LogFile(LOGS / "glued-tqdm-0.33-head.log")])
    log = a.logs[0]
    assert [e.line for e in log.events if e.kind.value == "graph_captured"] == [
        e.line
        for e in log.events
        if e.kind.value == "capture_bar" and "FULL)" in e.rec.msg and "dflash2" not in e.rec.msg
    ]
    assert any(e.kind.value == "speculator_capture" for e in log.events)
