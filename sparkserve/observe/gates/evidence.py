"""What every gate quotes: an event as evidence, the node an event came from, the nodes read, and where the
config puts each rank."""

from __future__ import annotations

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.events import Event
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Evidence
from sparkserve.observe.logs import ParsedLog


def ev(log: ParsedLog, e: Event) -> Evidence:
    return Evidence(log.node, e.line, e.text)


def node_of(an: Analysis) -> dict[int, ParsedLog]:
    return {id(e): log for log in an.logs for e in log.events}


def nodes_text(an: Analysis) -> str:
    return ", ".join(log.node for log in an.logs) or "no logs"


def rank_hosts(ex: Expectations) -> dict[str, list[str]]:
    """rank → the node the config puts it on (empty without a node → ranks map)."""
    out: dict[str, list[str]] = {}
    for node, ranks in (ex.node_ranks or {}).items():
        for r in ranks:
            out.setdefault(r, []).append(node)
    return out
