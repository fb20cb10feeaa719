"""`sparkserve tune`'s figures and reading: every candidate against every other, per cell, with the A/B
campaign's paired bootstrap (:mod:`sparkserve.measure.ab_stats`), and a recommendation in words. Pure.

    table = tune_table(spec, waves, min_effect=0.01)      # per cell: each candidate's AL, E2E p50, tok/s, TPOT
    table.cells[0].advice                                 # "K=3 for c16: output tok/s +8.9 % [5.1, 12.0] over K=5 …"
    clear = leader_clear(spec, waves, level=0.975, min_effect=0.01)   # the sequential look: None or the leader

What the figures are:

* **tok/s** and **AL** exactly as ``ab report`` has them (the counters' figures, intervals by resampling requests
  within a boot and boots across rounds);
* **E2E p50**: the median of the requests' end-to-end latencies (:func:`request_e2e_s`, from the per-request
  samples each wave keeps), its interval by the same two-level resampling: lower is better;
* **TPOT p50** where the protocol streams (the forced protocol; the card's replies are not streamed, so there is
  no first-token time to take off): ``(latency − TTFT) / (tokens − 1)`` per request (:func:`request_tpot_s`).

A difference is *called* only when its 95 % interval lies wholly on one side of 0 **and** its point is at least
the cell's noise floor: ``min_effect`` (default 1 %: a fraction of a percent is not worth a restart), or, when
larger, the widest spread of output tok/s between two boots of one candidate on that cell
(:func:`boot_spread`) — a bootstrap over two or three boots rests on those few values and can be narrower than
what one candidate does from boot to boot (seen on the rig: two K that stream the very same tokens read 2-4 %
apart, cell after cell, on a busy machine). Anything else is "inside noise", and the advice keeps the current
value: it never recommends a change that the interval and the floor do not support.

The sequential look (``tune`` between rounds, from the second round on, when every candidate has two counted
boots): the leader is clear on a cell when its tok/s delta against **every** other candidate is called at the
look's level (an intersection-union test: all of them must hold, so no correction across candidates; across
looks the level is split Bonferroni-wise by the caller).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from sparkserve.measure.ab_records import CROSSED, CampaignSpec, Wave
from sparkserve.measure.ab_stats import (
    Interval,
    _arm_reps,
    _by_round,
    _Draws,
    _per_position,
    boot_spread,
    fmt_interval,
    p50_reps,
    tpot_values,
)

LEVEL = 0.95
HIGHER, LOWER = "higher", "lower"  # which way is better
METRIC_WORDS = {"output_tok_s": ("output tok/s", HIGHER), "acceptance_length": ("acceptance length", HIGHER),
                "e2e_p50": ("E2E p50", LOWER), "tpot_p50": ("TPOT p50", LOWER)}


def request_e2e_s(w: Wave) -> list[float]:
    """A wave's per-request end-to-end latencies (s): request sent to last byte, as the cell measured them."""
    return [x for x in w.samples.latency_s if x is not None]


def request_tpot_s(w: Wave) -> list[float]:
    """A wave's per-request time per output token after the first (s); empty when the cell did not stream
    (``ab report``'s own definition: :func:`sparkserve.measure.ab_stats.tpot_values`)."""
    return tpot_values(w)


