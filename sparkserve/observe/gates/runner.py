"""``runner`` — every node's workers walk the V2 model runner (``Using V2 Model Runner``), no V1 fallback.

vLLM 0.34 removed the V1 runner (``vllm/v1/worker/gpu_model_runner.py`` is gone; ``gpu_worker`` always builds
``vllm/v1/worker/gpu/model_runner.GPUModelRunner``) and with it the line that said which runner ran: a real 0.34.0
boot on an H100 (tests/fixtures/logs/real-0.34.0-gpu/, session 47) prints no runner line at all. A log whose own
version line says 0.34 or later passes on that line: it cannot fall back. The V1 lines still fail it.
"""

from __future__ import annotations

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Evidence, Verdict
from sparkserve.observe.gates.evidence import ev
from sparkserve.observe.logpatterns import Kind
from sparkserve.observe.logs import Event, ParsedLog
from sparkserve.plan.dialects import has_no_v1_runner


def v2_only_version(log: ParsedLog) -> tuple[str, Event] | None:
    """The log's own vLLM version and its line when that release has only the V2 runner (0.34+); None else —
    a dev build's ``0.1.dev…`` (the card's fork) or no version line."""
    for e in log.of(Kind.VERSION):
        v = e.data.get("version") or e.data.get("v2") or e.data.get("v3") or ""
        if has_no_v1_runner(v):
            return v, e
    return None


def runner_gate(an: Analysis, ex: Expectations) -> Verdict:
    per_node: dict[str, str | None] = {}
    evidence: list[Evidence] = []
    problems = []
    only_v2: list[str] = []
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
        elif (newer := v2_only_version(log)) is not None:
            per_node[log.node] = "v2"
            evidence.append(ev(log, newer[1]))
            only_v2.append(newer[0])
        else:
            per_node[log.node] = None
            problems.append(f"{log.node}: looked for `Using V2 Model Runner`: not found")
    if not an.logs:
        problems.append("no logs")
    if problems:
        return Verdict("runner", False, ex.runner, per_node, "; ".join(problems), evidence)
    why = "V2 model runner on every node"
    if only_v2:
        why += (f" (vLLM {', '.join(sorted(set(only_v2)))} has no V1 runner and prints no runner line: its version "
                "line is the evidence)")
    return Verdict("runner", True, ex.runner, per_node, why, evidence)
