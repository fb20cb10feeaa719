"""The model card's bench protocol: streamed chat completions in cells, figured from ``/metrics`` deltas.

Example::

    result = run_cell("http://127.0.0.1:8000", "glm-5.3-flash", CELLS["smoke"], builtin_prompts())
    result.output_tok_s, result.acceptance_length, result.refused

Cells: smoke 20 prompts × concurrency 1 × 512 tokens; c1 100 × 1 × 1024; c16 500 × 16 × 1024. Thinking
on (``chat_template_kwargs``), T = 1.0, top_p 0.95, forced length (``min_tokens = max_tokens``,
``ignore_eos``). Every request has a deadline and a stall timeout: a hung server is a stream error
naming the node and URL, never a stuck command.

Guards (a refused cell keeps its figures but says why they must not be quoted): the server restarted
(boot id = ``process_start_time_seconds`` changed, or a counter went backwards); other traffic moved
the counters (more finished requests, or more generated tokens, than the cell's own); requests failed;
forced-length replies came back short; speculative decoding never ran.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.measure.httpstream import StreamConnection, StreamError
from sparkserve.measure.metrics import (
    MetricsError,
    Snapshot,
    acceptance,
    counter_delta,
    parse_metrics,
)
from sparkserve.measure.prompts import Prompt, PromptSet

CHAT_PATH = "/v1/chat/completions"
METRICS_PATH = "/metrics"
MODELS_PATH = "/v1/models"


@dataclass(frozen=True)
class Cell:
    name: str
    prompts: int
    concurrency: int
    max_tokens: int


CELLS: dict[str, Cell] = {
    "smoke": Cell("smoke", prompts=20, concurrency=1, max_tokens=512),
    "c1": Cell("c1", prompts=100, concurrency=1, max_tokens=1024),
    "c16": Cell("c16", prompts=500, concurrency=16, max_tokens=1024),
}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 0.95
    enable_thinking: bool = True
    forced_length: bool = True  # min_tokens = max_tokens and ignore_eos


# Stream-error kinds. "incomplete" (forced length came back short) is counted apart from these.
HTTP, ERROR_EVENT, NO_DONE, NO_TOKENS, NO_USAGE, HUNG, STALLED, TRANSPORT, BAD_CHUNK, NOT_SENT = (
    "http", "error_event", "no_done", "no_tokens", "no_usage", "hung", "stalled", "transport",
    "bad_chunk", "not_sent",
)
INCOMPLETE = "incomplete"
_HANG_KINDS = {HUNG, STALLED}


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


class RequestError(BaseModel):
    request: int
    kind: str
    detail: str


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

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"


MAX_ERRORS_KEPT = 20


def request_body(model: str, prompt: Prompt, max_tokens: int, sampling: Sampling) -> dict[str, Any]:
    """The chat-completions request of the seed protocol (all fields are real vLLM request params)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": prompt.messages,
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": sampling.enable_thinking},
    }
    if sampling.forced_length:
        body["min_tokens"] = max_tokens
        body["ignore_eos"] = True
    return body


def _where(url: str, node: str | None) -> str:
    return f"{node} ({url})" if node else url


