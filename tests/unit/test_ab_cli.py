"""`sparkserve ab run` / `ab report` as a user runs them: bad input is one line and exit 2 before any node
is touched (the default config's nodes do not exist here: touching one would be exit 3); the report of a
banked campaign in every format; an edited journal row is refused; `history` names the campaign."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _ab_waves import CELLS, bank, campaign, wave

from sparkserve.journal import Journal
from sparkserve.measure.ab_records import Boot

REPO = Path(__file__).parents[2]


def sparkserve(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkserve", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=env["HOME"])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
    e.update(HOME=str(home), SSJOURNAL_PATH=str(tmp_path / "journal.sqlite"), COLUMNS="200", PYTHONPATH=str(REPO))
    # a config file of its own (`ab run` reaches nodes: never on the embedded default's placeholder hosts)
    from sparkserve.config import default_yaml_text

    cfg = tmp_path / "sparkserve.yaml"
    cfg.write_text(default_yaml_text().replace("spark-a.lan", "spark-a.test").replace("spark-b.lan", "spark-b.test"))
    e["SPARKSERVE_CONFIG"] = str(cfg)
    return e


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[str, str]:
    a, b = tmp_path / "da", tmp_path / "db"
    a.mkdir()
    b.mkdir()
    return str(a), str(b)


@pytest.mark.parametrize(("extra", "where", "says"), [
    (["--drafter", "A={a}"], "--drafter", "at least two drafters"),
    (["--drafter", "A={a}", "--drafter", "A={b}"], "--drafter", "named twice"),
    (["--drafter", "A={a}", "--drafter", "B"], "--drafter", "NAME=PATH"),
    (["--drafter", "A={a}", "--drafter", "B=/no/such/dir"], "--drafter B", "not a directory"),
    (["--drafter", "A={a}", "--drafter", "B={b}", "--cells", "smoke,c99"], "--cells", "not a cell"),
    (["--drafter", "A={a}", "--drafter", "B={b}", "--size", "c16=8x16"], "--size", "three whole numbers"),
    (["--drafter", "A={a}", "--drafter", "B={b}", "--cells", "smoke", "--size", "c16=8x16x8"], "--size",
     "not one of --cells"),
    (["--drafter", "A={a}", "--drafter", "B={b}", "--cells", "smoke", "--primary", "c16"], "--primary",
     "not one of the campaign's cells"),
    (["--drafter", "A={a}", "--drafter", "B={b}", "--rounds", "0"], "--rounds", "at least 1"),
    (["--drafter", "A={a}", "--drafter", "B={b}", "--prompts", "/no/prompts.jsonl"], "/no/prompts.jsonl",
     "cannot read"),
    (["--resume", "9"], "campaign", "no A/B campaign 9"),
    (["--resume", "9", "--seed", "3"], "--resume", "give none of"),
])
def test_ab_run_bad_input_is_bad_input_before_any_node(env, dirs, extra, where, says, monkeypatch) -> None:
    """In-process (fast): the command raises BadInput (exit 2) naming the option, and no node is opened."""
    from typer.testing import CliRunner

    import sparkserve.nodes.factory as factory
    from sparkserve.cli import app
    from sparkserve.errors import BadInput

    monkeypatch.setenv("SSJOURNAL_PATH", env["SSJOURNAL_PATH"])
    monkeypatch.setenv("HOME", env["HOME"])
    monkeypatch.setenv("SPARKSERVE_CONFIG", env["SPARKSERVE_CONFIG"])
    monkeypatch.setattr(factory, "open_nodes", lambda *a, **k: pytest.fail("a node was opened"))
    a, b = dirs
    r = CliRunner().invoke(app, ["ab", "run", *[x.format(a=a, b=b) for x in extra]])
    e = r.exception
    assert isinstance(e, BadInput), f"{e!r} {r.output}"
    assert e.exit_code == 2 and e.where.startswith(where) and says in e.what, e.line()


def test_ab_run_bad_input_prints_one_line_and_exits_2(env, dirs) -> None:
    a, _ = dirs
    p = sparkserve("ab", "run", "--drafter", f"A={a}", "--drafter", "B=/no/such/dir", env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == ["error: --drafter B: /no/such/dir is not a directory"], p.stderr


def banked(env: dict[str, str], names: list[str], boots: list[Boot] | None = None, status: str = "done") -> int:
    sp, waves = campaign(names)
    with Journal.open(Path(env["SSJOURNAL_PATH"])) as j:
        return bank(j, sp, waves, boots, status)


def test_ab_report_markdown_json_plot_and_text(env, tmp_path) -> None:
    cid = banked(env, ["A", "B", "C"], [Boot(slot=9, round=0, drafter="C", ok=False, excluded="gates failed: mask")])
    md = sparkserve("ab", "report", str(cid), "--markdown", env=env)
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith(f"## A/B campaign {cid} — table of record")
    assert "| Cell (accept / tok/s) | A | B | C |" in md.stdout
    assert "C round 1: boot excluded — gates failed: mask" in md.stdout
    js = sparkserve("ab", "report", str(cid), "--json", env=env)
    data = json.loads(js.stdout)
    assert data["campaign"] == cid and data["status"] == "done"
    assert {v["drafter"]: v["verdict"] for v in data["analysis"]["verdicts"]} == {"B": "KEEP", "C": "TIE"}
    wave_ids = {w["id"] for w in data["waves"]}
    assert all(set(f["waves"]) <= wave_ids and f["waves"] for f in data["analysis"]["figures"])  # traceable rows
    png = tmp_path / "ab.png"
    text = sparkserve("ab", "report", str(cid), "--plot", str(png), env=env)
    assert text.returncode == 0, text.stderr
    assert png.read_bytes()[:4] == b"\x89PNG" and "table of record" in text.stdout and "KEEP" in text.stdout
    h = sparkserve("history", "--json", env=env)
    (entry,) = [e for e in json.loads(h.stdout)["entries"] if e["kind"] == "campaign"]
    assert entry["id"] == cid and "A, B, C: done" in entry["summary"] and f"ab report {cid}" in entry["summary"]


def test_an_edited_wave_row_is_refused(env) -> None:
    cid = banked(env, ["A", "B"])
    with sqlite3.connect(env["SSJOURNAL_PATH"]) as c:
        c.execute("UPDATE campaign_waves SET wave_json = replace(wave_json, '\"output_tok_s\":', "
                  "'\"output_tok_s\": 1') WHERE id = (SELECT MIN(id) FROM campaign_waves)")
    p = sparkserve("ab", "report", str(cid), env=env)
    assert p.returncode == 2 and "edited after it was written" in p.stderr, p.stderr


def test_resume_of_a_done_campaign_says_so(env) -> None:
    cid = banked(env, ["A", "B"])
    p = sparkserve("ab", "run", "--resume", str(cid), env=env)
    assert p.returncode == 2 and f"campaign {cid} is done" in p.stderr, p.stderr


def test_campaign_rows_round_trip_in_the_journal(tmp_path) -> None:
    from sparkserve.campaign.drive import load_campaign

    sp, _ = campaign(["A", "B"], rounds=1)
    w = wave(np.random.default_rng(0), "A", CELLS[0], 0, al=3.0, step_s=0.004, excluded="bench guard: restart")
    with Journal.open(tmp_path / "j.sqlite") as j:
        cid = bank(j, sp, [w], status="interrupted")
        status, spec, boots, waves = load_campaign(j, cid)
    assert status == "interrupted" and spec == sp
    assert [b.id for b in boots] == [waves[0].boot_row] and waves[0].id is not None
    assert waves[0].excluded == "bench guard: restart" and waves[0].samples == w.samples


def test_a_slot_is_finished_once_its_cells_are_banked_or_its_boot_was_excluded() -> None:
    from sparkserve.campaign.slots import slot_finished as _slot_finished

    sp, waves = campaign(["A", "B"], rounds=1)
    first = [w for w in waves if w.slot == 0]
    assert _slot_finished(sp, [], waves, 0) and _slot_finished(sp, [], waves, 1)
    assert not _slot_finished(sp, [], first[:1], 0)  # c16 missing: a resume boots it again for c16 alone
    failed = Boot(slot=1, round=0, drafter="B", ok=False, excluded="gates failed: graphs")
    assert _slot_finished(sp, [failed], first, 1)  # a failed boot is the slot's result, not retried
    assert not _slot_finished(sp, [], first, 1)
