"""Events of one or more log files → the ``sparkserve logs analyze --json`` object (DESIGN.md contract).

    >>> from sparkserve.observe.analyze import analyze_texts
    >>> a = analyze_texts({"head.log": head_text, "follower.log": follower_text})
    >>> a.to_json()["kv_cache_tokens"]
    [1677712]

Unknown stays ``None`` (``null``), never guessed. Ranks are global ranks (:mod:`sparkserve.observe.ranks`);
the configuration is what the logs print (:mod:`sparkserve.observe.engine_config`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkserve.observe.engine_config import EngineConfig, engine_config
from sparkserve.observe.events import Event
from sparkserve.observe.logpatterns import POINTER, FaultKind, Kind
from sparkserve.observe.logs import ParsedLog, parse_log
from sparkserve.observe.ranks import API_NAMES, attribute_ranks, rank_sort


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
                }
                for log, e in self.faults
            ],
        }


class _Events:
    """The events of several logs, by kind, each with its log."""

    def __init__(self, logs: Sequence[ParsedLog]) -> None:
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
    kv, kv_streams = _kv_pool(ev)
    ranks = _rank_states(ev)
    runner = _model_runner(ev)
    eager_known = any(e.rank is None for _, e in ev.of(Kind.EAGER)) or cfg.enforce_eager is True
    graphs = _graphs(ev, ranks, runner, eager_known)
    if len({s for (_, s) in kv_streams}) == 1:  # one engine: its pool is every rank's pool
        for st in ranks.values():
            st.kv_cache_tokens = list(kv_streams.values())[-1]
    faults, artefacts = _ordered_faults(logs)
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
        ready=_ready(ev),
        faults=faults,
        artefacts=artefacts,
        tensor_parallel_size=tp_size,
        versions=_versions(ev),
    )


def _kv_pool(ev: _Events) -> tuple[list[int], dict[tuple[Any, ...], int]]:
    """The distinct pool sizes in order, and the last size per (file, writer): one writer is one engine."""
    kv: list[int] = []
    kv_streams: dict[tuple[Any, ...], int] = {}
    for log, e in ev.of(Kind.KV_TOKENS):
        n = int(e.data["tokens"].replace(",", ""))
        if n not in kv:
            kv.append(n)
        kv_streams[(log.file, e.rec.stream)] = n
    return kv, kv_streams


def _rank_states(ev: _Events) -> dict[str, RankState]:
    """Per rank: its capture, mask, eager and downgrade lines, whether it finished loading, its nodes."""
    ranks: dict[str, RankState] = {}
    for log, e in ev.all:
        if e.rank is None:
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


def _graphs(ev: _Events, ranks: dict[str, RankState], runner: str | None, eager_known: bool) -> str:
    """Set each rank's ``graphs``; return the stack's: captured | partial | eager | unknown."""
    captures = ev.of(Kind.GRAPH_CAPTURED)
    # V1 (0.12+) logs `Graph capturing finished` with info_once: once per node, standing for its ranks
    v1_nodes = {log.node for log, e in captures if e.rank is not None} if runner == "v1" else set()
    for st in ranks.values():
        if st.capture or st.nodes & v1_nodes:
            st.graphs = "captured"
        elif st.eager or eager_known:
            st.graphs = "eager"
    if ranks:
        states = {s.graphs for s in ranks.values()}
        if states == {"captured"}:
            return "captured"
        if "captured" in states:
            return "partial"
        return "eager" if "eager" in states else "unknown"
    any_eager = eager_known or bool(ev.of(Kind.EAGER))
    if captures and any_eager:
        return "partial"
    if captures:
        return "captured"
    return "eager" if any_eager else "unknown"


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
    spec.mean_acceptance_length = [float(e.data["al"]) for _, e in ev.of(Kind.SPEC_METRICS)]
    return spec


def _ready(ev: _Events) -> bool | None:
    """True on the readiness line; False when an API server exists in the logs without it; else unknown."""
    if ev.of(Kind.READY):
        return True
    if ev.of(Kind.API_SERVER) or ev.of(Kind.NON_DEFAULT_ARGS) or any(
        e.rec.proc is not None and e.rec.proc.name.startswith(API_NAMES) for _, e in ev.all
    ):
        return False
    return None


def _versions(ev: _Events) -> list[str]:
    versions: list[str] = []
    for _, e in ev.of(Kind.VERSION):
        v = e.data.get("version") or e.data.get("v2") or e.data.get("v3")
        if v and v not in versions:
            versions.append(v)
    return versions


def _consequence(e: Event) -> int:
    """1 for a fault line that reports another fault (it sorts after the cause within the same second)."""
    if e.fault in (FaultKind.WORKER_DIED, FaultKind.ENGINE_DEAD) or POINTER.search(e.rec.msg):
        return 1
    return 1 if "TCPStore" in e.text or "[c10d]" in e.rec.msg else 0


def _ordered_faults(
    logs: Sequence[ParsedLog],
) -> tuple[list[tuple[ParsedLog, Event]], list[tuple[ParsedLog, Event]]]:
    """Rule 3 (cross-file stop) and the order of faults: by time; within one second a cause before a
    consequence (a dead worker or engine, a relayed "see above" error, a lost rendezvous store); then file
    order, then position. Timestamps have one-second resolution and nodes log independently."""
    stops = [(i, log.stop.ts) for i, log in enumerate(logs) if log.stop is not None and log.stop.ts is not None]
    faults: list[tuple[int, ParsedLog, Event]] = []
    artefacts = [(log, e) for log in logs for e in log.artefacts]
    for i, log in enumerate(logs):
        for e in log.faults:
            if e.ts is not None and any(j != i and e.ts >= t for j, t in stops):
                artefacts.append((log, e))
            else:
                faults.append((i, log, e))
    faults.sort(key=lambda x: (x[2].ts or (0,), _consequence(x[2]), x[0], x[2].sort_line, x[2].line))
    return [(log, e) for _, log, e in faults], artefacts


def analyze_texts(texts: Mapping[str, str], nodes: Mapping[str, str] | None = None) -> Analysis:
    """``{file name: text}`` (in order) → analysis; ``nodes`` maps file name → node name."""
    nodes = nodes or {}
    return analyze([parse_log(t, file=f, node=nodes.get(f)) for f, t in texts.items()])
