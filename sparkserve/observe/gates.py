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
not find (records: :mod:`sparkserve.observe.gate_report`). Gates (DESIGN.md):

* ``pool`` — ``KV cache size: N tokens`` equals the banked pool for this config fingerprint and
  ``gates.pool_tokens`` when set (with neither, the observed pool passes and is what ``--bank`` records).
* ``graphs`` — ``Graph capturing finished`` on every expected rank; no eager line, no ``--enforce-eager``
  / ``cudagraph_mode: NONE`` configured, no ``cudagraph_mode`` downgrade, drafter not forced eager. A
  failure names the rank lacking capture.
* ``mask`` — required when the drafter holds ``mask_embedding.pt`` or ``gates.mask_token_id`` is set:
  ``Loaded DFlash mask embedding for mask_token_id N …`` on every rank, with the expected id.
* ``smoke`` — the smoke cell ran: every request complete, zero stream errors. Not run → fails.
* ``faults`` — no fault line on any node since boot (shutdown artefacts after a deliberate stop are not
  faults), every node's engine container alive, and NCCL on RDMA: a node whose NCCL logged the socket transport
  (`Using network Socket`, seen with NCCL_DEBUG=INFO during the boot window) fails it; ``observed.transport`` holds
  each node's network (None: not shown). Informational NCCL WARN lines (a GID table change) are no faults.
