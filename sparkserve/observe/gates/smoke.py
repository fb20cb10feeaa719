"""``smoke`` — the smoke cell ran: every request complete, zero stream errors. Not run → fails."""

from __future__ import annotations

from sparkserve.observe.gate_inputs import Expectations, SmokeResult
from sparkserve.observe.gate_report import Evidence, Verdict


def smoke_gate(smoke: SmokeResult | None, ex: Expectations) -> Verdict:
    expected = {"requests": ex.smoke_prompts, "stream_errors": 0, "incomplete": 0}
    if smoke is None:
        return Verdict("smoke", False, expected, None, "not run: no smoke result (the smoke cell did not run)")
    observed = {
        "requests": smoke.requests,
        "requests_ok": smoke.requests_ok,
        "stream_errors": smoke.stream_errors,
        "incomplete": smoke.incomplete,
    }
    head = smoke.node or "head"
    evidence = [Evidence(e.node or head, None, e.text) for e in smoke.errors]
    evidence.append(
        Evidence(
            head,
            None,
            f"smoke cell: {smoke.requests_ok} of {smoke.requests} requests complete, "
            f"{smoke.stream_errors} stream errors, {smoke.incomplete} incomplete",
        )
    )
    want = ex.smoke_prompts if ex.smoke_prompts is not None else smoke.requests
    problems = []
    if smoke.stalled_s is not None:  # the wedge probe: the engine generated nothing; the cell did not run
        return Verdict("smoke", False, expected, observed, f"no progress for {smoke.stalled_s:g} s: the engine "
                       "generated nothing (a wedge, not the client)", evidence)
    if smoke.stream_errors:
        problems.append(f"{smoke.stream_errors} stream error(s)")
    if smoke.incomplete:
        problems.append(f"{smoke.incomplete} incomplete response(s)")
    if smoke.requests_ok < want:
        problems.append(f"{smoke.requests_ok} of {want} requests completed")
    if problems:
        named = sorted({e.node for e in smoke.errors if e.node})
        tail = f" (on {', '.join(named)})" if named else ""
        return Verdict("smoke", False, expected, observed, "; ".join(problems) + tail, evidence)
    return Verdict(
        "smoke",
        True,
        expected,
        observed,
        f"{smoke.requests_ok}/{want} requests complete, 0 stream errors",
        evidence,
    )
