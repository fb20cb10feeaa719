"""What the running stack serves, for `status`: since when, which model and drafter, which image, where.

The drafter is read from the running head (its drafter bind mount, or with runtime process its argv), its
digest from the journal's record of that deployment; ``differs`` says whether it is not the config's
drafter (after `swap-drafter --no-write`, or a config edited since `up`).

    facts = serving(cfg, nodes)        # None when no head rank runs
    facts.uptime_s, facts.drafter_path, facts.drafter_digest, facts.differs, facts.endpoint
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkserve import journal
from sparkserve.config import Config
from sparkserve.config.profiles import drafter_path
from sparkserve.errors import SparkserveError
from sparkserve.nodes.base import Node
from sparkserve.nodes.runtime import engine_for, serving_drafter
from sparkserve.plan.build import build_plan


@dataclass(frozen=True)
class Serving:
    """The serving stack as one record (``status --json``'s ``"serving"``)."""

    started_at: str | None
    uptime_s: float | None
    model: str  # the served name
    target: str
    drafter_path: str | None
    drafter_digest: str | None  # None: not in the journal
    config_drafter: str
    differs: bool | None  # the serving drafter is not the config's (None: unknown)
    image_ref: str
    image_id: str | None
    deployment: str
    endpoint: str  # the OpenAI-compatible base URL

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_docker_time(s: str) -> datetime | None:
    """Docker's RFC 3339 time with nanoseconds (``2026-12-01T11:42:24.123456789Z``) as an aware datetime."""
    if not s or s.startswith("0001-"):
        return None
    head, _, frac = s.rstrip("Z").partition(".")
    digits = "".join(c for c in frac if c.isdigit())[:6]
    try:
        t = datetime.fromisoformat(head + (f".{digits}" if digits else ""))
    except ValueError:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def serving(cfg: Config, nodes: dict[str, Node], *, now: datetime | None = None) -> Serving | None:
    """The head's running rank, as a :class:`Serving`; None when it does not run (or cannot be asked)."""
    head = nodes.get(cfg.head.name)
    if head is None:
        return None
    eng = engine_for(head, cfg)
    try:
        running = [c for c in eng.list_managed() if c.running and c.rank in (0, None)]
        if not running:
            return None
        c = running[0]
        started = eng.state(c).started_at
        drafter = serving_drafter(eng, c.id)
    except SparkserveError:
        return None
    t0 = parse_docker_time(started)
    now = now or datetime.now(UTC)
    record = journal.lookup(lambda j: j.deployment(c.fingerprint), None) if c.fingerprint else None
    digest = record["drafter_digest"] if record else None
    plan = build_plan(cfg)
    config_drafter = drafter_path(cfg) or "none (mtp)"
    differs = None if drafter is None else Path(drafter) != Path(config_drafter)
    return Serving(started_at=started or None, uptime_s=(now - t0).total_seconds() if t0 else None,
                   model=cfg.model.served_name, target=str(cfg.model.target), drafter_path=drafter,
                   drafter_digest=digest, config_drafter=config_drafter, differs=differs,
                   image_ref=cfg.image.ref, image_id=c.image_id or None, deployment=c.fingerprint,
                   endpoint=plan.api_url.rstrip("/") + "/v1")


def human_time(s: str | None) -> str:
    """Docker's start time for people: ``2026-12-01 11:42:24 UTC`` (no nanoseconds); ``?`` when unknown."""
    t = parse_docker_time(s or "")
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if t else "?"


def human_duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h}h {m}m"
    if h:
        return f"{h}h {m}m"
    return f"{m}m {s}s" if m else f"{s}s"


def usage_example(cfg: Config, api_url: str) -> str:
    """A ready-to-paste `curl` and OpenAI-client call against the served model. The API key is named (its
    env var or file), never printed."""
    import json
    import shlex

    base = api_url.rstrip("/") + "/v1"
    body = json.dumps({"model": cfg.model.served_name, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "Say hello in five words."}]})
    s = cfg.serve
    if s.api_key_env:
        header, key_py = f' -H "Authorization: Bearer ${s.api_key_env}"', f'os.environ["{s.api_key_env}"]'
    elif s.api_key_file:
        f = shlex.quote(str(s.api_key_file))
        header = f' -H "Authorization: Bearer $(cat {f})"'
        key_py = f'open("{s.api_key_file}").read().strip()'
    else:
        header, key_py = "", '"EMPTY"'
    curl = (f"curl -s {shlex.quote(base + '/chat/completions')} -H 'Content-Type: application/json'{header} "
            f"-d {shlex.quote(body)}")
    py = (f"python3 -c 'import os; from openai import OpenAI; c = OpenAI(base_url=\"{base}\", api_key={key_py}); "
          f"print(c.chat.completions.create(model=\"{cfg.model.served_name}\", max_tokens=64, messages=[{{\"role\": "
          "\"user\", \"content\": \"Say hello in five words.\"}]).choices[0].message.content)'")
    return f"try it:\n  {curl}\n  {py}"
