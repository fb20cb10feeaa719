"""The A/B campaign's pure core: interleaved order, cell sizes, bootstrap intervals, deltas, verdicts, the
honest read and the table of record (text, Markdown, JSON, plot) — on synthetic banked waves."""

from __future__ import annotations

import sys

import pytest
from _ab_waves import campaign

from sparkserve.errors import BadInput
from sparkserve.measure.ab_records import Boot, CellSpec, interleaved_order, parse_size
from sparkserve.measure.ab_report import build_report, card_rows, holdout_rows, interval_rows, markdown, plot
from sparkserve.measure.ab_stats import analyze


def test_order_interleaves_abba_every_drafter_once_per_round_and_is_seeded() -> None:
    order = interleaved_order(["A", "B", "C"], 4, seed=3)
    rounds = [[s.drafter for s in order if s.round == r] for r in range(4)]
    assert all(sorted(r) == ["A", "B", "C"] for r in rounds)
    assert rounds[1] == rounds[0][::-1] and rounds[3] == rounds[2][::-1]
    assert interleaved_order(["A", "B", "C"], 4, seed=3) == order
    assert len({tuple(s.drafter for s in interleaved_order(["A", "B", "C"], 2, seed=s)) for s in range(20)}) > 1


def test_size_parses_and_refuses_with_the_option_named() -> None:
    assert parse_size("c16=8x16x128") == CellSpec(name="c16", prompts=8, concurrency=16, max_tokens=128)
    for bad in ("c99=1x1x1", "c16=8x16", "c16=0x1x1", "smoke"):
        with pytest.raises(BadInput) as e:
            parse_size(bad)
        assert e.value.where == "--size"


def test_better_profile_keeps_identical_profile_ties_worse_reverts() -> None:
    sp, waves = campaign(["A", "B", "C", "D"])
    a = analyze(sp, waves, [])
    v = {x.drafter: x for x in a.verdicts}
    assert v["B"].verdict == "KEEP" and v["B"].rel.lo > 0
    assert v["C"].verdict == "TIE" and v["C"].rel.lo <= 0 <= v["C"].rel.hi
    assert v["D"].verdict == "REVERT" and v["D"].rel.hi < 0
    # the point delta is the ratio of the headline figures (mean over boots)
    fa = next(f for f in a.figures if f.drafter == "A" and f.cell == "c16")
    fb = next(f for f in a.figures if f.drafter == "B" and f.cell == "c16")
    assert v["B"].rel.point == pytest.approx(fb.tok_s.point / fa.tok_s.point - 1, rel=1e-4)
    for f in a.figures:
        assert f.tok_s.lo < f.tok_s.point < f.tok_s.hi
        assert f.acceptance_length.lo < f.acceptance_length.point < f.acceptance_length.hi
        assert f.boots == 2 and len(f.per_position) == 7 and f.per_position[0].lo is not None
        assert f.ttft_ms.p50 <= f.ttft_ms.p90 <= f.ttft_ms.p99 and f.tpot_ms.p50 > 0
    assert "B wins" in a.honest_read and "B KEEP" in a.honest_read and "D loses" in a.honest_read


def test_intervals_are_seeded_and_one_boot_has_no_per_position_interval() -> None:
    sp, waves = campaign(["A", "B"], rounds=1)
    one, two = analyze(sp, waves, []), analyze(sp, waves, [])
    assert one == two
    assert all(f.per_position[0].lo is None and f.tok_s.lo is not None for f in one.figures)
    other = analyze(sp.model_copy(update={"seed": sp.seed + 1}), waves, [])
    assert other.figures[0].tok_s.lo != one.figures[0].tok_s.lo


def test_excluded_boots_and_waves_are_named_and_not_counted() -> None:
    sp, waves = campaign(["A", "B", "C"])
    c_waves = [w for w in waves if w.drafter == "C"]
    rest = [w for w in waves if w.drafter != "C"]
    bad = rest[0].model_copy(update={"excluded": "bench guard: contaminated", "id": 999})
    boots = [Boot(slot=c_waves[0].slot, round=0, drafter="C", ok=False, excluded="gates failed: graphs"),
             Boot(slot=c_waves[-1].slot, round=1, drafter="C", ok=False, excluded="gates failed: graphs")]
    a = analyze(sp, [*rest, bad], boots)
    assert {f.drafter for f in a.figures} == {"A", "B"}
    assert [v.drafter for v in a.verdicts] == ["B"]
    assert any("C round 1: boot excluded — gates failed: graphs" in e for e in a.excluded)
    assert any("wave excluded — bench guard: contaminated" in e for e in a.excluded)
    assert any(e.startswith("C: no counted wave") for e in a.excluded)
    assert all(999 not in f.waves for f in a.figures)
    assert "C left without figures" in a.honest_read


