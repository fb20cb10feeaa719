"""A cell through the router (``replicas: N``): each replica's own ``/metrics`` scraped before and after, never
the router's (it forwards ``/metrics`` to one worker: docs/replicas-facts.md §1.3), summed into one snapshot so
the cell's figures and guards are the fleet's, and each replica's share of the requests kept beside them.

    each = await scrape_replicas(client, {1: "http://10.0.0.1:8000", 2: "http://10.0.0.3:8000"}, model, where)
    before = combine(list(each.values()))         # what summarize() compares, as for one stack
    result.per_replica = shares(urls, each, each_after)

A replica's share is its ``vllm:request_success_total`` delta, as the router gate counts
(:mod:`sparkserve.measure.router_reach`).
"""

from __future__ import annotations

from typing import Any

import httpx

from sparkserve.measure.metrics import Snapshot
from sparkserve.measure.scrape import scrape


def _sum(xs: list[float | None]) -> float | None:
    return None if any(x is None for x in xs) else sum(x for x in xs if x is not None)


def combine(snaps: list[Snapshot]) -> Snapshot:
    """The replicas' counters summed (a counter one replica lacks is None). ``boot_id`` is the sum of their
    ``process_start_time_seconds``: it moves when any replica restarted, so the bench's restart guard holds."""
    per_pos: dict[int, float] = {}
    for s in snaps:
        for p, v in s.accepted_per_pos.items():
            per_pos[p] = per_pos.get(p, 0.0) + v
    return Snapshot(
        boot_id=_sum([s.boot_id for s in snaps]),
        drafts=_sum([s.drafts for s in snaps]),
        draft_tokens=_sum([s.draft_tokens for s in snaps]),
        accepted_tokens=_sum([s.accepted_tokens for s in snaps]),
        accepted_per_pos=per_pos,
        generation_tokens=_sum([s.generation_tokens for s in snaps]),
        request_success=_sum([s.request_success for s in snaps]),
        preemptions=_sum([s.preemptions for s in snaps]),
    )


async def scrape_replicas(client: httpx.AsyncClient, urls: dict[int, str], model: str | None,
                          where: str) -> dict[int, Snapshot]:
    """Every replica's own snapshot (RemoteFailure naming the first that does not answer)."""
    return {i: await scrape(client, u.rstrip("/"), model, f"{where}, replica {i}") for i, u in urls.items()}


def _delta(a: float | None, b: float | None) -> int | None:
    return None if a is None or b is None else int(round(b - a))


def shares(urls: dict[int, str], before: dict[int, Snapshot], after: dict[int, Snapshot]) -> list[dict[str, Any]]:
    """Each replica's part of the cell: requests finished and tokens generated on it (None: not known)."""
    out = []
    for i, u in urls.items():
        b, a = before.get(i), after.get(i)
        out.append({"replica": i, "api_url": u,
                    "requests": _delta(b.request_success, a.request_success) if a and b else None,
                    "generation_tokens": _delta(b.generation_tokens, a.generation_tokens) if a and b else None})
    return out
