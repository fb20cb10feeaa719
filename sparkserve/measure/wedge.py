"""Before the smoke cell: is the engine making progress at all? One short streamed request with the supervisor's
stall bound (``supervise.stall_s``). A request that receives nothing for that long (no response head, or no
byte of its stream) is a frozen or wedged engine, and the smoke gate fails at once with "no progress for N s",
instead of every smoke request waiting out its own timeout (a frozen head took 63 s and read as "20 stream
errors").

    wedged = wedge_probe(cfg, plan)      # None: it answered; else the SmokeResult the smoke gate judges
"""

from __future__ import annotations

from sparkserve.config import Config, resolve_api_key
from sparkserve.interrupts import run_async
from sparkserve.measure.client import request_body, stream_request
from sparkserve.measure.httpstream import StreamConnection
from sparkserve.measure.prompts import builtin_prompts
from sparkserve.measure.records import HUNG, STALLED, RequestOutcome, Sampling
from sparkserve.observe.gate_inputs import SmokeError, SmokeResult
from sparkserve.plan.build import Plan

PROBE_TOKENS = 8


def wedge_probe(cfg: Config, plan: Plan) -> SmokeResult | None:
    bound = cfg.supervise.stall_s
    key = resolve_api_key(cfg)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = request_body(plan.served_name, builtin_prompts().prompts[0], PROBE_TOKENS, Sampling())
    where = f"{plan.head.node} ({plan.api_url})"

    async def ask() -> RequestOutcome:
        conn = StreamConnection(plan.api_url, connect_timeout_s=bound)
        try:
            return await stream_request(conn, body, 0, deadline_s=bound + 30.0, stall_s=bound, where=where,
                                        headers=headers)
        finally:
            conn.abort()

    o = run_async(ask)  # a signal during the loop's making leaves nothing half-made (interrupts.run_async)
    if o.error not in (STALLED, HUNG):
        return None
    text = (f"no progress for {bound:g} s: a {PROBE_TOKENS}-token request to the API on {plan.head.node} received "
            f"nothing — the engine is frozen or wedged, not the client: {o.detail}")
    return SmokeResult(requests=cfg.gates.smoke.prompts, requests_ok=0, stream_errors=1, incomplete=0,
                       errors=(SmokeError(plan.head.node, text),), node=plan.head.node, stalled_s=bound)
