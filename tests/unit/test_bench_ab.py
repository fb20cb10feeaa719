"""ab_table(): bench records set against the first one, pure (the CLI's files are in test_cli_measure)."""

from __future__ import annotations

import pytest

from sparkserve.errors import BadInput
from sparkserve.measure.ab import ab_table
from sparkserve.measure.records import BenchResult


def _r(**over: object) -> BenchResult:
    base: dict[str, object] = dict(
        cell="c1", prompts=100, concurrency=1, max_tokens=1024, requests_ok=100, stream_errors=0,
        output_tokens=102400, duration_s=100.0, output_tok_s=1024.0, acceptance_length=3.0,
        per_position_acceptance=[0.8, 0.6], drafts=10, draft_tokens=70, accepted_tokens=20, acceptance_rate=0.5,
    )
    base.update(over)
    return BenchResult.model_validate(base)


def test_rows_carry_relative_deltas_against_the_baseline_in_the_json_order() -> None:
    t = ab_table([("a", _r()), ("b", _r(output_tok_s=1126.4, per_position_acceptance=[0.4, 0.6, 0.2]))])
    dumped = t.model_dump(mode="json")
    assert list(dumped) == ["baseline", "cell", "rows"] and dumped["baseline"] == "a"
    assert list(dumped["rows"][0]) == [
        "file", "cell", "ok", "refused", "stream_errors", "output_tok_s", "output_tok_s_delta",
        "acceptance_length", "acceptance_length_delta", "acceptance_rate", "acceptance_rate_delta",
        "per_position_acceptance", "per_position_delta", "boot_id",
    ]
    b = t.rows[1]
    assert b.output_tok_s_delta == pytest.approx(0.1) and b.acceptance_length_delta == 0.0
    assert b.per_position_delta == [pytest.approx(-0.5), 0.0, None]


def test_a_refused_record_is_not_ok_and_an_unlike_cell_is_bad_input() -> None:
    assert not ab_table([("a", _r()), ("b", _r(refused=["contaminated"]))]).rows[1].ok
    with pytest.raises(BadInput, match=r"cell c16 \(500×c16×1024\) differs from the baseline a's c1"):
        ab_table([("a", _r()), ("b", _r(cell="c16", prompts=500, concurrency=16))])
