"""``replicas: N``: the config split into N stacks, and the argv of the router in front of them. Pure.

Example::

    for r in replicas_of(cfg):          # r.cfg is one TP x EP stack, exactly what `up` runs today
        plan = build_plan(r.cfg)
    argv = router_argv(cfg, [r.api_url for r in replicas_of(cfg)], exe="vllm-router")

Each replica's config is the whole config with ``nodes`` cut to its group and ``replicas: 1``: its plan, its
fingerprint, its head lock and its journal rows are those of a single stack on those nodes, so every per-stack
path (`up`, gates, `down`, `swap-drafter`) runs on a replica unchanged. The router flags come from vllm-router
0.1.17's ``--help`` (docs/replicas-facts.md §1.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkserve.config import Config
from sparkserve.plan.build import build_plan


@dataclass(frozen=True)
class Replica:
    """One copy of the stack: ``index`` from 1, ``name`` ("replica 1"), its own config, its API URL (the
    router's worker URL: the head's address as `up` reaches it)."""

    index: int
    cfg: Config
    api_url: str

    @property
    def name(self) -> str:
        return f"replica {self.index}"

    @property
    def nodes(self) -> list[str]:
        return [n.name for n in self.cfg.nodes]


def replica_config(cfg: Config, index: int) -> Config:
    """Replica ``index`` (from 1): the config with its node group only (``nodes`` in order, equal groups)."""
    size = len(cfg.nodes) // cfg.replicas
    group = cfg.nodes[(index - 1) * size: index * size]
    first, head = cfg.nodes[0], group[0]
    # serve.host naming the first head's address means "the head's": each replica binds its own head's
    host = {first.host: head.host, first.fabric_ip: head.fabric_ip}.get(cfg.serve.host or "", cfg.serve.host)
    serve = cfg.serve.model_copy(update={"host": host})
    return cfg.model_copy(update={"nodes": group, "replicas": 1, "serve": serve})


def replicas_of(cfg: Config, *, api_key: str | None = None) -> list[Replica]:
    """Every replica of the config, in order (one for ``replicas: 1``: the config itself)."""
    out = []
    for i in range(1, cfg.replicas + 1):
        rc = replica_config(cfg, i) if cfg.replicas > 1 else cfg
        out.append(Replica(i, rc, build_plan(rc, api_key=api_key).api_url))
    return out


def router_url(cfg: Config) -> str:
    """The endpoint clients use (a wildcard bind is reached on loopback from here)."""
    r = cfg.router
    host = "127.0.0.1" if r.bind in ("0.0.0.0", "::") else r.bind
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{r.port}"


def router_admin_url(cfg: Config) -> str:
    """Where sparkserve itself calls the router's management routes (the same port: 0.1.17 has no other)."""
    return router_url(cfg)


def router_argv(cfg: Config, worker_urls: list[str], *, exe: str | None = None) -> list[str]:
    """The `vllm-router` argv for these workers. No API key ever goes into it (an argv is world-readable in
    /proc): the router passes each client's own ``Authorization`` header to the workers, so every replica checks
    the key itself; only ``cache_aware``'s render calls would carry ``--api-key`` (docs: replicas)."""
    r = cfg.router
    argv = [exe or r.executable,
            "--host", r.bind, "--port", str(r.port),
            "--policy", r.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(r.metrics_port),
            "--retry-max-retries", str(r.retries),
            "--request-timeout-secs", str(r.request_timeout_s),
            "--cb-failure-threshold", str(r.breaker.failure_threshold),
            "--cb-success-threshold", str(r.breaker.success_threshold),
            "--cb-timeout-duration-secs", str(r.breaker.open_s),
            "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(r.health.interval_s),
            "--health-check-timeout-secs", str(r.health.timeout_s),
            "--health-failure-threshold", str(r.health.failure_threshold),
            "--health-success-threshold", str(r.health.success_threshold),
            # /add_worker blocks until the worker's /health answers: a replica is added only after its gates
            # passed, so a short wait is enough and a wrong URL fails in seconds, not in 600
            "--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1"]
    if worker_urls:
        argv += ["--worker-urls", *worker_urls]
    return argv


def render_replicas(cfg: Config, *, api_key: str | None = None) -> dict[str, Any]:
    """`render --json` with ``replicas`` > 1: every replica's plan (its ranks) and the router's argv."""
    reps = replicas_of(cfg, api_key=api_key)
    return {
        "replicas": [{"replica": r.index, "nodes": r.nodes, "api_url": r.api_url,
                      "plan": build_plan(r.cfg, api_key=api_key).public()} for r in reps],
        "router": {"url": router_url(cfg), "host": cfg.router.host, "policy": cfg.router.policy,
                   "argv": router_argv(cfg, [r.api_url for r in reps])},
    }
