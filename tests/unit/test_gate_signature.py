"""The `signature` gate: every rank prints the lines that prove the profile's path, as the image's dialect
names them (the card's fork: the sparse-MLA KV-layout line and DFLASH2-DRAFTER-GROUP with the drafter's layers).

The logs are the vLLM 0.33.0 fixture logs with the card's two lines added to each rank's worker, worded as the
card's README "Expected boot gates" quotes them (canada-quant/vllm-glm53-flash-sm121 README@00d42fa)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.config import load_config
from sparkserve.observe.gate_inputs import Expectations, NodeIdentity, SmokeResult
from sparkserve.observe.gates import judge
from sparkserve.observe.logs import ParsedLog, parse_log
from sparkserve.plan.dialects import dialect_for, shipped

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
FORK = "0.1.dev20051+g487ecf187"
LAYOUT = "Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend."
GROUP = ("DFLASH2-DRAFTER-GROUP: GLM-5-Next fast path engaged with a spec-decode drafter group (drafter_layers={n}, "
         "mamba_groups=4, tail_group=True)")
OK = {"smoke": SmokeResult(requests=20, requests_ok=20, stream_errors=0, incomplete=0),
      "liveness": {"spark-a": True, "spark-b": True},
      "identity": {n: NodeIdentity("sha256:aa11", "sha256:dd22") for n in ("spark-a", "spark-b")}}


def _with_lines(name: str, worker: str, lines: list[str]) -> str:
    """The fixture log with ``lines`` logged by ``worker`` right after its `Loading model` line."""
    out = []
    for ln in (LOGS / name).read_text().splitlines():
        out.append(ln)
        if "Loading model from scratch" in ln and ln.startswith(f"({worker} "):
            pid = ln.split("pid=", 1)[1].split(")", 1)[0]
            out += [f"({worker} pid={pid}) INFO 11-29 16:03:30 [kv_cache_utils.py:1240] {t}" for t in lines]
    return "\n".join(out) + "\n"


def _logs(head: list[str], follower: list[str]) -> dict[str, ParsedLog]:
    return {"spark-a": parse_log(_with_lines("v0.33-head.log", "Worker_TP0_EP0", head), file="head.log"),
            "spark-b": parse_log(_with_lines("v0.33-follower.log", "Worker_TP1_EP1", follower), file="f.log")}


@pytest.fixture(scope="module")
def fork() -> Expectations:
    cfg = load_config(None)  # the default image is the card's fork: its dialect carries the signature
    assert dialect_for(cfg).name == FORK
    return Expectations.from_config(cfg, mask_file=True, drafter_layers=8)


def test_the_card_lines_on_every_rank_pass(fork: Expectations) -> None:
    both = [LAYOUT, GROUP.format(n=8)]
    r = judge(_logs(both, both), fork, **OK)
    sig = r.get("signature")
    assert r.ok and sig.ok, sig.reason
    assert sorted((e.node, e.text.split("] ", 1)[1]) for e in sig.evidence) == sorted(
        [("spark-a", LAYOUT), ("spark-a", GROUP.format(n=8)), ("spark-b", LAYOUT), ("spark-b", GROUP.format(n=8))])
    assert sig.expected["lines"] == ["Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend",
                                     GROUP.format(n=8).split(" mamba")[0]]


def test_a_rank_on_another_attention_backend_fails_naming_it(fork: Expectations) -> None:
    other = "Using NHD KV cache layout for TRITON_MLA backend."
    r = judge(_logs([LAYOUT, GROUP.format(n=8)], [other, GROUP.format(n=8)]), fork, **OK)
    sig = r.get("signature")
    assert not sig.ok and [g.name for g in r.failed()] == ["signature"]
    assert "rank 1: no `Using HND KV cache layout for FLASHINFER_MLA_SPARSE_SM90 backend` line" in sig.reason
    assert sig.headline() == "signature (spark-b)"


def test_a_drafter_group_of_the_wrong_size_fails(fork: Expectations) -> None:
    r = judge(_logs([LAYOUT, GROUP.format(n=4)], [LAYOUT, GROUP.format(n=4)]), fork, **OK)
    sig = r.get("signature")
    assert not sig.ok
    assert "rank 0 printed" in sig.reason and "drafter_layers=4" in sig.reason and "has 8 layers" in sig.reason


def test_a_missing_drafter_group_fails_on_the_rank_without_it(fork: Expectations) -> None:
    r = judge(_logs([LAYOUT, GROUP.format(n=8)], [LAYOUT]), fork, **OK)
    sig = r.get("signature")
    assert not sig.ok and "rank 1: no `DFLASH2-DRAFTER-GROUP" in sig.reason and "rank 0" not in sig.reason


def test_an_image_whose_dialect_names_no_signature_is_not_failed_for_printing_none() -> None:
    up = Expectations.from_config(load_config(None), mask_file=True, dialect=shipped("0.33.0"))
    r = judge(_logs([], []), up, **OK)
    assert r.ok and r.get("signature").ok and "names no signature lines" in r.get("signature").reason


def test_the_fork_image_printing_neither_fails() -> None:
    ex = Expectations.from_config(load_config(None), mask_file=True, drafter_layers=8)
    r = judge(_logs([], []), ex, **OK)
    assert [g.name for g in r.failed()] == ["signature"]
    assert r.get("signature").reason.count("no `") == 4  # two lines x two ranks


def test_unknown_drafter_layers_still_require_the_line() -> None:
    ex = Expectations.from_config(load_config(None), mask_file=True)  # the drafter's config not read
    r = judge(_logs([LAYOUT, GROUP.format(n=3)], [LAYOUT, GROUP.format(n=3)]), ex, **OK)
    assert r.get("signature").ok and "drafter_layers not compared" in r.get("signature").reason
    assert not judge(_logs([LAYOUT], [LAYOUT]), ex, **OK).get("signature").ok
