"""Events of one or more log files → the ``sparkserve logs analyze --json`` object (DESIGN.md contract).

    >>> from sparkserve.observe.analyze import analyze_texts
    >>> a = analyze_texts({"head.log": head_text, "follower.log": follower_text})
    >>> a.to_json()["kv_cache_tokens"]
    [1677712]

Unknown stays ``None`` (``null``), never guessed. Ranks are global ranks: from the
``world_size=… rank=…`` / ``rank N in world size …`` lines (mapped by pid, so the rank-less
``(Worker pid=N)`` lines before the rename count), from the worker name (``Worker_TP1``,
``Worker_TP0_EP0``, ``VllmWorker TP0``, ``VllmWorker rank=1``, ``VllmWorker-1``), from PyTorch's
``[rankN]:`` or an NCCL line's pid. With ``tensor_parallel_size=1`` and ``pipeline_parallel_size=1`` in the
engine config the only rank is 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkserve.observe.logpatterns import CUDAGRAPH_MODE_VALUES, POINTER, FaultKind, Kind
from sparkserve.observe.logs import Event, ParsedLog, parse_log

_WORKER_NAME = re.compile(
    r"^(?:Worker|VllmWorker)(?:[ _]DP(?P<dp>\d+))?(?:[ _]PP(?P<pp>\d+))?(?:_PCP\d+)?(?:[ _]TP(?P<tp>\d+))?"
    r"(?:_DCP\d+)?(?:_EP\d+)?$"
)
_MP_NAME = re.compile(r"^VllmWorker-(?P<rank>\d+)$")
_API_NAMES = ("APIServer", "ApiServer")
_MODE_REPR = re.compile(
    r"""['"]cudagraph_mode['"]\s*:\s*(?:<CUDAGraphMode\.(?P<enum>\w+)[^>]*>|\[(?P<pair>\d+,\s*\d+)\]"""
    r"""|(?P<num>\d+)|['"](?P<name>\w+)['"]|CUDAGraphMode\.(?P<bare>\w+))"""
)
_SPEC_CFG = re.compile(r"speculative_config=SpeculativeConfig\((?P<body>[^)]*)\)")
_SPEC_ARGS = re.compile(r"""['"]speculative_config['"]\s*:\s*\{(?P<body>[^{}]*)\}""")


@dataclass
class RankState:
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
    method: str | None = None
    num_speculative_tokens: int | None = None
    mask_embedding_loaded: bool | None = None
    mask_token_id: int | None = None
    mean_acceptance_length: list[float] = field(default_factory=list)


@dataclass
class Analysis:
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


# ----------------------------------------------------------------------------------------------------
# ranks
# ----------------------------------------------------------------------------------------------------
def _name_rank(name: str, tp_size: int | None) -> str | None:
    m = _MP_NAME.match(name)
    if m:
        return m.group("rank")
    m = _WORKER_NAME.match(name)
    if not m or m.group("tp") is None and m.group("pp") is None:
        return None
    tp = int(m.group("tp") or 0)
    pp = m.group("pp")
    dp = m.group("dp")
    if dp is not None:
        return f"DP{dp}_{'PP' + pp + '_' if pp else ''}TP{tp}"
    if pp is None:
        return str(tp)
    if tp_size:
        return str(int(pp) * tp_size + tp)
    return f"PP{pp}_TP{tp}"


