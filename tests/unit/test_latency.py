"""measure/latency.py against vLLM's own ``calculate_metrics`` (vllm bench serve, 0.33.0) on the same requests."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from sparkserve.measure.latency import NOT_STREAMED, latency_of, latency_stats
from sparkserve.measure.records import HUNG, RequestOutcome

if TYPE_CHECKING:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

# vLLM is imported in the tests that use it, not at collection: importing it costs ~9 s of CPU, paid by every
# pytest-xdist worker of `scripts/test --quick` while it collects, whichever tests it then runs (issue 39)


def _requests(n: int, seed: int) -> list[tuple[RequestOutcome, RequestFuncOutput]]:
    """The same streamed requests as our outcome and as vLLM's request function records them."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    rng = random.Random(seed)
    out = []
    for i in range(n):
        ttft = rng.uniform(0.02, 0.4)
        gaps = [rng.uniform(0.005, 0.06) for _ in range(rng.randint(1, 60))]
        tokens = len(gaps) * rng.randint(1, 5) + 1  # several tokens per chunk, as a spec-decode step streams
        e2e = ttft + sum(gaps)
        ours = RequestOutcome(index=i, completion_tokens=tokens, ttft_s=ttft, e2e_s=e2e, latency_s=e2e + 0.001,
                              itl_s=gaps, chunks=len(gaps) + 1)
        theirs = RequestFuncOutput(success=True, latency=e2e, output_tokens=tokens, ttft=ttft, itl=list(gaps))
        out.append((ours, theirs))
    failed = RequestOutcome(index=n, error=HUNG, latency_s=9.0)
    out.append((failed, RequestFuncOutput(success=False, error="hung")))
    return out


def test_latency_matches_vllm_bench_serves_own_metrics() -> None:
    from vllm.benchmarks import serve

    pairs = _requests(40, seed=7)
    ours = latency_of([o for o, _ in pairs], streamed=True)
    m, _ = serve.calculate_metrics(input_requests=[], outputs=[t for _, t in pairs], dur_s=10.0, tokenizer=None,
                                   selected_percentiles=[90.0, 99.0], goodput_config_dict={})
    for name, got in (("ttft", ours.ttft), ("tpot", ours.tpot), ("itl", ours.itl), ("e2el", ours.e2e)):
        assert got is not None
        assert got.mean_ms == pytest.approx(getattr(m, f"mean_{name}_ms"), abs=1e-3), name
        assert got.median_ms == pytest.approx(getattr(m, f"median_{name}_ms"), abs=1e-3), name
        p = dict(getattr(m, f"percentiles_{name}_ms"))
        assert (got.p90_ms, got.p99_ms) == (pytest.approx(p[90.0], abs=1e-3), pytest.approx(p[99.0], abs=1e-3))
    assert ours.e2e.n == 40  # the failed request is left out, as vLLM leaves it out


def test_a_run_that_did_not_stream_has_e2e_only_and_says_why() -> None:
    replies = [RequestOutcome(index=i, completion_tokens=100 + i, latency_s=1.0 + i / 10) for i in range(5)]
    lat = latency_of(replies, streamed=False)
    assert lat.ttft is None and lat.tpot is None and lat.itl is None and not lat.streamed
    assert lat.note == NOT_STREAMED and "streamed run" in lat.note
    assert lat.e2e.median_ms == pytest.approx(1200.0) and lat.e2e.n == 5


def test_no_samples_no_figures() -> None:
    s = latency_stats([None, None])
    assert s.n == 0 and s.mean_ms is None and s.p99_ms is None
