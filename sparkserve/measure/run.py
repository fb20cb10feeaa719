"""Running a bench cell against a live server: model check, scrape, the requests, scrape, summary.

Example::

    result = run_cell("http://127.0.0.1:8000", "glm-5.3-flash", CELLS["smoke"], builtin_prompts())
    result.output_tok_s, result.acceptance_length, result.refused

    result, bench_id = bench_and_record(cfg, CELLS["c16"], None)   # the plan's head, recorded in the journal

Cells: smoke 20 prompts × concurrency 1 × 512 tokens; c1 100 × 1 × 1024; c16 (and c16-k4) 500 × 16 × 1024.

Two protocols (``Sampling.protocol``):

* ``card`` — the model card's holdout client: the first N prompts, each rendered client-side through the
  target's chat template (:mod:`sparkserve.measure.chat_template`; one user turn, generation prompt,
  ``enable_thinking=True``), ``POST /v1/completions`` ``{model, prompt, max_tokens, temperature 1.0,
  top_p 0.95}``, not streamed, no forced length (EOS ends a request), fixed concurrency; tok/s =
  Σ ``usage.completion_tokens`` / wall (:mod:`sparkserve.measure.completions`). The rendering happens
  before the clock starts.
* ``forced`` — streamed chat completions with thinking on (``chat_template_kwargs``), T = 1.0, top_p
  0.95, forced length (``min_tokens = max_tokens``, ``ignore_eos``), prompts cycled to N
  (:mod:`sparkserve.measure.client`).

Acceptance comes from ``/metrics`` deltas either way; the figures and guards come from
:mod:`sparkserve.measure.summary`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from sparkserve import journal
from sparkserve.config import Config, resolve_api_key
from sparkserve.errors import BadInput, RemoteFailure
from sparkserve.interrupts import run_async
from sparkserve.measure.chat_template import ChatTemplate, TemplateError, load_chat_template
from sparkserve.measure.client import CHAT_PATH, request_body, stream_request
from sparkserve.measure.completions import CARD_DEADLINE_S, COMPLETIONS_PATH, card_body, complete_request
from sparkserve.measure.fleet import combine, scrape_replicas, shares
from sparkserve.measure.httpstream import StreamConnection
from sparkserve.measure.metrics import Snapshot
from sparkserve.measure.prompts import Prompt, PromptSet, builtin_prompts, load_prompts
from sparkserve.measure.records import (
    CARD,
    HANG_KINDS,
    NOT_SENT,
    BenchResult,
    Cell,
    Power,
    RequestOutcome,
    Sampling,
    Warmup,
    sampling_for,
)
from sparkserve.measure.scrape import check_model, scrape
from sparkserve.measure.summary import summarize
from sparkserve.models.hf_cache import DEFAULT_HUB, parse_repo_id, resolve_local
from sparkserve.plan.build import build_plan
from sparkserve.plan.replicas import replica_config, replicas_of, router_url


def default_deadline_s(cell: Cell, protocol: str = "forced") -> float:
    """Per-request deadline. Forced: generous for the slowest sane decode (5 tok/s per stream) plus prefill.
    Card: the card client's own 1200 s total (a reply comes in one piece, after the whole generation)."""
    if protocol == CARD:
        return max(CARD_DEADLINE_S, 120.0 + cell.max_tokens / 5.0)
    return 120.0 + cell.max_tokens / 5.0


def default_warmup(cell: Cell) -> int:
    """The warm-up a cell gets unless told otherwise: twice its concurrency, so every batch size the cell will
    run at (1 … concurrency) is reached before the clock starts (real vLLM's first run after a boot pays
    for the shapes it meets first: shared/docs/real-vllm-notes.md, issue 41)."""
    return cell.concurrency * 2


class Window(Protocol):
    """Something sampled during the measured window only (the nodes' GPU power): started after the warm-up
    and the first /metrics read, stopped when the cell's last request ended."""

    def start(self) -> None: ...

    def stop(self, window_s: float, output_tokens: int) -> Power: ...


