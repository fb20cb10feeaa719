"""The card's banked rows beside the user's: `ab report --reference DIR` reads rows in the card's
``drafter/all/*.json`` shape (tests/fixtures/card_rows: written from the card's RESULTS.md figures, not copied),
labels each with its hardware (RESULTS.md's hw column), compares acceptance within the protocol's ±0.015 and
never compares tok/s across hardware; the user's rows are written back in the same shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _ab_waves import bank, spec, wave
from _fixtures import REPO, clean_env, cli

from sparkserve.journal import Journal
from sparkserve.measure import card_rows as cr
from sparkserve.measure.ab_records import CellSpec
from sparkserve.measure.records import BenchResult

REF = REPO / "tests" / "fixtures" / "card_rows" / "all"
SPARK = "2x DGX Spark (GB10)"


def result(al: float, *, c: int = 16, prompts: int = 500, max_tokens: int = 1024, tok_s: float = 70.9,
           k: int = 7) -> BenchResult:
    drafts = round(prompts * max_tokens / al)
    return BenchResult(cell="c16" if c == 16 else "c1", prompts=prompts, concurrency=c, max_tokens=max_tokens,
                       requests_ok=prompts, stream_errors=0, output_tokens=prompts * max_tokens,
                       duration_s=prompts * max_tokens / tok_s, output_tok_s=tok_s, acceptance_length=al,
                       per_position_acceptance=[0.75, 0.55, 0.42, 0.32, 0.25, 0.2, 0.16][:k], drafts=drafts,
                       draft_tokens=drafts * k, accepted_tokens=prompts * max_tokens - drafts, k=k,
                       acceptance_rate=0.38, url="http://127.0.0.1:8000")


def test_the_reference_rows_carry_their_hardware_and_the_default_match_keeps_the_cards_drafters() -> None:
    rows = {r.label: r for r in cr.read_reference(REF)}
    assert rows["dflash2G-k7"].hardware == "B300" and rows["dflash2E-k7"].hardware == "H200"
    assert rows["dflash2G-k7"].shape() == (16, 1024, 7) and rows["dflash2G-k7-mt4096"].shape() == (16, 4096, 7)
    assert "incoai-dflash2-k7-prob" not in rows and "base-mtp-n2-c1" not in rows  # other sampling; no drafter
    everything = {r.label for r in cr.read_reference(REF, match=None)}
    assert {"incoai-dflash2-k7-prob", "base-mtp-n2-c1"} <= everything


def test_acceptance_within_the_noise_is_the_same_and_tok_s_is_never_compared_across_hardware() -> None:
    ours = cr.row_from_result("spark-G", result(3.668), SPARK)
    assert ours.label == "spark-G-k7" and ours.hardware == SPARK
    got = {b.ref.label: b for b in cr.beside([ours], cr.read_reference(REF))}
    assert set(got) == {"dflash2G-k7", "dflash2E-k7", "dflash2E-k7-b300", "incoai-k7-b300"}  # c16 × 1024, K=7
    assert got["dflash2G-k7"].acceptance == "same (within ±0.015)"  # 3.668 vs 3.676
    assert got["dflash2E-k7-b300"].acceptance == "+0.107 above" and got["incoai-k7-b300"].acceptance.endswith("above")
    assert got["dflash2G-k7"].tok_s == f"not compared: {SPARK} vs B300"
    same_hw = cr.compare(cr.row_from_result("b", result(3.60, tok_s=1400.0), "B300"), got["dflash2G-k7"].ref)
    assert same_hw.acceptance == "-0.076 below" and same_hw.tok_s == "-0.7%"


def test_our_rows_are_written_in_the_cards_shape_and_read_back(tmp_path: Path) -> None:
    rows = [cr.row_from_result("spark-G", result(3.5788), SPARK),
            cr.row_from_result("spark-G", result(3.5970, c=1, prompts=100, tok_s=31.4), SPARK)]
    paths = cr.write_rows(rows, tmp_path / "all")
    assert [p.name for p in paths] == ["spark-G-k7.json", "spark-G-k7-c1.json"]
    data = json.loads(paths[0].read_text())
    card_keys = list(json.loads((REF / "dflash2G-k7.json").read_text()))
    assert list(data)[:len(card_keys)] == card_keys and list(data)[len(card_keys):] == ["hardware"]
    assert data["per_position_acceptance_rate"]["0"] == 0.75 and data["mean_acceptance_length"] == 3.579
    back = {r.label: r for r in cr.read_reference(tmp_path / "all", match=None)}
    assert back["spark-G-k7-c1"].hardware == SPARK and back["spark-G-k7-c1"].shape() == (1, 1024, 7)


def test_a_directory_without_rows_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no row in"):
        cr.read_reference(tmp_path)
    (tmp_path / "x.json").write_text('{"label": 1}')
    with pytest.raises(Exception, match="not a row in the card's shape"):
        cr.read_reference(tmp_path)


def test_ab_report_prints_the_cards_rows_beside_a_campaign_and_bench_results(tmp_path: Path) -> None:
    env = clean_env(tmp_path, SSJOURNAL_PATH=str(tmp_path / "journal.sqlite"))
    cell = CellSpec(name="c16", prompts=32, concurrency=16, max_tokens=1024)
    sp = spec(["E", "G"]).model_copy(update={"cells": [cell]})
    rng = np.random.default_rng(3)
    waves = [wave(rng, s.drafter, cell, s.round, al={"E": 3.2, "G": 3.67}[s.drafter], step_s=0.004, slot=i,
                  wid=i + 1) for i, s in enumerate(sp.order)]
    with Journal.open(tmp_path / "journal.sqlite") as j:
        cid = bank(j, sp, waves)
    (tmp_path / "r.json").write_text(result(3.6).to_json())
    p = cli("ab", "report", str(cid), "--bench", str(tmp_path / "r.json"), "--reference", str(REF),
            "--hardware", "rig: CPU emulator", "--card-rows", str(tmp_path / "ours"), env=env)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if "  vs  " in ln]
    assert any(ln.lstrip().startswith("G-k7 [rig: CPU emulator]") and "dflash2G-k7 [B300] 3.676 / 1,409.9" in ln
               and "tok/s not compared: rig: CPU emulator vs B300" in ln for ln in lines), lines
    assert any(ln.lstrip().startswith("r-k7 [rig: CPU emulator] 3.600") for ln in lines), lines
    assert sorted(f.name for f in (tmp_path / "ours").iterdir()) == ["E-k7.json", "G-k7.json", "r-k7.json"]
    js = json.loads(cli("ab", "report", "--bench", str(tmp_path / "r.json"), "--reference", str(REF), "--json",
                        env=env).stdout)
    assert {b["reference"] for b in js["beside"]} == {"dflash2G-k7", "dflash2E-k7", "dflash2E-k7-b300",
                                                      "incoai-k7-b300"}
    none = cli("ab", "report", env=env)
    assert none.returncode == 2 and none.stderr.startswith("error: campaign: give a campaign id or --bench")
