"""`bench` and `ab run` with `replicas: N` (issue 34 Deliver 4), without a rig: the crossed design's placement,
its record and its refusals; the bench's fleet counters (each replica's own /metrics summed, each one's share)
against two engine emulators; and why the crossed design exists — a replica's own speed cancels in the delta,
where a fixed placement would read it as a drafter difference."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from _ab_waves import CELLS, spec, wave
from test_bench_emulator import MODEL, StartEmu, emulator, models  # noqa: F401 (fixtures)

from sparkserve.campaign.spec import check_design
from sparkserve.config import Config, default_yaml_text, load_config
from sparkserve.errors import BadInput
from sparkserve.measure.ab_records import CROSSED, SEQUENTIAL, CampaignSpec, crossed_order, interleaved_order
from sparkserve.measure.ab_report import build_report, markdown
from sparkserve.measure.ab_stats import analyze
from sparkserve.measure.fleet import combine, shares
from sparkserve.measure.metrics import Snapshot
from sparkserve.measure.prompts import builtin_prompts
from sparkserve.measure.records import Cell
from sparkserve.measure.run import run_cell


def test_crossed_order_puts_each_drafter_on_each_replica_once_per_rotation_and_never_two_on_one() -> None:
    order = crossed_order(["A", "B"], 4, seed=11)
    assert len(order) == 8
    for r in range(4):
        rnd = [s for s in order if s.round == r]
        assert sorted(s.drafter for s in rnd) == ["A", "B"] and sorted(s.replica for s in rnd) == [1, 2]
    first = {s.drafter: s.replica for s in order if s.round == 0}
    second = {s.drafter: s.replica for s in order if s.round == 1}
    assert first["A"] == second["B"] and first["B"] == second["A"]  # swapped
    assert crossed_order(["A", "B"], 4, seed=11) == order  # seeded
    assert {tuple((s.drafter, s.replica) for s in crossed_order(["A", "B"], 2, seed=k) if s.round == 0)
            for k in range(20)} == {(("A", 1), ("B", 2)), (("B", 1), ("A", 2))}  # the seed draws the start
    latin = Counter((s.drafter, s.replica) for s in crossed_order(["A", "B", "C"], 3, seed=2))
    assert latin == {(d, r): 1 for d in "ABC" for r in (1, 2, 3)}


def test_a_spec_without_a_design_is_sequential_and_orders_as_before() -> None:
    old = spec(["A", "B"], rounds=2)
    doc = old.model_dump(mode="json")
    doc.pop("design")
    back = CampaignSpec.model_validate(doc)  # a campaign banked before the design existed
    assert back.design == SEQUENTIAL
    assert back.order == interleaved_order(["A", "B"], 2, back.seed)
    assert all(s.replica is None for s in back.order)
    crossed = back.model_copy(update={"design": CROSSED})
    assert all(s.replica in (1, 2) for s in crossed.order)
    assert "crossed over on 2 replicas" in crossed.design_text()


def _cfg(tmp_path: Path, replicas: int) -> Config:
    """The default config with ``replicas`` pairs of nodes."""
    data = yaml.safe_load(default_yaml_text())
    node = data["nodes"][0]
    data["nodes"] = [dict(node, name=f"spark-{i}", host=f"spark-{i}.test", fabric_ip=f"192.168.200.{i + 2}")
                     for i in range(2 * replicas)]
    data["replicas"] = replicas
    p = tmp_path / f"r{replicas}.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_config(p)


@pytest.mark.parametrize(("replicas", "drafters", "rounds", "where", "says"), [
    (1, 2, 2, "--design", "need replicas: 2 or more (the config has 1)"),
    (2, 3, 3, "--design", "3 drafters need replicas: 3"),
    (2, 2, 3, "--rounds", "a multiple of 2 rounds"),
])
def test_the_crossed_design_is_refused_where_it_cannot_cross(tmp_path, replicas, drafters, rounds, where,
                                                             says) -> None:
    with pytest.raises(BadInput) as e:
        check_design(_cfg(tmp_path, replicas), CROSSED, drafters, rounds)
    assert e.value.where == where and says in e.value.what
    check_design(_cfg(tmp_path, 2), CROSSED, 2, 4)  # whole rotations on enough replicas
    check_design(_cfg(tmp_path, 1), SEQUENTIAL, 3, 3)


def _snap(boot: float, drafts: float | None, success: float, pos: dict[int, float]) -> Snapshot:
    return Snapshot(boot_id=boot, drafts=drafts, draft_tokens=None if drafts is None else 7 * drafts,
                    accepted_tokens=sum(pos.values()), accepted_per_pos=pos, generation_tokens=10 * success,
                    request_success=success, preemptions=0.0)


def test_combine_sums_the_replicas_and_its_boot_id_moves_when_any_restarts() -> None:
    a, b = _snap(100.0, 10, 3, {0: 5, 1: 2}), _snap(200.0, 20, 4, {0: 9})
    s = combine([a, b])
    assert (s.drafts, s.draft_tokens, s.request_success, s.generation_tokens) == (30, 210, 7, 70)
    assert s.accepted_per_pos == {0: 14, 1: 2} and s.boot_id == 300.0
    assert combine([a, _snap(250.0, 20, 4, {0: 9})]).boot_id != s.boot_id  # replica 2 restarted
    assert combine([a, _snap(200.0, None, 4, {})]).drafts is None  # one replica without the counter: unknown
    got = shares({1: "http://r1", 2: "http://r2"}, {1: a, 2: b}, {1: _snap(100.0, 12, 9, {}), 2: b})
    assert got == [{"replica": 1, "api_url": "http://r1", "requests": 6, "generation_tokens": 60},
                   {"replica": 2, "api_url": "http://r2", "requests": 0, "generation_tokens": 0}]
    assert shares({1: "http://r1"}, {1: a}, {})[0]["requests"] is None  # the after-scrape failed


def test_a_cell_counted_over_two_replicas_sums_their_counters_and_names_each_share(emulator: StartEmu) -> None:  # noqa: F811
    one, two = emulator({"SSEMU_TOKEN_RATE": "400"}), emulator({"SSEMU_TOKEN_RATE": "400"})
    urls = {1: one.url, 2: two.url}
    cell = Cell("t", prompts=6, concurrency=2, max_tokens=128)
    r = run_cell(one.url, MODEL, cell, builtin_prompts(), metrics_urls=urls)
    assert r.ok, r.refused
    assert [(p["replica"], p["requests"]) for p in r.per_replica] == [(1, 6), (2, 0)]
    assert r.drafts and r.acceptance_length is not None

    # a request on the other replica during the cell is someone else's traffic on the fleet: refused
    def other() -> None:
        time.sleep(0.3)
        httpx.post(two.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})

    t = threading.Thread(target=other)
    t.start()
    r = run_cell(one.url, MODEL, cell, builtin_prompts(), metrics_urls=urls)
    t.join()
    assert not r.ok and any(x.startswith("contaminated") for x in r.refused), r.refused
    assert [(p["replica"], p["requests"]) for p in r.per_replica] == [(1, 6), (2, 1)]


def _crossed_waves(replica_step: dict[int, float], placement: dict[tuple[int, str], int]) -> list:
    """A and B identical drafters (same AL); each wave's speed set by the replica it ran on."""
    rng = np.random.default_rng(3)
    out = []
    for slot, ((rnd, drafter), rep) in enumerate(sorted(placement.items())):
        for cs in CELLS:
            w = wave(rng, drafter, cs, rnd, al=3.0, step_s=replica_step[rep], slot=slot, wid=len(out) + 1)
            w.replica = rep
            out.append(w)
    return out


