"""Per-request latency as ``vllm bench serve`` defines it, and the percentiles every report prints. Pure.

Example::

    lat = latency_of(outcomes, streamed=True)    # TTFT, TPOT, ITL, E2E: mean / median / p90 / p99 in ms
    lat.e2e.median_ms, lat.tpot.p99_ms
    latency_stats([0.12, 0.15, 0.11]).p90_ms      # the one percentile function (``ab report`` uses it too)

The definitions are vLLM's (``vllm/benchmarks/serve.py`` ``calculate_metrics`` and
``vllm/benchmarks/lib/endpoint_request_func.py``, vLLM 0.33.0, read 2026-12-07):

* **TTFT**: from sending the request to the first chunk that carries output;
* **ITL**: the gaps between successive output chunks of one request (a speculative-decoding step streams
  several tokens in one chunk: one gap per chunk, not per token), pooled over every request;
* **E2E**: from sending the request to its last output chunk (the usage chunk and ``[DONE]`` after it do
  not count); for a reply that is not streamed, the whole reply;
* **TPOT**: ``(E2E − TTFT) / (output tokens − 1)``, the first token excluded, for requests of more than one
  output token;
* the statistics: ``numpy.mean``, ``numpy.median`` and ``numpy.percentile`` (linear interpolation) over the
  successful requests, in milliseconds.

The card protocol's replies are not streamed: they give E2E only, and the record says that TTFT, TPOT and
ITL need a streamed run (``--protocol forced``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from sparkserve.measure.records import Latency, LatencyStats, RequestOutcome

#: Why a run that was not streamed has no TTFT, TPOT or ITL.
NOT_STREAMED = ("the card protocol's replies are not streamed: E2E only; TTFT, TPOT and ITL need a streamed run "
                "(--protocol forced)")


def latency_stats(values_s: Iterable[float | None]) -> LatencyStats:
    """Mean, median, p90 and p99 in ms of the values given in seconds (None values left out)."""
    a = np.asarray([v for v in values_s if v is not None], dtype=float)
    if a.size == 0:
        return LatencyStats(n=0, mean_ms=None, median_ms=None, p90_ms=None, p99_ms=None)
    a = a * 1000.0
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return LatencyStats(n=int(a.size), mean_ms=round(float(a.mean()), 3), median_ms=round(float(p50), 3),
                        p90_ms=round(float(p90), 3), p99_ms=round(float(p99), 3))


def tpot_s(tokens: int, ttft_s: float | None, e2e_s: float | None) -> float | None:
    """Time per output token after the first (vLLM's TPOT); None for one token or without both times."""
    if ttft_s is None or e2e_s is None or tokens <= 1:
        return None
    return (e2e_s - ttft_s) / (tokens - 1)


def e2e_of(o: RequestOutcome) -> float | None:
    """A request's E2E: to its last output chunk when it streamed, else the whole reply."""
    return o.e2e_s if o.e2e_s is not None else o.latency_s


def latency_of(outcomes: Sequence[RequestOutcome], *, streamed: bool) -> Latency:
    """The run's latencies over its successful requests (vLLM counts only those)."""
    ok = [o for o in outcomes if not o.error]
    e2e = latency_stats(e2e_of(o) for o in ok)
    if not streamed:
        return Latency(streamed=False, e2e=e2e, note=NOT_STREAMED)
    return Latency(
        streamed=True,
        ttft=latency_stats(o.ttft_s for o in ok),
        tpot=latency_stats(tpot_s(o.completion_tokens, o.ttft_s, e2e_of(o)) for o in ok),
        itl=latency_stats(x for o in ok for x in o.itl_s),
        e2e=e2e,
    )
