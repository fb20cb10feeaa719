"""``signature`` — every rank printed the lines that prove the profile's path, as the image's engine dialect
names them (the card's fork: the ``FLASHINFER_MLA_SPARSE_SM90`` KV-layout line and the ``DFLASH2-DRAFTER-GROUP``
line with ``drafter_layers`` = the drafter's layer count). An image whose dialect names none is not failed for
printing none. A failure names the rank and the line it lacks."""

from __future__ import annotations

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Evidence, Verdict
from sparkserve.observe.gates.evidence import ev, rank_hosts
from sparkserve.observe.logpatterns import Kind


def signature_gate(an: Analysis, ex: Expectations) -> Verdict:
    seen = an.events(Kind.SIGNATURE)
    wanted = [(s, s.text(ex.drafter_layers)) for s in ex.signature]
    expected = {"lines": [w or s.line for s, w in wanted], "ranks": list(ex.ranks), "from": ex.signature_source}
    observed: dict[str, list[str]] = {}
    for _log, e in seen:
        observed.setdefault(e.rank or "?", []).append(e.data["line"])
    if not wanted:
        said = f"{ex.signature_source or 'the engine'} names no signature lines"
        facts = [Evidence(log.node, None, f"{said}: none required") for log in an.logs]
        return Verdict("signature", True, expected, observed or None, f"{said}: nothing to require",
                       [ev(log, e) for log, e in seen[:4]] or facts)
    hosts = rank_hosts(ex)
    problems: list[str] = []
    evidence: list[Evidence] = []
    blame: list[str] = []
    unchecked = False
    for s, want in wanted:
        prefix = s.line.split("{", 1)[0]
        unchecked = unchecked or want is None
        for r in ex.ranks:
            mine = [(log, e) for log, e in seen if e.data["line"].startswith(prefix)
                    and (e.rank == r or (e.rank is None and log.node in hosts.get(r, [])))]
            hit = [(log, e) for log, e in mine if want is None or e.data["line"].startswith(want)]
            if hit:
                evidence.append(ev(*hit[0]))
                continue
            nodes = hosts.get(r) or sorted({log.node for log, _e in mine}) or [log.node for log in an.logs]
            blame += nodes
            if mine:
                evidence.append(ev(*mine[0]))
                problems.append(f"rank {r} printed `{mine[0][1].data['line']}`, expected `{want}` (the drafter has "
                                f"{ex.drafter_layers} layers)")
            else:
                problems.append(f"rank {r}: no `{(want or prefix).rstrip(' (,')}` line (looked in {', '.join(nodes)}): "
                                f"the path it proves ({s.proves or s.name}) is not in use")
    if problems:
        return Verdict("signature", False, expected, observed, "; ".join(problems), evidence, blame=blame)
    note = "; drafter_layers not compared (the drafter's config was not read)" if unchecked else ""
    return Verdict("signature", True, expected, observed,
                   f"{len(wanted)} signature line(s) on every rank ({', '.join(ex.ranks)}), as {ex.signature_source} "
                   f"prints them{note}", evidence)