def render_prompts(template: ChatTemplate, prompts: list[Prompt], n: int, sampling: Sampling) -> list[str]:
    """The card's rendering of the first ``n`` prompts (each prompt's messages through the chat template,
    generation prompt on, ``enable_thinking`` as sampled); BadInput naming the template and the prompt when
    the template raises."""
    out = []
    for i, p in enumerate(prompts[:n]):
        try:
            out.append(template.render(p.messages, add_generation_prompt=True,
                                       enable_thinking=sampling.enable_thinking))
        except TemplateError as e:
            raise BadInput(template.source, f"chat template failed on prompt {p.id or i}: {e}") from None
    return out


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
    rendered: list[str] | None = None,
) -> list[RequestOutcome]:
    """The cell's requests, ``cell.concurrency`` at a time, each worker on its own kept-alive connection, in
    prompt order. With ``rendered`` (the card protocol) request i is ``rendered[i]`` to /v1/completions."""
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
            if rendered is not None:
                o = await complete_request(
                    conn, card_body(model, rendered[i], cell.max_tokens, temperature=sampling.temperature,
                                    top_p=sampling.top_p),
                    i, deadline_s=deadline_s, where=where, headers=headers,
                )
            else:
                body = request_body(model, prompts[i % len(prompts)], cell.max_tokens, sampling)
                o = await stream_request(
                    conn, body, i, deadline_s=deadline_s, stall_s=stall_s, where=where, headers=headers,
                    on_chunk=tick,
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


async def _warm_up(
    base_url: str, model: str, cell: Cell, prompt_set: PromptSet, sampling: Sampling, n: int, *,
    rendered: list[str] | None, deadline_s: float, stall_s: float, headers: dict[str, str], where: str,
    progress: bool,
) -> Warmup:
    """``n`` unmeasured requests at the cell's concurrency and length, all with the cell's first prompt (as
    ``vllm bench serve --num-warmups`` sends its first request again)."""
    wcell = Cell("warm-up", prompts=n, concurrency=min(cell.concurrency, n), max_tokens=cell.max_tokens)
    live = _Live()
    t0 = time.perf_counter()
    runner = _run_requests(base_url, model, wcell, prompt_set.prompts[:1], sampling, deadline_s=deadline_s,
                           stall_s=stall_s, headers=headers, where=where, live=live,
                           rendered=None if rendered is None else [rendered[0]] * n)
    outcomes = await (_with_progress(runner, wcell, live, where) if progress else runner)
    kinds = Counter(o.error for o in outcomes if o.error)
    return Warmup(requests=n, concurrency=wcell.concurrency, max_tokens=wcell.max_tokens,
                  requests_ok=sum(1 for o in outcomes if not o.error), errors=sum(kinds.values()),
                  error_kinds=dict(kinds), output_tokens=sum(o.completion_tokens for o in outcomes),
                  duration_s=round(time.perf_counter() - t0, 6))


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
    template: ChatTemplate | None = None,
    metrics_urls: dict[int, str] | None = None,
    warmup: int = 0,
    window: Window | None = None,
) -> BenchResult:
    """:func:`run_cell` inside a running event loop."""
    result, _ = await run_cell_outcomes_async(
        base_url, model, cell, prompt_set, sampling=sampling, node=node, api_key=api_key, deadline_s=deadline_s,
        stall_timeout_s=stall_timeout_s, progress=progress, check_served_model=check_served_model,
        template=template, metrics_urls=metrics_urls, warmup=warmup, window=window,
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
    template: ChatTemplate | None = None,
    metrics_urls: dict[int, str] | None = None,
    warmup: int = 0,
    window: Window | None = None,
) -> tuple[BenchResult, list[RequestOutcome]]:
    """:func:`run_cell_async`, with every request's outcome beside the record (an A/B campaign keeps them:
    its intervals are bootstrapped over prompts). The card protocol (``sampling.protocol == "card"``)
    needs the target's chat ``template``; it runs the first ``cell.prompts`` prompts (fewer when the set
    holds fewer, with a warning), never cycling. ``metrics_urls`` (replicas behind a router at ``base_url``):
    the counters come from each replica's own /metrics, summed, each one's share kept (:mod:`.fleet`).
    ``warmup`` N: N unmeasured requests first (:func:`default_warmup` is what ``bench`` sends by default);
    their tokens and counters are not the cell's (/metrics is read after them), the record keeps them in
    ``warmup``, and a failed warm-up request refuses the cell. ``window``: sampled over the measured requests
    only (the nodes' power), its figures in ``power``."""
    base_url = base_url.rstrip("/")
    where = _where(base_url, node)
    card = sampling.protocol == CARD
    rendered: list[str] | None = None
    notes: list[str] = []
    if card:
        if template is None:
            raise BadInput("--chat-template", "the card protocol renders prompts through the target's chat "
                           "template: none was given")
        if len(prompt_set) < cell.prompts:
            notes.append(f"the prompt set holds {len(prompt_set)} prompts: the cell ran those (the card's client "
                         f"takes the first {cell.prompts} rows, never cycling)")
            cell = Cell(cell.name, prompts=len(prompt_set), concurrency=cell.concurrency,
                        max_tokens=cell.max_tokens, k=cell.k)
        rendered = render_prompts(template, prompt_set.prompts, cell.prompts, sampling)  # before the clock
    deadline = deadline_s if deadline_s is not None else default_deadline_s(cell, sampling.protocol)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # httpx for the two scrapes and the model check; the streams use their own lean connections
    async with httpx.AsyncClient(timeout=30.0, headers=headers, trust_env=False) as client:
        if check_served_model:
            await check_model(client, base_url, model, where)
        warm = Warmup(requests=0, concurrency=0, max_tokens=cell.max_tokens)  # --warmup 0: none, said so
        if warmup > 0:
            warm = await _warm_up(base_url, model, cell, prompt_set, sampling, warmup, rendered=rendered,
                                  deadline_s=deadline, stall_s=stall_timeout_s, headers=headers, where=where,
                                  progress=progress)
        each: dict[int, Snapshot] = {}
        if metrics_urls:
            each = await scrape_replicas(client, metrics_urls, model, where)
            before = combine(list(each.values()))
        else:
            before = await scrape(client, base_url, model, where)
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        live = _Live()
        if window is not None:
            window.start()
        t0 = time.perf_counter()
        runner = _run_requests(
            base_url, model, cell, prompt_set.prompts, sampling,
            deadline_s=deadline, stall_s=stall_timeout_s, headers=headers, where=where, live=live,
            rendered=rendered,
        )
        try:
            if progress:
                outcomes = await _with_progress(runner, cell, live, where)
            else:
                outcomes = await runner
        except BaseException:  # interrupted: the sampler stops with the cell
            if window is not None:
                window.stop(time.perf_counter() - t0, 0)
            raise
        duration = time.perf_counter() - t0
        power = None
        if window is not None:  # joins the samplers (each bounded by its nvidia-smi timeout): off the loop
            power = await asyncio.to_thread(window.stop, duration, sum(o.completion_tokens for o in outcomes))
        each_after: dict[int, Snapshot] = {}
        try:
            if metrics_urls:
                each_after = await scrape_replicas(client, metrics_urls, model, where)
                after: Snapshot | RemoteFailure = combine(list(each_after.values()))
            else:
                after = await scrape(client, base_url, model, where)
        except RemoteFailure as e:  # the server died during the cell: keep what the requests showed
            after = e
    result = summarize(
        cell, outcomes, duration, before, after, sampling=sampling, url=base_url, node=node, model=model,
        prompt_set=None if card else prompt_set, started_at=started_at,
    )
    result.warnings += notes
    result.warmup, result.power = warm, power
    if warm is not None and warm.errors:
        kinds = ", ".join(f"{n} {k}" for k, n in Counter(warm.error_kinds).most_common())
        result.refused.append(f"warm-up: {warm.errors} of {warm.requests} requests failed ({kinds})")
        result.ok = False
    if metrics_urls:
        result.per_replica = shares(metrics_urls, each, each_after)
    result.endpoint = COMPLETIONS_PATH if card else CHAT_PATH
    result.prompts_source, result.prompts_sha256 = prompt_set.source, prompt_set.sha256
    if card and template is not None:
        result.chat_template, result.chat_template_sha256 = template.source, template.sha256
    return result, outcomes


