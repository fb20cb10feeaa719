"""An A/B campaign's figures with 95 % intervals, deltas against the baseline, verdicts and the honest read. Pure.

Example::

    analysis = analyze(spec, waves, boots)      # waves/boots as banked (excluded ones are named, not counted)
    analysis.figures[0].tok_s                   # Interval(point=812.4, lo=797.0, hi=826.1)
    analysis.verdicts[0].verdict                # "KEEP" | "REVERT" | "TIE"
    analysis.honest_read                        # one paragraph, generated from the numbers

How the intervals are made (seeded: the same banked rows give the same intervals):

* **within a boot** the cell's requests are resampled with replacement (``spec.bootstrap`` times). The
  headline figures stay the counters' (tok/s = tokens / wall time; acceptance length from ``/metrics``);
  each replicate scales them by how the resampled requests' own ratio moves: Σ tokens / Σ latency for
  tok/s, Σ tokens / Σ output chunks (≈ engine steps) for acceptance length.
* **across boots** (a drafter with ≥ 2 counted boots of a cell) the boots are resampled too, and a
  replicate is the mean of its boots' replicates (a two-level bootstrap: boot, then prompt).
* **deltas** resample both drafters with the same draws — the same prompt indices, and boots matched by
  round (the crossed design: by replica, then round) — so what the two have in common cancels; the delta is
  relative, ``x / baseline − 1``.
* per-position acceptance comes from the counters only: its interval is across boots, none with one boot.
* **E2E p50** (:func:`e2e_p50`): each boot's median request latency, its replicates the medians of the same
  resampled requests, then boots as above; its delta is relative too, and lower is the win. The percentiles
  (TTFT, TPOT, E2E) come from :func:`sparkserve.measure.latency.latency_stats`, the function ``bench`` uses.
* a figure without within-boot replicates (acceptance length under the card protocol: its replies are not
  streamed, so no chunks count the engine steps) gets the across-boots interval alone, none with one boot.

The verdict rule (:class:`~sparkserve.measure.ab_records.Rule`): on the primary cell's metric, KEEP the
candidate when the delta's interval lies above 0, REVERT to the baseline when it lies below, TIE when it
spans 0 — or when the delta is inside the cell's **noise floor** (:func:`noise_floor`, as ``tune`` has it):
:data:`MIN_EFFECT` (1 %), or for tok/s, when larger, the widest spread between two boots of one drafter on
that cell (:func:`boot_spread`). A bootstrap over two or three boots rests on those few values and can be
narrower than what one drafter does from boot to boot: on the rig, a drafter A/B'd against a copy of itself
read +2.4 % [-2.7, +9.0] in one run and an interval above 0 in another (CI, a loaded machine), while one
boot of the same drafter read 4.7 % below its other boot. A delta is a win or a loss only when both hold. A
drafter with no counted wave of the primary cell gets no verdict (it is named as excluded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from sparkserve.measure.ab_records import CROSSED, Boot, CampaignSpec, Wave
from sparkserve.measure.latency import latency_stats, tpot_s

LEVEL = 0.95
#: A delta smaller than this is never called a win or a loss (a fraction of a percent is not worth a restart).
MIN_EFFECT = 0.01


class Interval(BaseModel):
    """A figure and its 95 % interval (``lo``/``hi`` None when there is nothing to resample)."""

    point: float | None
    lo: float | None = None
    hi: float | None = None

    @property
    def spans_zero(self) -> bool:
        return self.lo is None or self.hi is None or self.lo <= 0 <= self.hi


class Percentiles(BaseModel):
    """p50 / p90 / p99 in milliseconds (None without samples)."""

    p50: float | None
    p90: float | None
    p99: float | None


class CellFigures(BaseModel):
    """One drafter on one cell: the figures of its counted waves, and which journal rows they come from."""

    drafter: str
    cell: str
    boots: int
    waves: list[int]
    tok_s: Interval
    acceptance_length: Interval
    per_position: list[Interval]
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    requests: int
    e2e_ms: Percentiles | None = None  # E2E per request (vLLM's), streamed or not
    e2e_p50_ms: Interval | None = None  # the median E2E with its 95 % interval (prompts, then boots)


class Delta(BaseModel):
    """A drafter against the baseline on one cell and metric: the relative delta and whether it wins."""

    drafter: str
    baseline: str
    cell: str
    metric: str
    rel: Interval
    outcome: str  # win | loss | tie
    noise_floor: float | None = None  # the smallest |delta| called a win or a loss on this cell and metric


class Verdict(BaseModel):
    drafter: str
    baseline: str
    cell: str
    metric: str
    verdict: str  # KEEP | REVERT | TIE
    rel: Interval


class Analysis(BaseModel):
    figures: list[CellFigures]
    deltas: list[Delta]
    verdicts: list[Verdict]
    excluded: list[str]
    honest_read: str


def fmt_interval(i: Interval, spec: str) -> str:
    """``point [lo, hi]`` in ``spec`` (the point alone without bounds; ``—`` without a point): the one way
    ``ab report`` and ``tune`` print an interval."""
    if i.point is None:
        return "—"
    if i.lo is None or i.hi is None:
        return format(i.point, spec)
    return f"{format(i.point, spec)} [{format(i.lo, spec)}, {format(i.hi, spec)}]"


def _pct(values: Sequence[float]) -> Percentiles:
    """p50/p90/p99 in ms by the one percentile function every report uses (:func:`.latency.latency_stats`)."""
    s = latency_stats(values)
    return Percentiles(p50=s.median_ms, p90=s.p90_ms, p99=s.p99_ms)


def _interval(point: float | None, reps: np.ndarray | None) -> Interval:
    if point is None or reps is None or reps.size == 0 or not np.all(np.isfinite(reps)):
        return Interval(point=point)
    lo, hi = np.percentile(reps, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return Interval(point=round(point, 6), lo=round(float(lo), 6), hi=round(float(hi), 6))


class _Draws:
    """The seeded resampling draws of one cell, shared by every drafter so deltas are paired: prompt indices
    per request count, boot indices per boot count."""

    def __init__(self, seed: int, cell_index: int, n_boot: int) -> None:
        self.rng = np.random.default_rng([seed, cell_index])
        self.n_boot = n_boot
        self._prompts: dict[int, np.ndarray] = {}
        self._boots: dict[int, np.ndarray] = {}

    def prompts(self, n: int) -> np.ndarray:
        if n not in self._prompts:
            self._prompts[n] = self.rng.integers(0, n, size=(self.n_boot, n))
        return self._prompts[n]

    def boots(self, b: int) -> np.ndarray:
        if b not in self._boots:
            self._boots[b] = self.rng.integers(0, b, size=(self.n_boot, b))
        return self._boots[b]


def _ratio_reps(num: list[float], den: list[float], idx: np.ndarray) -> np.ndarray | None:
    """Replicates of Σnum/Σden over resampled requests, relative to the observed ratio (1.0 = no change)."""
    n = np.asarray(num, dtype=float)
    d = np.asarray(den, dtype=float)
    if n.size == 0 or d.sum() <= 0 or n.sum() <= 0:
        return None
    rep = n[idx].sum(axis=1) / np.maximum(d[idx].sum(axis=1), 1e-12)
    return rep / (n.sum() / d.sum())


def _wave_reps(w: Wave, metric: str, draws: _Draws) -> tuple[float | None, np.ndarray | None]:
    """The wave's headline figure and its within-boot replicates."""
    s = w.samples
    if metric == "output_tok_s":
        point: float | None = w.result.output_tok_s
        lat = [x if x is not None else 0.0 for x in s.latency_s]
        rel = _ratio_reps(s.tokens, lat, draws.prompts(len(s.tokens))) if s.tokens else None
    else:
        point = w.result.acceptance_length
        rel = _ratio_reps(s.tokens, s.chunks, draws.prompts(len(s.tokens))) if s.tokens else None
    if point is None:
        return None, None
    return point, None if rel is None else point * rel