def test_markdown_reproduces_the_card_table_shape() -> None:
    sp, waves = campaign(["A", "B", "C"])
    r = build_report(4, "done", sp, waves, [])
    header, rows = card_rows(r)
    assert header == ["Cell (accept / tok/s)", "A", "B", "C"]
    assert [row[0] for row in rows] == ["smoke 12×c1×256", "c16 32×c16×256 (primary)",
                                        "Per-position acceptance (K=7, c16)"]
    fa = next(f for f in r.analysis.figures if f.drafter == "A" and f.cell == "smoke")
    assert rows[0][1] == f"{fa.acceptance_length.point:.4f} / {fa.tok_s.point:,.2f}"  # the card's "3.5788 / 70.87"
    assert len(rows[2][1].split(" · ")) == 7
    # the drafter cards' holdout table: drafters as rows, "K=<k>, c<concurrency>" columns, "3.676 (1,410)"
    hh, hr = holdout_rows(r)
    assert hh == ["Mean acceptance length (output tok/s)", "K=7, c1", "K=7, c16"]
    fb = next(f for f in r.analysis.figures if f.drafter == "B" and f.cell == "c16")
    assert [row[0] for row in hr] == ["A", "B", "C"]
    assert hr[1][2] == f"{fb.acceptance_length.point:.3f} ({fb.tok_s.point:,.0f})"
    md = markdown(r)
    assert "| Cell (accept / tok/s) | A | B | C |" in md and "|---|---|---|---|" in md
    assert "### Verdicts" in md and "KEEP" in md and "### Honest read" in md
    assert "temperature 1.0, top_p 0.95" in md and "forced output length on" in md
    assert "### Holdout-table shape" in md and "| Mean acceptance length (output tok/s) | K=7, c1 | K=7, c16 |" in md
    assert "Protocol: the forced protocol" in md
    assert "TTFT ms p50/p90/p99" in md
    js = r.model_dump(mode="json")
    assert js["analysis"]["verdicts"][0]["drafter"] == "B" and js["waves"][0]["pins"]["boot_id"]


def test_a_card_protocol_campaign_says_so_and_k_heads_each_column() -> None:
    sp, waves = campaign(["A", "B"])
    sp = sp.model_copy(update={"sampling": {"protocol": "card", "temperature": 1.0, "top_p": 0.95,
                                            "enable_thinking": True, "forced_length": False,
                                            "chat_template": "/m/tokenizer_config.json",
                                            "chat_template_sha256": "9" * 64}})
    k4 = [w.model_copy(update={"result": w.result.model_copy(update={"k": 4})}) if w.cell == "c16" else w
          for w in waves]
    r = build_report(5, "done", sp, k4, [])
    assert holdout_rows(r)[0][1:] == ["K=7, c1", "K=4, c16"]
    md = markdown(r)
    assert "the model card's holdout protocol (/v1/completions" in md and "/m/tokenizer_config.json" in md
    assert "forced output length off" in md and "Per-position acceptance (K=4, c16)" in md


def test_without_chunks_the_acceptance_interval_is_across_boots_alone() -> None:
    """Card-protocol waves (replies not streamed: no chunks) still get an acceptance interval over boots."""
    sp, waves = campaign(["A", "B"], rounds=2)
    flat = [w.model_copy(update={"samples": w.samples.model_copy(update={"chunks": [0] * len(w.samples.chunks)})})
            for w in waves]
    a = analyze(sp, flat, [])
    f = next(x for x in a.figures if x.drafter == "A" and x.cell == "c16")
    points = [w.result.acceptance_length for w in flat if w.drafter == "A" and w.cell == "c16"]
    assert len(points) == 2 and f.acceptance_length.lo is not None
    assert min(points) - 1e-9 <= f.acceptance_length.lo <= f.acceptance_length.hi <= max(points) + 1e-9
    one = analyze(sp.model_copy(update={"rounds": 1}), [w for w in flat if w.round == 0], [])
    assert all(x.acceptance_length.lo is None for x in one.figures)  # one boot: nothing to resample


