"""Issue 26 fabric: NCCL's own lines. `NCCL WARN` is classified by message (the async-event thread's informational
events are no fault, the rest are), the transport NCCL chose is read from its INIT/NET INFO lines and gated (IB
passes, Socket fails, inside the `faults` gate), and the NCCL version and library each node loaded are identity facts.

Every line is built from NVIDIA/nccl's format strings: src/debug.cc (`%s:%d:%d ` host, pid, tid, then
`[%d] %s:%d (%s) NCCL WARN %s` / `[%d] NCCL INFO %s`), src/transport/net_ib (`NET/IB : Using%s %s; OOB %s:%s`,
the async events), src/transport/net_socket.cc (`NET/Socket : Using%s`), src/init.cc (`Using network %s`,
`NCCL version …+cuda…`), and vLLM's `vLLM is using nccl==%s` / `Found nccl from library %s`."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gates import ALIVE, SAME, SMOKE_OK

from sparkserve.config import load_config
from sparkserve.observe.analyze import analyze_texts
from sparkserve.observe.gate_inputs import Expectations
from sparkserve.observe.gates import judge
from sparkserve.observe.logpatterns import FATAL
from sparkserve.observe.logs import parse_log
from sparkserve.plan.dialects import shipped

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
H = "spark-a:3190:3301 [0] "

INFORMATIONAL = [
    # 2.18–2.22: every event as `Got async event : <ibv_event_type_str>` (vllm-facts.md §2.9 quotes this one)
    "07d92dd514d4:142935:143254 [0] transport/net_ib.cc:100 NCCL WARN NET/IB : mlx5_3:1 Got async event : "
    "GID table change",
    H + "transport/net_ib.cc:95 NCCL WARN NET/IB : Got async event : port active",
    # 2.23–2.27: the non-fatal branch, and GID change (18) falling to `unknown event type`
    H + "transport/net_ib.cc:199 NCCL WARN NET/IB : rocep1s0f1:1 Got async error event: port error",
    H + "transport/net_ib.cc:204 NCCL WARN NET/IB : roceP2p1s0f1:1 unknown event type (18)",
    # 2.28+
    H + "transport/net_ib/common.cc:153 (ncclIbAsyncThreadMain) NCCL WARN NET/IB : rocep1s0f1:1 GID table changed",
    H + "transport/net_ib/common.cc:172 (ncclIbAsyncThreadMain) NCCL WARN NET/IB : rocep1s0f1:1 Got non-fatal async "
        "event: port active(9)",
]
FATAL_WARNS = [
    H + "transport/net_ib.cc:168 NCCL WARN NET/IB : rocep1s0f1:1 async fatal event: local catastrophic error",
    H + "transport/net_ib.cc:95 NCCL WARN NET/IB : Got async event : local catastrophic error",
    H + "misc/ibvwrap.cc:100 NCCL WARN Call to ibv_modify_qp failed with 110 (Connection timed out)",
    H + "transport/net_ib.cc:204 NCCL WARN NET/IB : rocep1s0f1:1 unknown event type (19)",  # WQ fatal
]


@pytest.mark.parametrize("line", INFORMATIONAL)
def test_informational_nccl_warns_are_no_fault(line: str) -> None:
    assert not FATAL.search(line)  # the boot watcher goes on
    an = analyze_texts({"f.log": line + "\n"})
    assert an.faults == [] and [e.text for e in an.nccl["f.log"].notes] == [line]


@pytest.mark.parametrize("line", FATAL_WARNS)
def test_every_other_nccl_warn_is_fatal(line: str) -> None:
    assert FATAL.search(line)
    [f] = analyze_texts({"f.log": line + "\n"}).to_json()["faults"]
    assert f["kind"] == "nccl"


IB = [H + "NCCL INFO NCCL version 2.28.9+cuda13.0",
      H + "NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.200.1<0>",
      H + "NCCL INFO Using network IB"]
SOCKET = [H + "NCCL INFO NCCL version 2.28.9+cuda13.0",
          H + "NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.200.2<0>",
          H + "NCCL INFO Using network Socket"]
VLLM = ["(Worker_TP0_EP0 pid=3190) INFO 11-29 16:02:41 [__init__.py:1384] Found nccl from library libnccl.so.2",
        "(Worker_TP0_EP0 pid=3190) INFO 11-29 16:02:41 [pynccl.py:148] vLLM is using nccl==2.28.9"]


def test_transport_version_and_library_are_read_per_node() -> None:
    an = analyze_texts({"a.log": "\n".join(VLLM + IB) + "\n", "b.log": "\n".join(SOCKET) + "\n"})
    a, b = an.nccl["a.log"], an.nccl["b.log"]
    assert (a.transport, a.version, a.cuda, a.library) == ("IB", "2.28.9", "13.0", "libnccl.so.2")
    assert a.devices == "[0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]"
    assert b.transport == "Socket" and b.devices == "[0]enp1s0f1np1:192.168.200.2<0>"
    assert b.to_json()["transport"] == "Socket"
    # NCCL_DEBUG=WARN: NCCL still prints its version, bare (VERSION level, no host:pid prefix); no transport line
    assert analyze_texts({"w.log": "NCCL version 2.27.3+cuda12.9\n"}).nccl["w.log"].version == "2.27.3"


def _gates(head_extra: list[str], follower_extra: list[str]):
    def log(name: str, extra: list[str]):
        return parse_log((LOGS / name).read_bytes() + ("\n".join(extra) + "\n").encode(), file=name)

    # the fixture logs are vLLM 0.33.0's: judged as for an image of that dialect (no signature lines named)
    expect = Expectations.from_config(load_config(None), mask_file=True, dialect=shipped("0.33.0"))
    lg = {"spark-a": log("v0.33-head.log", head_extra), "spark-b": log("v0.33-follower.log", follower_extra)}
    return judge(lg, expect, smoke=SMOKE_OK, liveness=ALIVE, identity=SAME)


def test_the_faults_gate_passes_on_ib_and_fails_on_the_socket_fallback() -> None:
    ok = _gates(VLLM + IB, IB)
    g = {v.name: v for v in ok.gates}
    assert ok.ok and g["faults"].observed["transport"] == {"spark-a": "IB", "spark-b": "IB"}
    assert "NCCL over IB/RoCE on spark-a, spark-b" in g["faults"].reason
    bad = {v.name: v for v in _gates(IB, SOCKET).gates}
    assert not bad["faults"].ok and "socket transport on spark-b" in bad["faults"].reason
    assert any("Using network Socket" in e.text for e in bad["faults"].evidence)
    # a GID table change on a twin is reported, not failed
    noted = {v.name: v for v in _gates(IB + INFORMATIONAL[:1], IB).gates}
    assert noted["faults"].ok and "1 informational NCCL WARN line(s)" in noted["faults"].reason


def test_identity_records_each_nodes_nccl_and_fails_when_they_differ() -> None:
    g = {v.name: v for v in _gates(VLLM + IB, IB).gates}
    assert g["identity"].ok
    assert g["identity"].observed["spark-a"]["nccl"] == {"version": "2.28.9", "cuda": "13.0", "library": "libnccl.so.2"}
    other = [ln.replace("2.28.9+cuda13.0", "2.29.7+cuda13.0") for ln in IB]
    g = {v.name: v for v in _gates(IB, other).gates}
    assert not g["identity"].ok and "NCCL version differs: spark-a=2.28.9" in g["identity"].reason
