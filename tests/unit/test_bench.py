"""The bench client against an in-test vLLM-shaped server: protocol, stream errors, guards, figures."""

from __future__ import annotations

import json
import socket
import time

import pytest
from _fake_vllm import DRIBBLE, EMPTY, ERROR_EVENT, HANG, HTTP500, SHORT, FakeState, FakeVllm
from _fake_vllm import NO_DONE as FAKE_NO_DONE
from _fake_vllm import NO_USAGE as FAKE_NO_USAGE

from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.measure.client import request_body
from sparkserve.measure.prompts import Prompt, builtin_prompts
from sparkserve.measure.records import (
    CELLS,
    HTTP,
    NO_DONE,
    NO_TOKENS,
    NO_USAGE,
    NOT_SENT,
    STALLED,
    Cell,
    Sampling,
)
from sparkserve.measure.run import run_cell

CONTRACT_KEYS = [
    "cell", "prompts", "concurrency", "max_tokens", "requests_ok", "stream_errors", "output_tokens",
    "duration_s", "output_tok_s", "acceptance_length", "per_position_acceptance", "drafts", "draft_tokens",
    "accepted_tokens",
]
SMALL = Cell("t", prompts=6, concurrency=2, max_tokens=64)


def test_cells_are_the_model_card_protocol() -> None:
    assert {n: (c.prompts, c.concurrency, c.max_tokens) for n, c in CELLS.items()} == {
        "smoke": (20, 1, 512), "c1": (100, 1, 1024), "c16": (500, 16, 1024), "c16-k4": (500, 16, 1024),
        "mt4096": (500, 16, 4096),  # the card's deep-trace cell (drafter/README.md: --max-tokens 4096)
    }
    assert CELLS["c16-k4"].k == 4 and all(CELLS[n].k is None for n in ("smoke", "c1", "c16", "mt4096"))


def test_request_is_thinking_on_sampled_forced_length_streamed_with_usage() -> None:
    body = request_body("m", Prompt([{"role": "user", "content": "hi"}]), 512, Sampling())
    assert body["model"] == "m" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["temperature"] == 1.0 and body["top_p"] == 0.95
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["max_tokens"] == body["min_tokens"] == 512 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_healthy_cell_reports_tokens_acceptance_and_the_json_contract() -> None:
    with FakeVllm() as srv:
        r = run_cell(srv.url, "fake-model", SMALL, builtin_prompts())
        st = srv.state
    assert r.ok and r.refused == [] and r.stream_errors == 0 and r.incomplete == 0
    assert r.requests_ok == 6 and r.output_tokens == 6 * 64
    assert r.output_tok_s == pytest.approx(r.output_tokens / r.duration_s, rel=1e-3)
    assert (r.drafts, r.draft_tokens, r.accepted_tokens) == (st.drafts, st.draft_tokens, st.accepted)
    assert r.acceptance_length == pytest.approx(1 + st.accepted / st.drafts)
    assert r.acceptance_rate == pytest.approx(st.accepted / st.draft_tokens)
    assert r.per_position_acceptance == pytest.approx([c / st.drafts for c in st.per_pos], abs=1e-6)
    assert r.boot_id == st.boot_id and r.url == srv.url and r.model == "fake-model"
    data = json.loads(r.to_json())
    assert list(data)[: len(CONTRACT_KEYS)] == CONTRACT_KEYS
    assert data["sampling"] == {
        "protocol": "forced", "temperature": 1.0, "top_p": 0.95, "enable_thinking": True, "forced_length": True,
    }
    assert data["protocol"] == "forced" and data["endpoint"] == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("mode", "kind"),
    [(HTTP500, HTTP), (ERROR_EVENT, "error_event"), (FAKE_NO_DONE, NO_DONE), (FAKE_NO_USAGE, NO_USAGE),
     (EMPTY, NO_TOKENS)],
)
def test_each_stream_fault_is_counted_and_refuses_the_cell(mode: str, kind: str) -> None:
    st = FakeState(modes=lambda i: mode if i == 2 else "ok")
    with FakeVllm(st) as srv:  # concurrency 1: the server's arrival order is the request index
        r = run_cell(srv.url, "fake-model", Cell("t", 6, 1, 64), builtin_prompts())
    assert r.stream_errors == 1 and r.requests_ok == 5
    assert r.error_kinds == {kind: 1}
    assert [e.request for e in r.errors] == [2]
    assert not r.ok and r.refused[0].startswith("1 of 6 requests failed")


def test_stream_split_byte_by_byte_with_crlf_is_read_whole() -> None:
    with FakeVllm(FakeState(modes=lambda i: DRIBBLE)) as srv:
        r = run_cell(srv.url, "fake-model", Cell("t", 2, 1, 16), builtin_prompts())
    assert r.ok, r.refused
    assert r.output_tokens == 32


