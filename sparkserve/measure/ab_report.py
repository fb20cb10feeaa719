"""The table of record of an A/B campaign: the model card's table shape, as text, Markdown, JSON or a plot.

Example::

    report = build_report(campaign_id, status, spec, waves, boots)
    print(markdown(report))            # the model-card-ready section
    report.model_dump(mode="json")     # what ``ab report --json`` prints
    plot(report, Path("ab.png"))       # BadInput naming the ``plot`` extra when matplotlib is absent

The card's shapes (drafter/cards/GLM-5.3-Flash-DFlash2-{E,F,G}.md):

* the same-rig A/B table: one row per cell, ``Cell (accept / tok/s)``, one column per drafter, acceptance to
  4 decimals and tok/s to 2 (``3.5788 / 70.87``), the primary cell marked ``(primary)``; then the
  per-position row (the primary cell's, ``0.744 · 0.545 · …``);
* the holdout-evaluation table: one row per drafter, one column per cell headed ``K=<k>, c<concurrency>``
  (K as the counters show it: Δdraft_tokens / Δdrafts), ``Mean acceptance length (output tok/s)`` with
  ``3.676 (1,410)`` in each cell;

then the intervals and deltas, TTFT / TPOT percentiles, the verdicts and the honest read. Every figure
names the journal rows (waves) it comes from.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from sparkserve.errors import BadInput
from sparkserve.measure.ab_records import Boot, CampaignSpec, Wave
from sparkserve.measure.ab_stats import E2E_P50, Analysis, CellFigures, Interval, analyze, fmt_interval

PLOT_EXTRA = "plot"


class Report(BaseModel):
    """Everything ``ab report`` prints, and the ``--json`` object."""

    campaign: int
    status: str
    spec: CampaignSpec
    rule: str
    analysis: Analysis
    design: str = ""  # the campaign's design in words (spec.design_text())
    boots: list[Boot]
    waves: list[dict[str, object]]  # id, slot, round, drafter, cell, excluded, pins: each number's journal row


def build_report(campaign_id: int, status: str, spec: CampaignSpec, waves: list[Wave], boots: list[Boot]) -> Report:
    return Report(
        campaign=campaign_id, status=status, spec=spec, rule=spec.rule.text(), analysis=analyze(spec, waves, boots),
        boots=boots, design=spec.design_text(),
        waves=[{"id": w.id, "slot": w.slot, "round": w.round + 1, "drafter": w.drafter, "cell": w.cell,
                "boot": w.boot_row, "excluded": w.excluded, "output_tok_s": w.result.output_tok_s,
                "acceptance_length": w.result.acceptance_length, "k": _wave_k(w),
                "protocol": w.result.protocol, "replica": w.replica, "pins": w.pins.model_dump()} for w in waves],
    )


def _wave_k(w: Wave) -> int | None:
    """Tokens per draft of a wave's server: the record's, else Δdraft_tokens / Δdrafts."""
    r = w.result
    if r.k is not None:
        return r.k
    return round(r.draft_tokens / r.drafts) if r.drafts and r.draft_tokens is not None else None


def _fig(r: Report, drafter: str, cell: str) -> CellFigures | None:
    return next((f for f in r.analysis.figures if f.drafter == drafter and f.cell == cell), None)


def _num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


_ci = fmt_interval


def _rel(i: Interval) -> str:
    if i.point is None:
        return "—"
    s = f"{i.point * 100:+.1f} %"
    if i.lo is not None and i.hi is not None:
        s += f" [{i.lo * 100:+.1f}, {i.hi * 100:+.1f}]"
    return s


def _absent(r: Report, drafter: str, cell: str) -> str:
    """Why a drafter has no figure for a cell: its boots or waves were excluded, or it has not run it yet."""
    if any(b.drafter == drafter and b.excluded for b in r.boots) or any(
            w["drafter"] == drafter and w["cell"] == cell and w["excluded"] for w in r.waves):
        return "excluded"
    return "not run"


def card_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    """The card's same-rig A/B table: header ``Cell (accept / tok/s)`` + drafters, one row per cell (the
    primary marked), ``3.5788 / 70.87`` per drafter, then the per-position row of the primary cell."""
    names = [a.name for a in r.spec.drafters]
    header = ["Cell (accept / tok/s)", *names]
    rows = []
    primary = r.spec.rule.primary
    for cs in r.spec.cells:
        row = [f"{cs.name} {cs.shape()}" + (" (primary)" if cs.name == primary else "")]
        for n in names:
            f = _fig(r, n, cs.name)
            row.append(_absent(r, n, cs.name) if f is None else
                       f"{_num(f.acceptance_length.point, '.4f')} / {_num(f.tok_s.point, ',.2f')}")
        rows.append(row)
    pp = [f"Per-position acceptance ({_k_label(r, primary)})"]
    for n in names:
        f = _fig(r, n, primary)
        pp.append("—" if f is None or not f.per_position else
                  " · ".join(_num(i.point, ".3f") for i in f.per_position))
    rows.append(pp)
    return header, rows


def _cell_k(r: Report, cell: str) -> int | None:
    """The K a cell's counted waves drafted with (the most common, should they differ)."""
    ks = [w["k"] for w in r.waves if w["cell"] == cell and not w["excluded"] and isinstance(w.get("k"), int)]
    return max(set(ks), key=ks.count) if ks else None


