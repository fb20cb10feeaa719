"""Events of one or more log files → the ``sparkserve logs analyze --json`` object (DESIGN.md contract).

    >>> from sparkserve.observe.analyze import analyze_texts
    >>> a = analyze_texts({"head.log": head_text, "follower.log": follower_text})
    >>> a.to_json()["kv_cache_tokens"]
    [1677712]

Unknown stays ``None`` (``null``), never guessed. Ranks are global ranks (:mod:`sparkserve.observe.ranks`);
the configuration is what the logs print (:mod:`sparkserve.observe.engine_config`).

``ready`` (evidence in ``ready_evidence``) is decided in :mod:`sparkserve.observe.readiness`: true, false or null
— null when the log cannot tell. Requests the API server answered with an error are ``request_errors`` (a count
and the first), never faults. When PyTorch's watchdog names a timed-out collective, NCCL's transport WARN lines
before it are its evidence and sort after it.
``faults[0]`` says ``why`` it is a fault. A Ray worker's death is the root cause of the EngineCore error it causes;
a shared-memory broadcast stall before the engine was up (a slow boot) is no fault.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkserve.observe.engine_config import EngineConfig, engine_config
from sparkserve.observe.events import Event
from sparkserve.observe.logpatterns import (
    BOOT_FAILED,
    NCCL_TRANSPORT_WARN,
    PEER_LOST,
    POINTER,
    PROCESS_HEADER,
    RELAYED,
    WATCHDOG,
    FaultKind,
    Kind,
)
from sparkserve.observe.logs import ParsedLog, parse_log
from sparkserve.observe.nccl_facts import NcclFacts, nccl_facts
from sparkserve.observe.ranks import attribute_ranks, rank_sort
from sparkserve.observe.readiness import ReadyEvidence, decide_ready


@dataclass
class RankState:
    """What the logs show for one worker rank."""

    graphs: str = "unknown"  # captured | eager | unknown
    kv_cache_tokens: int | None = None
    mask_token_id: int | None = None
    loaded: bool = False  # printed `Model loading took …`
    capture: list[Event] = field(default_factory=list)
    mask: list[Event] = field(default_factory=list)
    eager: list[Event] = field(default_factory=list)
    downgrades: list[Event] = field(default_factory=list)
    nodes: set[str] = field(default_factory=set)


@dataclass
class Spec:
    """Speculative decoding as the logs show it."""

    method: str | None = None
    num_speculative_tokens: int | None = None
    mask_embedding_loaded: bool | None = None
    mask_token_id: int | None = None
    mean_acceptance_length: list[float] = field(default_factory=list)


@dataclass
class Analysis:
    """Everything ``logs analyze`` and the gates read off a set of logs."""

    logs: list[ParsedLog]
    kv_cache_tokens: list[int]
    graphs: str
    cudagraph_mode: str | None
    configured_cudagraph_mode: str | None
    enforce_eager: bool | None
    ranks: dict[str, RankState]
    spec: Spec
    model_runner: str | None
    ready: bool | None
    faults: list[tuple[ParsedLog, Event]]
    artefacts: list[tuple[ParsedLog, Event]]
    tensor_parallel_size: int | None = None
    versions: list[str] = field(default_factory=list)
    ready_evidence: ReadyEvidence | None = None
    failed_boot_kv_cache_tokens: list[int] = field(default_factory=list)  # pools of boots that then died
    request_errors: list[tuple[ParsedLog, Event]] = field(default_factory=list)  # answered with an error (kind 2)
    nccl: dict[str, NcclFacts] = field(default_factory=dict)  # node → what its log says of NCCL

    def events(self, *kinds: Kind) -> list[tuple[ParsedLog, Event]]:
        return [(log, e) for log in self.logs for e in log.events if e.kind in kinds]

    def to_json(self) -> dict[str, Any]:
        return {
            "kv_cache_tokens": list(self.kv_cache_tokens),
            "graphs": self.graphs,
            "cudagraph_mode": self.cudagraph_mode,
            "ranks": {r: {"graphs": s.graphs, "kv_cache_tokens": s.kv_cache_tokens} for r, s in self.ranks.items()},
            "spec": {
                "method": self.spec.method,
                "num_speculative_tokens": self.spec.num_speculative_tokens,
                "mask_embedding_loaded": self.spec.mask_embedding_loaded,
                "mask_token_id": self.spec.mask_token_id,
                "mean_acceptance_length": list(self.spec.mean_acceptance_length),
            },
            "model_runner": self.model_runner,
            "ready": self.ready,
            "faults": [
                {
                    "file": log.file,
                    "line": e.line,
                    "kind": e.fault.value if e.fault else "other",
                    "text": e.text,
                    "why": fault_why(e),
                }
                for log, e in self.faults
            ],
            "ready_evidence": self.ready_evidence.to_json() if self.ready_evidence else None,
            "request_errors": {
                "count": len(self.request_errors),
                "first": next(({"file": log.file, "line": e.line, "text": e.text} for log, e in self.request_errors),
                              None),
            },
            "failed_boot_kv_cache_tokens": list(self.failed_boot_kv_cache_tokens),
            "envelopes": [{"file": log.file, **log.envelope.to_json()} for log in self.logs if log.envelope],
        }


def fault_why(e: Event) -> str:
    """Why a fault line is one: the row it matched, or the traceback it ends (and the header folded into it)."""
    start = e.data.get("traceback_start")
    if start is None:
        return e.why or "a fault line"
    why = f"root-cause line of the traceback that starts at line {start}"
    return f"{why}, logged under {e.data['header']!r}" if e.data.get("header") else why


class _Events:
    """The events of several logs, by kind, each with its log."""

    def __init__(self, logs: Sequence[ParsedLog]) -> None:
        self.logs = list(logs)
        self.all = [(log, e) for log in logs for e in log.events]
        self._by_kind: dict[Kind, list[tuple[ParsedLog, Event]]] = {}
        for pair in self.all:
            self._by_kind.setdefault(pair[1].kind, []).append(pair)

    def of(self, kind: Kind) -> list[tuple[ParsedLog, Event]]:
        return self._by_kind.get(kind, [])


def analyze(logs: Sequence[ParsedLog], node_ranks: Mapping[str, Sequence[str]] | None = None) -> Analysis:
    """Combine the events of several files (e.g. head + follower) into one analysis (``node_ranks``: see
    :func:`sparkserve.observe.ranks.attribute_ranks`)."""
    tp_size = attribute_ranks(logs, node_ranks)
    ev = _Events(logs)
    cfg = engine_config(logs)
    faults, artefacts = _ordered_faults(logs)
    ready, ready_evidence = decide_ready(ev, faults)
    # the fault a failed boot was read from (a startup-frame traceback, a death during capture) ends the boot too
    failing = [(ready_evidence.log, ready_evidence.event)] if ready is False and ready_evidence is not None and \
        ready_evidence.event.kind is Kind.FAULT else []
    kv, kv_streams, kv_failed = _kv_pool(ev, [*faults, *failing], failing)
    ranks = _rank_states(ev)
    runner = _model_runner(ev)
    eager_known = any(e.rank is None for _, e in ev.of(Kind.EAGER)) or cfg.enforce_eager is True
    graphs = _graphs(ev, ranks, runner, eager_known, cfg.cudagraph_mode)
    if len({s for (_, s) in kv_streams}) == 1:  # one engine: its pool is every rank's pool
        for st in ranks.values():
            st.kv_cache_tokens = list(kv_streams.values())[-1]
    return Analysis(
        logs=list(logs),
        kv_cache_tokens=kv,
        graphs=graphs,
        cudagraph_mode=_effective_mode(ev, cfg, eager_known),
        configured_cudagraph_mode=cfg.cudagraph_mode,
        enforce_eager=cfg.enforce_eager,
        ranks={r: ranks[r] for r in sorted(ranks, key=rank_sort)},
        spec=_spec(ev, cfg, ranks),
        model_runner=runner,
        ready=ready,
        faults=faults,
        request_errors=ev.of(Kind.REQUEST_ERROR),
        artefacts=artefacts,
        tensor_parallel_size=tp_size,
        versions=_versions(ev),
        ready_evidence=ready_evidence,
        failed_boot_kv_cache_tokens=kv_failed,
        nccl=nccl_facts(logs),
    )


def _kv_pool(
    ev: _Events, faults: Sequence[tuple[ParsedLog, Event]], failing: Sequence[tuple[ParsedLog, Event]] = ()
) -> tuple[list[int], dict[tuple[Any, ...], int], list[int]]:
    """The distinct pool sizes in order, the last size per (file, writer) — one writer is one engine —, and the
    sizes of boots that failed after printing them. A pool line followed in its file by a boot failure
    (:data:`BOOT_FAILED` on the fault or its header, or ``failing``: the fault ``ready: false`` was read from — a
    traceback through start-up code, a death during capture) with no sign of readiness in between belongs to a boot that
    died (real 0.25.1 prints `GPU KV cache size: 234,374,992 tokens`, then dies of CUDA OOM allocating it): it
    is not the stack's pool. An engine that dies later (while serving) keeps its pool."""
    fault_at: dict[int, list[int]] = {}
    ends_boot = {id(f) for _, f in failing}
    for log, f in faults:
        if BOOT_FAILED.search(f.rec.msg) or BOOT_FAILED.search(f.data.get("header") or "") or id(f) in ends_boot:
            fault_at.setdefault(id(log), []).append(f.sort_line)
    kv: list[int] = []
    failed: list[int] = []
    kv_streams: dict[tuple[Any, ...], int] = {}
    for log, e in ev.of(Kind.KV_TOKENS):
        n = int(e.data["tokens"].replace(",", ""))
        if _died_before_ready(log, e.sort_line, fault_at.get(id(log), [])):
            if n not in failed:
                failed.append(n)
            continue
        if n not in kv:
            kv.append(n)
        kv_streams[(log.file, e.rec.stream)] = n
    return kv, kv_streams, failed