def _arm_reps(waves: list[Wave], metric: str, draws: _Draws) -> tuple[float | None, np.ndarray | None]:
    """A drafter's figure on a cell (mean over its counted boots) and its replicates (boot, then prompt)."""
    got = [_wave_reps(w, metric, draws) for w in waves]
    points = [p for p, _ in got if p is not None]
    if not points or len(points) != len(got):
        return None, None
    point = float(np.mean(points))
    reps = [r for _, r in got]
    if any(r is None for r in reps):
        # no within-boot replicates (the card protocol's replies are not streamed: no chunks to count steps
        # by): with two or more boots, resample the boots' own figures
        if len(waves) < 2:
            return point, None
        return point, np.asarray(points, dtype=float)[draws.boots(len(waves))].mean(axis=1)
    stack = np.stack(reps, axis=1)  # (n_boot, boots)
    if len(waves) == 1:
        return point, stack[:, 0]
    pick = draws.boots(len(waves))
    return point, np.take_along_axis(stack, pick, axis=1).mean(axis=1)


def _per_position(waves: list[Wave], draws: _Draws) -> list[Interval]:
    rows = [w.result.per_position_acceptance for w in waves if w.result.per_position_acceptance]
    if not rows:
        return []
    k = min(len(r) for r in rows)
    a = np.asarray([r[:k] for r in rows], dtype=float)  # (boots, k)
    means = a.mean(axis=0)
    if len(rows) < 2:
        return [Interval(point=round(float(m), 6)) for m in means]
    reps = a[draws.boots(len(rows))].mean(axis=1)  # (n_boot, k)
    return [_interval(float(means[p]), reps[:, p]) for p in range(k)]


