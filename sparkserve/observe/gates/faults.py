"""``faults`` — no fault line on any node since boot (shutdown artefacts after a deliberate stop are not
faults), every node's engine container alive, and NCCL on RDMA: a node whose NCCL logged the socket transport
(`Using network Socket`, seen with NCCL_DEBUG=INFO during the boot window) fails it; ``observed.transport`` holds
each node's network (None: not shown). Informational NCCL WARN lines (a GID table change) are no faults."""

from __future__ import annotations

from collections.abc import Mapping

from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gate_report import Evidence, Verdict
from sparkserve.observe.gates.evidence import ev, nodes_text
from sparkserve.observe.logpatterns import Kind


def faults_gate(an: Analysis, liveness: Mapping[str, bool | None] | None, ex: Expectations,
            kernel: Mapping[str, list[str] | None] | None = None) -> Verdict:
    """Fault lines in the ranks' logs, dead engines, missing logs — and the kernel's NVRM/Xid lines since the boot
    began (``kernel``: node → lines, None where no kernel log was readable): on GB10 the driver's own failures
    (``NV_ERR_NO_MEMORY``, an Xid) go to the kernel log, never into a container's."""
    faults = an.faults
    knl = {n: lines for n, lines in (kernel or {}).items() if lines}
    dead = sorted(n for n, alive in (liveness or {}).items() if alive is False)
    missing = [n for n in (ex.nodes or ()) if n not in {log.node for log in an.logs}]
    observed = {
        "faults": [
            {"node": log.node, "line": e.line, "kind": e.fault.value if e.fault else "other"} for log, e in faults
        ],
        "dead_containers": dead,
        "kernel_lines": {n: len(lines) for n, lines in knl.items()},
        "transport": {n: f.transport for n, f in an.nccl.items()},  # NCCL's network per node (None: not shown)
    }
    evidence = [ev(log, e) for log, e in faults] + [
        Evidence(n, None, f"engine container on {n} is not running") for n in dead
    ] + [Evidence(n, None, f"kernel: {line}") for n, lines in knl.items() for line in lines[:5]]
    expected = {"faults": 0, "containers": "alive on every node"}
    problems = []
    if faults:
        kinds = sorted({e.fault.value for _, e in faults if e.fault})
        log0, e0 = faults[0]
        problems.append(
            f"{len(faults)} fault line(s) ({', '.join(kinds)}); first on {log0.node} line {e0.line}: "
            f"{e0.rec.msg.strip()}"
        )
    if dead:
        problems.append(f"engine not running on {', '.join(dead)}")
    if knl:
        n0 = next(iter(knl))
        problems.append(f"{sum(map(len, knl.values()))} NVRM/Xid kernel line(s) since the boot began; first on "
                        f"{n0}: {knl[n0][0][:200]}")
    if missing:
        problems.append(f"no log from {', '.join(missing)}")
    # the transport (NCCL_DEBUG=INFO during the boot window): RDMA passes, the TCP socket fallback fails
    socket = sorted(n for n, f in an.nccl.items() if f.transport == "Socket")
    evidence += [ev(log, e) for log in an.logs for e in log.of(Kind.NCCL_TRANSPORT)
                 if an.nccl.get(log.node) and an.nccl[log.node].transport == "Socket"][:4]
    if socket:
        problems.append(f"NCCL fell back to the socket transport on {', '.join(socket)} (`Using network Socket`): "
                        "TP runs several times slower — check NCCL_IB_HCA and the CX-7 RoCE devices (`doctor`)")
    if problems:
        return Verdict("faults", False, expected, observed, "; ".join(problems), evidence)
    if liveness is None:
        alive = "container liveness not checked (offline)"
    else:
        unknown = sorted(n for n, a in liveness.items() if a is None)
        alive = "every engine container alive" + (f" (not checked: {', '.join(unknown)})" if unknown else "")
    arte = f"; {len(an.artefacts)} shutdown artefact line(s) after a deliberate stop ignored" if an.artefacts else ""
    ib = sorted(n for n, f in an.nccl.items() if f.transport == "IB")
    arte += f"; NCCL over IB/RoCE on {', '.join(ib)}" if ib else ""
    notes = [(log, e) for log in an.logs for e in log.of(Kind.NCCL_NOTE)]
    arte += f"; {len(notes)} informational NCCL WARN line(s) (async events)" if notes else ""
    evidence += [ev(log, e) for log, e in notes[:3]]
    unread = sorted(n for n, lines in (kernel or {}).items() if lines is None)
    if kernel is not None:
        arte += "; no NVRM/Xid kernel lines" + (f" (kernel log not readable on {', '.join(unread)})" if unread else "")
    for log in an.logs:
        state = {True: "engine container running", False: "engine container NOT running", None: "liveness not checked"}
        live = state[(liveness or {}).get(log.node)] if liveness is not None else "liveness not checked (offline)"
        evidence.append(Evidence(log.node, None, f"{log.line_count} log lines read, no fault line; {live}"))
    return Verdict("faults", True, expected, observed, f"no fault lines in {nodes_text(an)}; {alive}{arte}", evidence)