def _died_before_ready(log: ParsedLog, at: int, fault_lines: list[int]) -> bool:
    """A fault after position ``at`` of ``log`` with no sign of readiness between the two (the readiness
    line, or requests visibly served: the evidence ``ready`` reads)."""
    later = [f for f in fault_lines if f > at]
    if not later:
        return False
    ready = [e.sort_line for e in log.of(Kind.READY, Kind.SERVED)
             if e.sort_line > at and (e.kind is not Kind.SERVED or e.data.get("prompt") is None
                                      or float(e.data["prompt"]) + float(e.data["gen"]) > 0)]
    k = bisect.bisect_right(log.spec_at, at)  # SpecDecoding lines: requests were served
    if k < len(log.spec_at):
        ready.append(log.spec_at[k])
    first_ready = min(ready, default=None)
    return any(first_ready is None or f < first_ready for f in later)


#: Events that say nothing of a rank's state: where a traceback ran, a request answered with an error.
_NOT_RANK_STATE = frozenset({Kind.FRAME, Kind.REQUEST_ERROR})


def _rank_states(ev: _Events) -> dict[str, RankState]:
    """Per rank: its capture, mask, eager and downgrade lines, whether it finished loading, its nodes."""
    ranks: dict[str, RankState] = {}
    for log, e in ev.all:
        if e.rank is None or e.kind in _NOT_RANK_STATE:
            continue
        st = ranks.setdefault(e.rank, RankState())
        st.nodes.add(log.node)
        if e.kind is Kind.GRAPH_CAPTURED:
            st.capture.append(e)
        elif e.kind is Kind.MASK_LOADED:
            st.mask.append(e)
            if st.mask_token_id is None:
                st.mask_token_id = int(e.data["id"])
        elif e.kind is Kind.EAGER:
            st.eager.append(e)
        elif e.kind is Kind.CUDAGRAPH_DOWNGRADE:
            st.downgrades.append(e)
        elif e.kind is Kind.RANK_PRESENCE and e.data.get("gib"):
            st.loaded = True
    return ranks


