"""Counter arithmetic on real vLLM /metrics scrapes (0.25.1) and on hand-built expositions."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkserve.measure.metrics import (
    MetricsError,
    Snapshot,
    acceptance,
    counter_delta,
    parse_metrics,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "metrics"


def _before_after(name: str) -> tuple[str, str]:
    text = (FIXTURES / name).read_text()
    before, after = text.split("# AFTER\n")
    return before.removeprefix("# BEFORE\n"), after


def expo(
    *,
    boot: float = 1795970132.07,
    drafts: dict[str, float] | None = None,
    draft_tokens: dict[str, float] | None = None,
    accepted: dict[str, float] | None = None,
    per_pos: dict[str, list[float]] | None = None,
    generation: float = 0.0,
    success: float = 0.0,
    model: str = "m",
) -> str:
    """A small vLLM-shaped exposition; dict keys are engine labels."""
    lines = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {boot}",
    ]

    def counter(name: str, values: dict[str, float] | None) -> None:
        if values is None:
            return
        lines.append(f"# TYPE {name}_total counter")
        for eng, v in values.items():
            lines.append(f'{name}_total{{engine="{eng}",model_name="{model}"}} {v}')

    counter("vllm:spec_decode_num_drafts", drafts)
    counter("vllm:spec_decode_num_draft_tokens", draft_tokens)
    counter("vllm:spec_decode_num_accepted_tokens", accepted)
    if per_pos is not None:
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
        for eng, vals in per_pos.items():
            for p, v in enumerate(vals):
                lines.append(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{eng}",model_name="{model}",'
                    f'position="{p}"}} {v}'
                )
    lines.append("# TYPE vllm:generation_tokens_total counter")
    lines.append(f'vllm:generation_tokens_total{{engine="0",model_name="{model}"}} {generation}')
    lines.append("# TYPE vllm:request_success_total counter")
    for reason, v in (("length", success), ("stop", 0.0)):
        labels = f'engine="0",finished_reason="{reason}",model_name="{model}"'
        lines.append(f"vllm:request_success_total{{{labels}}} {v}")
    return "\n".join(lines) + "\n"


def zero(k: int) -> Snapshot:
    """A freshly booted server's snapshot with k draft positions."""
    z = {"0": 0.0}
    return parse_metrics(expo(drafts=z, draft_tokens=z, accepted=z, per_pos={"0": [0] * k}))


def test_real_smoke_scrape_parses_counters_and_boot_id() -> None:
    before_text, after_text = _before_after("real-0.25.1-A-metrics.txt")
    before, after = parse_metrics(before_text), parse_metrics(after_text)
    assert before.boot_id == after.boot_id == pytest.approx(1795970132.07)
    assert (before.drafts, before.accepted_tokens, before.generation_tokens) == (0, 0, 0)
    assert after.drafts == 10215
    assert after.draft_tokens == 71505
    assert after.accepted_tokens == 5
    assert after.accepted_per_pos == {0: 5, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0}
    assert after.generation_tokens == 10240  # 20 requests × 512 forced tokens
    assert after.request_success == 20  # summed over finished_reason labels


def test_real_smoke_delta_gives_acceptance_per_vllm_formulas() -> None:
    before_text, after_text = _before_after("real-0.25.1-A-metrics.txt")
    fig = acceptance(counter_delta(parse_metrics(before_text), parse_metrics(after_text)))
    assert fig.drafts == 10215 and fig.draft_tokens == 71505 and fig.accepted_tokens == 5
    assert fig.acceptance_length == pytest.approx(1 + 5 / 10215)
    assert fig.acceptance_rate == pytest.approx(5 / 71505)
    assert fig.per_position == pytest.approx([5 / 10215, 0, 0, 0, 0, 0, 0])
    assert fig.warnings == []


def test_real_eager_scrape_without_acceptance_is_length_one() -> None:
    before_text, after_text = _before_after("real-0.25.1-B-metrics.txt")
    d = counter_delta(parse_metrics(before_text), parse_metrics(after_text))
    assert d.drafts == 1533 and d.generation_tokens == 1536 and d.request_success == 3
    fig = acceptance(d)
    assert fig.acceptance_length == 1.0
    assert fig.per_position == [0.0] * 7
    assert fig.warnings == []


def test_counters_are_summed_over_engines() -> None:
    snap = parse_metrics(expo(drafts={"0": 10, "1": 30}, accepted={"0": 5, "1": 25},
                              per_pos={"0": [4, 1], "1": [20, 5]}))
    assert snap.drafts == 40
    assert snap.accepted_tokens == 30
    assert snap.accepted_per_pos == {0: 24, 1: 6}


