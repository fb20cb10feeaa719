"""What `sparkserve status` says about the supervisor of this deployment: it asks the supervisor's own port
(``supervise.listen``, ``/status.json``) — the one record the supervisor writes after every round.

    view = supervisor_view(cfg)      # {"running": True, "phase": "incident", "failing": [...], ...}
    view["failing_now"]              # True: `status` exits 1 (the supervisor sees a fault)
    print(view_lines(view))          # "supervisor: incident — progress: the canary ..." or one line when none runs

A port that answers for another deployment (another served name or API) is not this deployment's supervisor.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from sparkserve.config import Config
from sparkserve.operate.exporter import parse_listen
from sparkserve.plan.build import build_plan
from sparkserve.plan.replicas import router_url

FAILING_PHASES = ("incident", "recovering", "gave_up")


def supervisor_view(cfg: Config, *, timeout: float = 2.0) -> dict[str, Any]:
    """The supervisor's last verdict for this deployment, or ``{"running": False, "why": ...}``."""
    listen = cfg.supervise.listen
    if not listen:
        return {"running": False, "why": "supervise.listen is empty: a supervisor of this config has no port to ask"}
    host, port = parse_listen(listen)
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    url = f"http://{host}:{port}/status.json"
    try:
        r = httpx.get(url, timeout=timeout, trust_env=False)
        r.raise_for_status()
        st = r.json()
    except (httpx.HTTPError, ValueError) as e:
        return {"running": False, "url": url, "why": f"nothing answers at {url} ({type(e).__name__})"}
    api_url, served = (router_url(cfg), cfg.model.served_name) if cfg.replicas > 1 else \
        (build_plan(cfg).api_url, build_plan(cfg).served_name)
    stack = st.get("stack") or {}
    if stack.get("api_url") != api_url or stack.get("served_name") != served:
        return {"running": False, "url": url, "why": f"the supervisor at {url} watches {stack.get('served_name')} "
                                                     f"at {stack.get('api_url')}, not this deployment"}
    failing = [{"check": g.get("check", name), "summary": g.get("summary", ""), "node": g.get("node")}
               for name, g in (st.get("gates") or {}).items() if g.get("ok") is False]
    incidents = st.get("incidents") or []
    last = incidents[-1] if incidents else None
    at = st.get("last_round_at")
    return {
        "running": True, "url": url, "phase": st.get("phase"), "rounds": st.get("rounds"),
        "last_round_at": at, "last_round_age_s": None if at is None else round(time.time() - float(at), 1),
        "failing": failing, "restarts": st.get("restarts"), "recoveries": st.get("recoveries"),
        "gave_up": st.get("gave_up"),
        "last_incident": None if last is None else {
            "dir": last.get("dir"), "time": last.get("time"),
            "checks": sorted({v.get("check") for v in last.get("verdict") or []}), "pyspy_ok": last.get("pyspy_ok")},
        "failing_now": bool(failing) or st.get("phase") in FAILING_PHASES,
        **_fleet(st),
    }


def _fleet(st: dict[str, Any]) -> dict[str, Any]:
    """A fleet supervisor's per-replica verdicts and its router's (nothing for a single stack)."""
    if not st.get("replicas"):
        return {}
    reps = [{"replica": r.get("replica"), "label": r.get("label"), "phase": r.get("phase"), "ok": r.get("ok"),
             "in_router": r.get("in_router"), "gave_up": r.get("gave_up"), "restarts": r.get("restarts"),
             "failing": [{"check": g.get("check", name), "summary": g.get("summary", ""), "node": g.get("node")}
                         for name, g in (r.get("gates") or {}).items() if g.get("ok") is False]}
            for r in st["replicas"]]
    router = st.get("router") or {}
    return {"replicas": reps, "router": {k: router.get(k) for k in ("ok", "summary", "pid", "restarts")},
            **({"failing_now": True} if router.get("ok") is False or any(r["failing"] for r in reps) else {})}


def view_lines(v: dict[str, Any]) -> list[str]:
    if not v.get("running"):
        return [f"supervisor: none runs for this deployment — {v.get('why')}"]
    age = v.get("last_round_age_s")
    head = (f"supervisor: {v['phase']}, {v['rounds']} round(s), the last {age:.0f}s ago" if age is not None else
            f"supervisor: {v['phase']}, no round yet")
    out = [head + f" ({v['url']})"]
    for f in v["failing"]:
        out.append(f"  FAILING {f['check']}: {f['summary']}")
    for r in v.get("replicas") or []:
        out.append(f"  {r['label']}: {r['phase']}, {'in' if r['in_router'] else 'NOT in'} the router"
                   + "".join(f"; FAILING {f['check']}: {f['summary']}" for f in r["failing"]))
    if v.get("router"):
        out.append(f"  router: {'ok' if v['router']['ok'] else 'FAILING'} — {v['router']['summary']}")
    inc = v.get("last_incident")
    if inc:
        out.append(f"  last incident {inc['time']}: {', '.join(inc['checks']) or 'manual'} — {inc['dir']}")
    return out
