"""vLLM ``/metrics`` text → counter snapshots → speculative-decoding figures. Pure, no I/O.

Example::

    before = parse_metrics(text_scraped_before)
    after = parse_metrics(text_scraped_after)
    spec = acceptance(counter_delta(before, after))
    spec.acceptance_length, spec.per_position, spec.warnings

Formulas (vllm-facts.md section 3), over two scrapes, counters summed over the ``engine`` label:
``AL = 1 + Δaccepted / Δdrafts``, ``rate = Δaccepted / Δdraft_tokens``,
``r[p] = Δaccepted_per_pos[p] / Δdrafts``; acceptance counts a prefix, so ``r`` is non-increasing
and ``Σ r = AL − 1``. A check that does not hold is reported as a warning, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PROCESS_START = "process_start_time_seconds"

_SUMMED = (DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATION_TOKENS, REQUEST_SUCCESS, PREEMPTIONS)


class MetricsError(ValueError):
    """The text is not Prometheus exposition, or two snapshots cannot be compared."""


@dataclass(frozen=True)
class Snapshot:
    """The counters the bench needs from one scrape. A counter the server does not export is ``None``."""

    boot_id: float | None  # process_start_time_seconds of the API server
    drafts: float | None
    draft_tokens: float | None
    accepted_tokens: float | None
    accepted_per_pos: dict[int, float]
    generation_tokens: float | None
    request_success: float | None  # summed over every finished_reason
    preemptions: float | None

    @property
    def has_spec_decode(self) -> bool:
        return self.drafts is not None


@dataclass(frozen=True)
class CounterDelta:
    """``after − before`` for each counter (``None`` where either scrape lacks it)."""

    drafts: float | None
    draft_tokens: float | None
    accepted_tokens: float | None
    accepted_per_pos: dict[int, float]
    generation_tokens: float | None
    request_success: float | None
    preemptions: float | None
    boot_id: float | None


@dataclass
class SpecFigures:
    """Acceptance figures from one counter delta. ``None`` means no data (no drafts in the interval)."""

    drafts: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    acceptance_length: float | None
    acceptance_rate: float | None
    per_position: list[float]
    warnings: list[str] = field(default_factory=list)


def parse_metrics(text: str, *, model_name: str | None = None) -> Snapshot:
    """Read Prometheus text exposition (as served by vLLM's ``/metrics``) into a :class:`Snapshot`.

    Counters are summed over every label set (DP engines, finished reasons); with ``model_name`` only
    samples labelled with that model count. Raises :class:`MetricsError` on text that does not parse.
    """
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    boot_id: float | None = None
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == PROCESS_START:
                    boot_id = s.value
                    continue
                if model_name is not None and s.labels.get("model_name", model_name) != model_name:
                    continue
                if s.name in _SUMMED:
                    sums[s.name] = sums.get(s.name, 0.0) + s.value
                elif s.name == ACCEPTED_PER_POS:
                    pos = s.labels.get("position")
                    if pos is None or not pos.isdigit():
                        raise MetricsError(f"{ACCEPTED_PER_POS} sample without a numeric position label")
                    per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + s.value
    except MetricsError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise MetricsError(f"not Prometheus text exposition ({e})") from e
    return Snapshot(
        boot_id=boot_id,
        drafts=sums.get(DRAFTS),
        draft_tokens=sums.get(DRAFT_TOKENS),
        accepted_tokens=sums.get(ACCEPTED),
        accepted_per_pos=dict(sorted(per_pos.items())),
        generation_tokens=sums.get(GENERATION_TOKENS),
        request_success=sums.get(REQUEST_SUCCESS),
        preemptions=sums.get(PREEMPTIONS),
    )


def _d(name: str, before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    d = after - before
    if d < 0:
        raise MetricsError(f"{name} went backwards ({before:g} → {after:g}): the server restarted")
    return d


def counter_delta(before: Snapshot, after: Snapshot) -> CounterDelta:
    """``after − before``. Raises :class:`MetricsError` when the server restarted in between
    (boot id changed, or any counter went backwards): that interval's figures mean nothing."""
    if before.boot_id is not None and after.boot_id is not None and before.boot_id != after.boot_id:
        raise MetricsError(
            f"{PROCESS_START} changed ({before.boot_id:.3f} → {after.boot_id:.3f}): the server restarted"
        )
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    per_pos: dict[int, float] = {}
    for p in positions:
        d = _d(f'{ACCEPTED_PER_POS}{{position="{p}"}}',
               before.accepted_per_pos.get(p, 0.0), after.accepted_per_pos.get(p, 0.0))
        per_pos[p] = d or 0.0
    return CounterDelta(
        drafts=_d(DRAFTS, before.drafts, after.drafts),
        draft_tokens=_d(DRAFT_TOKENS, before.draft_tokens, after.draft_tokens),
        accepted_tokens=_d(ACCEPTED, before.accepted_tokens, after.accepted_tokens),
        accepted_per_pos=per_pos,
        generation_tokens=_d(GENERATION_TOKENS, before.generation_tokens, after.generation_tokens),
        request_success=_d(REQUEST_SUCCESS, before.request_success, after.request_success),
        preemptions=_d(PREEMPTIONS, before.preemptions, after.preemptions),
        boot_id=after.boot_id if after.boot_id is not None else before.boot_id,
    )


def _int(x: float | None) -> int | None:
    return None if x is None else int(round(x))


def acceptance(delta: CounterDelta) -> SpecFigures:
    """Acceptance length, rate and per-position rates from a counter delta, with the prefix checks."""
    fig = SpecFigures(
        drafts=_int(delta.drafts),
        draft_tokens=_int(delta.draft_tokens),
        accepted_tokens=_int(delta.accepted_tokens),
        acceptance_length=None,
        acceptance_rate=None,
        per_position=[],
    )
    if delta.drafts is None or delta.accepted_tokens is None:
        fig.warnings.append("the server exports no speculative-decoding counters (no speculative config?)")
        return fig
    if delta.drafts == 0:
        fig.warnings.append(f"no speculative drafts in this interval (Δ {DRAFTS} = 0)")
        return fig
    drafts = delta.drafts
    fig.acceptance_length = 1.0 + delta.accepted_tokens / drafts
    if delta.draft_tokens:
        fig.acceptance_rate = delta.accepted_tokens / delta.draft_tokens
    if delta.accepted_per_pos:
        k = max(delta.accepted_per_pos) + 1
        counts = [delta.accepted_per_pos.get(p, 0.0) for p in range(k)]
        fig.per_position = [c / drafts for c in counts]
        fig.warnings += prefix_checks(counts, drafts, delta.accepted_tokens)
    else:
        fig.warnings.append(f"no {ACCEPTED_PER_POS} series: per-position acceptance unknown")
    return fig


def prefix_checks(per_pos_counts: list[float], drafts: float, accepted: float) -> list[str]:
    """Acceptance is counted as a prefix: per-position counts are non-increasing, none exceeds the
    drafts, and they sum to the accepted tokens (Σ r = AL − 1). Returns one warning per violation."""
    out: list[str] = []
    for p in range(1, len(per_pos_counts)):
        if per_pos_counts[p] > per_pos_counts[p - 1]:
            out.append(
                f"per-position acceptance rises at position {p} "
                f"({per_pos_counts[p - 1] / drafts:.3f} → {per_pos_counts[p] / drafts:.3f}): "
                "acceptance is a prefix, so it must not increase"
            )
    for p, c in enumerate(per_pos_counts):
        if c > drafts:
            out.append(f"per-position acceptance at position {p} exceeds 1 ({c:g} of {drafts:g} drafts)")
    total = sum(per_pos_counts)
    if abs(total - accepted) > 0.5:  # integer counters: any difference of one token or more is real
        out.append(
            f"per-position rates sum to {total / drafts:.4f} but acceptance length − 1 is "
            f"{accepted / drafts:.4f} (Σ per-position {total:g} ≠ accepted {accepted:g})"
        )
    return out
