"""The gates as a pure judgement: each fault mode fails exactly the gate(s) it should, with its evidence."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sparkserve.config import load_config
from sparkserve.observe.gate_inputs import Expectations, NodeIdentity, SmokeError, SmokeResult
from sparkserve.observe.gate_report import GATE_NAMES, GateReport
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import ParsedLog, parse_log
from sparkserve.plan.dialects import shipped

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REAL = LOGS / "real-0.25.1"

SMOKE_OK = SmokeResult(requests=20, requests_ok=20, stream_errors=0, incomplete=0)
ALIVE = {"spark-a": True, "spark-b": True}
SAME = {"spark-a": NodeIdentity("sha256:aa11", "sha256:dd22"), "spark-b": NodeIdentity("sha256:aa11", "sha256:dd22")}


def logs(head: str = "v0.33-head.log", follower: str | None = "v0.33-follower.log") -> dict[str, ParsedLog]:
    out = {"spark-a": parse_log((LOGS / head).read_bytes(), file=head)}
    if follower:
        out["spark-b"] = parse_log((LOGS / follower).read_bytes(), file=follower)
    return out


@pytest.fixture(scope="module")
def expect() -> Expectations:
    # the embedded production default: TP=2, FULL_AND_PIECEWISE, pool 366,749, mask 154856, smoke 20 prompts,
    # judged as for a vLLM 0.33.0 image: the fixture logs are vLLM 0.33.0's, whose dialect names no signature
    # lines (the card fork's signature: tests/unit/test_gate_signature.py)
    return Expectations.from_config(load_config(None), mask_file=True, dialect=shipped("0.33.0"))


def run(expect: Expectations, lg: dict[str, ParsedLog] | None = None, **kw) -> GateReport:
    args = {"smoke": SMOKE_OK, "liveness": ALIVE, "identity": SAME} | kw
    return judge(lg if lg is not None else logs(), expect, **args)


def failed(r: GateReport) -> set[str]:
    return {g.name for g in r.failed()}


def test_expectations_from_the_default_config(expect: Expectations) -> None:
    assert expect.ranks == ("0", "1") and expect.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert (expect.pool_tokens, expect.mask_token_id, expect.smoke_prompts) == (366749, 154856, 20)
    assert expect.nodes == ("spark-a", "spark-b") and expect.enforce_eager is False


def test_healthy_stack_passes_every_gate_with_evidence(expect: Expectations) -> None:
    r = run(expect)
    assert r.ok and failed(r) == set()
    assert [g.name for g in r.gates] == list(GATE_NAMES)
    pool = r.get("pool")
    assert pool.observed == [366749] and [
        (e.node, "KV cache size: 366,749 tokens" in e.text) for e in pool.evidence
    ] == [("spark-a", True)]
    assert sorted(e.node for e in r.get("graphs").evidence) == ["spark-a", "spark-b"]
    assert sorted(e.node for e in r.get("mask").evidence) == ["spark-a", "spark-b"]
    assert all("mask_token_id 154856" in e.text for e in r.get("mask").evidence)
    for g in r.gates:
        assert g.evidence, g.name  # every verdict shows what it saw


def test_evidence_lines_are_the_lines_of_the_nodes_log(expect: Expectations) -> None:
    r = run(expect)
    files = {"spark-a": "v0.33-head.log", "spark-b": "v0.33-follower.log"}
    for g in r.gates:
        for e in g.evidence:
            if e.line is not None:
                assert (LOGS / files[e.node]).read_text().split("\n")[e.line - 1] == e.text


# --- graphs ------------------------------------------------------------------------------------------
def test_enforce_eager_fails_graphs_only(expect: Expectations) -> None:
    r = run(expect, logs("v0.33-head-eager.log", "v0.33-follower-eager.log"))
    assert failed(r) == {"graphs"}
    g = r.get("graphs")
    assert "rank 0 graphs off" in g.reason and "rank 1 graphs off" in g.reason
    assert any("Cudagraph is disabled under eager mode" in e.text for e in g.evidence)


def test_configured_enforce_eager_fails_graphs_even_when_the_log_agrees(expect: Expectations) -> None:
    r = run(replace(expect, enforce_eager=True), logs("v0.33-head-eager.log", "v0.33-follower-eager.log"))
    assert "--enforce-eager is configured" in r.get("graphs").reason and not r.get("graphs").ok


def test_rank1_graphs_off_fails_graphs_naming_rank_1(expect: Expectations) -> None:
    r = run(expect, logs(follower="v0.33-follower-rank1-nographs.log"))
    assert failed(r) == {"graphs"}
    g = r.get("graphs")
    assert "rank 1 graphs off" in g.reason and "rank 0" not in g.reason and "spark-b" in g.reason
    assert g.observed["ranks"] == {"0": "captured", "1": "unknown"}


def test_missing_follower_log_fails_graphs_and_mask_for_rank_1(expect: Expectations) -> None:
    r = run(expect, logs(follower=None), liveness={"spark-a": True})
    assert {"graphs", "mask", "faults"} <= failed(r)
    assert "rank 1: no line from rank 1" in r.get("graphs").reason
    assert "no log from spark-b" in r.get("faults").reason


def test_cudagraph_downgrade_fails_graphs(expect: Expectations) -> None:
    lg = logs()
    extra = parse_log(
        (LOGS / "v0.33-follower.log").read_text()
        + "(Worker_TP1_EP1 pid=3190) WARNING 11-29 16:03:46 [compilation.py:900] CUDAGraphMode.FULL_AND_PIECEWISE is "
        "not supported with FLASHINFER backend (support: AttentionCGSupport.UNIFORM_BATCH); setting "
        "cudagraph_mode=PIECEWISE because attention is compiled piecewise\n",
        file="f",
    )
    lg["spark-b"] = extra
    g = run(expect, lg).get("graphs")
    assert not g.ok and "downgraded FULL_AND_PIECEWISE → PIECEWISE on rank 1" in g.reason
    assert any("setting cudagraph_mode=PIECEWISE" in e.text for e in g.evidence)


def test_drafter_forced_eager_fails_graphs(expect: Expectations) -> None:
    lg = logs()
    lg["spark-a"] = parse_log(
        (LOGS / "v0.33-head.log").read_text()
        + "(Worker_TP0_EP0 pid=2513) WARNING 11-29 16:03:47 [speculator.py:90] DFlash2 draft attention (TRITON_ATTN) "
        "does not support full CUDA graphs; running the draft eagerly.\n",
        file="h",
    )
    g = run(expect, lg).get("graphs")
    assert not g.ok and "drafter runs eagerly on rank 0" in g.reason


# --- mask --------------------------------------------------------------------------------------------
def test_drafter_without_mask_file_fails_mask_on_every_rank(expect: Expectations) -> None:
    r = run(expect, logs("v0.33-head-nomask.log", "v0.33-follower-nomask.log"))
    assert failed(r) == {"mask"}
    m = r.get("mask")
    assert "rank 0: no `Loaded DFlash mask embedding` line" in m.reason and "rank 1:" in m.reason
    assert m.observed == {"0": None, "1": None}


def test_mask_missing_on_one_rank_names_that_rank(expect: Expectations) -> None:
    m = run(expect, logs(follower="v0.33-follower-nomask.log")).get("mask")
    assert not m.ok and "rank 1:" in m.reason and "rank 0" not in m.reason and "spark-b" in m.reason


def test_config_expects_a_mask_the_drafter_does_not_hold(expect: Expectations) -> None:
    m = run(replace(expect, mask_file=False), logs("v0.33-head-nomask.log", "v0.33-follower-nomask.log")).get("mask")
    assert not m.ok and "has no mask_embedding.pt but gates.mask_token_id=154856" in m.reason


def test_no_mask_file_and_no_mask_id_needs_no_loader_line(expect: Expectations) -> None:
    e = replace(expect, mask_file=False, mask_token_id=None)
    m = run(e, logs("v0.33-head-nomask.log", "v0.33-follower-nomask.log")).get("mask")
    assert m.ok and "nothing to load" in m.reason


def test_mask_with_the_wrong_id_fails(expect: Expectations) -> None:
    m = run(replace(expect, mask_token_id=151669)).get("mask")
    assert not m.ok and "rank 0 loaded mask_token_id 154856, expected 151669" in m.reason


def test_mask_file_present_without_configured_id_requires_the_line(expect: Expectations) -> None:
    e = replace(expect, mask_token_id=None)
    assert run(e).get("mask").ok
    assert not run(e, logs("v0.33-head-nomask.log", "v0.33-follower-nomask.log")).get("mask").ok


# --- pool --------------------------------------------------------------------------------------------
def test_changed_pool_fails_against_config(expect: Expectations) -> None:
    r = run(expect, logs(head="v0.33-head-pool-changed.log"))
    assert failed(r) == {"pool"}
    assert "352,118" in r.get("pool").reason and "366,749" in r.get("pool").reason


def test_changed_pool_fails_against_the_banked_value(expect: Expectations) -> None:
    e = replace(expect, pool_tokens=None, banked_pool=366749)
    p = run(e, logs(head="v0.33-head-pool-changed.log")).get("pool")
    assert not p.ok and "banked pool is 366,749" in p.reason
    assert run(e).get("pool").ok


def test_banked_and_configured_pool_must_agree(expect: Expectations) -> None:
    p = run(replace(expect, banked_pool=352118)).get("pool")
    assert not p.ok and "disagrees with the pool banked" in p.reason


def test_pool_with_nothing_to_compare_passes_and_says_so(expect: Expectations) -> None:
    p = run(replace(expect, pool_tokens=None)).get("pool")
    assert p.ok and "--bank" in p.reason and p.observed == [366749]


def test_pool_not_found_says_what_it_looked_for(expect: Expectations) -> None:
    p = run(expect, {"spark-b": logs()["spark-b"]}).get("pool")
    assert not p.ok and "looked for `KV cache size: N tokens`" in p.reason and p.observed is None
    v0 = run(expect, {"spark-a": parse_log((LOGS / "v0-gpu-blocks.log").read_bytes(), file="v0")}).get("pool")
    assert not v0.ok and "blocks, not tokens" in v0.reason and "# GPU blocks" in v0.evidence[0].text


# --- smoke -------------------------------------------------------------------------------------------
def test_smoke_not_run_fails(expect: Expectations) -> None:
    s = run(expect, smoke=None).get("smoke")
    assert not s.ok and s.reason.startswith("not run")


def test_smoke_stream_error_fails_naming_the_node(expect: Expectations) -> None:
    res = SmokeResult(20, 19, 1, 0, (SmokeError("spark-b", "request 7: no token for 120 s (stream stalled)"),))
    s = run(expect, smoke=res).get("smoke")
    assert not s.ok and "1 stream error(s)" in s.reason and "spark-b" in s.reason
    assert [(e.node, e.line) for e in s.evidence] == [("spark-b", None), ("head", None)]
    assert "stream stalled" in s.evidence[0].text and "19 of 20 requests complete" in s.evidence[1].text


def test_smoke_incomplete_or_short_fails(expect: Expectations) -> None:
    assert "1 incomplete" in run(expect, smoke=SmokeResult(20, 20, 0, 1)).get("smoke").reason
    assert "18 of 20 requests completed" in run(expect, smoke=SmokeResult(18, 18, 0, 0)).get("smoke").reason


# --- faults ------------------------------------------------------------------------------------------
def test_dead_follower_fails_faults_with_the_info_shm_line_and_the_dead_container(expect: Expectations) -> None:
    r = run(expect, logs(head="fault-dead-follower-0.33-head.log"), liveness={"spark-a": True, "spark-b": False})
    assert failed(r) == {"faults"}
    f = r.get("faults")
    assert "No available shared memory broadcast block found" in f.evidence[0].text
    assert ("spark-b", None) in [(e.node, e.line) for e in f.evidence]
    assert "not running on spark-b" in f.reason


def test_dead_container_alone_fails_faults(expect: Expectations) -> None:
    f = run(expect, liveness={"spark-a": True, "spark-b": False}).get("faults")
    assert not f.ok and f.observed["dead_containers"] == ["spark-b"]


@pytest.mark.parametrize(
    ("head", "follower", "kind", "needle"),
    [
        ("fault-worker-oom-0.33-head.log", "v0.33-follower.log", "oom", "torch.OutOfMemoryError: CUDA out of memory"),
        ("fault-rpc-timeout-0.33-head.log", "v0.33-follower.log", "timeout", "RPC call to sample_tokens timed out"),
        ("v0.33-head.log", "fault-nccl-0.33-follower.log", "nccl", "NCCL WARN"),
        ("v0.33-head.log", "fault-watchdog-0.33-follower.log", "timeout", "Watchdog caught collective operation"),
    ],
)
def test_each_engine_fault_fails_exactly_faults(expect, head, follower, kind, needle) -> None:
    r = run(expect, logs(head, follower))
    assert failed(r) == {"faults"}
    f = r.get("faults")
    assert f.observed["faults"][0]["kind"] == kind and needle in f.evidence[0].text


def test_boot_failure_reports_the_root_cause_first(expect: Expectations) -> None:
    r = run(expect, logs(head="fault-init-mask-mismatch-0.33-head.log"))
    f = r.get("faults")
    assert not f.ok and "mask_embedding.pt mask_token_id does not match" in f.evidence[0].text
    assert "first on spark-a line 32" in f.reason


def test_shutdown_artefacts_are_not_faults(expect: Expectations) -> None:
    f = run(expect, logs("shutdown-0.33-head.log", "shutdown-0.33-follower.log")).get("faults")
    assert f.ok and "shutdown artefact" in f.reason


def test_offline_faults_say_liveness_was_not_checked(expect: Expectations) -> None:
    f = run(expect, liveness=None).get("faults")
    assert f.ok and "not checked (offline)" in f.reason


# --- runner ------------------------------------------------------------------------------------------
def test_v1_fallback_fails_runner_with_the_warning(expect: Expectations) -> None:
    r = run(expect, logs(head="v1-fallback-0.33-head.log"))
    assert failed(r) == {"runner"}
    assert r.get("runner").observed == {"spark-a": "v1", "spark-b": "v2"}
    assert "using the V1 model runner instead" in r.get("runner").evidence[0].text


def test_runner_not_found_says_what_it_looked_for(expect: Expectations) -> None:
    lg = {"spark-a": parse_log((LOGS / "v0-gpu-blocks.log").read_bytes(), file="v0")}
    g = run(expect, lg).get("runner")
    assert not g.ok and "looked for `Using V2 Model Runner`" in g.reason


# --- identity ----------------------------------------------------------------------------------------
def test_different_images_fail_identity(expect: Expectations) -> None:
    ident = dict(SAME, **{"spark-b": NodeIdentity("sha256:bb99", "sha256:dd22")})
    i = run(expect, identity=ident).get("identity")
    assert not i.ok and "image IDs differ" in i.reason and "drafter" not in i.reason


def test_different_drafters_fail_identity(expect: Expectations) -> None:
    ident = dict(SAME, **{"spark-b": NodeIdentity("sha256:aa11", "sha256:ee33")})
    assert "drafter digests differ" in run(expect, identity=ident).get("identity").reason


def test_identity_missing_facts_fail(expect: Expectations) -> None:
    assert run(expect, identity=None).get("identity").reason.startswith("not run")
    i = run(expect, identity={"spark-a": SAME["spark-a"]}).get("identity")
    assert not i.ok and "no identity facts from spark-b" in i.reason
    j = run(expect, identity=dict(SAME, **{"spark-b": NodeIdentity(None, "sha256:dd22")})).get("identity")
    assert not j.ok and "no image ID from spark-b" in j.reason


# --- skip and contract -------------------------------------------------------------------------------
def test_skipped_gates_stay_listed_as_skipped(expect: Expectations) -> None:
    r = judge(logs(), expect, skip=["smoke", "identity"])
    assert r.ok
    assert [(g.name, g.skipped) for g in r.gates if g.skipped] == [("smoke", True), ("identity", True)]
    assert r.get("smoke").reason.startswith("skipped")


def test_unknown_gate_to_skip_is_an_error(expect: Expectations) -> None:
    with pytest.raises(ValueError, match="unknown gate"):
        judge(logs(), expect, skip=["pools"])


def test_gates_json_contract(expect: Expectations) -> None:
    j = run(expect, logs(follower="v0.33-follower-rank1-nographs.log")).to_json()
    assert list(j) == ["ok", "gates"] and j["ok"] is False
    assert [g["name"] for g in j["gates"]] == ["pool", "graphs", "mask", "smoke", "faults", "runner", "signature",
                                               "identity"]
    for g in j["gates"]:
        assert list(g) == ["name", "ok", "expected", "observed", "reason", "evidence"]
        for e in g["evidence"]:
            assert list(e) == ["node", "line", "text"]


# --- the real vLLM 0.25.1 logs ------------------------------------------------------------------------
def real_logs(*pairs: tuple[str, str]) -> dict[str, ParsedLog]:
    return {n: parse_log((REAL / f).read_bytes(), file=f) for n, f in pairs}


def test_real_025_mp_stack_passes_the_log_gates() -> None:
    e = Expectations(ranks=("0", "1"), pool_tokens=1677712, mask_file=True, mask_token_id=4, smoke_prompts=20)
    r = judge(
        real_logs(("a", "A-head.log"), ("b", "A-follower.log")),
        e,
        smoke=SMOKE_OK,
        liveness={"a": True, "b": True},
        identity={"a": SAME["spark-a"], "b": SAME["spark-a"]},
    )
    assert r.ok, [(g.name, g.reason) for g in r.failed()]


def test_real_025_eager_run_without_mask_fails_graphs_and_mask() -> None:
    e = Expectations(ranks=("0", "1"), pool_tokens=838848, mask_file=True, mask_token_id=4)
    r = judge(real_logs(("a", "B-head.log")), e, skip=["smoke", "identity"])
    assert failed(r) == {"graphs", "mask"}
    assert "Enforce eager set" in r.get("graphs").reason


def test_rankless_worker_lines_are_attributed_by_node_when_it_hosts_one_rank(expect: Expectations) -> None:
    # a follower whose worker lines lost their `(Worker_TP1_EP1 pid=N)` prefix: only the node says which rank
    text = (LOGS / "v0.33-follower.log").read_text()
    bare = "\n".join(x.split(") ", 1)[1] if x.startswith("(Worker") else x for x in text.splitlines()) + "\n"
    lg = logs()
    lg["spark-b"] = parse_log(bare, file="f")
    assert run(expect, lg).ok
    lg["spark-b"] = parse_log(bare, file="f")
    r = run(replace(expect, node_ranks=None), lg)
    assert failed(r) == {"graphs", "mask"} and "rank 1: no line from rank 1" in r.get("graphs").reason


def test_ray_gives_no_node_to_rank_mapping() -> None:
    cfg = load_config(None)
    cfg.serve.executor = "ray"
    assert Expectations.from_config(cfg).node_ranks is None
