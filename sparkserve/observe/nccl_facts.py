"""What each node's log says of NCCL: the library and version its ranks loaded and the transport NCCL chose."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkserve.observe.events import Event
from sparkserve.observe.logpatterns import Kind
from sparkserve.observe.logs import ParsedLog


@dataclass
class NcclFacts:
    """What one node's log says of NCCL: the library and its version, and the network transport it chose
    (``IB`` / ``Socket`` / another plugin's name; None when not shown — NCCL_DEBUG below INFO)."""

    version: str | None = None  # NCCL's own `NCCL version x.y.z+cudaX` line, else vLLM's `vLLM is using nccl==`
    cuda: str | None = None
    library: str | None = None  # what vLLM loaded: `Found nccl from library …` / VLLM_NCCL_SO_PATH
    transport: str | None = None
    devices: str | None = None  # `[0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE` or the socket interfaces
    evidence: list[Event] = field(default_factory=list)  # the lines these were read from
    notes: list[Event] = field(default_factory=list)  # informational NCCL WARN lines (GID table change, …)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "cuda": self.cuda, "library": self.library, "transport": self.transport,
                "devices": self.devices, "notes": [e.text for e in self.notes]}


def nccl_facts(logs: Sequence[ParsedLog]) -> dict[str, NcclFacts]:
    """Per node (file): the NCCL version and library its ranks loaded, and the transport NCCL chose. A node whose log
    shows the socket transport anywhere is on ``Socket`` (one rank falling back is enough to slow the pair)."""
    out: dict[str, NcclFacts] = {}
    for log in logs:
        f = out.setdefault(log.node, NcclFacts())
        for e in log.of(Kind.NCCL_VERSION, Kind.NCCL_TRANSPORT, Kind.NCCL_NOTE):
            d = e.data
            if e.kind is Kind.NCCL_NOTE:
                f.notes.append(e)
                continue
            f.evidence.append(e)
            if e.kind is Kind.NCCL_VERSION:
                if d.get("version"):
                    f.version, f.cuda = d["version"], d.get("cuda") or f.cuda
                elif d.get("v2") and f.version is None:
                    f.version = d["v2"]
                if d.get("library"):
                    f.library = d["library"]
            else:
                net = d.get("net") or d.get("net2")
                if f.transport != "Socket":  # a fallback anywhere wins
                    f.transport = net
                if d.get("devices"):
                    f.devices = d["devices"].strip()
    return {n: f for n, f in out.items() if f.evidence or f.notes}