def _k_label(r: Report, cell: str) -> str:
    """``K=7, c16`` as the cards head a column (``K=?`` when no counted wave says)."""
    cs = next(c for c in r.spec.cells if c.name == cell)
    k = _cell_k(r, cell)
    return f"K={'?' if k is None else k}, c{cs.concurrency}"


def holdout_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    """The drafter cards' holdout-evaluation table: header ``Mean acceptance length (output tok/s)`` + one
    column per cell (``K=7, c16``; the cell's name added where two cells would share a heading), one row per
    drafter, ``3.676 (1,410)`` in each."""
    labels = [_k_label(r, cs.name) for cs in r.spec.cells]
    heads = [lab if labels.count(lab) == 1 else f"{lab} ({cs.name})" for lab, cs in zip(labels, r.spec.cells,
                                                                                           strict=True)]
    rows = []
    for a in r.spec.drafters:
        row = [a.name]
        for cs in r.spec.cells:
            f = _fig(r, a.name, cs.name)
            row.append(_absent(r, a.name, cs.name) if f is None else
                       f"{_num(f.acceptance_length.point, '.3f')} ({_num(f.tok_s.point, ',.0f')})")
        rows.append(row)
    return ["Mean acceptance length (output tok/s)", *heads], rows


def interval_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    """Per cell and drafter: boots, acceptance length and tok/s with 95 % intervals, the delta vs the
    baseline, TTFT and TPOT p50/p90/p99, E2E p50 with its interval and delta, and the journal rows."""
    base = r.spec.rule.baseline
    header = ["Cell", "Drafter", "Boots", "Accept [95 %]", "tok/s [95 %]", f"Δ accept vs {base}",
              f"Δ tok/s vs {base}", "TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99", "E2E ms p50 [95 %]",
              f"Δ E2E p50 vs {base}", "Waves"]
    rows = []
    for cs in r.spec.cells:
        for a in r.spec.drafters:
            f = _fig(r, a.name, cs.name)
            if f is None:
                continue
            d = {x.metric: x for x in r.analysis.deltas if x.drafter == a.name and x.cell == cs.name}

            def delta(metric: str, d: dict = d, name: str = a.name) -> str:
                return "baseline" if name == base else (_rel(d[metric].rel) if metric in d else "—")

            rows.append([
                cs.name, a.name, str(f.boots), _ci(f.acceptance_length, ".2f"), _ci(f.tok_s, ",.1f"),
                delta("acceptance_length"), delta("output_tok_s"),
                "/".join(_num(x, ".1f") for x in (f.ttft_ms.p50, f.ttft_ms.p90, f.ttft_ms.p99)),
                "/".join(_num(x, ".2f") for x in (f.tpot_ms.p50, f.tpot_ms.p90, f.tpot_ms.p99)),
                "—" if f.e2e_p50_ms is None else _ci(f.e2e_p50_ms, ",.0f"), delta(E2E_P50),
                ",".join(f"#{i}" for i in f.waves),
            ])
    return header, rows


