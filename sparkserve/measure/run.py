"""Running a bench cell against a live server: model check, scrape, the requests, scrape, summary.

Example::

    result = run_cell("http://127.0.0.1:8000", "glm-5.3-flash", CELLS["smoke"], builtin_prompts())
    result.output_tok_s, result.acceptance_length, result.refused

    result, bench_id = bench_and_record(cfg, CELLS["c16"], None)   # the plan's head, recorded in the journal

Cells: smoke 20 prompts × concurrency 1 × 512 tokens; c1 100 × 1 × 1024; c16 500 × 16 × 1024. Thinking
on (``chat_template_kwargs``), T = 1.0, top_p 0.95, forced length (``min_tokens = max_tokens``,
``ignore_eos``). Each request is bounded by :mod:`sparkserve.measure.client`; the figures and guards
come from :mod:`sparkserve.measure.summary`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from sparkserve import journal
from sparkserve.config import Config, resolve_api_key
from sparkserve.errors import RemoteFailure
from sparkserve.measure.client import request_body, stream_request
from sparkserve.measure.httpstream import StreamConnection
from sparkserve.measure.metrics import Snapshot
from sparkserve.measure.prompts import Prompt, PromptSet, builtin_prompts, load_prompts
from sparkserve.measure.records import HANG_KINDS, NOT_SENT, BenchResult, Cell, RequestOutcome, Sampling
from sparkserve.measure.scrape import check_model, scrape
from sparkserve.measure.summary import summarize
from sparkserve.plan.build import build_plan


def default_deadline_s(cell: Cell) -> float:
    """Per-request deadline: generous for the slowest sane decode (5 tok/s per stream) plus prefill."""
    return 120.0 + cell.max_tokens / 5.0


def _where(url: str, node: str | None) -> str:
    return f"{node} ({url})" if node else url


@dataclass
class _Live:
    """Running counts the progress bar shows while the requests are in flight."""

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
    """The cell's requests, ``cell.concurrency`` at a time, each worker on its own kept-alive connection."""
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
            if o.error in HANG_KINDS:
                live.hangs += 1

    await asyncio.gather(*(worker() for _ in range(cell.concurrency)))
    return [o for o in outcomes if o is not None]


async def _with_progress(
    runner: Coroutine[Any, Any, list[RequestOutcome]], cell: Cell, live: _Live, where: str
) -> list[RequestOutcome]:
    """Await ``runner`` under a progress bar on stderr (stdout may be carrying ``--json``)."""
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
    """:func:`run_cell` inside a running event loop."""
    result, _ = await run_cell_outcomes_async(
        base_url, model, cell, prompt_set, sampling=sampling, node=node, api_key=api_key, deadline_s=deadline_s,
        stall_timeout_s=stall_timeout_s, progress=progress, check_served_model=check_served_model,
    )
    return result


async def run_cell_outcomes_async(
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
) -> tuple[BenchResult, list[RequestOutcome]]:
    """:func:`run_cell_async`, with every request's outcome beside the record (an A/B campaign keeps them:
    its intervals are bootstrapped over prompts)."""
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
    ), outcomes


def run_cell(base_url: str, model: str, cell: Cell, prompt_set: PromptSet, **kw: Any) -> BenchResult:
    """Run one cell against a live server and return its record (keywords: see :func:`run_cell_async`)."""
    return asyncio.run(run_cell_async(base_url, model, cell, prompt_set, **kw))


def bench_and_record(
    cfg: Config,
    cell: Cell,
    prompts: Path | None,
    *,
    url: str | None = None,
    model: str | None = None,
    config_given: bool = False,
    deadline_s: float | None = None,
    stall_timeout_s: float = 60.0,
    progress: bool = False,
) -> tuple[BenchResult, int | None]:
    """``sparkserve bench``: run ``cell`` against ``url`` (default: the plan's head) with ``prompts``
    (default: the built-in set) and record it in the journal; returns the record and its journal id
    (None: the journal could not take it and the record went to the fallback file, with a warning).

    The record carries the config's deployment fingerprint only when it is known to be that stack's:
    the URL is the plan's own, or the config was named (``config_given``) alongside the URL.
    """
    plan = build_plan(cfg)
    prompt_set = load_prompts(prompts) if prompts else builtin_prompts()
    api_key = resolve_api_key(cfg)
    fingerprint: str | None = None
    if url is None or config_given:
        fingerprint = journal.lookup(lambda j: j.latest_fingerprint_for_config(cfg.fingerprint()),
                                     None) or cfg.fingerprint()
    result = run_cell(
        url or plan.api_url,
        model or plan.served_name,
        cell,
        prompt_set,
        node=None if url else plan.head.node,
        api_key=api_key,
        deadline_s=deadline_s,
        stall_timeout_s=stall_timeout_s,
        progress=progress,
    )
    # the journal is a record, not a gate: a damaged one gets a warning and the fallback file, not a lost run
    bench_id = journal.record("bench", fingerprint=fingerprint, cell=result.cell, result_json=result.to_json())
    return result, bench_id
