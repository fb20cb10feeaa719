"""``graphs`` — ``Graph capturing finished`` on every expected rank; no eager line, no ``--enforce-eager``
/ ``cudagraph_mode: NONE`` configured, no ``cudagraph_mode`` downgrade, drafter not forced eager. A failure names
the rank lacking capture."""

from __future__ import annotations

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Evidence, Verdict
from sparkserve.observe.gates.evidence import ev, node_of, nodes_text, rank_hosts
from sparkserve.observe.logpatterns import Kind


def graphs_gate(an: Analysis, ex: Expectations) -> Verdict:
    expected = {
        "cudagraph_mode": ex.cudagraph_mode,
        "enforce_eager": ex.enforce_eager,
        "ranks": list(ex.ranks),
    }
    observed = {
        "cudagraph_mode": an.cudagraph_mode,
        "ranks": {r: (an.ranks[r].graphs if r in an.ranks else None) for r in ex.ranks},
    }
    problems: list[str] = []
    evidence: list[Evidence] = []
    blame: list[str] = []  # the failing ranks' nodes: the evidence also quotes the healthy ranks' capture
    eager = an.events(Kind.EAGER)
    downgrades = an.events(Kind.CUDAGRAPH_DOWNGRADE)
    draft_eager = an.events(Kind.DRAFT_EAGER)
    if ex.enforce_eager:
        problems.append("--enforce-eager is configured: CUDA graphs are off on every rank")
    elif ex.cudagraph_mode == "NONE":
        problems.append("cudagraph_mode NONE is configured: no CUDA graphs")
    hosts = rank_hosts(ex)
    for r in ex.ranks:
        st = an.ranks.get(r)
        if st is None:
            problems.append(f"rank {r}: no line from rank {r} in {nodes_text(an)}")
            blame += hosts.get(r, [])
        elif not st.capture:
            how = "eager" if st.graphs == "eager" else "no `Graph capturing finished` line"
            problems.append(f"rank {r} graphs off ({how}; looked in {', '.join(sorted(st.nodes))})")
            nodes = hosts.get(r) or sorted(st.nodes)
            blame += nodes
            evidence += [Evidence(n, None, f"rank {r}: {how}") for n in nodes]
        else:
            log = node_of(an)[id(st.capture[0])]
            evidence.append(ev(log, st.capture[0]))
    if eager:
        problems.append("eager mode line: " + eager[0][1].rec.msg.strip())
        evidence += [ev(log, e) for log, e in eager[:4]]
    for log, e in downgrades:
        d = e.data
        src, dst = d.get("src") or d.get("src2"), d.get("dst") or d.get("dst2")
        where = f"rank {e.rank}" if e.rank is not None else log.node
        problems.append(f"cudagraph_mode downgraded {src} → {dst} on {where}")
        evidence.append(ev(log, e))
        blame.append(log.node)
    if (
        not downgrades
        and ex.cudagraph_mode
        and an.cudagraph_mode
        and an.cudagraph_mode != ex.cudagraph_mode
        and not ex.enforce_eager
        and not eager
    ):
        problems.append(f"effective cudagraph_mode {an.cudagraph_mode}, configured {ex.cudagraph_mode}")
    for log, e in draft_eager:
        problems.append(f"the drafter runs eagerly on {f'rank {e.rank}' if e.rank is not None else log.node}")
        evidence.append(ev(log, e))
        blame.append(log.node)
    if problems:
        failing = sorted(evidence, key=lambda ev: ev.node not in blame)  # what failed leads (stable sort)
        return Verdict("graphs", False, expected, observed, "; ".join(problems), failing, blame=blame)
    return Verdict(
        "graphs",
        True,
        expected,
        observed,
        f"graphs captured on every rank ({', '.join(ex.ranks)}), cudagraph_mode "
        f"{an.cudagraph_mode or ex.cudagraph_mode}",
        evidence,
    )