def per_position_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    """Acceptance per draft position, every cell and arm (issue 42: where a K's acceptance falls off is why it
    wins or loses): ``K`` as the counters show it, then one column per position (``—`` past an arm's K)."""
    width = max((len(f.per_position) for f in r.analysis.figures), default=0)
    header = ["Cell", "Arm", "K", *(f"pos {p + 1}" for p in range(width))]
    rows = []
    for cs in r.spec.cells:
        for a in r.spec.drafters:
            f = _fig(r, a.name, cs.name)
            if f is None or not f.per_position:
                continue
            ks = [w["k"] for w in r.waves if w["drafter"] == a.name and w["cell"] == cs.name and not w["excluded"]
                  and isinstance(w.get("k"), int)]
            cells = [_ci(i, ".3f") for i in f.per_position] + ["—"] * (width - len(f.per_position))
            rows.append([cs.name, a.name, str(max(set(ks), key=ks.count)) if ks else "?", *cells])
    return header, rows


def _has_variants(r: Report) -> bool:
    return any(a.is_variant for a in r.spec.drafters)


def _arm_line(a: object) -> str:
    from sparkserve.measure.ab_records import Arm

    assert isinstance(a, Arm)
    if not a.is_variant:
        return f"- **{a.name}**: `{a.source}` (manifest sha256 `{a.digest[:12]}`)"
    settings = ", ".join(f"`{k}={v}`" for k, v in a.settings.items())
    drafter = f"drafter `{a.source}` (`{a.digest[:12]}`)" if a.source else (
        f"the config's drafter `{a.node_path}`" if a.node_path else "no drafter (mtp)")
    return f"- **{a.name}**: {settings} (config `{(a.fingerprint or '')[:12]}`, {drafter})"


def verdict_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    header = ["Drafter", "vs", "Cell", "Δ (95 %)", "Verdict"]
    return header, [[v.drafter, v.baseline, v.cell, _rel(v.rel), v.verdict] for v in r.analysis.verdicts]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in row] for row in [header, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in esc[1:]]
    return "\n".join(lines)


def _protocol(r: Report) -> str:
    s = r.spec.sampling
    cells = ", ".join(f"{c.name} {c.shape()}" for c in r.spec.cells)
    if s.get("protocol") == "card":
        how = (f"the model card's holdout protocol (/v1/completions, each prompt rendered with the target's chat "
               f"template {s.get('chat_template')} (sha256 {str(s.get('chat_template_sha256'))[:12]}), not "
               "streamed, EOS ends a request)")
    else:
        how = "the forced protocol (streamed chat completions)"
    return (f"Protocol: {how}; {cells}; {r.spec.rounds} round(s), design {r.spec.design_text()}; "
            f"temperature {s.get('temperature')}, top_p {s.get('top_p')}, thinking "
            f"{'on' if s.get('enable_thinking') else 'off'}, "
            f"forced output length {'on' if s.get('forced_length') else 'off'}; prompts {r.spec.prompts_source} "
            f"(sha256 {r.spec.prompts_sha256[:12]}); config {r.spec.config_sha256[:12]}. Intervals: 95 % bootstrap "
            f"({r.spec.bootstrap} resamples) over prompts within a boot and over boots across rounds.")


