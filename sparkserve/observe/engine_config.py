"""What a stack was configured with, as its logs print it: the EngineCore config dump and the API server's
``non-default args``.

The dump wins over the args (it is what the engine built); the args fill in what the dump lacks. The
0.10–0.11 dump is JSON (``"cudagraph_mode":[2,1]``), 0.12+ a dict repr (``<CUDAGraphMode.X: (2, 1)>``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sparkserve.observe.events import Event
from sparkserve.observe.logpatterns import CUDAGRAPH_MODE_VALUES, Kind
from sparkserve.observe.logs import ParsedLog

_MODE_REPR = re.compile(
    r"""['"]cudagraph_mode['"]\s*:\s*(?:<CUDAGraphMode\.(?P<enum>\w+)[^>]*>|\[(?P<pair>\d+,\s*\d+)\]"""
    r"""|(?P<num>\d+)|['"](?P<name>\w+)['"]|CUDAGraphMode\.(?P<bare>\w+))"""
)
_SPEC_CFG = re.compile(r"speculative_config=SpeculativeConfig\((?P<body>[^)]*)\)")
_SPEC_ARGS = re.compile(r"""['"]speculative_config['"]\s*:\s*\{(?P<body>[^{}]*)\}""")


@dataclass(frozen=True)
class EngineConfig:
    """The configuration facts the logs state; ``None`` where no line says."""

    cudagraph_mode: str | None  # from the engine dump, else from the args
    enforce_eager: bool | None
    spec_method: str | None
    num_speculative_tokens: int | None


def engine_config(logs: Sequence[ParsedLog]) -> EngineConfig:
    """The configuration stated by the ENGINE_CONFIG and NON_DEFAULT_ARGS events of ``logs``."""
    dump_mode = args_mode = None
    enforce_eager: bool | None = None
    method = k = None
    spec_found = False
    for e in _events(logs, Kind.ENGINE_CONFIG):
        cfg = e.data.get("config", "")
        dump_mode = _mode_from(cfg) or dump_mode
        ee = re.search(r"\benforce_eager=(True|False)", cfg)
        if ee:
            enforce_eager = ee.group(1) == "True"
        mm, kk, found = _spec_from_config(cfg)
        if found:
            spec_found = True
            method, k = mm or method, kk or k
    for e in _events(logs, Kind.NON_DEFAULT_ARGS):
        args = e.data.get("args", "")
        args_mode = _mode_from(args) or args_mode
        if enforce_eager is None and re.search(r"""['"]enforce_eager['"]\s*:\s*True""", args):
            enforce_eager = True
        if not spec_found:
            mm, kk = _spec_from_args(args)
            method, k = method or mm, k or kk
    return EngineConfig(dump_mode or args_mode, enforce_eager, method, k)


def parallel_sizes(logs: Sequence[ParsedLog]) -> tuple[int | None, int | None]:
    """(tensor_parallel_size, pipeline_parallel_size) as configured, None where not stated."""
    tp = pp = None
    for e in _events(logs, Kind.ENGINE_CONFIG, Kind.NON_DEFAULT_ARGS):
        if e.kind is Kind.ENGINE_CONFIG:
            cfg = e.data.get("config", "")
            tp = _int_of(r"\btensor_parallel_size=(\d+)", cfg) or tp
            pp = _int_of(r"\bpipeline_parallel_size=(\d+)", cfg) or pp
        elif tp is None:
            tp = _int_of(r"""['"]tensor_parallel_size['"]:\s*(\d+)""", e.data.get("args", ""))
    return tp, pp


def _events(logs: Sequence[ParsedLog], *kinds: Kind) -> list[Event]:
    return [e for log in logs for e in log.events if e.kind in kinds]


def _int_of(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


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
