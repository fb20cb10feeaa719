"""The pattern table's NCCL rows: the library's own lines (``host:pid:tid [dev] NCCL INFO …``, src/debug.cc; no vLLM
prefix) that say which transport and version a rank uses, the WARN lines that only report, and the collective
failures (PyTorch's ProcessGroupNCCL watchdog, NCCL WARN, RDMA verbs errors).

A transport WARN line (``transport/net_ib/…`` since 2.28, ``NET/IB : …`` before) is evidence of what the network
did; when PyTorch's watchdog reports the collective that timed out, the watchdog line is the fault and the NCCL
lines before it are its evidence (:data:`NCCL_TRANSPORT_WARN`, :data:`WATCHDOG`; issue 32, kind 3).
"""

from __future__ import annotations

import re

from sparkserve.observe.logrows import FaultKind, Kind, LogPattern, row

#: NCCL's async-event WARN lines that are information, not failure. NVIDIA/nccl's IB async thread: 2.18–2.22 `NET/IB :
#: [%s:%d ]Got async event : %s` for every event (ibv_event_type_str: the non-fatal ones below); 2.23–2.27 `%s:%d Got
#: async error event: %s` (its own "non-fatal" branch) and `%s:%d unknown event type (%d)` for GID change (18) and
#: speed change (20); 2.28+ `%s:%d GID table changed` and `%s:%d Got non-fatal async event: %s(%d)`. Fatal events
#: (`async fatal event`, a catastrophic error, CQ/QP/SRQ errors) stay faults.
NCCL_INFORMATIONAL = (
    r"(?:\S+:\d+ )?Got async event : (?:GID table change|port active|port error|LID change|P_Key change|SM change"
    r"|client reregistration|path migrated|send queue drained|last WQE reached|SRQ limit reached)"
    r"|\S+:\d+ Got async error event: |\S+:\d+ Got non-fatal async event: |\S+:\d+ GID table changed"
    r"|\S+:\d+ unknown event type \((?:18|20)\)"
)

NCCL_INFO_ROWS: tuple[LogPattern, ...] = (
    row(Kind.NCCL_TRANSPORT, ("NET/IB : Using", "NET/Socket : Using", "Using network "),
       r"NET/(?P<net>IB|Socket) : Using(?P<devices>.*?)(?:; OOB (?P<oob>\S+))?$|Using network (?P<net2>\S+(?: \S+)*)$",
       "NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS INIT,NET: `NET/IB : Using%s %s; OOB %s:%s` (devices ` [%d]%s:%d/RoCE`, "
       "NVIDIA/nccl src/transport/net_ib/init.cc, net_ib.cc before 2.28), `NET/Socket : Using%s` "
       "(src/transport/net_socket.cc) and `Using network %s` (src/init.cc): RDMA, or the TCP fallback that runs "
       "TP=2 several times slower"),
    row(Kind.NCCL_VERSION, ("NCCL version ", "is using nccl==", "Found nccl from"),
       r"NCCL version (?P<version>\d+\.\d+\.\d+)\S*?(?:\+cuda(?P<cuda>[\d.]+))?$"
       r"|vLLM is using nccl==(?P<v2>[\w.+-]+)"
       r"|Found nccl from (?:library|environment variable VLLM_NCCL_SO_PATH=)\s*(?P<library>\S+)",
       "NCCL's `NCCL version %d.%d.%d%s+cuda%d.%d` (src/init.cc VERSION_STRING: bare at NCCL_DEBUG=WARN/VERSION, "
       "an INFO line at INFO), vLLM's `vLLM is using nccl==%s` (pynccl) and `Found nccl from library %s` / "
       "`Found nccl from environment variable VLLM_NCCL_SO_PATH=%s` (vllm/utils find_nccl_library)"),
    row(Kind.NCCL_NOTE, ("async event", "async error event", "GID table changed", "unknown event type"),
       r"NET/IB : (?P<what>" + NCCL_INFORMATIONAL + r")",
       "NCCL WARN lines that report, not fail (the async-event thread, src/transport/net_ib…): a GID table change "
       "(an address renewed on a RoCE netdev), port active/error and the other events NCCL itself calls non-fatal"),
)

NCCL_FAULTS: tuple[LogPattern, ...] = (
    row(Kind.FAULT, ("operation timeout: WorkNCCL",),
       r"Watchdog caught collective operation timeout",
       "PyTorch ProcessGroupNCCL watchdog (`[rank0]:[E… ProcessGroupNCCL.cpp:…] [Rank 0] Watchdog caught …`)",
       FaultKind.TIMEOUT, fatal=True),
    row(Kind.FAULT, ("NCCL WARN", "NCCL error"),
       r"\bNCCL WARN\b(?!.*NET/IB : (?:" + NCCL_INFORMATIONAL + r"))|NCCL error",
       "NCCL library `host:pid:tid [dev] file.cc:line [(func) ]NCCL WARN …` (src/debug.cc; no vLLM prefix) — every "
       "WARN but the informational async events (NCCL_NOTE); vLLM `RuntimeError: NCCL error: …`",
       FaultKind.NCCL, fatal=True),
    row(Kind.FAULT, ("watchdog thread terminated with exception",),
       r"Process group watchdog thread terminated with exception: \S",
       "PyTorch ProcessGroupNCCL: `[PG ID %d …] Process group watchdog thread terminated with exception: CUDA error: "
       "…` — the watchdog found a failed CUDA call and takes the process down (`terminate called after throwing an "
       "instance of 'c10::DistBackendError'`, then `what(): …` with this text: QwenLM/Qwen3-VL#1756)",
       FaultKind.OTHER, fatal=True),
    row(Kind.FAULT, ("ibv_",),
       r"\bibv_\w+ failed",
       "RDMA `ibv_modify_qp failed with 110 (Connection timed out)`", FaultKind.NCCL),
)

#: PyTorch's ProcessGroupNCCL watchdog: the collective that timed out (the fault when NCCL's own lines precede it).
WATCHDOG = re.compile(r"Watchdog caught collective operation timeout")
#: An NCCL WARN line of the network transport (NVIDIA/nccl src/transport/net_ib/*.cc, net_ib.cc, net_socket.cc, an
#: IB plugin's `ib_plugin.c`): `NET/IB : Got completion from peer … with error 12 … vendor err 129`, `NET/Socket : …`.
#: Evidence of what the network did; the watchdog line that follows is the fault.
NCCL_TRANSPORT_WARN = re.compile(r"\bNCCL WARN\b.*\bNET/(?:IB|Socket|IBP)\b|\btransport/net\w*[/.]\S*\s+NCCL WARN\b")