def tpot_values(w: Wave) -> list[float]:
    """A wave's per-request time per output token after the first (s); empty when the cell did not stream."""
    s = w.samples
    out = []
    for n, t, lat in zip(s.tokens, s.ttft_s, s.latency_s, strict=True):
        x = tpot_s(n, t, lat)
        if x is not None:
            out.append(x)
    return out


E2E_P50 = "e2e_p50_ms"  # the delta metric: the median E2E (lower is better)


def _median_reps(values: list[float], idx: np.ndarray) -> np.ndarray:
    """Replicates of the median over resampled requests."""
    a = np.asarray(values, dtype=float)
    return np.median(a[idx], axis=1)


def p50_reps(per_wave: list[list[float]], draws: _Draws) -> tuple[float | None, np.ndarray | None]:
    """The mean over boots of each boot's median, and its bootstrap replicates: requests resampled within each
    boot (the draws every arm shares), then boots across rounds. None when a boot has no value."""
    if not per_wave or any(not v for v in per_wave):
        return None, None
    point = float(np.mean([np.median(v) for v in per_wave]))
    stack = np.stack([_median_reps(v, draws.prompts(len(v))) for v in per_wave], axis=1)
    if len(per_wave) == 1:
        return point, stack[:, 0]
    return point, np.take_along_axis(stack, draws.boots(len(per_wave)), axis=1).mean(axis=1)


def e2e_p50(waves: list[Wave], draws: _Draws) -> tuple[float | None, np.ndarray | None]:
    """A drafter's median E2E (ms) on a cell — the mean over its boots of each boot's median request latency —
    and its bootstrap replicates (requests within a boot, then boots), paired with every other drafter's by
    ``draws``. The requests' latency is the banked ``latency_s``: the whole reply (for a streamed request it
    includes the usage chunk and ``[DONE]`` after the last token, well under a millisecond). None when any
    request of a boot has no latency."""
    per_wave = []
    for w in waves:
        lat = [x * 1000.0 for x in w.samples.latency_s if x is not None]
        if len(lat) != len(w.samples.latency_s):
            return None, None
        per_wave.append(lat)
    return p50_reps(per_wave, draws)


def boot_spread(spec: CampaignSpec, waves: list[Wave], cell: str) -> float:
    """The widest relative spread of output tok/s between counted waves of one drafter (or candidate) on
    ``cell`` (max / min − 1; 0 while none has two): how far one setting moves from boot to boot here."""
    out = 0.0
    for arm in spec.drafters:
        v = [w.result.output_tok_s for w in waves if w.counts and w.drafter == arm.name and w.cell == cell]
        if len(v) >= 2 and min(v) > 0:
            out = max(out, max(v) / min(v) - 1)
    return out


