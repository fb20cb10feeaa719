"""Property: wrapping every line of a log in an envelope never changes what ``logs analyze`` reads (issue 44).

Every log of the public corpus (tests/fixtures/logs/public) is analysed once bare, then again with every line
wrapped in generated envelopes: a prefix built from timestamp, host and pipe shapes (CI stamps, journald in
several locales, log-table rows, kubectl and compose columns), an optional suffix (a table's closing pipe), an
encoding (UTF-8 with or without a BOM, UTF-16 either order with or without a BOM, Latin-1) and CRLF, LF or
mixed line ends. The JSON must be the same as the bare file's, but for the ``envelopes`` it reports.

The generator is a seeded ``random.Random`` of our own, not hypothesis: hypothesis is no dependency of the
project, and a fixed seed gives the same envelopes on every run (a failure names the envelope and the log, and
reproduces). :data:`ENVELOPES` envelopes are drawn; each log is wrapped in :data:`PER_LOG` of them, so every
envelope covers several logs and the test stays a few seconds long.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkserve.observe.analyze import analyze
from sparkserve.observe.envelope import decode, detect_encoding
from sparkserve.observe.logs import parse_log

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "public"
ENVELOPES = 24
PER_LOG = 3
SEED = 44

MONTHS = {"en": ["Jan", "Feb", "Mar", "Nov"], "de": ["Jan", "Feb", "Mär", "Okt"], "ru": ["янв", "фев", "авг"],
          "fr": ["janv.", "févr.", "août"], "es": ["ene", "feb", "ago"]}


@dataclass(frozen=True)
class Envelope:
    name: str
    prefix: Callable[[int], str]  # line number → the text before it
    suffix: str
    encoding: str
    bom: bool
    ends: str  # lf | crlf | mixed


def _stamp(rng: random.Random) -> Callable[[int], str]:
    """A timestamp shape, rising with the line number."""
    style = rng.choice(["iso_z", "iso_ns", "iso_off", "space_ms", "space_comma", "journald", "hms"])
    day, base = rng.randint(1, 28), rng.randint(0, 80000)
    loc = rng.choice(sorted(MONTHS))
    month = rng.choice(MONTHS[loc])

    def at(i: int) -> str:
        t = base + i // 3
        h, m, s = t // 3600 % 24, t // 60 % 60, t % 60
        ms = (i * 37) % 1000
        return {
            "iso_z": f"2025-07-{day:02d}T{h:02d}:{m:02d}:{s:02d}.{ms:03d}Z",
            "iso_ns": f"2026-01-{day:02d}T{h:02d}:{m:02d}:{s:02d}.{ms:03d}456789Z",
            "iso_off": f"2025-11-{day:02d}T{h:02d}:{m:02d}:{s:02d}+02:00",
            "space_ms": f"2025-11-{day:02d} {h:02d}:{m:02d}:{s:02d}.{ms:03d}123",
            "space_comma": f"2024-05-{day:02d} {h:02d}:{m:02d}:{s:02d},{ms:03d}",
            "journald": f"{month} {day:2d} {h:02d}:{m:02d}:{s:02d}",
            "hms": f"{h:02d}:{m:02d}:{s:02d}",
        }[style]

    return at


def _prefix(rng: random.Random) -> tuple[str, Callable[[int], str]]:
    stamp = _stamp(rng)
    host = rng.choice(["spark-a", "gpu-node-07", "ip-10-0-3-17", "master-0", "llm", "worker1.example.com"])
    shape = rng.choice(["ci_brackets", "ci_bare", "table", "journald", "kubectl", "compose_ts", "arrow", "level_col",
                        "ts_pipe"])
    pid = rng.randint(100, 99999)
    forms: dict[str, Callable[[int], str]] = {
        "ci_brackets": lambda i: f"[{stamp(i)}] ",
        "ci_bare": lambda i: f"{stamp(i)} ",
        "table": lambda i: f"  |   | {stamp(i)} {host} >> ",
        "journald": lambda i: f"{stamp(i)} {host} vllm[{pid}]: ",
        "kubectl": lambda i: f"[pod/{host}/vllm] ",
        "compose_ts": lambda i: f"{host}-1  | {stamp(i)} ",
        "arrow": lambda i: f"{host} {stamp(i)} > ",
        "level_col": lambda i: f"{stamp(i)} [Info] (Process) ",
        "ts_pipe": lambda i: f"| {stamp(i)} | {host} | ",
    }
    return shape, forms[shape]


def envelopes(seed: int = SEED, n: int = ENVELOPES) -> list[Envelope]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        shape, prefix = _prefix(rng)
        suffix = rng.choice(["", "", " |", "  |  ", " │"]) if shape in ("table", "ts_pipe") else rng.choice(["", ""])
        encoding, bom = rng.choice([("utf-8", False), ("utf-8", True), ("utf-16-le", True), ("utf-16-le", False),
                                    ("utf-16-be", True), ("latin-1", False)])
        ends = rng.choice(["lf", "crlf", "mixed"])
        out.append(Envelope(f"#{k} {shape} {encoding}{'+bom' if bom else ''} {ends}{' suffix' if suffix else ''}",
                            prefix, suffix, encoding, bom, ends))
    return out


_BOM = {"utf-8": b"\xef\xbb\xbf", "utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}


def wrap(text: str, env: Envelope) -> bytes:
    """Every line of ``text`` inside ``env``, encoded."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rng = random.Random(len(text))
    out = []
    for i, line in enumerate(lines):
        body = line[:-1] if line.endswith("\r") else line  # a CRLF file's line ends are the envelope's now
        end = {"lf": "\n", "crlf": "\r\n", "mixed": rng.choice(["\n", "\r\n"])}[env.ends]
        out.append(env.prefix(i) + body + env.suffix + end)
    wrapped = "".join(out)
    encoding = env.encoding
    if encoding == "latin-1" and not _latin1(wrapped):
        encoding = "utf-8"  # text Latin-1 cannot hold (a bar's blocks, Cyrillic) stays UTF-8
    data = wrapped.encode(encoding, "surrogateescape" if encoding == "utf-8" else "strict")
    return (_BOM[encoding] if env.bom and encoding in _BOM else b"") + data