def test_model_name_filter_ignores_other_models() -> None:
    text = expo(drafts={"0": 10}, model="a") + expo(drafts={"0": 99}, model="b").split("\n", 3)[3]
    assert parse_metrics(text, model_name="a").drafts == 10
    assert parse_metrics(text, model_name="b").drafts == 99


def test_acceptance_profile_from_synthetic_delta() -> None:
    before = parse_metrics(expo(drafts={"0": 100}, draft_tokens={"0": 700}, accepted={"0": 50},
                                per_pos={"0": [30, 15, 5]}))
    after = parse_metrics(expo(drafts={"0": 1100}, draft_tokens={"0": 7700}, accepted={"0": 2550},
                               per_pos={"0": [1030, 815, 705]}))
    fig = acceptance(counter_delta(before, after))
    assert fig.acceptance_length == pytest.approx(1 + 2500 / 1000)
    assert fig.acceptance_rate == pytest.approx(2500 / 7000)
    assert fig.per_position == pytest.approx([1.0, 0.8, 0.7])
    assert sum(fig.per_position) == pytest.approx(fig.acceptance_length - 1)
    assert fig.warnings == []


def test_restart_detected_by_boot_id() -> None:
    before = parse_metrics(expo(boot=100.0, drafts={"0": 5}))
    after = parse_metrics(expo(boot=200.0, drafts={"0": 50}))
    with pytest.raises(MetricsError, match="process_start_time_seconds changed.*restarted"):
        counter_delta(before, after)


def test_restart_detected_by_counter_going_backwards() -> None:
    before = parse_metrics(expo(drafts={"0": 500}))
    after = parse_metrics(expo(drafts={"0": 20}))
    with pytest.raises(MetricsError, match="spec_decode_num_drafts_total went backwards"):
        counter_delta(before, after)


def test_rising_per_position_is_reported_not_hidden() -> None:
    before = zero(3)
    after = parse_metrics(expo(drafts={"0": 100}, draft_tokens={"0": 300}, accepted={"0": 120},
                               per_pos={"0": [50, 60, 10]}))
    fig = acceptance(counter_delta(before, after))
    assert fig.per_position == pytest.approx([0.5, 0.6, 0.1])
    assert any("rises at position 1" in w for w in fig.warnings)


def test_per_position_sum_mismatch_is_reported() -> None:
    before = zero(2)
    after = parse_metrics(expo(drafts={"0": 100}, draft_tokens={"0": 200}, accepted={"0": 150},
                               per_pos={"0": [80, 40]}))
    fig = acceptance(counter_delta(before, after))
    assert fig.acceptance_length == pytest.approx(2.5)
    assert any("sum to 1.2000 but acceptance length − 1 is 1.5000" in w for w in fig.warnings)


def test_per_position_above_one_is_reported() -> None:
    before = zero(1)
    after = parse_metrics(expo(drafts={"0": 10}, draft_tokens={"0": 10}, accepted={"0": 12},
                               per_pos={"0": [12]}))
    fig = acceptance(counter_delta(before, after))
    assert any("exceeds 1" in w for w in fig.warnings)


def test_no_drafts_means_no_figures_and_says_so() -> None:
    s = parse_metrics(expo(drafts={"0": 7}, draft_tokens={"0": 49}, accepted={"0": 3}, per_pos={"0": [3]}))
    fig = acceptance(counter_delta(s, s))
    assert fig.acceptance_length is None and fig.per_position == []
    assert any("no speculative drafts" in w for w in fig.warnings)


def test_server_without_spec_decode_counters() -> None:
    s = parse_metrics(expo(generation=10))
    assert not s.has_spec_decode
    fig = acceptance(counter_delta(s, parse_metrics(expo(generation=20))))
    assert fig.acceptance_length is None
    assert any("no speculative-decoding counters" in w for w in fig.warnings)


def test_garbage_is_not_metrics() -> None:
    with pytest.raises(MetricsError, match="not Prometheus"):
        parse_metrics("<html>502 Bad Gateway</html>\n")


def test_snapshot_without_boot_id_still_compares() -> None:
    a = Snapshot(None, 1, 1, 0, {}, 1, 0, None)
    b = Snapshot(None, 11, 71, 30, {0: 10, 1: 10, 2: 10}, 41, 1, None)
    fig = acceptance(counter_delta(a, b))
    assert fig.acceptance_length == pytest.approx(4.0)
    assert fig.per_position == pytest.approx([1.0, 1.0, 1.0])
