"""Before the smoke cell: is the engine making progress at all? One short streamed request with the supervisor's
stall bound (``supervise.stall_s``). A stream that receives nothing for that long is a wedged engine — the API
answered, the engine behind it generates nothing — and the smoke gate fails at once with "no progress for N s",
instead of every smoke request waiting out its own timeout (a frozen head took 63 s and read as "20 stream
errors").

    wedged = wedge_probe(cfg, plan)      # None: it answered; else the SmokeResult the smoke gate judges
"""

from __future__ import annotations

from sparkserve.config import Config, resolve_api_key
from sparkserve.measure.prompts import builtin_prompts
from sparkserve.measure.records import HUNG, STALLED, Cell
from sparkserve.measure.run import run_cell
from sparkserve.observe.gate_inputs import SmokeError, SmokeResult
from sparkserve.plan.build import Plan

PROBE_TOKENS = 8


def wedge_probe(cfg: Config, plan: Plan) -> SmokeResult | None:
    bound = cfg.supervise.stall_s
    cell = Cell("smoke-probe", prompts=1, concurrency=1, max_tokens=PROBE_TOKENS)
    res = run_cell(plan.api_url, plan.served_name, cell, builtin_prompts(), node=plan.head.node,
                   api_key=resolve_api_key(cfg), deadline_s=bound + 30.0, stall_timeout_s=bound)
    stuck = [e for e in res.errors if e.kind in (STALLED, HUNG)]
    if not stuck:
        return None
    text = (f"no progress for {bound:g} s: the engine on {plan.head.node} streamed nothing to a {PROBE_TOKENS}-token "
            f"request (the API answered; the engine behind it is wedged — not the client): {stuck[0].detail}")
    return SmokeResult(requests=cfg.gates.smoke.prompts, requests_ok=0, stream_errors=1, incomplete=0,
                       errors=(SmokeError(plan.head.node, text),), node=plan.head.node, stalled_s=bound)
