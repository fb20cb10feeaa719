"""Score the log reader on real public vLLM logs: fields right / total, per field, and the misses.

    .venv/bin/python bench/score_logs.py [--corpus tests/fixtures/logs/public] [--json]

Each log in the corpus is analysed alone, as ``sparkserve logs analyze FILE --json`` does (the same function,
in-process), and compared with the verdicts a person wrote in ``expected.json`` by reading the log:
``kv_cache_tokens`` (first value), ``graphs``, ``ready``, ``spec_method``, ``mask_embedding_loaded`` and ``fault``
(faults[0]'s text holds one of the given substrings; null = no fault at all), and where a verdict gives it
``rank_graphs`` (each rank's ``graphs``) and ``failed_boot_kv_cache_tokens`` (first value); a field left out is not
scored. A log may name the kinds of reading it exercises (``"kinds": [1, 4]``, :data:`KINDS`: issue 32's six kinds,
issue 44's 7–12); the figures
and misses are then also printed per kind. Exit 1 when the reader crashed on any log, 0 otherwise — the score
itself is judged by tests/unit/test_public_logs.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests/fixtures/logs/public"
FIELDS = ("kv_cache_tokens", "graphs", "ready", "spec_method", "mask_embedding_loaded", "fault", "rank_graphs",
          "failed_boot_kv_cache_tokens")
#: The kinds of reading issue 32 named (each seen misread in more than one held-out log), then issue 44's (7–12).
KINDS = {
    1: "ready false on a fatal start-up failure",
    2: "per-request errors are no engine fault",
    3: "NCCL's own lines are evidence, the watchdog is the fault",
    4: "the exception, not the frame; a cut EngineCore traceback is a fault",
    5: "KV and graphs behind prefixes",
    6: "output-handler and busy-loop deaths while serving",
    7: "encoding: UTF-16 (BOM or not), Latin-1, mixed CRLF/LF",
    8: "an envelope the file reveals: CI stamps, log tables, journald",
    9: "capture seen only in bars",
    10: "a start-up failure in one line (bare ValueError, Cuda error)",
    11: "an INFO wait during a boot is slowness, not a fault",
    12: "a pool printed, then a failed boot: failed_boot_kv_cache_tokens",
}


@dataclass
class Score:
    """Which (log, field) pairs the reader got right, the misses with both values, and the logs it crashed on."""

    right: set[tuple[str, str]] = field(default_factory=set)
    misses: list[tuple[str, str, Any, Any]] = field(default_factory=list)  # (log, field, expected, observed)
    crashes: dict[str, str] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, list[int]] = field(default_factory=dict)  # log → the kinds of reading it exercises
    scored: list[tuple[str, str]] = field(default_factory=list)  # every (log, field) scored

    def per_kind(self) -> dict[int, tuple[int, int]]:
        """Kind → (right, total) over the scored fields of the logs that name it."""
        out: dict[int, tuple[int, int]] = {}
        for k in KINDS:
            pairs = [(n, f) for n, f in self.scored if k in self.kinds.get(n, [])]
            out[k] = (sum(1 for p in pairs if p in self.right), len(pairs))
        return out

    def per_field(self) -> dict[str, tuple[int, int]]:
        return {f: (sum(1 for _, g in self.right if g == f), self.total.get(f, 0)) for f in FIELDS}

    def fraction(self) -> float:
        total = sum(self.total.values())
        return len(self.right) / total if total else 0.0


def observed(analysis_json: dict[str, Any]) -> dict[str, Any]:
    """The scored fields of one ``logs analyze --json`` object."""
    faults = analysis_json["faults"]
    kv = analysis_json["kv_cache_tokens"]
    return {
        "kv_cache_tokens": kv[0] if kv else None,
        "graphs": analysis_json["graphs"],
        "ready": analysis_json["ready"],
        "spec_method": analysis_json["spec"]["method"],
        "mask_embedding_loaded": analysis_json["spec"]["mask_embedding_loaded"],
        "fault": faults[0]["text"] if faults else None,
        "rank_graphs": {r: st["graphs"] for r, st in analysis_json["ranks"].items()},
        "failed_boot_kv_cache_tokens": (analysis_json.get("failed_boot_kv_cache_tokens") or [None])[0],
    }


def field_right(name: str, expected: Any, got: Any) -> bool:
    """Does the reader's value match the person's verdict? ``fault``: substring match, any alternative."""
    if name != "fault":
        return bool(expected == got)
    if expected is None:
        return got is None
    return got is not None and any(s in got for s in expected)


def analyze_one(path: Path) -> dict[str, Any]:
    """``sparkserve logs analyze PATH --json``, in-process."""
    from sparkserve.observe.saved import LogFile, analyze_files

    return analyze_files([LogFile(path=path)]).to_json()


def score(corpus: Path = CORPUS) -> Score:
    """Analyse every log named in ``expected.json`` and compare each field."""
    expected: dict[str, dict[str, Any]] = json.loads((corpus / "expected.json").read_text())
    result = Score()
    for name, verdicts in expected.items():
        result.kinds[name] = list(verdicts.get("kinds", []))
        try:
            got = observed(analyze_one(corpus / name))
        except Exception:  # a crash on any log is what this bench exists to catch
            result.crashes[name] = traceback.format_exc()
            got = None
        for f in FIELDS:
            if f not in verdicts:
                continue
            result.total[f] = result.total.get(f, 0) + 1
            result.scored.append((name, f))
            if got is not None and field_right(f, verdicts[f], got[f]):
                result.right.add((name, f))
            else:
                result.misses.append((name, f, verdicts[f], None if got is None else got[f]))
    return result


def _print(s: Score) -> None:
    for f, (right, total) in s.per_field().items():
        print(f"{f:28} {right:3}/{total:<3} {100 * right / total if total else 0:5.1f} %")
    total = sum(s.total.values())
    print(f"{'all fields':28} {len(s.right):3}/{total:<3} {100 * s.fraction():5.1f} %   crashes: {len(s.crashes)}")
    for k, (right, n) in s.per_kind().items():
        print(f"kind {k} {KINDS[k][:46]:46} {right:3}/{n:<3} {100 * right / n if n else 0:5.1f} %")
    for name, f, want, got in s.misses:
        shown = got if not isinstance(got, str) else got[:160]
        kinds = ",".join(str(k) for k in s.kinds.get(name, [])) or "-"
        print(f"MISS [kind {kinds}] {name} {f}: expected {want!r}, got {shown!r}")
    for name, tb in s.crashes.items():
        print(f"CRASH {name}\n{tb}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--json", action="store_true", help="print the score as JSON")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("sparkserve") is None:  # run from a checkout without the package installed
        sys.path.insert(0, str(ROOT))
    s = score(args.corpus)
    if args.json:
        print(json.dumps({
            "per_field": {f: {"right": r, "total": t} for f, (r, t) in s.per_field().items()},
            "per_kind": {str(k): {"right": r, "total": t} for k, (r, t) in s.per_kind().items()},
            "fraction": s.fraction(),
            "right": sorted(f"{n}:{f}" for n, f in s.right),
            "misses": [{"log": n, "field": f, "expected": w, "observed": g, "kinds": s.kinds.get(n, [])}
                       for n, f, w, g in s.misses],
            "crashes": sorted(s.crashes),
        }, indent=1))
    else:
        _print(s)
    return 1 if s.crashes else 0


if __name__ == "__main__":
    raise SystemExit(main())