def _model_runner(ev: _Events) -> str | None:
    """``v1`` / ``v2`` / None: a V1 fallback line wins over the V2 line, which wins over V1-only lines."""
    if ev.of(Kind.RUNNER_V1_FALLBACK):
        return "v1"
    if ev.of(Kind.RUNNER_V2):
        return "v2"
    return "v1" if ev.of(Kind.RUNNER_V1) else None


def _graphs(
    ev: _Events, ranks: dict[str, RankState], runner: str | None, eager_known: bool, mode: str | None
) -> str:
    """Set each rank's ``graphs``; return the stack's: captured | partial | eager | unknown."""
    captures = ev.of(Kind.GRAPH_CAPTURED)
    # V1 (0.12+) logs `Graph capturing finished` with info_once: once per node, standing for its ranks
    v1_nodes = {log.node for log, e in captures if e.rank is not None} if runner == "v1" else set()
    for st in ranks.values():
        if st.capture or st.nodes & v1_nodes:
            st.graphs = "captured"
        elif st.eager or eager_known:
            st.graphs = "eager"
    bar_done = _last_bar_done(ev, mode)
    if ranks:
        states = {s.graphs for s in ranks.values()}
        if states == {"captured"} or (states == {"unknown"} and bar_done):
            return "captured"
        if "captured" in states:
            return "partial"
        return "eager" if "eager" in states else "unknown"
    any_eager = eager_known or bool(ev.of(Kind.EAGER))
    if (captures or bar_done) and any_eager:
        return "partial"
    if captures or bar_done:
        return "captured"
    return "eager" if any_eager else "unknown"