def noise_floor(spec: CampaignSpec, waves: list[Wave], cell: str, metric: str) -> float:
    """The smallest |relative delta| called a win or a loss on ``cell``'s ``metric``: :data:`MIN_EFFECT`, and
    for output tok/s the cell's :func:`boot_spread` when larger."""
    return max(MIN_EFFECT, boot_spread(spec, waves, cell)) if metric == "output_tok_s" else MIN_EFFECT


def _by_round(waves: list[Wave], crossed: bool = False) -> list[Wave]:
    """The order in which two drafters' boots are matched: by round; crossed, by replica first, so a resampled
    boot of A and the matching one of B ran on the same replica (its own speed cancels in the pair)."""
    if crossed:
        return sorted(waves, key=lambda w: (w.replica or 0, w.round, w.slot))
    return sorted(waves, key=lambda w: (w.round, w.slot))


def analyze(spec: CampaignSpec, waves: list[Wave], boots: list[Boot]) -> Analysis:
    """Figures, deltas against the baseline, verdicts by the rule, and the honest read (module docstring)."""
    counted = [w for w in waves if w.counts]
    figures: list[CellFigures] = []
    deltas: list[Delta] = []
    base = spec.rule.baseline
    for ci, cs in enumerate(spec.cells):
        draws = _Draws(spec.seed, ci, spec.bootstrap)
        reps: dict[tuple[str, str], tuple[float | None, np.ndarray | None]] = {}
        for arm in spec.drafters:
            mine = _by_round([w for w in counted if w.drafter == arm.name and w.cell == cs.name],
                             crossed=spec.design == CROSSED)
            if not mine:
                continue
            tok = reps[(arm.name, "output_tok_s")] = _arm_reps(mine, "output_tok_s", draws)
            al = reps[(arm.name, "acceptance_length")] = _arm_reps(mine, "acceptance_length", draws)
            e2e = reps[(arm.name, E2E_P50)] = e2e_p50(mine, draws)
            figures.append(CellFigures(
                drafter=arm.name, cell=cs.name, boots=len(mine), waves=[w.id for w in mine if w.id is not None],
                tok_s=_interval(*tok), acceptance_length=_interval(*al), per_position=_per_position(mine, draws),
                ttft_ms=_pct([t for w in mine for t in w.samples.ttft_s if t is not None]),
                tpot_ms=_pct([t for w in mine for t in tpot_values(w)]),
                requests=sum(len(w.samples.tokens) for w in mine),
                e2e_ms=_pct([x for w in mine for x in w.samples.latency_s if x is not None]),
                e2e_p50_ms=_interval(*e2e),
            ))
        for arm in spec.drafters:
            if arm.name == base:
                continue
            for metric in ("output_tok_s", "acceptance_length", E2E_P50):
                b, x = reps.get((base, metric)), reps.get((arm.name, metric))
                if b is None or x is None or b[0] is None or x[0] is None or b[0] == 0:
                    continue
                point = x[0] / b[0] - 1
                rel_reps = None if b[1] is None or x[1] is None else x[1] / b[1] - 1
                rel = _interval(point, rel_reps)
                better = (rel.hi or 0) < 0 if metric == E2E_P50 else (rel.lo or 0) > 0  # E2E: lower wins
                floor = noise_floor(spec, counted, cs.name, metric)
                inside = rel.spans_zero or abs(point) < floor
                outcome = "tie" if inside else ("win" if better else "loss")
                deltas.append(Delta(drafter=arm.name, baseline=base, cell=cs.name, metric=metric, rel=rel,
                                    outcome=outcome, noise_floor=round(floor, 6)))
    verdicts = _verdicts(spec, deltas)
    excluded = _excluded(spec, waves, boots, figures)
    return Analysis(figures=figures, deltas=deltas, verdicts=verdicts, excluded=excluded,
                    honest_read=honest_read(spec, figures, deltas, verdicts, excluded))


def _verdicts(spec: CampaignSpec, deltas: list[Delta]) -> list[Verdict]:
    out = []
    for d in deltas:
        if d.cell != spec.rule.primary or d.metric != spec.rule.metric:
            continue
        v = {"win": "KEEP", "loss": "REVERT", "tie": "TIE"}[d.outcome]
        out.append(Verdict(drafter=d.drafter, baseline=d.baseline, cell=d.cell, metric=d.metric, verdict=v,
                           rel=d.rel))
    return out