def test_crossing_over_cancels_a_slower_replica_that_a_fixed_placement_reads_as_a_drafter_difference() -> None:
    steps = {1: 0.010, 2: 0.012}  # replica 2 is 20 % slower; A and B are the same drafter
    crossed = {(0, "A"): 1, (0, "B"): 2, (1, "A"): 2, (1, "B"): 1}
    fixed = {(0, "A"): 1, (0, "B"): 2, (1, "A"): 1, (1, "B"): 2}

    def delta(design: str, placement: dict):  # noqa: ANN202
        sp = spec(["A", "B"], rounds=2).model_copy(update={"design": design})
        a = analyze(sp, _crossed_waves(steps, placement), [])
        return next(d for d in a.deltas if d.cell == "c16" and d.metric == "output_tok_s").rel

    x, f = delta(CROSSED, crossed), delta(CROSSED, fixed)
    assert abs(x.point) < 0.03 and x.spans_zero, x  # the replica's speed cancels: a tie, as it should
    assert x.hi - x.lo < 0.08, x  # boots matched by replica: A on 1 against B on 1, A on 2 against B on 2
    assert f.point < -0.12 and not f.spans_zero, f  # fixed: B "loses" by the replica's 20 %
    by_round = delta(SEQUENTIAL, crossed)  # the same waves matched by round: the replica gap becomes width
    assert by_round.point == x.point and by_round.hi - by_round.lo > 0.25, by_round


