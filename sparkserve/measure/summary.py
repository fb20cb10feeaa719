"""One cell's figures and guards, from its request outcomes and two ``/metrics`` snapshots. Pure.

Example::

    result = summarize(cell, outcomes, duration_s, before, after, url=url, prompt_set=prompts)
    result.output_tok_s, result.acceptance_length, result.refused

Guards (a refused cell keeps its figures but says why they must not be quoted): the server restarted
(boot id = ``process_start_time_seconds`` changed, or a counter went backwards); other traffic moved
the counters (more finished requests, or more generated tokens, than the cell's own); requests failed;
forced-length replies came back short; speculative decoding never ran; the server drafts another number of
tokens than the cell is for (``c16-k4``: Δdraft_tokens / Δdrafts must be 4).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from sparkserve.errors import RemoteFailure
from sparkserve.measure.latency import latency_of
from sparkserve.measure.metrics import CounterDelta, MetricsError, Snapshot, SpecFigures, acceptance, counter_delta
from sparkserve.measure.prompts import PromptSet
from sparkserve.measure.records import (
    CARD,
    INCOMPLETE,
    NOT_SENT,
    BenchResult,
    Cell,
    RequestError,
    RequestOutcome,
    Sampling,
)

MAX_ERRORS_KEPT = 20


@dataclass
class _Verdict:
    """The guards' findings so far: refusals void the cell's figures, warnings qualify them."""

    refused: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Tally:
    """What the cell's own requests add up to."""

    kinds: Counter[str]  # stream-error kind → count, INCOMPLETE left out
    incomplete: int
    stream_errors: int
    sent: int  # requests that went out (NOT_SENT ones did not)
    output_tokens: int

    @classmethod
    def of(cls, outcomes: list[RequestOutcome]) -> _Tally:
        kinds = Counter(o.error for o in outcomes if o.error)
        incomplete = kinds.pop(INCOMPLETE, 0)
        return cls(
            kinds=kinds,
            incomplete=incomplete,
            stream_errors=sum(kinds.values()),
            sent=sum(1 for o in outcomes if o.error != NOT_SENT),
            output_tokens=sum(o.completion_tokens for o in outcomes),
        )


def _check_requests(cell: Cell, tally: _Tally, outcomes: list[RequestOutcome], v: _Verdict) -> None:
    """Failed requests and short forced-length replies."""
    if tally.stream_errors:
        summary = ", ".join(f"{n} {k}" for k, n in tally.kinds.most_common())
        v.refused.append(f"{tally.stream_errors} of {cell.prompts} requests failed ({summary})")
    if tally.incomplete:
        shortest = min(o.completion_tokens for o in outcomes if o.error == INCOMPLETE)
        v.refused.append(
            f"{tally.incomplete} forced-length replies came back short "
            f"(shortest {shortest} of {cell.max_tokens} tokens)"
        )


def _delta(before: Snapshot, after: Snapshot | RemoteFailure, v: _Verdict) -> CounterDelta | None:
    """The cell's counter delta, or None (refused) when the last scrape failed or the server restarted."""
    if isinstance(after, RemoteFailure):
        v.refused.append(f"/metrics unreadable after the cell ({after.what}): no acceptance figures")
        return None
    try:
        return counter_delta(before, after)
    except MetricsError as e:
        v.refused.append(f"server restarted during the cell: {e}")
        return None


def _check_counters(
    cell: Cell, delta: CounterDelta, spec: SpecFigures, tally: _Tally, before: Snapshot, v: _Verdict
) -> None:
    """Other traffic on the server, preemptions, and speculative decoding that never ran."""
    v.warnings += spec.warnings
    if delta.request_success is None:
        v.warnings.append("no vllm:request_success_total: cannot check for other traffic")
    elif delta.request_success > tally.sent:
        v.refused.append(
            f"contaminated: the server finished {delta.request_success:g} requests, the cell sent {tally.sent} "
            "(someone else used the server)"
        )
    elif delta.request_success < tally.sent:
        v.refused.append(f"the server counted {delta.request_success:g} finished requests of {tally.sent} sent")
    if delta.generation_tokens is None:
        v.warnings.append("no vllm:generation_tokens_total: cannot check generated tokens")
    elif not tally.stream_errors and delta.generation_tokens > tally.output_tokens:
        # with failed streams the server may have generated tokens no usage chunk reported
        v.refused.append(
            f"contaminated: the server generated {delta.generation_tokens:g} tokens, the cell received "
            f"{tally.output_tokens} (someone else used the server)"
        )
    if delta.preemptions:
        v.warnings.append(f"{delta.preemptions:g} preemptions during the cell (KV pool too small for it?)")
    if cell.k is not None and spec.drafts and spec.draft_tokens is not None:
        k = spec.draft_tokens / spec.drafts
        if abs(k - cell.k) > 1e-9:
            v.refused.append(f"cell {cell.name} is for K={cell.k} drafted tokens; the server drafted {k:g} per "
                             "draft (Δdraft_tokens / Δdrafts): boot it with num_speculative_tokens "
                             f"{cell.k} for this cell")
    if spec.drafts == 0 and tally.output_tokens > 0 and before.has_spec_decode:
        v.refused.append(
            "speculative decoding did not run: no drafts while tokens were generated "
            "(or the server runs with --disable-log-stats, which freezes these counters)"
        )