def _has_output(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(
        delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
        or delta.get("tool_calls")
        # a token may decode to "" (special token): a content key without a role still counts
        or ("content" in delta and delta.get("role") is None)
    )


class _SSE:
    """Reads one chat-completions event stream: SSE ``data:`` lines in, what the stream said out."""

    __slots__ = ("t0", "on_chunk", "done", "got_tokens", "usage_tokens", "ttft_s", "finish_reason", "error")

    def __init__(self, t0: float, on_chunk: Callable[[], None] | None) -> None:
        self.t0 = t0
        self.on_chunk = on_chunk
        self.done = self.got_tokens = False
        self.usage_tokens: int | None = None
        self.ttft_s: float | None = None
        self.finish_reason: str | None = None
        self.error: tuple[str, str] | None = None

    def feed(self, line: bytes) -> bool:
        """One line of the stream; False once the stream is known to be broken."""
        if not line.startswith(b"data:"):
            return True  # blank separators, comments, event names
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = (BAD_CHUNK, f"unparseable SSE data: {payload[:200]!r}")
            return False
        if not isinstance(obj, dict):
            return True
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.error = (ERROR_EVENT, f"error event in stream: {msg}")
            return False
        choices = obj.get("choices")
        if choices:
            c0 = choices[0]
            if _has_output(c0):
                if not self.got_tokens:
                    self.got_tokens = True
                    self.ttft_s = time.perf_counter() - self.t0
                if self.on_chunk is not None:
                    self.on_chunk()
            if c0.get("finish_reason"):
                self.finish_reason = c0["finish_reason"]
        usage = obj.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        return True


class _Stalled(Exception):
    """A stream went silent longer than the stall timeout."""


async def stream_request(
    conn: StreamConnection,
    body: dict[str, Any],
    index: int,
    *,
    deadline_s: float,
    stall_s: float,
    where: str,
    headers: dict[str, str] | None = None,
    on_chunk: Callable[[], None] | None = None,
) -> RequestOutcome:
    """POST one streamed chat completion on ``conn`` and classify how it ended. Never raises for the
    server's faults: ``deadline_s`` bounds the whole request, ``stall_s`` any silence within it."""
    out = RequestOutcome(index=index)
    t0 = time.perf_counter()
    sse = _SSE(t0, on_chunk)
    payload = json.dumps(body).encode()
    try:
        async with asyncio.timeout(deadline_s):
            try:
                async with asyncio.timeout(stall_s):
                    status, _ = await conn.post(CHAT_PATH, payload, headers)
                if status != 200:
                    text = (await conn.read_text(300, stall_s=stall_s)).strip()
                    out.error, out.detail = HTTP, f"HTTP {status}: {text}"
                    return out
                buf = b""
                while raw := await conn.read(stall_s=stall_s):
                    buf += raw
                    if b"\n" not in raw:
                        continue
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if not sse.feed(line):
                            out.error, out.detail = sse.error  # type: ignore[misc]
                            return out
                if buf and not sse.feed(buf):  # a last line without its newline
                    out.error, out.detail = sse.error  # type: ignore[misc]
                    return out
            except TimeoutError:
                raise _Stalled() from None
    except _Stalled:
        out.error = STALLED
        out.detail = f"{where}: request {index} stalled: nothing received for {stall_s:g} s (hung?)"
        return out
    except TimeoutError:
        out.error = HUNG
        out.detail = f"{where}: request {index} hung: not finished within the {deadline_s:g} s deadline"
        return out
    except (StreamError, OSError) as e:
        out.error, out.detail = TRANSPORT, f"{where}: {e}"
        return out
    finally:
        if not conn.idle:
            conn.abort()  # a response left part-way must not be mistaken for the next one
        out.latency_s = time.perf_counter() - t0
        out.ttft_s, out.finish_reason = sse.ttft_s, sse.finish_reason
    usage_tokens = sse.usage_tokens
    if usage_tokens is not None:
        out.completion_tokens = usage_tokens
    if not sse.done:
        out.error, out.detail = NO_DONE, "stream ended without [DONE]"
    elif not sse.got_tokens:
        out.error, out.detail = NO_TOKENS, "stream carried no tokens"
    elif usage_tokens is None:
        out.error, out.detail = NO_USAGE, "stream carried no usage chunk (stream_options.include_usage)"
    elif usage_tokens == 0:
        out.error, out.detail = NO_TOKENS, "usage reports completion_tokens = 0"
    elif body.get("min_tokens") and usage_tokens < body["min_tokens"]:
        out.error = INCOMPLETE
        out.detail = f"forced length {body['min_tokens']} but {usage_tokens} tokens came back"
    return out


async def scrape(client: httpx.AsyncClient, base_url: str, model: str | None, where: str) -> Snapshot:
    url = base_url + METRICS_PATH
    try:
        r = await client.get(url, timeout=30.0)
    except httpx.HTTPError as e:
        raise RemoteFailure(url, f"{where}: cannot scrape ({type(e).__name__}: {e or 'no answer'})") from e
    if r.status_code != 200:
        raise RemoteFailure(url, f"{where}: HTTP {r.status_code}")
    try:
        return parse_metrics(r.text, model_name=model)
    except MetricsError as e:
        raise RemoteFailure(url, str(e)) from e


async def check_model(client: httpx.AsyncClient, base_url: str, model: str, where: str) -> None:
    url = base_url + MODELS_PATH
    try:
        r = await client.get(url, timeout=30.0)
        ids = [m.get("id") for m in r.json().get("data", [])] if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise RemoteFailure(url, f"{where}: no model list ({type(e).__name__}: {e})") from e
    if ids is None:
        raise RemoteFailure(url, f"{where}: HTTP {r.status_code}")
    if model not in ids:
        raise BadInput("model.served_name", f"{where} serves {ids}, not {model!r}")


@dataclass
class _Live:
    done: int = 0
    tokens: int = 0
    chunks: int = 0
    errors: int = 0
    hangs: int = 0


async def _run_requests(
    base_url: str,
    model: str,
    cell: Cell,
    prompts: list[Prompt],
    sampling: Sampling,
    *,
    deadline_s: float,
    stall_s: float,
    headers: dict[str, str],
    where: str,
    live: _Live,
) -> list[RequestOutcome]:
    outcomes: list[RequestOutcome | None] = [None] * cell.prompts
    next_index = iter(range(cell.prompts))

    def tick() -> None:
        live.chunks += 1

    async def worker() -> None:
        conn = StreamConnection(base_url)
        try:
            await work(conn)
        finally:
            conn.abort()

    async def work(conn: StreamConnection) -> None:
        for i in next_index:
            if live.hangs >= cell.concurrency:  # the server hangs: do not queue the rest behind it
                outcomes[i] = RequestOutcome(
                    index=i, error=NOT_SENT,
                    detail=f"{where}: not sent: {live.hangs} earlier requests hung",
                )
                live.errors += 1
                live.done += 1
                continue
            body = request_body(model, prompts[i % len(prompts)], cell.max_tokens, sampling)
            o = await stream_request(
                conn, body, i, deadline_s=deadline_s, stall_s=stall_s, where=where, headers=headers, on_chunk=tick
            )
            outcomes[i] = o
            live.done += 1
            live.tokens += o.completion_tokens
            if o.error:
                live.errors += 1
            if o.error in _HANG_KINDS:
                live.hangs += 1

    await asyncio.gather(*(worker() for _ in range(cell.concurrency)))
    return [o for o in outcomes if o is not None]


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
    (``after`` is the scrape's failure when the server stopped answering during the cell). Pure."""
    kinds = Counter(o.error for o in outcomes if o.error)
    incomplete = kinds.pop(INCOMPLETE, 0)
    stream_errors = sum(kinds.values())
    sent = sum(1 for o in outcomes if o.error != NOT_SENT)
    output_tokens = sum(o.completion_tokens for o in outcomes)
    refused: list[str] = []
    warnings: list[str] = []

    if stream_errors:
        summary = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
        refused.append(f"{stream_errors} of {cell.prompts} requests failed ({summary})")
    if incomplete:
        shortest = min(o.completion_tokens for o in outcomes if o.error == INCOMPLETE)
        refused.append(
            f"{incomplete} forced-length replies came back short "
            f"(shortest {shortest} of {cell.max_tokens} tokens)"
        )

    spec = None
    delta = None
    if isinstance(after, RemoteFailure):
        refused.append(f"/metrics unreadable after the cell ({after.what}): no acceptance figures")
        after_boot = None
    else:
        after_boot = after.boot_id
        try:
            delta = counter_delta(before, after)
        except MetricsError as e:
            refused.append(f"server restarted during the cell: {e}")
    if delta is not None:
        spec = acceptance(delta)
        warnings += spec.warnings
        if delta.request_success is None:
            warnings.append("no vllm:request_success_total: cannot check for other traffic")
        elif delta.request_success > sent:
            refused.append(
                f"contaminated: the server finished {delta.request_success:g} requests, the cell sent {sent} "
                "(someone else used the server)"
            )
        elif delta.request_success < sent:
            refused.append(f"the server counted {delta.request_success:g} finished requests of {sent} sent")
        if delta.generation_tokens is None:
            warnings.append("no vllm:generation_tokens_total: cannot check generated tokens")
        elif not stream_errors and delta.generation_tokens > output_tokens:
            refused.append(
                f"contaminated: the server generated {delta.generation_tokens:g} tokens, the cell received "
                f"{output_tokens} (someone else used the server)"
            )
        if delta.preemptions:
            warnings.append(f"{delta.preemptions:g} preemptions during the cell (KV pool too small for it?)")
        if spec.drafts == 0 and output_tokens > 0 and before.has_spec_decode:
            refused.append(
                "speculative decoding did not run: no drafts while tokens were generated "
                "(or the server runs with --disable-log-stats, which freezes these counters)"
            )
    if prompt_set is not None and len(prompt_set) < cell.prompts:
        warnings.append(f"{len(prompt_set)} distinct prompts cycled over {cell.prompts} requests")

    errors = [
        RequestError(request=o.index, kind=o.error, detail=o.detail)
        for o in outcomes
        if o.error
    ][:MAX_ERRORS_KEPT]
    tok_s = output_tokens / duration_s if duration_s > 0 else 0.0
    return BenchResult(
        cell=cell.name,
        prompts=cell.prompts,
        concurrency=cell.concurrency,
        max_tokens=cell.max_tokens,
        requests_ok=len(outcomes) - stream_errors - incomplete,
        stream_errors=stream_errors,
        output_tokens=output_tokens,
        duration_s=round(duration_s, 6),
        output_tok_s=round(tok_s, 3),
        acceptance_length=_r(spec.acceptance_length) if spec else None,
        per_position_acceptance=[_r(x) for x in spec.per_position] if spec else [],
        drafts=spec.drafts if spec else None,
        draft_tokens=spec.draft_tokens if spec else None,
        accepted_tokens=spec.accepted_tokens if spec else None,
        ok=not refused,
        refused=refused,
        warnings=warnings,
        acceptance_rate=_r(spec.acceptance_rate) if spec else None,
        incomplete=incomplete,
        error_kinds=dict(kinds) | ({INCOMPLETE: incomplete} if incomplete else {}),
        errors=errors,
        boot_id=after_boot if after_boot is not None else before.boot_id,
        url=url,
        node=node,
        model=model,
        prompts_source=prompt_set.source if prompt_set else None,
        prompts_sha256=prompt_set.sha256 if prompt_set else None,
        sampling={
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "enable_thinking": sampling.enable_thinking,
            "forced_length": sampling.forced_length,
        },
        started_at=started_at,
    )


def _r(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 6)


def default_deadline_s(cell: Cell) -> float:
    """Per-request deadline: generous for the slowest sane decode (5 tok/s per stream) plus prefill."""
    return 120.0 + cell.max_tokens / 5.0


async def run_cell_async(
    base_url: str,
    model: str,
    cell: Cell,
    prompt_set: PromptSet,
    *,
    sampling: Sampling = Sampling(),
    node: str | None = None,
    api_key: str | None = None,
    deadline_s: float | None = None,
    stall_timeout_s: float = 60.0,
    progress: bool = False,
    check_served_model: bool = True,
) -> BenchResult:
    base_url = base_url.rstrip("/")
    where = _where(base_url, node)
    deadline = deadline_s if deadline_s is not None else default_deadline_s(cell)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # httpx for the two scrapes and the model check; the streams use their own lean connections
    async with httpx.AsyncClient(timeout=30.0, headers=headers, trust_env=False) as client:
        if check_served_model:
            await check_model(client, base_url, model, where)
        before = await scrape(client, base_url, model, where)
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        live = _Live()
        t0 = time.perf_counter()
        runner = _run_requests(
            base_url, model, cell, prompt_set.prompts, sampling,
            deadline_s=deadline, stall_s=stall_timeout_s, headers=headers, where=where, live=live,
        )
        if progress:
            outcomes = await _with_progress(runner, cell, live, where)
        else:
            outcomes = await runner
        duration = time.perf_counter() - t0
        try:
            after: Snapshot | RemoteFailure = await scrape(client, base_url, model, where)
        except RemoteFailure as e:  # the server died during the cell: keep what the requests showed
            after = e
    return summarize(
        cell, outcomes, duration, before, after, sampling=sampling, url=base_url, node=node, model=model,
        prompt_set=prompt_set, started_at=started_at,
    )


async def _with_progress(runner: Any, cell: Cell, live: _Live, where: str) -> list[RequestOutcome]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(f"{cell.name} {where}", total=cell.prompts, stats="")
        t0 = time.perf_counter()
        job = asyncio.ensure_future(runner)
        while not job.done():
            await asyncio.wait({job}, timeout=0.25)
            elapsed = max(time.perf_counter() - t0, 1e-9)
            bar.update(
                task, completed=live.done,
                stats=f"{live.tokens:,} tok · {live.tokens / elapsed:,.0f} tok/s · {live.errors} errors",
            )
        return job.result()


def run_cell(base_url: str, model: str, cell: Cell, prompt_set: PromptSet, **kw: Any) -> BenchResult:
    """Run one cell against a live server and return its record (see module docstring)."""
    return asyncio.run(run_cell_async(base_url, model, cell, prompt_set, **kw))