* ``runner`` — every node's workers walk the V2 model runner (``Using V2 Model Runner``), no V1 fallback.
* ``signature`` — every rank printed the lines that prove the profile's path, as the image's engine dialect
  names them (the card's fork: the ``FLASHINFER_MLA_SPARSE_SM90`` KV-layout line and the
  ``DFLASH2-DRAFTER-GROUP`` line with ``drafter_layers`` = the drafter's layer count). An image whose dialect
  names none is not failed for printing none. A failure names the rank and the line it lacks.
* ``identity`` — the same image ID and the same drafter digest on every node. Not collected → fails.

``skip`` marks gates as skipped: they stay in the report with ``ok: true`` and a reason that starts
with ``skipped``; ``--from-log`` cannot observe ``smoke`` and ``identity``, so those fail there unless
skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sparkserve.observe.analyze import Analysis, analyze
from sparkserve.observe.events import Event
from sparkserve.observe.gate_inputs import Expectations, NodeIdentity, SmokeResult
from sparkserve.observe.gate_report import GATE_NAMES, Evidence, GateReport, Verdict
from sparkserve.observe.logpatterns import Kind
from sparkserve.observe.logs import ParsedLog


def _ev(log: ParsedLog, e: Event) -> Evidence:
    return Evidence(log.node, e.line, e.text)


def _node_of(an: Analysis) -> dict[int, ParsedLog]:
    return {id(e): log for log in an.logs for e in log.events}


def _nodes_text(an: Analysis) -> str:
    return ", ".join(log.node for log in an.logs) or "no logs"


def _pool(an: Analysis, ex: Expectations) -> Verdict:
    lines = an.events(Kind.KV_TOKENS)
    observed = list(an.kv_cache_tokens)
    expected = {"config": ex.pool_tokens, "banked": ex.banked_pool}
    evidence = [_ev(log, e) for log, e in lines]
    if not observed:
        blocks = an.events(Kind.GPU_BLOCKS)
        extra = " (only V0 `# GPU blocks` lines, which are blocks, not tokens)" if blocks else ""
        if an.failed_boot_kv_cache_tokens:
            extra = (" (the pool line of " + ", ".join(f"{n:,}" for n in an.failed_boot_kv_cache_tokens)
                     + " tokens belongs to a boot that failed after printing it)")
        return Verdict(
            "pool",
            False,
            expected,
            None,
            f"looked for `KV cache size: N tokens` (EngineCore, head) in {_nodes_text(an)}: not found{extra}",
            [_ev(log, e) for log, e in blocks],
        )
    if ex.pool_tokens is not None and ex.banked_pool is not None and ex.pool_tokens != ex.banked_pool:
        return Verdict(
            "pool",
            False,
            expected,
            observed,
            f"gates.pool_tokens={ex.pool_tokens:,} disagrees with the pool banked for this config "
            f"fingerprint ({ex.banked_pool:,}): fix the config or re-bank",
            evidence,
        )
    if len(observed) > 1:
        return Verdict(
            "pool",
            False,
            expected,
            observed,
            "the pool changed within the log ("
            + " → ".join(f"{n:,}" for n in observed)
            + "): a different configuration booted",
            evidence,
        )
    got = observed[0]
    want = ex.banked_pool if ex.banked_pool is not None else ex.pool_tokens
    if want is None:
        return Verdict(
            "pool",
            True,
            expected,
            observed,
            f"{got:,} tokens; nothing to compare with (no gates.pool_tokens, nothing banked): `--bank` records it",
            evidence,
        )
    source = "banked pool" if ex.banked_pool is not None else "gates.pool_tokens"
    if got != want:
        return Verdict(
            "pool",
            False,
            expected,
            observed,
            f"KV cache size is {got:,} tokens, {source} is {want:,}: a different configuration booted",
            evidence,
        )
    return Verdict("pool", True, expected, observed, f"{got:,} tokens = {source}", evidence)


def _rank_hosts(ex: Expectations) -> dict[str, list[str]]:
    """rank → the node the config puts it on (empty without a node → ranks map)."""
    out: dict[str, list[str]] = {}
    for node, ranks in (ex.node_ranks or {}).items():
        for r in ranks:
            out.setdefault(r, []).append(node)
    return out


def _graphs(an: Analysis, ex: Expectations) -> Verdict:
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
    hosts = _rank_hosts(ex)
    for r in ex.ranks:
        st = an.ranks.get(r)
        if st is None:
            problems.append(f"rank {r}: no line from rank {r} in {_nodes_text(an)}")
            blame += hosts.get(r, [])
        elif not st.capture:
            how = "eager" if st.graphs == "eager" else "no `Graph capturing finished` line"
            problems.append(f"rank {r} graphs off ({how}; looked in {', '.join(sorted(st.nodes))})")
            nodes = hosts.get(r) or sorted(st.nodes)
            blame += nodes
            evidence += [Evidence(n, None, f"rank {r}: {how}") for n in nodes]
        else:
            log = _node_of(an)[id(st.capture[0])]
            evidence.append(_ev(log, st.capture[0]))
    if eager:
        problems.append("eager mode line: " + eager[0][1].rec.msg.strip())
        evidence += [_ev(log, e) for log, e in eager[:4]]
    for log, e in downgrades:
        d = e.data
        src, dst = d.get("src") or d.get("src2"), d.get("dst") or d.get("dst2")
        where = f"rank {e.rank}" if e.rank is not None else log.node
        problems.append(f"cudagraph_mode downgraded {src} → {dst} on {where}")
        evidence.append(_ev(log, e))
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
        evidence.append(_ev(log, e))
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


def _mask(an: Analysis, ex: Expectations) -> Verdict:
    required = ex.mask_file is True or ex.mask_token_id is not None
    expected = {"required": required, "mask_token_id": ex.mask_token_id, "ranks": list(ex.ranks)}
    observed = {r: (an.ranks[r].mask_token_id if r in an.ranks else None) for r in ex.ranks}
    lines = an.events(Kind.MASK_LOADED)
    evidence = [_ev(log, e) for log, e in lines]
    if not required:
        return Verdict(
            "mask",
            True,
            expected,
            observed,
            "the drafter holds no mask_embedding.pt and gates.mask_token_id is unset: nothing to load",
            evidence,
        )
    problems = []
    if ex.mask_file is False:
        problems.append(
            f"the drafter has no mask_embedding.pt but gates.mask_token_id={ex.mask_token_id} expects "
            "one: the mask would be silently ignored"
        )
    for r in ex.ranks:
        st = an.ranks.get(r)
        if st is None or not st.mask:
            where = ", ".join(sorted(st.nodes)) if st else _nodes_text(an)
            problems.append(
                f"rank {r}: no `Loaded DFlash mask embedding` line (looked in {where}): the mask was silently ignored"
            )
        elif ex.mask_token_id is not None and st.mask_token_id != ex.mask_token_id:
            problems.append(f"rank {r} loaded mask_token_id {st.mask_token_id}, expected {ex.mask_token_id}")
    if problems:
        return Verdict("mask", False, expected, observed, "; ".join(problems), evidence)
    ids = sorted({v for v in observed.values() if v is not None})
    return Verdict(
        "mask",
        True,
        expected,
        observed,
        f"mask embedding loaded on every rank ({', '.join(ex.ranks)}), mask_token_id {', '.join(map(str, ids))}",
        evidence,
    )


def _smoke(smoke: SmokeResult | None, ex: Expectations) -> Verdict:
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


def _faults(an: Analysis, liveness: Mapping[str, bool | None] | None, ex: Expectations,
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
    evidence = [_ev(log, e) for log, e in faults] + [
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
    evidence += [_ev(log, e) for log in an.logs for e in log.of(Kind.NCCL_TRANSPORT)
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
    evidence += [_ev(log, e) for log, e in notes[:3]]
    unread = sorted(n for n, lines in (kernel or {}).items() if lines is None)
    if kernel is not None:
        arte += "; no NVRM/Xid kernel lines" + (f" (kernel log not readable on {', '.join(unread)})" if unread else "")
    for log in an.logs:
        state = {True: "engine container running", False: "engine container NOT running", None: "liveness not checked"}
        live = state[(liveness or {}).get(log.node)] if liveness is not None else "liveness not checked (offline)"
        evidence.append(Evidence(log.node, None, f"{log.line_count} log lines read, no fault line; {live}"))
    return Verdict("faults", True, expected, observed, f"no fault lines in {_nodes_text(an)}; {alive}{arte}", evidence)


def _runner(an: Analysis, ex: Expectations) -> Verdict:
    per_node: dict[str, str | None] = {}
    evidence: list[Evidence] = []
    problems = []
    for log in an.logs:
        v2 = log.of(Kind.RUNNER_V2)
        fallback = log.of(Kind.RUNNER_V1_FALLBACK)
        v1 = log.of(Kind.RUNNER_V1)
        if fallback:
            per_node[log.node] = "v1"
            evidence += [_ev(log, e) for e in fallback[:2]]
            problems.append(f"{log.node}: V1 fallback — {fallback[0].rec.msg.strip()}")
        elif v2:
            per_node[log.node] = "v2"
            evidence.append(_ev(log, v2[0]))
        elif v1:
            per_node[log.node] = "v1"
            evidence.append(_ev(log, v1[0]))
            problems.append(f"{log.node}: V1 runner lines and no `Using V2 Model Runner`")
        else:
            per_node[log.node] = None
            problems.append(f"{log.node}: looked for `Using V2 Model Runner`: not found")
    if not an.logs:
        problems.append("no logs")
    if problems:
        return Verdict("runner", False, ex.runner, per_node, "; ".join(problems), evidence)
    return Verdict("runner", True, ex.runner, per_node, "V2 model runner on every node", evidence)


def _signature(an: Analysis, ex: Expectations) -> Verdict:
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
                       [_ev(log, e) for log, e in seen[:4]] or facts)
    hosts = _rank_hosts(ex)
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
                evidence.append(_ev(*hit[0]))
                continue
            nodes = hosts.get(r) or sorted({log.node for log, _e in mine}) or [log.node for log in an.logs]
            blame += nodes
            if mine:
                evidence.append(_ev(*mine[0]))
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


def _identity(identity: Mapping[str, NodeIdentity] | None, ex: Expectations, an: Analysis | None = None) -> Verdict:
    expected = "the same image ID and drafter digest on every node"
    if not identity:
        return Verdict("identity", False, expected, None, "not run: no image IDs or drafter digests collected")
    observed = {n: {"image_id": i.image_id, "drafter_digest": i.drafter_digest} for n, i in identity.items()}
    for n, f in (an.nccl if an is not None else {}).items():  # the NCCL each rank loaded, from its own log
        observed.setdefault(n, {})["nccl"] = {"version": f.version, "cuda": f.cuda, "library": f.library}
    evidence = []
    for n, i in identity.items():
        evidence.append(Evidence(n, None, f"image {i.image_id or '?'}"))
        evidence.append(Evidence(n, None, f"drafter {i.drafter_digest or '?'}"))
    problems = []
    for what, attr in (("image ID", "image_id"), ("drafter digest", "drafter_digest")):
        vals = {n: getattr(i, attr) for n, i in identity.items()}
        missing = sorted(n for n, v in vals.items() if not v)
        if missing:
            problems.append(f"no {what} from {', '.join(missing)}")
        distinct = {v for v in vals.values() if v}
        if len(distinct) > 1:
            problems.append(f"{what}s differ: " + ", ".join(f"{n}={(v or '?')[:19]}" for n, v in vals.items()))
    nccl = an.nccl if an is not None else {}
    for what, attr in (("NCCL version", "version"), ("NCCL library", "library")):
        vals = {n: getattr(f, attr) for n, f in nccl.items() if getattr(f, attr)}
        if len(set(vals.values())) > 1:  # a build one node loads and the other does not (pip vs system libnccl)
            problems.append(f"{what} differs: " + ", ".join(f"{n}={v}" for n, v in vals.items()))
    for n in ex.nodes or ():
        if n not in identity:
            problems.append(f"no identity facts from {n}")
    if problems:
        return Verdict("identity", False, expected, observed, "; ".join(problems), evidence)
    return Verdict(
        "identity",
        True,
        expected,
        observed,
        f"one image and one drafter digest on {len(identity)} node(s)",
        evidence,
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
    report = GateReport(
        [
            _pool(an, expect),
            _graphs(an, expect),
            _mask(an, expect),
            _smoke(smoke, expect),
            _faults(an, liveness, expect, kernel),
            _runner(an, expect),
            _signature(an, expect),
            _identity(identity, expect, an),
        ]
    )
    return report.with_skipped(skip) if skip else report