def _interval(point: float | None, reps: np.ndarray | None, level: float) -> Interval:
    if point is None or reps is None or reps.size == 0 or not np.all(np.isfinite(reps)):
        return Interval(point=point)
    lo, hi = np.percentile(reps, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return Interval(point=round(point, 6), lo=round(float(lo), 6), hi=round(float(hi), 6))


Reps = dict[str, tuple[float | None, np.ndarray | None]]


def cell_reps(spec: CampaignSpec, waves: list[Wave], cell_index: int) -> dict[str, Reps]:
    """Every arm's figures and replicates on one cell, all drawn with one shared set of draws (paired)."""
    cs = spec.cells[cell_index]
    draws = _Draws(spec.seed, cell_index, spec.bootstrap)
    out: dict[str, Reps] = {}
    for arm in spec.drafters:
        mine = _by_round([w for w in waves if w.counts and w.drafter == arm.name and w.cell == cs.name],
                         crossed=spec.design == CROSSED)
        if not mine:
            continue
        out[arm.name] = {
            "output_tok_s": _arm_reps(mine, "output_tok_s", draws),
            "acceptance_length": _arm_reps(mine, "acceptance_length", draws),
            "e2e_p50": p50_reps([request_e2e_s(w) for w in mine], draws),
            "tpot_p50": p50_reps([request_tpot_s(w) for w in mine], draws),
        }
    return out


def rel_delta(x: tuple[float | None, np.ndarray | None], base: tuple[float | None, np.ndarray | None],
              level: float = LEVEL) -> Interval:
    """x against base, relative (``x / base − 1``), its interval from the paired replicates."""
    if x[0] is None or base[0] is None or base[0] == 0:
        return Interval(point=None)
    reps = None if x[1] is None or base[1] is None else x[1] / base[1] - 1
    return _interval(x[0] / base[0] - 1, reps, level)


def called(d: Interval, metric: str, min_effect: float) -> int:
    """+1 when the delta is a called improvement (interval wholly better and at least ``min_effect``), -1 a
    called loss, 0 inside noise (or no interval)."""
    if d.point is None or d.lo is None or d.hi is None:
        return 0
    sign = 1 if METRIC_WORDS[metric][1] == HIGHER else -1
    if d.lo > 0 and d.point >= min_effect:
        return sign
    if d.hi < 0 and d.point <= -min_effect:
        return -sign
    return 0


class Candidate(BaseModel):
    """One candidate value on one cell: its figures with intervals, its delta against the current value."""

    arm: str
    value: object
    boots: int
    acceptance_length: Interval
    e2e_p50_ms: Interval
    output_tok_s: Interval
    tpot_p50_ms: Interval
    per_position: list[Interval]
    vs_current: dict[str, Interval]  # metric → relative delta against the current value (absent for itself)


class CellAdvice(BaseModel):
    cell: str
    noise_floor: float  # the smallest difference called on this cell: --min-effect, or the spread between boots
    current: str  # the arm that is the config's value now (the campaign's baseline)
    leader: str | None  # the arm with the highest output tok/s
    recommend: str | None  # the arm recommended (the current one when nothing beats it beyond noise)
    change: bool  # whether the recommendation differs from the current value
    candidates: list[Candidate]
    advice: str  # the sentence
    why: str  # what per-position acceptance says about the leader (K only)


class TuneTable(BaseModel):
    knob: str
    cells: list[CellAdvice]
    min_effect: float


def _ms(i: tuple[float | None, np.ndarray | None]) -> tuple[float | None, np.ndarray | None]:
    return (None if i[0] is None else i[0] * 1000.0, None if i[1] is None else i[1] * 1000.0)


def _pct(i: Interval) -> str:
    p = (i.point or 0) * 100
    if i.lo is None or i.hi is None:
        return f"{p:+.1f} %"
    return f"{p:+.1f} % [{i.lo * 100:+.1f}, {i.hi * 100:+.1f}]"


def value_label(knob: str, value: object) -> str:
    """``K=5``, ``max_num_seqs=8``, ``capture sizes [1, 2, 4]``: a candidate as the advice names it."""
    if knob == "speculative.num_speculative_tokens":
        return f"K={value}"
    if knob == "serve.compilation.cudagraph_capture_sizes":
        return f"capture sizes {value}"
    return f"{knob.rsplit('.', 1)[-1]}={value}"


def _why(knob: str, cands: list[Candidate], leader: Candidate, cell: str) -> str:
    """Per-position acceptance, read for K: what the positions a longer K adds accept, what a shorter K leaves."""
    if knob != "speculative.num_speculative_tokens" or not leader.per_position:
        return ""
    longest = max((c for c in cands if c.per_position), key=lambda c: len(c.per_position))
    pp = [p.point or 0.0 for p in longest.per_position]
    k = len(leader.per_position)
    shown = " · ".join(f"{x:.2f}" for x in pp)
    s = f"Per-position acceptance at {cell} ({value_label(knob, longest.value)}): {shown}."
    if len(pp) > k:
        extra = sum(pp[k:])
        s += (f" Positions {k + 1}–{len(pp)} accept {extra:.2f} tokens per step between them, for "
              f"{len(pp) - k} more drafted token(s) per step")
        s += "; that is why a longer K does not pay." if leader.arm != longest.arm else "."
    if k > 1:
        s += f" Position {k} of {value_label(knob, leader.value)} still accepts {pp[k - 1]:.2f}."
    return s


def tune_table(spec: CampaignSpec, waves: list[Wave], *, values: dict[str, object],
               min_effect: float = 0.01) -> TuneTable:
    """Per cell: every candidate's figures and deltas against the current value (the campaign's baseline),
    the leader, and the advice (module docstring). ``values``: each arm's candidate value."""
    knob = spec.tuning or ""
    current = spec.rule.baseline
    out: list[CellAdvice] = []
    for ci, cs in enumerate(spec.cells):
        reps = cell_reps(spec, waves, ci)
        draws = _Draws(spec.seed, ci, spec.bootstrap)
        cands: list[Candidate] = []
        for arm in spec.drafters:
            r = reps.get(arm.name)
            if r is None:
                continue
            mine = [w for w in waves if w.counts and w.drafter == arm.name and w.cell == cs.name]
            base = reps.get(current)
            vs = {} if arm.name == current or base is None else {
                m: rel_delta(r[m], base[m]) for m in ("output_tok_s", "acceptance_length", "e2e_p50", "tpot_p50")}
            cands.append(Candidate(
                arm=arm.name, value=values.get(arm.name), boots=len(mine),
                acceptance_length=_interval(*r["acceptance_length"], LEVEL),
                e2e_p50_ms=_interval(*_ms(r["e2e_p50"]), LEVEL), output_tok_s=_interval(*r["output_tok_s"], LEVEL),
                tpot_p50_ms=_interval(*_ms(r["tpot_p50"]), LEVEL), per_position=_per_position(mine, draws),
                vs_current=vs))
        floor = max(min_effect, boot_spread(spec, waves, cs.name))
        out.append(_advice(knob, cs.name, current, cands, values, floor))
    return TuneTable(knob=knob, cells=out, min_effect=min_effect)


def _advice(knob: str, cell: str, current: str, cands: list[Candidate], values: dict[str, object],
            min_effect: float) -> CellAdvice:
    """The advice on one cell; ``min_effect`` here is the cell's noise floor."""
    label = {c.arm: value_label(knob, values.get(c.arm)) for c in cands}
    cur_label = value_label(knob, values.get(current))
    ranked = sorted((c for c in cands if c.output_tok_s.point is not None),
                    key=lambda c: c.output_tok_s.point or 0.0, reverse=True)
    if not ranked or current not in label:
        missing = "no candidate has" if not ranked else f"the current value {cur_label} has no"
        return CellAdvice(cell=cell, noise_floor=min_effect, current=current,
                          leader=ranked[0].arm if ranked else None, recommend=None,
                          change=False, candidates=cands, why="",
                          advice=f"{cell}: {missing} counted waves: no recommendation; keep {cur_label}")
    leader = ranked[0]
    better = [c for c in ranked if c.arm != current and called(c.vs_current["output_tok_s"], "output_tok_s",
                                                                 min_effect) > 0]
    why = _why(knob, cands, leader, cell)
    if better:
        best = better[0]  # the highest tok/s among those that beat the current value beyond noise
        d = best.vs_current
        extra = []
        if d["e2e_p50"].point is not None:
            extra.append(f"E2E p50 {_pct(d['e2e_p50'])}")
        if d["tpot_p50"].point is not None:
            extra.append(f"TPOT p50 {_pct(d['tpot_p50'])}")
        tail = f" ({', '.join(extra)})" if extra else ""
        advice = (f"{label[best.arm]} for {cell}: output tok/s {_pct(d['output_tok_s'])} over {cur_label}{tail}")
        if best.arm != leader.arm:
            advice += (f"; {label[leader.arm]} leads on the point, but its gain over {cur_label} is not beyond "
                       "noise")
        return CellAdvice(cell=cell, noise_floor=min_effect, current=current, leader=leader.arm, recommend=best.arm,
                          change=True,
                          candidates=cands, advice=advice, why=why)
    worse = [c for c in cands if c.arm != current and called(c.vs_current["output_tok_s"], "output_tok_s",
                                                             min_effect) < 0]
    level = [c for c in cands if c.arm != current and c not in worse]
    if level:
        nearest = max(level, key=lambda c: c.output_tok_s.point or 0.0)
        advice = (f"at {cell} the difference is inside noise ({label[nearest.arm]} vs {cur_label}: output tok/s "
                  f"{_pct(nearest.vs_current['output_tok_s'])}, noise floor {min_effect * 100:.1f} %); keep "
                  f"{cur_label}")
    else:
        advice = f"keep {cur_label} for {cell}: every other candidate is slower beyond noise"
    if worse and level:
        advice += "; " + ", ".join(f"{label[c.arm]} {_pct(c.vs_current['output_tok_s'])}" for c in worse) + \
            " are slower beyond noise"
    return CellAdvice(cell=cell, noise_floor=min_effect, current=current, leader=leader.arm, recommend=current,
                      change=False, candidates=cands, advice=advice, why=why)


def leader_clear(spec: CampaignSpec, waves: list[Wave], *, level: float, min_effect: float,
                 min_boots: int = 2) -> dict[str, str] | None:
    """The sequential look: {cell: leader} when on every cell the tok/s leader beats every other candidate
    beyond noise (the interval at ``level``, the cell's noise floor) with ``min_boots`` counted boots each;
    None when not (yet)."""
    out: dict[str, str] = {}
    for ci, cs in enumerate(spec.cells):
        reps = cell_reps(spec, waves, ci)
        if len(reps) != len(spec.drafters):
            return None
        for arm in spec.drafters:
            n = len({w.boot_row for w in waves if w.counts and w.drafter == arm.name and w.cell == cs.name})
            if n < min_boots:
                return None
        tok = {a: r["output_tok_s"] for a, r in reps.items() if r["output_tok_s"][0] is not None}
        if len(tok) != len(reps):
            return None
        leader = max(tok, key=lambda a: tok[a][0] or 0.0)
        floor = max(min_effect, boot_spread(spec, waves, cs.name))
        for a, r in tok.items():
            if a != leader and called(rel_delta(tok[leader], r, level), "output_tok_s", floor) <= 0:
                return None
        out[cs.name] = leader
    return out


def table_rows(t: TuneTable, cell: CellAdvice) -> tuple[list[str], list[list[str]]]:
    """One cell's table: a row per candidate, AL / E2E p50 / tok/s / TPOT with intervals, Δ tok/s vs the current
    value, per-position acceptance."""
    ci = fmt_interval
    streamed = any(c.tpot_p50_ms.point is not None for c in cell.candidates)
    header = ["Candidate", "Boots", "AL [95 %]", "E2E p50 ms [95 %]", "tok/s [95 %]"]
    header += ["TPOT p50 ms [95 %]"] if streamed else []
    header += ["Δ tok/s vs current", "Per-position acceptance"]
    rows = []
    for c in cell.candidates:
        name = value_label(t.knob, c.value) + (" (current)" if c.arm == cell.current else "") + (
            " ← recommended" if cell.change and c.arm == cell.recommend else "")
        row = [name, str(c.boots), ci(c.acceptance_length, ".2f"), ci(c.e2e_p50_ms, ",.0f"),
               ci(c.output_tok_s, ",.1f")]
        row += [ci(c.tpot_p50_ms, ".2f")] if streamed else []
        row += ["current" if c.arm == cell.current else _pct(c.vs_current.get("output_tok_s", Interval(point=None))),
                " · ".join(f"{p.point:.2f}" for p in c.per_position if p.point is not None) or "—"]
        rows.append(row)
    return header, rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


__all__ = ["CellAdvice", "Candidate", "TuneTable", "boot_spread", "called", "cell_reps", "leader_clear",
           "markdown_table", "rel_delta", "request_e2e_s", "request_tpot_s", "table_rows", "tune_table", "value_label"]