def _last_bar_done(ev: _Events, mode: str | None) -> bool:
    """The capture finished by its bars (the finished line may be out of view: an excerpt, info_once on another
    node): the last bar reached 100% and is the last capture phase — FULL (V1 `decode, FULL` after the PIECEWISE
    bar), V0's one `shapes` bar, a bar without mode, or PIECEWISE unless a FULL mode is configured."""
    bars = ev.of(Kind.CAPTURE_BAR)
    if not bars or bars[-1][1].data.get("pct") != "100":
        return False
    bar_mode = bars[-1][1].data.get("mode") or ""
    # a PIECEWISE bar at 100 % ends the capture unless a FULL phase is configured to follow it (issue 44, kind 3)
    return not bar_mode or "FULL" in bar_mode or mode not in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL")


def _effective_mode(ev: _Events, cfg: EngineConfig, eager_known: bool) -> str | None:
    """The cudagraph mode in effect: a downgrade wins, then eager (NONE), then the configured mode."""
    downgrades = ev.of(Kind.CUDAGRAPH_DOWNGRADE)
    if downgrades:
        d = downgrades[-1][1].data
        return d.get("dst") or d.get("dst2")
    if eager_known or (ev.of(Kind.EAGER) and not ev.of(Kind.GRAPH_CAPTURED)):
        return "NONE"
    return cfg.cudagraph_mode


def _spec(ev: _Events, cfg: EngineConfig, ranks: dict[str, RankState]) -> Spec:
    """Method and k as configured; the mask is loaded when every rank that finished loading logged it (a
    DFlash drafter without any mask line: not loaded)."""
    spec = Spec(method=cfg.spec_method, num_speculative_tokens=cfg.num_speculative_tokens)
    mask_events = ev.of(Kind.MASK_LOADED)
    dflash = (cfg.spec_method or "").lower().startswith("dflash") or any(
        (e.data.get("which") or "").lower().startswith("dflash") for _, e in ev.of(Kind.SPECULATOR_CAPTURE)
    )
    finished = [r for r, s in ranks.items() if s.loaded]
    if mask_events:
        spec.mask_token_id = int(mask_events[0][1].data["id"])
        spec.mask_embedding_loaded = all(ranks[r].mask for r in finished)
    elif dflash and finished:
        spec.mask_embedding_loaded = False
    spec.mean_acceptance_length = [float(al) for log in ev.logs for al in log.spec_al]
    return spec


def _versions(ev: _Events) -> list[str]:
    versions: list[str] = []
    for _, e in ev.of(Kind.VERSION):
        v = e.data.get("version") or e.data.get("v2") or e.data.get("v3")
        if v and v not in versions:
            versions.append(v)
    return versions


def _consequence(e: Event) -> int:
    """1 for a fault line that reports another fault (it sorts after the cause within the same second); -1 for a
    Ray worker's death, the cause of the EngineCore error it brings, which Ray's log monitor may print after it."""
    if "A worker died or was killed" in e.rec.msg or "its worker process has died" in e.rec.msg:
        return -1
    if e.fault in (FaultKind.WORKER_DIED, FaultKind.ENGINE_DEAD) or POINTER.search(e.rec.msg):
        return 1
    return 1 if "TCPStore" in e.text or "[c10d]" in e.rec.msg else 0


def is_consequence(e: Event) -> bool:
    """A fault line that is never faults[0] while a cause is in view: it relays a failure logged elsewhere (a "see
    root cause above" pointer, ``EngineDeadError``, a process's death reported by its parent, a header whose
    traceback is out of view), reports a lost peer (:data:`PEER_LOST`) or a stall a peer caused (the shm broadcast
    wait)."""
    msg = e.rec.msg.strip()
    if POINTER.search(msg) or RELAYED.search(msg) or PEER_LOST.search(e.text) or _survived(e):
        return True
    if PROCESS_HEADER.match(msg):  # a process died, its exception line out of view: the cause is not in the log
        return True
    return "[c10d]" in msg and e.fault is FaultKind.OTHER