def test_plot_writes_a_png_and_names_the_extra_when_matplotlib_is_missing(tmp_path, monkeypatch) -> None:
    sp, waves = campaign(["A", "B"])
    r = build_report(1, "done", sp, waves, [])
    out = tmp_path / "ab.png"
    plot(r, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(BadInput) as e:
        plot(r, tmp_path / "b.png")
    assert "sparkserve[plot]" in e.value.what and e.value.where == "--plot"


def test_a_wave_is_excluded_for_a_guard_a_restart_or_a_replaced_container() -> None:
    from sparkserve.measure.ab_records import wave_exclusion

    _, waves = campaign(["A", "B"], rounds=1)
    r = waves[0].result.model_copy(update={"boot_id": 100.0})
    assert wave_exclusion(r, None, "b1", "b1") is None
    assert wave_exclusion(r, 100.0, "b1", "b1") is None
    refused = r.model_copy(update={"refused": ["contaminated: the server finished 9 requests, the cell sent 8"]})
    assert wave_exclusion(refused, None, "b1", "b1") == "bench guard: contaminated: the server finished 9 " \
        "requests, the cell sent 8"
    assert "restarted since this boot's first cell" in wave_exclusion(r, 99.0, "b1", "b1")
    assert "rank of this boot restarted" in wave_exclusion(r, 100.0, "b1", "b2")


def test_e2e_p50_has_a_bootstrap_interval_and_a_delta_that_wins_when_lower() -> None:
    # B accepts more (3.6 vs 3.0): fewer steps per request, so its median E2E is lower — a win; D's is higher
    sp, waves = campaign(["A", "B", "C", "D"])
    a = analyze(sp, waves, [])
    fig = {(f.drafter, f.cell): f for f in a.figures}
    e2e = fig[("A", "c16")].e2e_p50_ms
    assert e2e is not None and e2e.lo is not None and e2e.hi is not None and e2e.lo < e2e.point < e2e.hi
    assert fig[("A", "c16")].e2e_ms is not None and fig[("A", "c16")].e2e_ms.p50 is not None
    d = {(x.drafter, x.cell): x for x in a.deltas if x.metric == "e2e_p50_ms"}
    assert d[("B", "c16")].outcome == "win" and d[("B", "c16")].rel.hi < 0
    assert d[("D", "c16")].outcome == "loss" and d[("D", "c16")].rel.lo > 0
    assert d[("C", "c16")].outcome == "tie"
    assert [v.metric for v in a.verdicts] == ["output_tok_s"] * 3  # the verdict stays the rule's metric
    r = build_report(7, "done", sp, waves, [])
    header, rows = interval_rows(r)
    col = header.index("E2E ms p50 [95 %]")
    b_row = next(row for row in rows if row[0] == "c16" and row[1] == "B")
    assert "[" in b_row[col] and b_row[col + 1].startswith("-")  # the interval, and B's delta below 0
    assert "E2E ms p50" in markdown(r)


def _scaled(w, factor: float):
    """``w`` as if every request ran ``factor`` times as long (a slower boot, the same tokens and steps)."""
    s = w.samples.model_copy(update={"latency_s": [x * factor for x in w.samples.latency_s]})
    r = w.result.model_copy(update={"duration_s": w.result.duration_s * factor,
                                    "output_tok_s": round(w.result.output_tok_s / factor, 3)})
    return w.model_copy(update={"samples": s, "result": r})


def test_a_delta_inside_the_noise_floor_is_a_tie_though_its_interval_clears_0() -> None:
    """The rule calls a win only past the cell's noise floor: a copy of the baseline (identical requests) that
    ran 0.5 % faster in both rounds, or ~6 % faster than the mean of a baseline whose own two boots lie ~10 %
    apart, ties (both with an interval above 0); 3 % over a baseline whose boots agree is a win."""
    import numpy as np
    from _ab_waves import CELLS, spec, wave

    def run(c_factor: float, a_round1: float) -> tuple:
        sp = spec(["A", "C"])
        waves = []
        for k, slot in enumerate(sp.order):
            for cell in CELLS:
                w = wave(np.random.default_rng(100 * slot.round + CELLS.index(cell)), slot.drafter, cell,
                         slot.round, al=3.0, step_s=0.004, slot=k, wid=len(waves) + 1)  # A and C: one stream
                factor = c_factor if slot.drafter == "C" else (a_round1 if slot.round == 1 else 1.0)
                waves.append(_scaled(w, factor))
        a = analyze(sp, waves, [])
        (v,) = a.verdicts
        d = next(x for x in a.deltas if x.cell == "c16" and x.metric == "output_tok_s")
        return v, d, a.honest_read

    v, d, read = run(1 / 1.005, 1.0)  # +0.5 % every time: the interval clears 0, the floor (1 %) is not reached
    assert v.rel.lo > 0 and v.verdict == "TIE" and d.outcome == "tie" and d.noise_floor == pytest.approx(0.01)
    assert "inside the noise floor, 1.0 % here" in read
    v, d, _ = run(1 / 1.01, 1.10)  # over A's mean while A's two boots lie ~10 % apart: inside A's own spread
    assert v.verdict == "TIE" and v.rel.lo > 0 and 0.08 < d.noise_floor < 0.12 and 0.04 < v.rel.point < d.noise_floor
    v, d, _ = run(1 / 1.03, 1.0)  # the same 3 % over a baseline whose boots agree: a win
    assert v.verdict == "KEEP" and v.rel.lo > 0 and d.noise_floor == pytest.approx(0.01)
