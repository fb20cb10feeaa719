"""The crossed design of an A/B campaign (``replicas: N``): every round boots each drafter on a replica of its
own, all at once, and benches them at the same time, each cell against that replica's own head API (never
through the router: the router would mix the arms); the next round rotates the drafters over the replicas.

    run_crossed(cfg, nodes, cid, spec, clock, say=say, progress=False)

Round r of ``spec.order`` (``ab_records.crossed_order``) names each slot's replica. Each slot is booted, banked
and excluded exactly as a sequential slot is (:mod:`sparkserve.campaign.slots`), on its replica's config and
nodes; the boots run in threads of their own (Ctrl-C ends every boot's wait, and each `up` tears down what it
started), the journal rows are written from this thread. A resumed round boots only its unfinished slots.
"""

from __future__ import annotations

import asyncio
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any

from sparkserve import interrupts
from sparkserve.campaign.slots import (
    Clock,
    StopCheck,
    bank_boot,
    bank_wave,
    done_cells,
    slot_finished,
    up_slot,
    wave_line,
)
from sparkserve.campaign.spec import campaign_sampling, journal_open, load_campaign, prompts_of
from sparkserve.config import Config, resolve_api_key
from sparkserve.deploy.teardown import Reporter, interrupted
from sparkserve.deploy.up import UpResult
from sparkserve.deploy.wait import NodeView
from sparkserve.errors import SparkserveError
from sparkserve.measure.ab_records import Boot, CampaignSpec, CellSpec
from sparkserve.measure.chat_template import ChatTemplate
from sparkserve.measure.prompts import PromptSet
from sparkserve.measure.records import BenchResult, RequestOutcome, Sampling
from sparkserve.measure.run import default_warmup, run_cell_outcomes_async
from sparkserve.nodes.base import Node
from sparkserve.plan.replicas import Replica, replicas_of

Live = tuple[int, Boot, UpResult, Replica]  # slot index, its boot row, its `up`, its replica


def _stop_check(views: list[NodeView], elapsed: float) -> None:
    """Every boot's watcher: an interrupt the main thread received ends the wait."""
    if interrupts.stopping():
        raise interrupts.Interrupted(signal.SIGINT)


def _sub(nodes: dict[str, Node], r: Replica) -> dict[str, Node]:
    return {n: nodes[n] for n in r.nodes}


def run_crossed(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, clock: Clock, *,
                say: Reporter, progress: bool, stop: StopCheck | None = None) -> str | None:
    """Round by round: the round's unfinished slots booted at once, then each cell on all of them at once.
    With ``stop``, asked before each round (its first slot): the reason it stopped early, or None."""
    prompt_set = prompts_of(spec.prompts_source)
    sampling, template = campaign_sampling(spec, cid)
    reps = {r.index: r for r in replicas_of(cfg)}
    order = spec.order
    for rnd in range(spec.rounds):
        with journal_open() as j:
            _, _, boots, waves = load_campaign(j, cid)
        todo = [i for i, s in enumerate(order) if s.round == rnd and not slot_finished(spec, boots, waves, i)]
        if not todo:
            continue
        why = stop(order[todo[0]], todo[0]) if stop is not None else None
        if why is not None:
            return why
        where = f"round {rnd + 1}/{spec.rounds}"
        say(f"ab: {where} · booting at once: " + "; ".join(
            f"drafter {order[i].drafter} on replica {order[i].replica}" for i in todo))
        live = _boot_at_once(nodes, cid, spec, todo, reps, clock, say=say)
        for i, boot, _, r in [x for x in live if x[2] is None]:  # type: ignore[misc]
            say(f"ab: {where} · drafter {order[i].drafter} on {r.name}: excluded — {boot.excluded}")
        counted: list[Live] = [(i, b, res, r) for i, b, res, r in live if res is not None]
        first: dict[int, float | None] = {i: None for i, *_ in counted}
        for cs in spec.cells:
            jobs = [x for x in counted if cs.name not in done_cells(waves, x[0])]
            if not jobs:
                continue
            say(f"ab: {where} · cell {cs.name} {cs.shape()} at once on " + ", ".join(
                f"{r.name} (drafter {order[i].drafter})" for i, _, _, r in jobs))
            t = time.monotonic()
            got = interrupts.run_async(_cells_at_once, jobs, cs, prompt_set, sampling, template,
                                       resolve_api_key(cfg))
            clock.cells.setdefault(cs.name, []).append(time.monotonic() - t)
            for (i, boot, res, r), out in zip(jobs, got, strict=True):
                if isinstance(out, SparkserveError):
                    say(f"ab: {where} · {r.name} · cell {cs.name}: {out.line()}")
                    continue  # nothing measured: the slot stays unfinished, a resume runs it again
                result, outcomes = out
                clock.requests += result.duration_s
                wave, wid = bank_wave(r.cfg, _sub(nodes, r), cid, spec, i, order[i], boot, res, cs, result,
                                      outcomes, prompt_set, first[i])
                if first[i] is None:
                    first[i] = result.boot_id
                say(f"ab: {where} · drafter {order[i].drafter} on {r.name} · " + wave_line(cs, result, wave, wid))
    return None