def test_short_forced_length_reply_is_incomplete_and_refused() -> None:
    st = FakeState(modes=lambda i: SHORT if i in (1, 4) else "ok")
    with FakeVllm(st) as srv:
        r = run_cell(srv.url, "fake-model", Cell("t", 6, 1, 64), builtin_prompts())
    assert r.stream_errors == 0 and r.incomplete == 2 and r.requests_ok == 4
    assert any("2 forced-length replies came back short (shortest 32 of 64" in x for x in r.refused)
    assert not r.ok


def test_hung_server_is_a_stream_error_naming_the_node_not_a_stuck_command() -> None:
    st = FakeState(modes=lambda i: HANG if i == 1 else "ok")
    cell = Cell("t", prompts=5, concurrency=1, max_tokens=32)
    with FakeVllm(st) as srv:
        t0 = time.monotonic()
        r = run_cell(srv.url, "fake-model", cell, builtin_prompts(), node="spark-a", stall_timeout_s=0.5)
        elapsed = time.monotonic() - t0
    assert elapsed < 10
    assert r.error_kinds == {STALLED: 1, NOT_SENT: 3}  # one hang at c1: the rest are not queued behind it
    hung = r.errors[0]
    assert hung.request == 1 and "spark-a" in hung.detail and srv.url in hung.detail
    assert not r.ok


def test_request_deadline_bounds_a_slow_stream() -> None:
    st = FakeState(chunk_delay_s=0.05)
    cell = Cell("t", prompts=2, concurrency=2, max_tokens=400)
    with FakeVllm(st) as srv:
        t0 = time.monotonic()
        r = run_cell(srv.url, "fake-model", cell, builtin_prompts(), deadline_s=0.5)
        assert time.monotonic() - t0 < 10
    assert r.error_kinds == {"hung": 2}
    assert "deadline" in r.errors[0].detail


def test_foreign_traffic_between_scrapes_refuses_the_cell_as_contaminated() -> None:
    with FakeVllm(FakeState(foreign_requests_per_scrape=3)) as srv:
        r = run_cell(srv.url, "fake-model", SMALL, builtin_prompts())
    assert r.stream_errors == 0
    want = "contaminated: the server finished 9 requests, the cell sent 6 (someone else used the server)"
    assert want in r.refused
    assert any("generated" in x for x in r.refused)


def test_server_restart_during_the_cell_refuses_it() -> None:
    with FakeVllm(FakeState(restart_at_scrape=1)) as srv:
        r = run_cell(srv.url, "fake-model", SMALL, builtin_prompts())
    assert any("restarted" in x for x in r.refused) and not r.ok
    assert r.acceptance_length is None


def test_unreachable_server_is_a_remote_failure_naming_the_url() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RemoteFailure) as e:
        run_cell(url, "m", SMALL, builtin_prompts(), node="spark-a")
    assert e.value.exit_code == 3 and url in e.value.line() and "spark-a" in e.value.line()


def test_wrong_model_name_is_bad_input() -> None:
    with FakeVllm() as srv, pytest.raises(BadInput, match="serves \\['fake-model'\\], not 'other'"):
        run_cell(srv.url, "other", SMALL, builtin_prompts())


def test_progress_bar_goes_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeVllm() as srv:
        run_cell(srv.url, "fake-model", SMALL, builtin_prompts(), progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "6/6" in err


def test_acceptance_profile_given_to_the_server_is_measured_within_sampling_error() -> None:
    profile = (0.744, 0.545, 0.405, 0.306, 0.237, 0.185, 0.147)
    cell = Cell("t", prompts=40, concurrency=4, max_tokens=512)
    with FakeVllm(FakeState(profile=profile, seed=7)) as srv:
        r = run_cell(srv.url, "fake-model", cell, builtin_prompts())
    assert r.ok, r.refused
    n = r.drafts
    assert n and n > 3000
    for got, want in zip(r.per_position_acceptance, profile, strict=True):
        se = (want * (1 - want) / n) ** 0.5
        assert abs(got - want) < 4 * se + 1e-9
    mean = sum(profile)  # E[accepted per draft]; a² = Σ_{p<a} (2p + 1), so E[a²] = Σ (2p + 1) r[p]
    var = sum((2 * p + 1) * x for p, x in enumerate(profile)) - mean**2
    assert r.acceptance_length == pytest.approx(1 + mean, abs=4 * (var / n) ** 0.5)
    assert sum(r.per_position_acceptance) == pytest.approx(r.acceptance_length - 1, abs=1e-5)
    assert r.warnings == [f"{len(builtin_prompts())} distinct prompts cycled over 40 requests"]