def _excluded(spec: CampaignSpec, waves: list[Wave], boots: list[Boot], figures: list[CellFigures]) -> list[str]:
    """One line per boot or wave that does not count, and per drafter left with no figures at all."""
    out = [f"{b.drafter} round {b.round + 1}: boot excluded — {b.excluded}" for b in boots if b.excluded]
    out += [f"{w.drafter} round {w.round + 1} {w.cell}: wave excluded — {w.excluded}" for w in waves if w.excluded]
    have = {f.drafter for f in figures}
    out += [f"{a.name}: no counted wave — no figures, no verdict" for a in spec.drafters if a.name not in have]
    return out


def _fmt_rel(i: Interval) -> str:
    p = (i.point or 0) * 100
    if i.lo is None or i.hi is None:
        return f"{p:+.1f} %"
    return f"{p:+.1f} % [{i.lo * 100:+.1f}, {i.hi * 100:+.1f}]"


def honest_read(spec: CampaignSpec, figures: list[CellFigures], deltas: list[Delta], verdicts: list[Verdict],
                excluded: list[str]) -> str:
    """The paragraph a model card carries: who wins or loses which cell, by how much, and the verdicts."""
    base = spec.rule.baseline
    parts: list[str] = []
    for arm in spec.drafters:
        if arm.name == base:
            continue
        mine = [d for d in deltas if d.drafter == arm.name and d.metric == "output_tok_s"]
        if not mine:
            continue
        wins = [d for d in mine if d.outcome == "win"]
        losses = [d for d in mine if d.outcome == "loss"]
        ties = [d for d in mine if d.outcome == "tie"]
        bits = []
        if wins:
            bits.append("wins " + ", ".join(f"{d.cell} ({_fmt_rel(d.rel)})" for d in wins))
        if losses:
            bits.append("loses " + ", ".join(f"{d.cell} ({_fmt_rel(d.rel)})" for d in losses))
        if ties:
            bits.append(("is level on " if bits else "is level with it on every cell: ")
                        + ", ".join(f"{d.cell} ({_fmt_rel(d.rel)})" for d in ties))
        al = next((d for d in deltas if d.drafter == arm.name and d.metric == "acceptance_length"
                   and d.cell == spec.rule.primary), None)
        al_s = f"; acceptance length on {al.cell} {_fmt_rel(al.rel)}" if al else ""
        parts.append(f"Against {base}, {arm.name} " + "; ".join(bits) + f" in output tok/s{al_s}.")
    best = []
    for cs in spec.cells:
        mine = [f for f in figures if f.cell == cs.name and f.tok_s.point is not None]
        if mine:
            top = max(mine, key=lambda f: f.tok_s.point or -math.inf)
            best.append(f"{cs.name} {top.drafter} ({top.tok_s.point:,.1f} tok/s)")
    if best:
        parts.append("Fastest per cell: " + ", ".join(best) + ".")
    if verdicts:
        what = "tok/s" if spec.rule.metric == "output_tok_s" else "acceptance length"
        floor = next((d.noise_floor for d in deltas if d.cell == spec.rule.primary and d.metric == spec.rule.metric
                      and d.noise_floor is not None), MIN_EFFECT)
        parts.append(f"By the rule ({spec.rule.primary} {what}, TIE when the 95 % interval spans 0 or the delta is "
                     f"inside the noise floor, {floor * 100:.1f} % here): "
                     + ", ".join(f"{v.drafter} {v.verdict}" for v in verdicts) + ".")
    else:
        parts.append(f"No verdict: no drafter has counted {spec.rule.primary} waves beside {base}'s.")
    n_boot = sum(1 for e in excluded if ": boot excluded" in e)
    n_wave = sum(1 for e in excluded if ": wave excluded" in e)
    gone = [e.split(":")[0] for e in excluded if "no counted wave" in e]
    if n_boot or n_wave or gone:
        s = f"Excluded: {n_boot} boot(s), {n_wave} wave(s)"
        if gone:
            s += f"; {', '.join(gone)} left without figures"
        parts.append(s + " (listed below).")
    return " ".join(parts)