def _int_of(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def _parallel_sizes(logs: Sequence[ParsedLog]) -> tuple[int | None, int | None]:
    tp = pp = None
    for log in logs:
        for e in log.events:
            if e.kind is Kind.ENGINE_CONFIG:
                cfg = e.data.get("config", "")
                tp = _int_of(r"\btensor_parallel_size=(\d+)", cfg) or tp
                pp = _int_of(r"\bpipeline_parallel_size=(\d+)", cfg) or pp
            elif e.kind is Kind.NON_DEFAULT_ARGS and tp is None:
                tp = _int_of(r"""['"]tensor_parallel_size['"]:\s*(\d+)""", e.data.get("args", ""))
    return tp, pp


#: Events that belong to one worker rank (the ones a node's rank can be inferred for).
RANKED_KINDS = frozenset(
    {
        Kind.GRAPH_CAPTURED,
        Kind.MASK_LOADED,
        Kind.RANK_PRESENCE,
        Kind.CUDAGRAPH_DOWNGRADE,
        Kind.SPECULATOR_CAPTURE,
        Kind.DRAFT_EAGER,
    }
)
_NOT_WORKERS = ("APIServer", "ApiServer", "EngineCore")


def attribute_ranks(logs: Sequence[ParsedLog], node_ranks: Mapping[str, Sequence[str]] | None = None) -> int | None:
    """Set ``Event.rank`` on every event that belongs to a worker rank; returns the TP size if known.

    ``node_ranks`` (node → the ranks it hosts, from the caller's config) attributes worker lines that carry
    no rank of their own to the node's rank — only for a node that hosts exactly one rank.
    """
    tp_size, pp_size = _parallel_sizes(logs)
    for log in logs:
        # keyed by (source, ip, pid): one file may interleave nodes (compose columns, `sparkserve logs` output)
        by_pid: dict[tuple[str | None, str | None, int], str] = {}
        identity: dict[tuple[str | None, str | None, int], str] = {}
        for e in log.events:
            p = e.rec.proc
            if p is None:
                continue
            key = (e.rec.source, p.ip, p.pid)
            if e.kind is Kind.RANK_IDENTITY:
                r = e.data.get("rank") or e.data.get("rank2")
                if r is not None:
                    identity[key] = r
            if p.rank is not None:
                by_pid.setdefault(key, str(p.rank))
            else:
                r = _name_rank(p.name, tp_size)
                if r is not None:
                    by_pid.setdefault(key, r)
        by_pid.update(identity)  # the world-size lines give the global rank: they win
        single = tp_size == 1 and (pp_size or 1) == 1 and not by_pid
        for e in log.events:
            p = e.rec.proc
            rank = None
            if p is not None:
                rank = by_pid.get((e.rec.source, p.ip, p.pid))
                if rank is None and p.rank is not None:
                    rank = str(p.rank)
                if rank is None:
                    rank = _name_rank(p.name, tp_size)
            if rank is None and e.rec.c10_rank is not None:
                rank = str(e.rec.c10_rank)
            if rank is None and e.rec.nccl_pid is not None:
                rank = by_pid.get((e.rec.source, None, e.rec.nccl_pid))
            if rank is None and single and not (p and p.name.startswith(_API_NAMES)):
                rank = "0"
            e.rank = rank
        hosted = (node_ranks or {}).get(log.node)
        if hosted is not None and len(hosted) == 1:
            for e in log.events:
                p = e.rec.proc
                if e.rank is None and e.kind in RANKED_KINDS and not (p and p.name.startswith(_NOT_WORKERS)):
                    e.rank = hosted[0]
    return tp_size


def _rank_sort(r: str) -> tuple[int, int | str]:
    return (0, int(r)) if r.isdigit() else (1, r)


# ----------------------------------------------------------------------------------------------------
# facts
# ----------------------------------------------------------------------------------------------------
def _mode_from(text: str) -> str | None:
    m = _MODE_REPR.search(text)
    if not m:
        return None
    if m.group("enum"):
        return m.group("enum")
    if m.group("bare"):
        return m.group("bare")
    if m.group("name"):
        return m.group("name").upper()
    raw = (m.group("pair") or m.group("num") or "").replace(" ", "")
    return CUDAGRAPH_MODE_VALUES.get(raw)


def _spec_from_config(cfg: str) -> tuple[str | None, int | None, bool]:
    """(method, k, found) from the EngineCore config dump."""
    m = _SPEC_CFG.search(cfg)
    if not m:
        return None, None, "speculative_config=None" in cfg
    body = m.group("body")
    method = re.search(r"method='([^']+)'", body)
    k = re.search(r"num_spec_tokens=(\d+)", body)
    return (method.group(1) if method else None), (int(k.group(1)) if k else None), True


def _spec_from_args(args: str) -> tuple[str | None, int | None]:
    m = _SPEC_ARGS.search(args)
    if not m:
        return None, None
    body = m.group("body")
    method = re.search(r"""['"]method['"]\s*:\s*['"]([^'"]+)['"]""", body)
    k = re.search(r"""['"]num_speculative_tokens['"]\s*:\s*(\d+)""", body)
    return (method.group(1) if method else None), (int(k.group(1)) if k else None)


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


def analyze(logs: Sequence[ParsedLog], node_ranks: Mapping[str, Sequence[str]] | None = None) -> Analysis:
    """Combine the events of several files (e.g. head + follower) into one analysis (``node_ranks``: see
    :func:`attribute_ranks`)."""
    tp_size = attribute_ranks(logs, node_ranks)
    evs = [(log, e) for log in logs for e in log.events]
    by_kind: dict[Kind, list[tuple[ParsedLog, Event]]] = {}
    for pair in evs:
        by_kind.setdefault(pair[1].kind, []).append(pair)

    def of(*kinds: Kind) -> list[tuple[ParsedLog, Event]]:
        if len(kinds) == 1:
            return by_kind.get(kinds[0], [])
        return [(log, e) for log, e in evs if e.kind in kinds]

    # KV pool
    kv: list[int] = []
    kv_streams: dict[tuple[Any, ...], int] = {}
    for log, e in of(Kind.KV_TOKENS):
        n = int(e.data["tokens"].replace(",", ""))
        if n not in kv:
            kv.append(n)
        kv_streams[(log.file, e.rec.stream)] = n

    # configuration
    configured_mode = None
    enforce_eager: bool | None = None
    method = k = None
    spec_found = False
    for _, e in of(Kind.ENGINE_CONFIG):
        cfg = e.data.get("config", "")
        configured_mode = _mode_from(cfg) or configured_mode
        ee = re.search(r"\benforce_eager=(True|False)", cfg)
        if ee:
            enforce_eager = ee.group(1) == "True"
        mm, kk, found = _spec_from_config(cfg)
        if found:
            spec_found = True
            method, k = mm or method, kk or k
    args_mode = None
    for _, e in of(Kind.NON_DEFAULT_ARGS):
        args = e.data.get("args", "")
        args_mode = _mode_from(args) or args_mode
        if enforce_eager is None and re.search(r"""['"]enforce_eager['"]\s*:\s*True""", args):
            enforce_eager = True
        if not spec_found:
            mm, kk = _spec_from_args(args)
            method, k = method or mm, k or kk

    # ranks
    ranks: dict[str, RankState] = {}

    def rs(r: str) -> RankState:
        if r not in ranks:
            ranks[r] = RankState()
        return ranks[r]

    for log, e in evs:
        if e.rank is None:
            continue
        st = rs(e.rank)
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
    # model runner
    if of(Kind.RUNNER_V1_FALLBACK):
        runner: str | None = "v1"
    elif of(Kind.RUNNER_V2):
        runner = "v2"
    elif of(Kind.RUNNER_V1):
        runner = "v1"
    else:
        runner = None
    global_eager = [e for _, e in of(Kind.EAGER) if e.rank is None]
    eager_known = bool(global_eager) or enforce_eager is True
    captures = of(Kind.GRAPH_CAPTURED)
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
            graphs = "captured"
        elif "captured" in states:
            graphs = "partial"
        elif "eager" in states:
            graphs = "eager"
        else:
            graphs = "unknown"
    else:
        any_eager = eager_known or bool(of(Kind.EAGER))
        if captures and any_eager:
            graphs = "partial"
        elif captures:
            graphs = "captured"
        elif any_eager:
            graphs = "eager"
        else:
            graphs = "unknown"

    # effective cudagraph mode: a downgrade wins, then eager (NONE), then the engine dump, then the args
    downgrades = of(Kind.CUDAGRAPH_DOWNGRADE)
    if downgrades:
        d = downgrades[-1][1].data
        mode = d.get("dst") or d.get("dst2")
    elif eager_known or (of(Kind.EAGER) and not captures):
        mode = "NONE"
    else:
        mode = configured_mode or args_mode

    # per-rank pool: one engine → its pool is every rank's pool
    engines = {s for (_, s) in kv_streams}
    if len(engines) == 1:
        last = list(kv_streams.values())[-1]
        for st in ranks.values():
            st.kv_cache_tokens = last

    # speculative decoding
    spec = Spec(method=method, num_speculative_tokens=k)
    mask_events = of(Kind.MASK_LOADED)
    dflash = (method or "").lower().startswith("dflash") or any(
        (e.data.get("which") or "").lower().startswith("dflash") for _, e in of(Kind.SPECULATOR_CAPTURE)
    )
    finished = [r for r, s in ranks.items() if s.loaded]
    if mask_events:
        spec.mask_token_id = int(mask_events[0][1].data["id"])
        lacking = [r for r in finished if not ranks[r].mask]
        spec.mask_embedding_loaded = not lacking
    elif dflash and finished:
        spec.mask_embedding_loaded = False
    spec.mean_acceptance_length = [float(e.data["al"]) for _, e in of(Kind.SPEC_METRICS)]

    # readiness
    if of(Kind.READY):
        ready: bool | None = True
    elif of(Kind.API_SERVER, Kind.NON_DEFAULT_ARGS) or any(
        e.rec.proc is not None and e.rec.proc.name.startswith(_API_NAMES) for _, e in evs
    ):
        ready = False
    else:
        ready = None

    faults, artefacts = _ordered_faults(logs)
    versions: list[str] = []
    for _, e in of(Kind.VERSION):
        v = e.data.get("version") or e.data.get("v2") or e.data.get("v3")
        if v and v not in versions:
            versions.append(v)

    return Analysis(
        logs=list(logs),
        kv_cache_tokens=kv,
        graphs=graphs,
        cudagraph_mode=mode,
        configured_cudagraph_mode=configured_mode or args_mode,
        enforce_eager=enforce_eager,
        ranks={r: ranks[r] for r in sorted(ranks, key=_rank_sort)},
        spec=spec,
        model_runner=runner,
        ready=ready,
        faults=faults,
        artefacts=artefacts,
        tensor_parallel_size=tp_size,
        versions=versions,
    )


def analyze_texts(texts: Mapping[str, str], nodes: Mapping[str, str] | None = None) -> Analysis:
    """``{file name: text}`` (in order) → analysis; ``nodes`` maps file name → node name."""
    nodes = nodes or {}
    return analyze([parse_log(t, file=f, node=nodes.get(f)) for f, t in texts.items()])


def analyze_files(paths: Iterable[tuple[str, str | None]]) -> Analysis:
    """``[(path, node or None)]`` → analysis. Lines are decoded as UTF-8, undecodable bytes replaced."""
    logs = []
    for path, node in paths:
        with open(path, "rb") as fh:
            logs.append(parse_log(fh.read(), file=path, node=node))
    return analyze(logs)