def markdown(r: Report) -> str:
    """The model-card-ready section."""
    out = [f"## A/B campaign {r.campaign} — table of record", ""]
    out += [_md_table(*card_rows(r)), ""]
    out += ["### Holdout-table shape", "", _md_table(*holdout_rows(r)), ""]
    out += ["### Intervals, deltas and latency", "", _md_table(*interval_rows(r)), ""]
    if _has_variants(r) and per_position_rows(r)[1]:
        out += ["### Acceptance per position", "", _md_table(*per_position_rows(r)), ""]
    out += ["### Verdicts", "", f"Rule: {r.rule}.", "", f"Design: {r.spec.design_text()}.", ""]
    vh, vr = verdict_rows(r)
    out += [_md_table(vh, vr) if vr else "No verdict (no comparable primary waves).", ""]
    out += ["### Honest read", "", r.analysis.honest_read, ""]
    if r.analysis.excluded:
        out += ["### Excluded", ""] + [f"- {e}" for e in r.analysis.excluded] + [""]
    out += ["### Variants" if _has_variants(r) else "### Drafters", ""]
    out += [_arm_line(a) for a in r.spec.drafters]
    out += ["", _protocol(r), ""]
    if r.status != "done":
        out[2:2] = [f"> campaign status: **{r.status}** — figures so far", ""]
    return "\n".join(out)


def render_rich(r: Report) -> list[object]:
    """The report as rich renderables (tables, then paragraphs) for the terminal."""
    from rich.table import Table
    from rich.text import Text

    def table(title: str, header: list[str], rows: list[list[str]]) -> Table:
        t = Table(title=title)
        for h in header:
            t.add_column(h)
        for row in rows:
            t.add_row(*row)
        return t

    out: list[object] = [table(f"A/B campaign {r.campaign} ({r.status}) — table of record", *card_rows(r)),
                         table("holdout-table shape", *holdout_rows(r)),
                         table("intervals, deltas, latency", *interval_rows(r))]
    if _has_variants(r) and per_position_rows(r)[1]:
        out.append(table("acceptance per position", *per_position_rows(r)))
    vh, vr = verdict_rows(r)
    if vr:
        out.append(table("verdicts", vh, vr))
    out.append(Text(f"Rule: {r.rule}."))
    out.append(Text(f"Design: {r.spec.design_text()}."))
    out.append(Text(r.analysis.honest_read))
    out += [Text(f"excluded: {e}", style="yellow") for e in r.analysis.excluded]
    out.append(Text(_protocol(r), style="dim"))
    return out


def plot(r: Report, path: Path) -> None:
    """Per-position acceptance per drafter (primary cell) and tok/s per cell with intervals, as one PNG.
    BadInput naming the extra when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--plot", f"needs matplotlib: pip install 'sparkserve[{PLOT_EXTRA}]'") from None
    names = [a.name for a in r.spec.drafters]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for n in names:
        f = _fig(r, n, r.spec.rule.primary)
        if f is None or not f.per_position:
            continue
        xs = list(range(1, len(f.per_position) + 1))
        ys = [i.point or 0 for i in f.per_position]
        lo = [(i.point or 0) - (i.lo if i.lo is not None else i.point or 0) for i in f.per_position]
        hi = [(i.hi if i.hi is not None else i.point or 0) - (i.point or 0) for i in f.per_position]
        ax1.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=n)
    ax1.set(title=f"per-position acceptance ({r.spec.rule.primary})", xlabel="draft position", ylabel="acceptance")
    ax1.legend()
    width = 0.8 / max(len(names), 1)
    for k, n in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for ci, cs in enumerate(r.spec.cells):
            f = _fig(r, n, cs.name)
            if f is None or f.tok_s.point is None:
                continue
            xs.append(ci + k * width)
            ys.append(f.tok_s.point)
            lo.append(f.tok_s.point - (f.tok_s.lo if f.tok_s.lo is not None else f.tok_s.point))
            hi.append((f.tok_s.hi if f.tok_s.hi is not None else f.tok_s.point) - f.tok_s.point)
        ax2.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=n)
    ax2.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(r.spec.cells))],
                   [c.name for c in r.spec.cells])
    ax2.set(title="output tok/s per cell (95 % intervals)", ylabel="tok/s")
    ax2.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise BadInput(str(path), f"cannot write ({e.strerror or e})") from None
    finally:
        plt.close(fig)
