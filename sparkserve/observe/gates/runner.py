"""``runner`` — every node's workers walk the V2 model runner (``Using V2 Model Runner``), no V1 fallback."""

from __future__ import annotations

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Evidence, Verdict
from sparkserve.observe.gates.evidence import ev
from sparkserve.observe.logpatterns import Kind


def runner_gate(an: Analysis, ex: Expectations) -> Verdict:
    per_node: dict[str, str | None] = {}
    evidence: list[Evidence] = []
    problems = []
    for log in an.logs:
        v2 = log.of(Kind.RUNNER_V2)
        fallback = log.of(Kind.RUNNER_V1_FALLBACK)
        v1 = log.of(Kind.RUNNER_V1)
        if fallback:
            per_node[log.node] = "v1"
            evidence += [ev(log, e) for e in fallback[:2]]
            problems.append(f"{log.node}: V1 fallback — {fallback[0].rec.msg.strip()}")
        elif v2:
            per_node[log.node] = "v2"
            evidence.append(ev(log, v2[0]))
        elif v1:
            per_node[log.node] = "v1"
            evidence.append(ev(log, v1[0]))
            problems.append(f"{log.node}: V1 runner lines and no `Using V2 Model Runner`")
        else:
            per_node[log.node] = None
            problems.append(f"{log.node}: looked for `Using V2 Model Runner`: not found")
    if not an.logs:
        problems.append("no logs")
    if problems:
        return Verdict("runner", False, ex.runner, per_node, "; ".join(problems), evidence)
    return Verdict("runner", True, ex.runner, per_node, "V2 model runner on every node", evidence)