def _ordered_faults(
    logs: Sequence[ParsedLog],
) -> tuple[list[tuple[ParsedLog, Event]], list[tuple[ParsedLog, Event]]]:
    """Rule 3 (cross-file stop) and the order of faults (rule 7): causes before consequences
    (:func:`is_consequence`); each file's faults in file order (its stamps only place them among the other files'
    — a line without a stamp, or one stamped before its predecessor, keeps its place); across files by time, and
    within one second a cause before a consequence, then file order. Timestamps have one-second resolution and
    nodes log independently. An ERROR line no row names whose process went on (a later boot or serving line of
    the same writer) was survived (rule 8): an artefact."""
    stops = [(i, log.stop.ts) for i, log in enumerate(logs) if log.stop is not None and log.stop.ts is not None]
    faults: list[tuple[int, tuple[int, ...], ParsedLog, Event]] = []
    artefacts = [(log, e) for log in logs for e in log.artefacts]
    up = {id(log): _up_at(log) for log in logs}
    stack_up = any(at is not None for at in up.values())  # a follower's log has no readiness line of its own
    for i, log in enumerate(logs):
        ready_at = up[id(log)]
        progress = _progress_by_stream(log)
        first_ts = next((e.ts for e in log.faults if e.ts is not None), None) or (0,)
        eff = first_ts
        for e in sorted(log.faults, key=lambda x: (x.sort_line, x.line)):
            eff = max(eff, e.ts) if e.ts is not None else eff  # a file's own order is kept
            # a shm-broadcast wait before the engine was up (a boot still compiling or loading, or one it outlived)
            # is slowness, not a fault; after it was up (in this log, or in another when this one is a follower's
            # and has no readiness line), a follower stopped answering (issue 44, kind 5)
            outlived = _survived(e) and (e.sort_line < ready_at if ready_at is not None else not stack_up)
            went_on = _went_on(e, progress)
            if outlived or went_on or (e.ts is not None and any(j != i and e.ts >= t for j, t in stops)):
                artefacts.append((log, e))
            else:
                faults.append((i, eff, log, e))
    # NCCL's transport WARN lines are evidence when PyTorch's watchdog names the collective that timed out (kind 3)
    watchdog = any(WATCHDOG.search(e.rec.msg) for _, _, _, e in faults)
    evidence = [watchdog and NCCL_TRANSPORT_WARN.search(f[3].rec.text) is not None for f in faults]
    order = {id(f[3]): is_consequence(f[3]) or ev for f, ev in zip(faults, evidence, strict=True)}
    faults.sort(key=lambda x: (order[id(x[3])], x[1], _consequence(x[3]), x[0], x[3].sort_line, x[3].line))
    return [(log, e) for _, _, log, e in faults], artefacts


#: Lines that show a process making progress (booting on, or serving): after them, an earlier ERROR was survived.
_PROGRESS = frozenset({Kind.RANK_PRESENCE, Kind.KV_TOKENS, Kind.KV_MEMORY, Kind.GRAPH_CAPTURED,
                       Kind.SPECULATOR_CAPTURE, Kind.READY, Kind.SERVED, Kind.SPEC_METRICS, Kind.RUNNER_V2})


def _up_at(log: ParsedLog) -> int | None:
    """Where a log first shows its engine up: the readiness line, a stats line with work done, a SpecDecoding
    line."""
    at = [e.sort_line for e in log.of(Kind.READY)]
    at += [e.sort_line for e in log.of(Kind.SERVED)
           if e.data.get("prompt") is None or float(e.data["prompt"]) + float(e.data["gen"]) > 0]
    at += log.spec_at[:1]
    return min(at, default=None)


def _progress_by_stream(log: ParsedLog) -> dict[tuple[Any, ...], int]:
    """Per writer, the position of its last progress line."""
    last: dict[tuple[Any, ...], int] = {}
    for e in log.events:
        if e.kind in _PROGRESS:
            last[e.rec.stream] = max(last.get(e.rec.stream, -1), e.sort_line)
    return last


def _went_on(e: Event, progress: dict[tuple[Any, ...], int]) -> bool:
    """An ERROR line that no pattern row names, after which the same writer logged progress: not what stopped it."""
    if e.data.get("level") is None or e.fault is not FaultKind.OTHER:
        return False
    return progress.get(e.rec.stream, -1) > e.sort_line


def _survived(e: Event) -> bool:
    """A stall the engine outlived: the shm-broadcast wait it logs while a peer compiles or warms up."""
    return e.fault is FaultKind.TIMEOUT and "No available shared memory broadcast block" in e.rec.msg


def analyze_texts(texts: Mapping[str, str], nodes: Mapping[str, str] | None = None) -> Analysis:
    """``{file name: text}`` (in order) → analysis; ``nodes`` maps file name → node name."""
    nodes = nodes or {}
    return analyze([parse_log(t, file=f, node=nodes.get(f)) for f, t in texts.items()])
