"""Boot logs of any vLLM version (0.25 captures, 0.33 emulator) as ordered events per process role.

An event is (role, key): role is APIServer / EngineCore / MainProcess / Worker (a node runs one worker here)
/ uvicorn / bars; key names the message (the formats_033 key; 0.25 wordings are mapped onto the same keys).
``compare`` lists the differences that remain once the documented 0.25 → 0.33 changes are allowed for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import formats_033 as F

REC = re.compile(r"^(?:\((?P<proc>[A-Za-z_]\w*) pid=(?P<pid>\d+)\) )?(?:(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                 r"\d\d-\d\d \d\d:\d\d:\d\d \[(?P<file>[^\]:]+):(?P<line>\d+)\] (?P<msg>.*)|(?P<raw>.*))$")
BAR = re.compile(r"^(?P<desc>Loading safetensors checkpoint shards|Capturing CUDA graphs \((?:PIECEWISE|FULL)\)|"
                 r"Capturing (?:dflash|dflash2) CUDA graphs \(FULL\)): +\d+%")

# 0.25.1 wordings of events whose 0.33 text changed (vllm-facts.md 2.1, 2.3)
V025_ALIASES = [
    (re.compile(r"Model loading took [\d.]+ GiB and [\d.]+ seconds"), "model_load"),
    (re.compile(r"GPU KV cache size: [\d,]+ tokens"), "kv_size"),
    (re.compile(r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x"), "kv_size_concurrency"),
    (re.compile(r"rank \d+ in world size \d+ is assigned as DP rank \d+, PP rank \d+, PCP rank \d+, TP rank \d+, "
                r"EP rank \S+, EPLB rank \S+"), "assigned"),
]
# Events of the 0.25.1 H200 capture that 0.33 on a Spark does not print, and why (the allowed differences).
ONLY_IN_025 = {
    "v025:ulimit": (r"Found ulimit of", "host fd-limit warning of the capture machine"),
    "v025:async": (r"Asynchronous scheduling is enabled\.", "no such message in vLLM 0.33.0"),
    "v025:max_sched": (r"max_num_scheduled_tokens is set to", "0.33 warns only below 8192 scheduled tokens"),
    "v025:torch_threads": (r"Reducing Torch parallelism", "no such message in vLLM 0.33.0"),
    "v025:symm_mem": (r"SymmMemCommunicator", "H200 single-machine symmetric memory; a Spark pair warns about MNNVL"),
    "v025:deep_gemm": (r"deep_gemm|DeepGEMM", "Hopper DeepGEMM kernels, not on an SM121 Spark image"),
    "v025:cutedsl": (r"Skipping CuTeDSL warmup", "DEBUG level in 0.33.0"),
    "v025:kv_concurrency": (r"^$", "merged into the KV cache size line (0.30+)"),
}
ONLY_IN_033 = {
    "tc_start": "`[tag] Starting torch.compile` is new in 0.32+",
    "mnnvl": "multi-node Spark pair: custom collectives off (replaces the H200 symm-mem warning)",
}
COLLAPSE = {"route", "logo"}  # one event however many lines


@dataclass(frozen=True)
class Event:
    role: str
    key: str
    proc: str
    text: str


def _key(msg: str) -> str | None:
    for f, rx in F._COMPILED:
        if rx.fullmatch(msg) and not f.exc:
            return f.key
        if f.exc and msg.startswith(f.fmt):
            return f.key
    for rx, key in V025_ALIASES:
        if rx.fullmatch(msg):
            return key
    for key, (pat, _) in ONLY_IN_025.items():
        if pat != "^$" and re.search(pat, msg):
            return key
    return None


def _role(proc: str | None) -> str:
    if proc is None:
        return "MainProcess"
    return "Worker" if proc.startswith("Worker") else proc


def events(text: str, until: str | None = None) -> list[Event]:
    """Events in file order; stops after the first line containing ``until``."""
    out: list[Event] = []
    for line in re.split(r"\r?\n", text):
        if line.startswith("$ "):
            continue
        m = REC.match(line)
        if m is None:
            continue
        proc = m.group("proc")
        if m.group("msg") is not None:
            msg = m.group("msg")
            if msg.strip() == "" or "█" in msg or "▀▀" in msg:
                key: str | None = "logo"
            else:
                key = _key(msg)
            out.append(Event(_role(proc), key or f"?{msg[:60]}", proc or "MainProcess", msg))
        else:
            raw = m.group("raw")
            for seg in raw.split("\r"):
                b = BAR.match(seg)
                if b and "100%" in seg:  # one event per finished bar
                    out.append(Event("bars", b.group("desc"), proc or "", seg))
            u = re.match(r"^(?:INFO|WARNING|ERROR):\s+(Started server process|Waiting for application startup\.|"
                         r"Application startup complete\.)", raw)
            if u:
                out.append(Event("uvicorn", u.group(1), proc or "", raw))
        if until and until in line:
            break
    return out


def sequence(evs: list[Event], role: str, drop: set[str]) -> list[str]:
    seq: list[str] = []
    for e in evs:
        if e.role != role or e.key in drop:
            continue
        if seq and e.key == seq[-1] and e.key in COLLAPSE:
            continue
        seq.append(e.key)
    return seq


def compare(real: list[Event], emu: list[Event]) -> dict[str, tuple[list[str], list[str]]]:
    """Per role: (real sequence, emulator sequence) where they differ after the allowed differences."""
    drop_real = set(ONLY_IN_025) | {"kv_size_concurrency"}
    drop_emu = set(ONLY_IN_033)
    diffs = {}
    for role in sorted({e.role for e in real} | {e.role for e in emu}):
        a, b = sequence(real, role, drop_real), sequence(emu, role, drop_emu)
        if a != b:
            diffs[role] = (a, b)
    return diffs
