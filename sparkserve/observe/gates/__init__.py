"""The production gates as a pure judgement: parsed logs + expectations + smoke/liveness/identity facts → verdicts.

    >>> from sparkserve.observe.gate_inputs import Expectations
    >>> from sparkserve.observe.gates import judge
    >>> from sparkserve.observe.logs import parse_log
    >>> logs = {"spark-a": parse_log(head_text, file="head.log"), "spark-b": parse_log(f_text, file="f.log")}
    >>> report = judge(logs, Expectations.from_config(cfg, mask_file=True), smoke=None)
    >>> report.ok, [g.name for g in report.gates if not g.ok]

Nothing here touches a node: the live side (``sparkserve.deploy.gates_live``) collects the logs since the
containers started, runs the smoke cell, checks that every container is alive and reads image IDs and
drafter digests, then calls :func:`judge`. ``sparkserve gates --from-log NODE=FILE`` calls it on saved
logs. Each verdict carries its evidence lines ``{node, line, text}`` or says what it looked for and did
not find (records: :mod:`sparkserve.observe.gate_report`; the quoting: :mod:`.evidence`).

Gates (DESIGN.md), one module each, its rule in its docstring, judged in the order of :data:`GATES`:
``pool`` · ``graphs`` · ``mask`` · ``smoke`` · ``faults`` · ``runner`` · ``signature`` · ``identity``.

``skip`` marks gates as skipped: they stay in the report with ``ok: true`` and a reason that starts
with ``skipped``; ``--from-log`` cannot observe ``smoke`` and ``identity``, so those fail there unless
skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sparkserve.observe.analyze import Analysis, analyze
from sparkserve.observe.gate_inputs import Expectations, NodeIdentity, SmokeResult
from sparkserve.observe.gate_report import GATE_NAMES, GateReport, Verdict
from sparkserve.observe.gates.faults import faults_gate
from sparkserve.observe.gates.graphs import graphs_gate
from sparkserve.observe.gates.identity import identity_gate
from sparkserve.observe.gates.mask import mask_gate
from sparkserve.observe.gates.pool import pool_gate
from sparkserve.observe.gates.runner import runner_gate
from sparkserve.observe.gates.signature import signature_gate
from sparkserve.observe.gates.smoke import smoke_gate
from sparkserve.observe.logs import ParsedLog


@dataclass(frozen=True)
class Seen:
    """Everything :func:`judge` was handed, the logs analysed: what each gate reads its part of."""

    an: Analysis
    expect: Expectations
    smoke: SmokeResult | None
    liveness: Mapping[str, bool | None] | None
    identity: Mapping[str, NodeIdentity] | None
    kernel: Mapping[str, list[str] | None] | None


#: The gates in report order (gate_report.GATE_NAMES): each one's verdict from what was seen.
GATES: tuple[tuple[str, Callable[[Seen], Verdict]], ...] = (
    ("pool", lambda s: pool_gate(s.an, s.expect)),
    ("graphs", lambda s: graphs_gate(s.an, s.expect)),
    ("mask", lambda s: mask_gate(s.an, s.expect)),
    ("smoke", lambda s: smoke_gate(s.smoke, s.expect)),
    ("faults", lambda s: faults_gate(s.an, s.liveness, s.expect, s.kernel)),
    ("runner", lambda s: runner_gate(s.an, s.expect)),
    ("signature", lambda s: signature_gate(s.an, s.expect)),
    ("identity", lambda s: identity_gate(s.identity, s.expect, s.an)),
)


def judge(
    logs: Mapping[str, ParsedLog],
    expect: Expectations,
    *,
    smoke: SmokeResult | None = None,
    liveness: Mapping[str, bool | None] | None = None,
    identity: Mapping[str, NodeIdentity] | None = None,
    skip: Iterable[str] = (),
    kernel: Mapping[str, list[str] | None] | None = None,
) -> GateReport:
    """Judge the eight gates. ``logs`` maps node name → that node's parsed log (since its container started)."""
    unknown = set(skip) - set(GATE_NAMES)
    if unknown:
        raise ValueError(f"unknown gate(s) {', '.join(sorted(unknown))}; gates are {', '.join(GATE_NAMES)}")
    parsed = []
    for node, log in logs.items():
        log.node = node
        parsed.append(log)
    an = analyze(parsed, expect.node_ranks)
    seen = Seen(an, expect, smoke, liveness, identity, kernel)
    report = GateReport([gate(seen) for _name, gate in GATES])
    return report.with_skipped(skip) if skip else report