def _r(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 6)


def summarize(
    cell: Cell,
    outcomes: list[RequestOutcome],
    duration_s: float,
    before: Snapshot,
    after: Snapshot | RemoteFailure,
    *,
    sampling: Sampling = Sampling(),
    url: str | None = None,
    node: str | None = None,
    model: str | None = None,
    prompt_set: PromptSet | None = None,
    started_at: str | None = None,
) -> BenchResult:
    """Figures and guards for one cell from its request outcomes and the two ``/metrics`` snapshots
    (``after`` is the scrape's failure when the server stopped answering during the cell)."""
    tally = _Tally.of(outcomes)
    v = _Verdict()
    _check_requests(cell, tally, outcomes, v)
    delta = _delta(before, after, v)
    spec = None
    if delta is not None:
        spec = acceptance(delta)
        _check_counters(cell, delta, spec, tally, before, v)
    if prompt_set is not None and len(prompt_set) < cell.prompts:
        v.warnings.append(f"{len(prompt_set)} distinct prompts cycled over {cell.prompts} requests")
    after_boot = None if isinstance(after, RemoteFailure) else after.boot_id
    ok_tokens = [o.completion_tokens for o in outcomes if not o.error]
    return BenchResult(
        cell=cell.name,
        prompts=cell.prompts,
        concurrency=cell.concurrency,
        max_tokens=cell.max_tokens,
        requests_ok=len(outcomes) - tally.stream_errors - tally.incomplete,
        stream_errors=tally.stream_errors,
        output_tokens=tally.output_tokens,
        duration_s=round(duration_s, 6),
        output_tok_s=round(tally.output_tokens / duration_s if duration_s > 0 else 0.0, 3),
        acceptance_length=_r(spec.acceptance_length) if spec else None,
        per_position_acceptance=[_r(x) for x in spec.per_position] if spec else [],
        drafts=spec.drafts if spec else None,
        draft_tokens=spec.draft_tokens if spec else None,
        accepted_tokens=spec.accepted_tokens if spec else None,
        ok=not v.refused,
        refused=v.refused,
        warnings=v.warnings,
        acceptance_rate=_r(spec.acceptance_rate) if spec else None,
        incomplete=tally.incomplete,
        error_kinds=dict(tally.kinds) | ({INCOMPLETE: tally.incomplete} if tally.incomplete else {}),
        errors=[RequestError(request=o.index, kind=o.error, detail=o.detail) for o in outcomes if o.error][
            :MAX_ERRORS_KEPT
        ],
        boot_id=after_boot if after_boot is not None else before.boot_id,
        url=url,
        node=node,
        model=model,
        prompts_source=prompt_set.source if prompt_set else None,
        prompts_sha256=prompt_set.sha256 if prompt_set else None,
        sampling=sampling.as_dict(),
        started_at=started_at,
        protocol=sampling.protocol,
        k=_k(spec),
        requests_per_s=round(len(ok_tokens) / duration_s, 6) if duration_s > 0 else None,
        output_len_mean=round(statistics.fmean(ok_tokens), 3) if ok_tokens else None,
        output_len_p50=round(float(statistics.median(ok_tokens)), 3) if ok_tokens else None,
        latency=latency_of(outcomes, streamed=sampling.protocol != CARD),
    )


def _k(spec: SpecFigures | None) -> int | None:
    """Tokens per draft as the counters show them (every draft of one server proposes the same K)."""
    if spec is None or not spec.drafts or spec.draft_tokens is None:
        return None
    return round(spec.draft_tokens / spec.drafts)
