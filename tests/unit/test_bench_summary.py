"""summarize(): a cell's figures and guards from request outcomes and two /metrics snapshots, pure."""

from __future__ import annotations

import pytest

from sparkserve.errors import RemoteFailure
from sparkserve.measure.metrics import Snapshot
from sparkserve.measure.records import BenchResult, Cell, RequestOutcome
from sparkserve.measure.summary import summarize


def _snap(**kw: object) -> Snapshot:
    base: dict[str, object] = dict(boot_id=1.0, drafts=0.0, draft_tokens=0.0, accepted_tokens=0.0,
                                   accepted_per_pos={0: 0.0, 1: 0.0}, generation_tokens=0.0,
                                   request_success=0.0, preemptions=None)
    base.update(kw)
    return Snapshot(**base)  # type: ignore[arg-type]


def _ok(n: int, tokens: int) -> list[RequestOutcome]:
    return [RequestOutcome(index=i, completion_tokens=tokens) for i in range(n)]


def test_summarize_passes_prefix_violations_through_as_warnings() -> None:
    cell = Cell("t", 2, 1, 10)
    after = _snap(drafts=10.0, draft_tokens=20.0, accepted_tokens=8.0, accepted_per_pos={0: 3.0, 1: 5.0},
                  generation_tokens=20.0, request_success=2.0)
    r = summarize(cell, _ok(2, 10), 1.0, _snap(), after)
    assert r.ok
    assert any("rises at position 1" in w for w in r.warnings)


def test_summarize_refuses_when_speculation_never_ran() -> None:
    cell = Cell("t", 2, 1, 10)
    after = _snap(generation_tokens=20.0, request_success=2.0)
    r = summarize(cell, _ok(2, 10), 1.0, _snap(), after)
    assert any("speculative decoding did not run" in x for x in r.refused)


def test_summarize_refuses_a_server_that_finished_fewer_requests_than_sent() -> None:
    cell = Cell("t", 3, 1, 10)
    after = _snap(drafts=5.0, draft_tokens=10.0, accepted_tokens=5.0, accepted_per_pos={0: 5.0, 1: 0.0},
                  generation_tokens=30.0, request_success=2.0)
    r = summarize(cell, _ok(3, 10), 1.0, _snap(), after)
    assert r.refused == ["the server counted 2 finished requests of 3 sent"]


def test_summarize_keeps_the_outcomes_when_the_after_scrape_fails() -> None:
    cell = Cell("t", 2, 1, 10)
    outcomes = [RequestOutcome(0, 10), RequestOutcome(1, 0, error="stalled", detail="spark-a: hung")]
    r = summarize(cell, outcomes, 1.0, _snap(), RemoteFailure("http://h/metrics", "spark-a: connection refused"))
    assert r.stream_errors == 1 and r.requests_ok == 1 and r.acceptance_length is None
    assert "/metrics unreadable after the cell (spark-a: connection refused): no acceptance figures" in r.refused
    assert r.boot_id == 1.0


def test_result_round_trips_through_json() -> None:
    cell = Cell("t", 1, 1, 10)
    after = _snap(drafts=4.0, draft_tokens=8.0, accepted_tokens=5.0, accepted_per_pos={0: 3.0, 1: 2.0},
                  generation_tokens=10.0, request_success=1.0)
    r = summarize(cell, _ok(1, 10), 2.0, _snap(), after)
    again = BenchResult.model_validate_json(r.to_json())
    assert again == r and again.acceptance_length == pytest.approx(2.25) and r.output_tok_s == 5.0