def _boot_at_once(nodes: dict[str, Node], cid: int, spec: CampaignSpec, todo: list[int], reps: dict[int, Replica],
                  clock: Clock, *, say: Reporter) -> list[tuple[int, Boot, UpResult | None, Replica]]:
    """Each slot's `up` on its replica in a thread of its own; then every boot banked (from this thread)."""
    order = spec.order
    slots = [(i, reps[order[i].replica or 1]) for i in todo]

    def one(i: int, r: Replica) -> tuple[UpResult | None, str | None, float]:
        return up_slot(r.cfg, _sub(nodes, r), spec, order[i], on_update=_stop_check,
                       say=lambda line, r=r: say(f"{r.name}: {line}"))

    pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="ab-replica")
    with interrupts.watching():
        futures = [pool.submit(one, i, r) for i, r in slots]
        try:
            wait_all(futures)
        except KeyboardInterrupt as e:
            interrupts.note(e)
            with interrupts.deferred():
                wait_all(futures)  # each boot's wait ends at the interrupt; each `up` tears down what it started
            raise
        finally:
            pool.shutdown(wait=True)
    out = []
    for (i, r), f in zip(slots, futures, strict=True):
        exc = f.exception()
        if exc is not None:
            if isinstance(exc, SparkserveError) and not interrupted(exc):
                res, excluded, secs = None, f"boot failed: {exc.line().removeprefix('error: ')}", 0.0
            else:
                raise exc
        else:
            res, excluded, secs = f.result()
        boot, counted = bank_boot(r.cfg, _sub(nodes, r), cid, i, order[i], res, excluded, secs, clock)
        out.append((i, boot, counted, r))
    return out


async def _cells_at_once(jobs: list[Live], cs: CellSpec, prompt_set: PromptSet, sampling: Sampling,
                         template: ChatTemplate | None, api_key: str | None
                         ) -> list[tuple[BenchResult, list[RequestOutcome]] | SparkserveError]:
    """The cell against every job's own head API at the same time (no progress bars: one screen, N cells); a
    replica's failure is its own (returned), an interrupt stops them all."""

    async def one(res: UpResult, node: str) -> Any:
        try:
            return await run_cell_outcomes_async(res.api_url, res.served_name, cs.cell(), prompt_set,
                                                 sampling=sampling, node=node, api_key=api_key, template=template,
                                                 warmup=default_warmup(cs.cell()))  # issue 41
        except SparkserveError as e:
            if interrupted(e):
                raise
            return e

    return list(await asyncio.gather(*(one(res, r.cfg.head.name) for _, _, res, r in jobs)))