def _latin1(s: str) -> bool:
    try:
        s.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def verdict(data: bytes, name: str) -> dict[str, Any]:
    """``logs analyze --json`` without what only the envelope decides: the ``envelopes`` it reports, and the blanks
    at the end of a quoted line (a suffix takes the blanks before it, as a log table pads its column)."""
    j = analyze([parse_log(data, file=name)]).to_json()
    j.pop("envelopes")
    for item in [*j["faults"], j["ready_evidence"] or {}, j["request_errors"]["first"] or {}]:
        if "text" in item:
            item["text"] = item["text"].rstrip()
    return j


def corpus_text(name: str) -> str:
    """A corpus log's text (the derived UTF-16 twins too), read the way the envelope stage reads it."""
    data = (PUBLIC / name).read_bytes()
    encoding, bom = detect_encoding(data, whole=True)
    return decode(data, encoding, bom)


LOGS = sorted(p.name for p in PUBLIC.glob("*.log"))


def _plan() -> list[tuple[str, Envelope]]:
    envs = envelopes()
    rng = random.Random(SEED)
    plan = []
    for k, name in enumerate(LOGS):
        picks = {envs[(k * PER_LOG + j) % len(envs)].name: envs[(k * PER_LOG + j) % len(envs)] for j in range(PER_LOG)}
        picks.setdefault(rng.choice(envs).name, rng.choice(envs))
        plan.extend((name, e) for e in list(picks.values())[:PER_LOG])
    return plan


@pytest.mark.parametrize("name", LOGS)
def test_a_log_in_any_envelope_reads_as_the_bare_log(name: str) -> None:
    text = corpus_text(name)
    bare = verdict(text.encode("utf-8", "surrogateescape"), name)
    for log, env in _plan():
        if log != name:
            continue
        got = verdict(wrap(text, env), name)
        assert got == bare, f"{name} in envelope {env.name}: {json.dumps(_diff(bare, got))[:600]}"


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}


def test_the_property_covers_the_whole_corpus_in_at_least_20_envelopes() -> None:
    plan = _plan()
    assert {n for n, _ in plan} == set(LOGS) and len(LOGS) >= 95
    assert len({e.name for _, e in plan}) >= 20
    kinds = {e.name.split()[1] for _, e in plan}
    assert {"ci_brackets", "table", "journald", "kubectl"} <= kinds
