"""The ``router:`` section: vLLM's own router (``vllm-router`` 0.1.17, a Rust binary in a PyPI wheel) in front of
``replicas: N`` copies of the stack. Its own module beside the config/ package; config/root.py
imports :class:`RouterConfig` and checks the rules that need the rest of the config (the port clash).

Defaults and why (facts: docs/replicas-facts.md, measured on the 0.1.17 wheel):

- ``policy: round_robin``, not the router's ``cache_aware``: with ``cache_aware`` 16 requests sharing a prefix went
  16/0 to one of two workers while the card caps each replica at ``--max-num-seqs 6``, and it sends one render call
  per worker per request, which needs the workers' key in the router's argv (§1.6, §1.7, §3.2).
- ``retries: 4``: ``--retry-max-retries`` counts attempts, not re-sends (5 sends seen with 5), and each attempt picks a
  worker through the policy again (§1.4): with 3 attempts and the breaker's 3 failures, one request under load spent
  all three on a just-killed replica and got the router's 500 (1 of ~58 non-streaming requests, in 2 of 5 rig
  runs). One attempt more than the breaker's threshold: by the last attempt the dead replica's breaker is open.
- The breaker and health checks: with the router's defaults (breaker after 10 consecutive failures, open 60 s,
  health every 60 s x 3) ten 5xx opened the breaker on every worker and the endpoint answered 503 for a minute
  although both workers were healthy (§1.4). Here a dead replica's breaker opens after 3 failures and closes again
  after 10 s, and its health checks mark it down within ~10 s; the others keep serving.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: vllm-router 0.1.17's --policy choices (its --help).
POLICIES = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
            "sticky_least_loaded")
#: Policies refused, with why: power_of_two polls SGLang's /get_load, which vLLM does not serve (replicas-facts
#: §1.7); the other two were never run against vLLM workers here (kv_aware also needs KV event sources sparkserve
#: does not render).
REFUSED_POLICIES = {
    "power_of_two": "polls each worker's load from /get_load, SGLang's endpoint, which vLLM does not serve",
    "kv_aware": "needs KV event sources (--kv-event-source) that sparkserve does not render; untested here",
    "sticky_least_loaded": "untested with vLLM workers here",
}


class RouterBreaker(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    failure_threshold: int = Field(default=3, ge=1, description="--cb-failure-threshold: consecutive failures "
                                   "that open one worker's breaker (the router's default, 10, closed the endpoint)")
    success_threshold: int = Field(default=1, ge=1, description="--cb-success-threshold")
    open_s: int = Field(default=10, ge=1, description="--cb-timeout-duration-secs: how long an open breaker keeps "
                        "a worker out (the router's default: 60)")


class RouterHealth(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    interval_s: int = Field(default=5, ge=1, description="--health-check-interval-secs (a GET /health per worker)")
    timeout_s: int = Field(default=3, ge=1, description="--health-check-timeout-secs")
    failure_threshold: int = Field(default=2, ge=1, description="--health-failure-threshold")
    success_threshold: int = Field(default=1, ge=1, description="--health-success-threshold")


class RouterConfig(BaseModel):
    """Where vllm-router runs and how it balances the replicas (used only with ``replicas`` > 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    host: str = Field(default="local", description="where the router runs: local (this control machine; the "
                      "only place supported so far)")
    bind: str = Field(default="127.0.0.1", description="--host: the address the router listens on. Its worker "
                      "management routes (/add_worker, /remove_worker) answer on the same port without any key, "
                      "so a non-loopback address is refused unless allow_remote_admin")
    port: int = Field(default=30000, ge=1, le=65535, description="--port: the endpoint clients use")
    metrics_port: int = Field(default=29000, ge=1, le=65535, description="--prometheus-port (always on; bound to "
                              "127.0.0.1)")
    policy: Literal["random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                    "sticky_least_loaded"] = Field(default="round_robin", description="--policy (round_robin: "
                                                   "see docs; cache_aware skews a shared-prefix load to one replica)")
    retries: int = Field(default=4, ge=1, le=10, description="--retry-max-retries: total attempts per request "
                         "(1 = no retry)")
    request_timeout_s: int = Field(default=1800, ge=1, description="--request-timeout-secs, per attempt, a "
                                   "streamed body included")
    breaker: RouterBreaker = Field(default_factory=RouterBreaker)
    health: RouterHealth = Field(default_factory=RouterHealth)
    allow_remote_admin: bool = Field(default=False, description="accept a non-loopback bind although anyone who "
                                     "reaches it can add or remove workers")
    executable: str = Field(default="vllm-router", min_length=1, description="the vllm-router launcher (a name on "
                            "PATH or next to sparkserve's Python, or a path)")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if v != "local":
            raise ValueError(f"{v!r}: only `local` (this control machine) is supported so far; a router on a Spark "
                             "would go down with that pair during a rolling swap (docs/replicas-facts.md §3.3)")
        return v

    @field_validator("bind")
    @classmethod
    def _bind(cls, v: str) -> str:
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError(f"{v!r} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)") from None

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v in REFUSED_POLICIES:
            raise ValueError(f"{v} {REFUSED_POLICIES[v]}; use round_robin, cache_aware, consistent_hash or random")
        return v

    @field_validator("executable")
    @classmethod
    def _exe(cls, v: str) -> str:
        if any(c in v for c in "\n\r\0"):
            raise ValueError(f"{v!r} contains a control character")
        return v

    def loopback(self) -> bool:
        return ipaddress.ip_address(self.bind).is_loopback


WILDCARDS = (None, "0.0.0.0", "::")


def router_rules(router: RouterConfig, *, replicas: int, nodes: int, local_ports: set[int],
                 serve_host: str | None = None, first_head: tuple[str, str] = ("", "")) -> str | None:
    """The first rule the section breaks against the rest of the config, as ``@field: what`` (the config's
    model-level error form), or None. ``local_ports``: the ports this control machine already serves for
    sparkserve (a node with ``local: true``: its API and rendezvous ports; the supervise exporter);
    ``first_head``: the first node's (host, fabric_ip), the only specific serve.host a fleet may name."""
    if replicas < 1:
        return f"@replicas: {replicas} must be at least 1"
    if nodes % replicas:
        return (f"@replicas: {nodes} nodes do not split into {replicas} equal replicas (each replica is a TP x EP "
                "stack of the same node count)")
    if router.port == router.metrics_port:
        return f"@router.metrics_port: {router.metrics_port} is also router.port"
    if replicas > 1 and serve_host not in WILDCARDS and serve_host not in first_head:
        return (f"@serve.host: {serve_host} is one address, but each replica's head binds its own API: leave it "
                "unset (every address) or name the first head's address (each replica then binds its own head's)")
    if replicas > 1:
        for port, what in ((router.port, "router.port"), (router.metrics_port, "router.metrics_port")):
            if port in local_ports:
                return f"@{what}: {port} clashes with a port sparkserve already uses on this machine"
        if not router.loopback() and not router.allow_remote_admin:
            return (f"@router.bind: {router.bind} exposes the router's /add_worker and /remove_worker to the network "
                    "without a key (vllm-router 0.1.17 has none); bind 127.0.0.1 and put a proxy with auth in "
                    "front, or set router.allow_remote_admin: true")
    return None