def test_the_report_states_the_design() -> None:
    sp = spec(["A", "B"], rounds=2).model_copy(update={"design": CROSSED})
    waves = _crossed_waves({1: 0.01, 2: 0.01}, {(0, "A"): 1, (0, "B"): 2, (1, "A"): 2, (1, "B"): 1})
    r = build_report(4, "done", sp, waves, [])
    assert r.design.startswith("crossed over on 2 replicas")
    assert "Design: crossed over on 2 replicas" in markdown(r)
    assert {w["replica"] for w in r.waves} == {1, 2}
    seq = build_report(5, "done", spec(["A", "B"]), [], [])
    assert "Design: sequential: one stack boots the drafters in turn" in markdown(seq)


def _cli(tmp_path: Path, cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSERVE_")}
    env.update(HOME=str(home), SSJOURNAL_PATH=str(tmp_path / "j.sqlite"), COLUMNS="200",
               PYTHONPATH=str(Path(__file__).parents[2]))
    return subprocess.run([sys.executable, "-m", "sparkserve", *args, "-c", str(cfg)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=home)


@pytest.mark.parametrize(("replicas", "args", "says"), [
    (2, ["bench", "--cell", "smoke", "--replica", "3"], "error: --replica: 3 is not a replica of this config "
     "(replicas: 2)"),
    (2, ["bench", "--cell", "smoke", "--replica", "0"], "error: --replica: 0 is not a replica"),
    (1, ["bench", "--cell", "smoke", "--replica", "1"], "error: --replica: 1 is not a replica of this config "
     "(replicas: 1)"),
    (2, ["bench", "--cell", "smoke", "--replica", "1", "--url", "http://127.0.0.1:9"], "error: --replica: --url "
     "names the server itself"),
    (1, ["ab", "run", "--drafter", "A={d}", "--drafter", "B={d}", "--rounds", "2", "--design", "crossed"],
     "error: --design: crossed runs every drafter at once"),
    (2, ["ab", "run", "--drafter", "A={d}", "--drafter", "B={d}", "--design", "crossed"], "error: --rounds: the "
     "crossed design rotates 2 drafters"),
    (2, ["ab", "run", "--resume", "3", "--design", "crossed"], "error: --resume: takes the campaign's own"),
])
def test_bad_replica_or_design_is_one_line_and_exit_2_before_any_node(tmp_path, replicas, args, says) -> None:
    d = tmp_path / "d"
    d.mkdir()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(tmp_path, replicas).model_dump(mode="json", exclude_none=True)))
    p = _cli(tmp_path, cfg, *[a.replace("{d}", str(d)) for a in args])
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(says), p.stderr
