"""The bench's records: what a cell is, how it samples, what one request and one cell came back with.

Example::

    cell = CELLS["smoke"]                      # Cell("smoke", prompts=20, concurrency=1, max_tokens=512)
    CARD_SAMPLING.protocol                     # "card": the model card's holdout client, exactly
    outcome = RequestOutcome(index=3, completion_tokens=512)
    result = BenchResult.model_validate_json(path.read_bytes())   # a ``bench --json`` file, read back

:class:`BenchResult` is the ``bench --json`` record; its first fourteen fields are the contract in
DESIGN.md (Output contracts) and their order is the printed order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Cell:
    """One bench cell: how many requests, how many in flight, how many tokens each must produce."""

    name: str
    prompts: int
    concurrency: int
    max_tokens: int
    k: int | None = None  # the speculative tokens per draft the cell is for (None: whatever the server drafts)


#: The card's cells (drafter cards' tables): smoke, c1 and c16 at the served K; c16-k4 is the c16 cell of the
#: card's "K=4, c16" column, for a server drafting 4 tokens (the bench refuses it on any other K).
CELLS: dict[str, Cell] = {
    "smoke": Cell("smoke", prompts=20, concurrency=1, max_tokens=512),
    "c1": Cell("c1", prompts=100, concurrency=1, max_tokens=1024),
    "c16": Cell("c16", prompts=500, concurrency=16, max_tokens=1024),
    "c16-k4": Cell("c16-k4", prompts=500, concurrency=16, max_tokens=1024, k=4),
    # the card's deep-trace cell (label suffix -mt4096): the c16 cell with max_tokens 4096 (drafter/README.md)
    "mt4096": Cell("mt4096", prompts=500, concurrency=16, max_tokens=4096),
}

FORCED, CARD = "forced", "card"
PROTOCOLS = (CARD, FORCED)


@dataclass(frozen=True)
class Sampling:
    """The sampling every request of a cell asks for (the model card's: thinking on, T 1.0, top_p 0.95), and
    the protocol that sends it: ``forced`` (streamed chat completions, output forced to ``max_tokens``) or
    ``card`` (the card's holdout client: ``/v1/completions`` with the prompt rendered client-side through
    the target's chat template, not streamed, EOS ends a request)."""

    temperature: float = 1.0
    top_p: float = 0.95
    enable_thinking: bool = True
    forced_length: bool = True  # min_tokens = max_tokens and ignore_eos
    protocol: str = FORCED

    def as_dict(self) -> dict[str, Any]:
        """The ``sampling`` object of a bench record."""
        return {
            "protocol": self.protocol,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "enable_thinking": self.enable_thinking,
            "forced_length": self.forced_length,
        }


#: The card's holdout client: T 1.0, top_p 0.95, thinking on (in the rendered prompt), no forced length.
CARD_SAMPLING = Sampling(forced_length=False, protocol=CARD)
FORCED_SAMPLING = Sampling()


def sampling_for(protocol: str) -> Sampling:
    """The sampling of a protocol by name (``card`` or ``forced``)."""
    return CARD_SAMPLING if protocol == CARD else FORCED_SAMPLING


# Stream-error kinds. "incomplete" (forced length came back short) is counted apart from these.
HTTP, ERROR_EVENT, NO_DONE, NO_TOKENS, NO_USAGE, HUNG, STALLED, TRANSPORT, BAD_CHUNK, NOT_SENT = (
    "http", "error_event", "no_done", "no_tokens", "no_usage", "hung", "stalled", "transport",
    "bad_chunk", "not_sent",
)
INCOMPLETE = "incomplete"
HANG_KINDS = frozenset({HUNG, STALLED})


@dataclass
class RequestOutcome:
    """What one streamed request returned. ``error`` is a kind above, or INCOMPLETE, or None."""

    index: int
    completion_tokens: int = 0
    error: str | None = None
    detail: str = ""
    ttft_s: float | None = None
    latency_s: float | None = None
    finish_reason: str | None = None
    chunks: int = 0  # stream chunks that carried output (≈ engine steps: tokens / chunks ≈ acceptance length)
    e2e_s: float | None = None  # streamed: to the last output chunk (vLLM's E2E); None: the whole reply
    itl_s: list[float] = field(default_factory=list)  # streamed: gaps between successive output chunks


class RequestError(BaseModel):
    """One failed request as a bench record keeps it."""

    request: int
    kind: str
    detail: str


class LatencyStats(BaseModel):
    """One latency's statistics over a run's requests, in milliseconds (None without samples)."""

    n: int
    mean_ms: float | None
    median_ms: float | None
    p90_ms: float | None
    p99_ms: float | None


class Latency(BaseModel):
    """A run's TTFT, TPOT, ITL and E2E (vLLM's definitions; ``ttft``/``tpot``/``itl`` None when the run did
    not stream, with ``note`` saying so)."""

    streamed: bool
    ttft: LatencyStats | None = None
    tpot: LatencyStats | None = None
    itl: LatencyStats | None = None
    e2e: LatencyStats
    note: str | None = None


class Warmup(BaseModel):
    """The unmeasured requests sent before a cell (``--warmup N``): their tokens, time and errors are not the
    cell's, and /metrics is read after them."""

    requests: int
    concurrency: int
    max_tokens: int
    requests_ok: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = Field(default_factory=dict)
    output_tokens: int = 0
    duration_s: float = 0.0


class NodePower(BaseModel):
    """One node's GPU power over the measured window (``nvidia-smi power.draw`` samples, summed over its GPUs)."""

    node: str
    samples: int
    mean_w: float | None
    note: str | None = None  # why there is no figure (no nvidia-smi, no power reading)


class Power(BaseModel):
    """Energy over the measured window: each node's mean watts; joules per output token only when every node
    of the stack reported power (never a partial or invented figure)."""

    nodes: list[NodePower]
    window_s: float
    joules: float | None = None
    joules_per_token: float | None = None
    tokens_per_joule: float | None = None
    note: str | None = None


class BenchResult(BaseModel):
    """One cell's record. The first fourteen keys are the firm ``bench --json`` contract (DESIGN.md)."""

    model_config = ConfigDict(extra="ignore")

    cell: str
    prompts: int
    concurrency: int
    max_tokens: int
    requests_ok: int
    stream_errors: int
    output_tokens: int
    duration_s: float
    output_tok_s: float
    acceptance_length: float | None
    per_position_acceptance: list[float]
    drafts: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    # --- additions after the contract keys ---
    ok: bool = True
    refused: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    acceptance_rate: float | None = None
    incomplete: int = 0
    error_kinds: dict[str, int] = Field(default_factory=dict)
    errors: list[RequestError] = Field(default_factory=list)
    boot_id: float | None = None
    url: str | None = None
    node: str | None = None
    model: str | None = None
    prompts_source: str | None = None
    prompts_sha256: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None
    protocol: str = FORCED  # "card" or "forced" (records from before issue 21 were all forced)
    endpoint: str | None = None  # /v1/completions (card) or /v1/chat/completions (forced)
    chat_template: str | None = None  # card: the file the prompts were rendered with
    chat_template_sha256: str | None = None
    k: int | None = None  # speculative tokens per draft, as the counters show (Δdraft_tokens / Δdrafts)
    # replicas: N — through the router: {url, policy, replicas}; each replica's share (measure/fleet.py); or
    # the one replica benched on its own head API (--replica K)
    router: dict[str, Any] | None = None
    per_replica: list[dict[str, Any]] = Field(default_factory=list)
    replica: int | None = None
    # --- issue 41: figures that compare across runs, latency as vLLM defines it, the warm-up, energy ---
    requests_per_s: float | None = None
    output_len_mean: float | None = None  # output tokens per successful request
    output_len_p50: float | None = None
    latency: Latency | None = None  # TTFT / TPOT / ITL (streamed) and E2E: mean, median, p90, p99 in ms
    warmup: Warmup | None = None  # None: no warm-up (--warmup 0, or a record from before issue 41)
    power: Power | None = None  # None: not sampled (a bench given --url, or a record from before issue 41)

    def to_json(self) -> str:
        """The record as ``bench --json`` prints it and the journal stores it."""
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"
