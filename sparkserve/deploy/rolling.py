"""`swap-drafter PATH` with ``replicas`` > 1: a rolling swap behind the router, one replica at a time.

For each replica, in order:

1. refuse to take it out when no other replica is in the router (never zero serving);
2. ``POST /remove_worker`` (immediate; requests in flight on it run to completion: docs/replicas-facts.md §1.3);
3. wait until its own ``/metrics`` shows ``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` = 0
   (bounded by ``router.request_timeout_s``, at most 600 s; then it goes on and says so);
4. :func:`sparkserve.deploy.swap.swap_drafter` on that replica alone: sync, restart with the new bind mount, gates,
   and its own rollback;
5. ``POST /add_worker`` (blocks until its /health answers) — after a rollback too, since the previous drafter
   serves again.

The first replica whose swap fails stops the rollout, named; replicas already swapped keep the new drafter (the
message says which run what). A replica whose rollback failed too is left out of the router (exit 4).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sparkserve.config import Config
from sparkserve.deploy.swap import SwapResult, swap_drafter
from sparkserve.deploy.teardown import Reporter, quiet
from sparkserve.errors import RemoteFailure
from sparkserve.nodes.base import Node
from sparkserve.nodes.router import RouterAPI, running
from sparkserve.plan.replicas import Replica, replicas_of, router_url

IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def in_flight(api_url: str, model: str) -> int | None:
    """Requests running or waiting on one replica (its own /metrics); None when it does not answer."""
    try:
        r = httpx.get(api_url + "/metrics", timeout=10.0, trust_env=False)
        if r.status_code != 200:
            return None
        total = 0.0
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                if s.name in IN_FLIGHT and s.labels.get("model_name", model) == model:
                    total += s.value
        return int(total)
    except (httpx.HTTPError, ValueError):
        return None


def drain(api_url: str, model: str, *, timeout_s: float, say: Reporter, poll_s: float = 0.5) -> bool:
    """Wait until the replica runs no request (True), or ``timeout_s`` passed (False: said)."""
    deadline = time.monotonic() + timeout_s
    n = in_flight(api_url, model)
    while n and time.monotonic() < deadline:
        time.sleep(poll_s)
        n = in_flight(api_url, model)
    if n:
        say(f"drain: {n} request(s) still running after {timeout_s:g}s; swapping anyway")
        return False
    return True


def rolling_swap(cfg: Config, nodes: dict[str, Node], path: Path, *, break_lock: bool = False,
                 say: Reporter = quiet) -> SwapResult:
    """The rolling swap of the module docstring. The result is the fleet's, in swap-drafter's terms: ok when every
    replica swapped; rolled_back when one failed and came back on its previous drafter; neither when its rollback
    failed too. RemoteFailure (step "router") when the router does not run or refuses a call."""
    if running(cfg.router.port) is None:
        raise RemoteFailure("router", f"no vllm-router runs on this machine for port {cfg.router.port}: a rolling swap "
                            "goes through it (`sparkserve up` starts it)", step="router")
    api = RouterAPI(router_url(cfg))
    model = cfg.model.served_name
    reps = replicas_of(cfg)
    done: list[Replica] = []
    last: SwapResult | None = None
    for r in reps:
        rsay = _prefixed(say, r)
        members = set(api.urls())
        others = [x for x in reps if x is not r and x.api_url in members]
        if not others:
            return _stopped(done, r, "no other replica is in the router: taking it out would leave zero serving",
                            rolled_back=True)
        if r.api_url in members:
            rsay(f"out of the router ({', '.join(x.name for x in others)} keep serving)")
            api.remove_worker(r.api_url)
        drain(r.api_url, model, timeout_s=min(cfg.router.request_timeout_s, 600), say=rsay)
        try:
            mine = {n: nodes[n] for n in r.nodes if n in nodes}
            res = swap_drafter(r.cfg, mine, path, break_lock=break_lock, say=rsay)
        except BaseException:
            _back(api, r, rsay)  # refused before anything changed (bad drafter, Ctrl-C before the restart…)
            raise
        if res.ok or res.rolled_back:
            _back(api, r, rsay)
        if not res.ok:
            return _stopped(done, r, res.message, rolled_back=res.rolled_back, res=res)
        done.append(r)
        last = res
    assert last is not None
    last.message = (f"swapped on all {len(reps)} replicas, one at a time behind the router: {model} now drafts "
                    f"with {path.name} ({(last.drafter_digest or '')[:12]})")
    return last


def _back(api: RouterAPI, r: Replica, say: Reporter) -> None:
    api.add_worker(r.api_url)
    say("back in the router")


def _stopped(done: list[Replica], r: Replica, why: str, *, rolled_back: bool, res: SwapResult | None = None
             ) -> SwapResult:
    swapped = ", ".join(x.name for x in done) or "none"
    msg = f"rolling swap stopped at {r.name}: {why} (already swapped: {swapped}; the rest keep their drafter)"
    out = res or SwapResult(False, rolled_back, msg, error=why)
    out.message = msg
    return out


def _prefixed(say: Reporter, r: Replica) -> Reporter:
    return lambda line: say(f"{r.name}: {line}")
