"""`ab run`: an A/B campaign of drafters — each booted through the swap path, gated, benched, banked.

    outcome = run_campaign(cfg, nodes, CampaignRequest(drafters=[("A", a), ("B", b)], cells=[…], rounds=2))
    outcome = resume_campaign(cfg, nodes, 7)            # the interrupted campaign 7, finished cells kept

1. every drafter is validated against the config first (nothing starts when one is wrong, exit 2), hashed,
   and the campaign (drafters, cells, rounds, design, seed, order, prompts digest, rule) is written to the
   journal (:mod:`sparkserve.campaign.spec`);
2. every drafter is synced to every node once, next to the configured one (``swap.swapped_config``: the
   path a swap would use), before the first boot;
3. by the campaign's design (``ab_records``): **sequential** — boot by boot in the interleaved order on one
   stack (the config's, or replica 1's with ``replicas: N``; :mod:`sparkserve.campaign.slots`); **crossed** —
   round by round, every drafter on a replica of its own at once, rotated each round
   (:mod:`sparkserve.campaign.crossed`). Each boot is `up` with that drafter's bind mount (no image rebuild)
   and the gates; a boot whose gates fail, or that does not come up, is banked as excluded and the campaign
   goes on; then the cells (by the card's protocol unless the request says ``forced``; the spec's
   ``sampling`` keeps which, and the chat template's sha256), each banked with its pins (config, deployment,
   image, drafter digest, prompts digest, boot id) and excluded when a bench guard refused it or the boot
   restarted;
4. at the end the drafter that was serving before the campaign is booted again (``swap.serving_config``),
   or the stack is taken down when nothing served. With ``replicas: N`` the router is stopped first (no
   outside request reaches a replica under test, and no client is served a mix of drafters) and the fleet
   comes back through ``up_replicas`` (the router with it).

Ctrl-C (SIGTERM, SIGHUP): the cell in flight is dropped, the campaign is marked interrupted, the serving
drafter is restored as at the end, and the run exits 3; ``resume_campaign`` runs only what is missing.
The campaign never writes the config file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkserve import interrupts
from sparkserve.campaign.slots import Clock, StopCheck, run_sequential
from sparkserve.campaign.spec import (
    CampaignRequest,
    arm_config,
    campaign_report,
    check_request,
    check_resume,
    journal_open,
    load_campaign,
    plan_campaign,
)
from sparkserve.config import Config
from sparkserve.deploy.drafter import sync_drafter
from sparkserve.deploy.stack import down, managed_on_all
from sparkserve.deploy.swap import serving_config
from sparkserve.deploy.teardown import Reporter, interrupted, interrupted_what, quiet
from sparkserve.deploy.up import up
from sparkserve.errors import BadInput, RemoteFailure, SparkserveError
from sparkserve.measure.ab_records import CROSSED, CampaignSpec
from sparkserve.measure.ab_report import Report
from sparkserve.nodes.base import Node
from sparkserve.plan.replicas import replicas_of

__all__ = ["CampaignOutcome", "CampaignRequest", "campaign_report", "check_request", "check_resume",
           "load_campaign", "resume_campaign", "run_campaign"]


@dataclass
class CampaignOutcome:
    """How the run ended, the campaign's journal id and its report; ``restored`` says what serves now."""

    campaign: int
    status: str
    report: Report
    restored: str
    timings: dict[str, float] = field(default_factory=dict)  # seconds per kind of step: bench/bench_ab.py
    stopped: str | None = None  # why it stopped before its last slot (`tune`: a budget, the leader clear)


Progress = Callable[[str], None]
StopMaker = Callable[[int, CampaignSpec], StopCheck]  # (campaign id, spec) → the check before each boot


def run_campaign(cfg: Config, nodes: dict[str, Node], req: CampaignRequest, *, say: Reporter = quiet,
                 progress: bool = False, stop: StopMaker | None = None) -> CampaignOutcome:
    """A new campaign (see the module docstring). ``stop`` (``tune``): given the campaign's id and spec, the
    check asked before each boot whether to stop early."""
    with journal_open() as j:
        spec = plan_campaign(cfg, nodes, req, say)
        cid = j.create_campaign(spec.config_sha256, spec.model_dump_json())
    say(f"ab: campaign {cid}: {len(spec.order)} boots ({spec.design}), cells "
        f"{', '.join(c.name for c in spec.cells)}, seed {spec.seed}, order "
        + " ".join(s.drafter + (f"@{s.replica}" if s.replica else "") for s in spec.order))
    return _drive(cfg, nodes, cid, spec, say=say, progress=progress, stop=stop(cid, spec) if stop else None)


def resume_campaign(cfg: Config, nodes: dict[str, Node], campaign_id: int, *, say: Reporter = quiet,
                    progress: bool = False) -> CampaignOutcome:
    """Run what campaign ``campaign_id`` has not banked yet (BadInput when it cannot resume: see
    :func:`check_resume`); cells already banked are not run again."""
    spec = check_resume(cfg, campaign_id)
    say(f"ab: resuming campaign {campaign_id}")
    return _drive(cfg, nodes, campaign_id, spec, say=say, progress=progress)


def _serving_before(cfg: Config, nodes: dict[str, Node]) -> Config | None:
    """The config that serves now (its drafter the one a head serves), or None when no head runs. With
    replicas: the fleet's config with the first running replica's drafter."""
    for r in replicas_of(cfg):
        head = {r.cfg.head.name: nodes[r.cfg.head.name]}
        if any(c.running for c in managed_on_all(head, r.cfg).get(r.cfg.head.name, [])):
            served = serving_config(r.cfg, {n: nodes[n] for n in r.nodes})
            return cfg.model_copy(update={"drafter": served.drafter}) if cfg.replicas > 1 else served
    return None


