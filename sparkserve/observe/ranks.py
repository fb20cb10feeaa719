"""Which worker rank each event belongs to. Ranks are global ranks, found (strongest first) from:

* the ``world_size=… rank=…`` / ``rank N in world size …`` lines, mapped by pid (so the rank-less
  ``(Worker pid=N)`` lines before the rename count);
* the worker name (``Worker_TP1``, ``Worker_TP0_EP0``, ``VllmWorker TP0``, ``VllmWorker rank=1``,
  ``VllmWorker-1``), PyTorch's ``[rankN]:`` or an NCCL line's pid;
* with ``tensor_parallel_size=1`` and ``pipeline_parallel_size=1`` in the engine config, rank 0;
* the caller's node → ranks map, for a node that hosts exactly one rank.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from sparkserve.observe.engine_config import parallel_sizes
from sparkserve.observe.logpatterns import Kind
from sparkserve.observe.logs import ParsedLog

_WORKER_NAME = re.compile(
    r"^(?:Worker|VllmWorker)(?:[ _]DP(?P<dp>\d+))?(?:[ _]PP(?P<pp>\d+))?(?:_PCP\d+)?(?:[ _]TP(?P<tp>\d+))?"
    r"(?:_DCP\d+)?(?:_EP\d+)?$"
)
_MP_NAME = re.compile(r"^VllmWorker-(?P<rank>\d+)$")
#: Process names of the API server (its lines belong to no rank).
API_NAMES = ("APIServer", "ApiServer")


def _name_rank(name: str, tp_size: int | None) -> str | None:
    """The rank a worker's process name states (``PP1_TP0`` when the TP size to flatten it is unknown)."""
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


#: Events that belong to one worker rank (the ones a node's rank can be inferred for).
RANKED_KINDS = frozenset(
    {
        Kind.GRAPH_CAPTURED,
        Kind.MASK_LOADED,
        Kind.RANK_PRESENCE,
        Kind.CUDAGRAPH_DOWNGRADE,
        Kind.SPECULATOR_CAPTURE,
        Kind.DRAFT_EAGER,
        Kind.SIGNATURE,
    }
)
_NOT_WORKERS = (*API_NAMES, "EngineCore")


def attribute_ranks(logs: Sequence[ParsedLog], node_ranks: Mapping[str, Sequence[str]] | None = None) -> int | None:
    """Set ``Event.rank`` on every event that belongs to a worker rank; returns the TP size if known.

    ``node_ranks`` (node → the ranks it hosts, from the caller's config) attributes worker lines that carry
    no rank of their own to the node's rank — only for a node that hosts exactly one rank.
    """
    tp_size, pp_size = parallel_sizes(logs)
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
            if rank is None and single and not (p and p.name.startswith(API_NAMES)):
                rank = "0"
            e.rank = rank
        hosted = (node_ranks or {}).get(log.node)
        if hosted is not None and len(hosted) == 1:
            for e in log.events:
                p = e.rec.proc
                if e.rank is None and e.kind in RANKED_KINDS and not (p and p.name.startswith(_NOT_WORKERS)):
                    e.rank = hosted[0]
    return tp_size


def rank_sort(r: str) -> tuple[int, int | str]:
    """Sort key: numeric ranks in order, then named ones (``DP0_TP1``, ``PP1_TP0``)."""
    return (0, int(r)) if r.isdigit() else (1, r)