def run_cell(base_url: str, model: str, cell: Cell, prompt_set: PromptSet, **kw: Any) -> BenchResult:
    """Run one cell against a live server and return its record (keywords: see :func:`run_cell_async`)."""
    return run_async(run_cell_async, base_url, model, cell, prompt_set, **kw)


def target_template(cfg: Config, path: Path | None) -> ChatTemplate:
    """The chat template the card protocol renders with: ``path`` (``--chat-template``: a tokenizer directory,
    its tokenizer_config.json or a .jinja file), else the target's own (``model.target``, when this machine
    has it: a directory, or a Hugging Face repo id in this machine's cache). BadInput saying which to give."""
    if path is not None:
        return load_chat_template(path)
    target = str(cfg.model.target)
    ref = parse_repo_id(target)
    if ref is not None:
        hub = os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub")
                                                 if os.environ.get("HF_HOME") else DEFAULT_HUB)
        try:
            local = resolve_local(ref, Path(hub).expanduser())
        except BadInput as e:
            raise BadInput("--chat-template", f"the card protocol renders prompts with the target's chat template, "
                           f"and {e.what}; or give --chat-template DIR (the target's tokenizer files)") from None
        return load_chat_template(local, where="model.target")
    local = Path(target)
    if not local.is_dir():
        raise BadInput("--chat-template", f"the card protocol renders prompts with the target's chat template, and "
                       f"model.target {target} is not on this machine: give --chat-template DIR (a copy of the "
                       "target's tokenizer_config.json / chat_template.jinja)")
    return load_chat_template(local, where="model.target")


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
    protocol: str = CARD,
    chat_template: Path | None = None,
    replica: int | None = None,
    warmup: int | None = None,
    window: Window | None = None,
) -> tuple[BenchResult, int | None]:
    """``sparkserve bench``: run ``cell`` against ``url`` (default: the plan's head) with ``prompts``
    (default: the built-in set) by ``protocol`` (the card's by default) and record it in the journal;
    returns the record and its journal id (None: the journal could not take it and the record went to the
    fallback file, with a warning). Bad input (prompts, chat template) is refused before any request.

    The record carries the config's deployment fingerprint only when it is known to be that stack's:
    the URL is the plan's own, or the config was named (``config_given``) alongside the URL.

    ``replicas: N``: by default the cell goes through the router (its URL; the counters from every replica's
    own /metrics, each one's share in ``per_replica``); ``replica`` K benches that replica's own head API, as
    the single stack it is (its own deployment fingerprint).

    ``warmup``: unmeasured requests before the cell (None: :func:`default_warmup`; 0: none); ``window``:
    sampled over the measured requests (the nodes' power).
    """
    fleet = cfg.replicas > 1 and replica is None and url is None
    if cfg.replicas > 1 and replica is not None:
        cfg = replica_config(cfg, replica)
    plan = build_plan(cfg)
    prompt_set = load_prompts(prompts) if prompts else builtin_prompts()
    sampling = sampling_for(protocol)
    template = target_template(cfg, chat_template) if protocol == CARD else None
    api_key = resolve_api_key(cfg)
    fingerprint: str | None = None
    if url is None or config_given:
        fingerprint = journal.lookup(lambda j: j.latest_fingerprint_for_config(cfg.fingerprint()),
                                     None) or cfg.fingerprint()
    metrics_urls = {r.index: r.api_url for r in replicas_of(cfg)} if fleet else None
    result = run_cell(
        url or (router_url(cfg) if fleet else plan.api_url),
        model or plan.served_name,
        cell,
        prompt_set,
        metrics_urls=metrics_urls,
        node=None if url or fleet else plan.head.node,
        api_key=api_key,
        deadline_s=deadline_s,
        stall_timeout_s=stall_timeout_s,
        progress=progress,
        sampling=sampling,
        template=template,
        warmup=default_warmup(cell) if warmup is None else warmup,
        window=window,
    )
    if fleet:
        result.router = {"url": router_url(cfg), "policy": cfg.router.policy, "replicas": cfg.replicas}
    result.replica = replica
    # the journal is a record, not a gate: a damaged one gets a warning and the fallback file, not a lost run
    bench_id = journal.record("bench", fingerprint=fingerprint, cell=result.cell, result_json=result.to_json())
    return result, bench_id