def _run_design(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, clock: Clock, *,
                say: Reporter, progress: bool, stop: StopCheck | None) -> str | None:
    if spec.design == CROSSED:
        from sparkserve.campaign.crossed import run_crossed

        return run_crossed(cfg, nodes, cid, spec, clock, say=say, progress=progress, stop=stop)
    one = replicas_of(cfg)[0]  # sequential: the config's own stack, or replica 1's
    return run_sequential(one.cfg, {n: nodes[n] for n in one.nodes}, cid, spec, clock, say=say, progress=progress,
                          stop=stop)


def _sync_arms(cfg: Config, nodes: dict[str, Node], spec: CampaignSpec, say: Reporter) -> None:
    """Every arm's drafter to every node, once per drafter (variants of one config share the config's)."""
    done: set[tuple[str, str]] = set()
    for arm in spec.drafters:
        acfg = arm_config(cfg, arm, with_source=True)
        key = (arm.source, arm.node_path)
        if key in done:
            continue
        done.add(key)
        synced = sync_drafter(acfg, nodes, say)
        if arm.digest and synced.digest != arm.digest:
            raise BadInput(f"drafter {arm.name}", f"{arm.source} changed while the campaign started")


def _drive(cfg: Config, nodes: dict[str, Node], cid: int, spec: CampaignSpec, *, say: Reporter,
           progress: bool, stop: StopCheck | None = None) -> CampaignOutcome:
    clock = Clock()
    before = _serving_before(cfg, nodes)
    stopped: str | None = None
    try:
        if cfg.replicas > 1:
            _router_off(cfg, say)
        t = time.monotonic()
        _sync_arms(cfg, nodes, spec, say)
        clock.sync = time.monotonic() - t
        stopped = _run_design(cfg, nodes, cid, spec, clock, say=say, progress=progress, stop=stop)
    except BaseException as e:
        if not interrupted(e):
            _set_status(cid, "failed")
            restored = _restore(cfg, nodes, before, say)
            say(f"ab: campaign {cid} failed; {restored}")
            raise
        what = interrupted_what()
        _set_status(cid, "interrupted")
        say(f"ab: campaign {cid} {what}: restoring what served before")
        restored = _restore(cfg, nodes, before, say)
        raise RemoteFailure("ab run", f"{what}: campaign {cid} stopped, finished cells are banked; {restored}; "
                            f"resume with `sparkserve ab run --resume {cid}`", step="interrupted") from None
    if stopped is not None:
        say(f"ab: campaign {cid} stopped before its last boot: {stopped}")
    _set_status(cid, "done" if stopped is None else f"stopped — {stopped}")
    t = time.monotonic()
    restored = _restore(cfg, nodes, before, say)
    clock.restore = time.monotonic() - t
    if interrupts.stopping():  # Ctrl-C during the restore: the campaign is banked, the stack is not back
        raise RemoteFailure("ab run", f"{interrupted_what()}: campaign {cid} is done and banked (`sparkserve ab "
                            f"report {cid}`); {restored}", step="interrupted")
    t = time.monotonic()
    report = campaign_report(cid)
    timings = {"wall": time.monotonic() - clock.t0, "sync": clock.sync, "boots": sum(clock.boots),
               "cells": sum(sum(v) for v in clock.cells.values()), "requests": clock.requests,
               "restore": clock.restore, "report": time.monotonic() - t}
    return CampaignOutcome(cid, "done" if stopped is None else "stopped", report, restored, timings, stopped)


def _router_off(cfg: Config, say: Reporter) -> None:
    """replicas: N — the router stopped for the campaign (it comes back with the fleet at the restore)."""
    from sparkserve.nodes.router import stop_router

    if stop_router(cfg.router.port) is not None:
        say("ab: router stopped for the campaign: each arm is benched on its replica's own API (the restore "
            "starts it again)")


def _set_status(cid: int, status: str) -> None:
    with journal_open() as j:
        j.set_campaign_status(cid, status)


def _restore(cfg: Config, nodes: dict[str, Node], before: Config | None, say: Reporter) -> str:
    """Bring back what served before the campaign; the one line that says what serves now."""
    try:
        if cfg.replicas > 1:
            return _restore_fleet(cfg, nodes, before, say)
        if before is None:
            down(cfg, nodes, say=say)
            return "nothing served before the campaign: nothing runs now"
        res = up(before, nodes, validate=False, say=say)
        return f"restored drafter {before.drafter.path} ({res.drafter_digest[:12]}) at {res.api_url}"
    except SparkserveError as e:
        if interrupted(e):
            return f"restoring {before.drafter.path if before else 'the empty stack'} was interrupted: nothing runs"
        return f"restoring {before.drafter.path if before else 'the empty stack'} FAILED ({e.line()}): check the stack"


def _restore_fleet(cfg: Config, nodes: dict[str, Node], before: Config | None, say: Reporter) -> str:
    from sparkserve.deploy.replicas import down_replicas, up_replicas

    if before is None:
        down_replicas(cfg, nodes, say=say)
        return "nothing served before the campaign: no replica and no router run now"
    fleet = up_replicas(before, nodes, say=say)
    return (f"restored drafter {before.drafter.path} on {len(fleet.serving)} of {len(fleet.replicas)} replicas "
            f"behind {fleet.router.get('url')}")
