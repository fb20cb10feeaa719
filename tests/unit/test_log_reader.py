"""The log reader's one pass (sparkserve.observe.reader): chunked reading changes no result, memory stays
bounded by the chunk rather than the log, every needle of the table is prefiltered, and the SpecDecoding fast
path agrees with the table's regex."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import pytest

from sparkserve.observe import logbytes, reader
from sparkserve.observe import logs as logs_mod
from sparkserve.observe.logpatterns import NEEDLES, FaultKind, Kind
from sparkserve.observe.logs import ParsedLog, parse_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
ALL_LOGS = sorted(FIXTURES.rglob("*.log"))


def digest(log: ParsedLog) -> list[tuple]:
    def ev(e) -> tuple:
        return (e.kind, e.rec.lineno, e.rec.text, e.rec.msg, sorted(e.data.items()), e.fault, e.sort_line, e.ts)

    return [
        *map(ev, log.events),
        ("faults", *map(ev, log.faults)),
        ("artefacts", *map(ev, log.artefacts)),
        ("stop", log.stop and ev(log.stop)),
        log.line_count,
    ]


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_tiny_chunks_and_blocks_change_nothing(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = digest(parse_log(path.read_bytes(), file=path.name))
    monkeypatch.setattr(logbytes, "CHUNK", 97)  # lines cut across chunks, lines longer than a chunk
    monkeypatch.setattr(logbytes, "BLOCK", 61)
    with path.open("rb") as f:
        assert digest(parse_log(f, file=path.name)) == whole


def test_cr_only_file_and_a_line_longer_than_a_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [
        "(EngineCore pid=2) INFO 11-29 16:03:45 [kv.py:1] GPU KV cache size: 1,234 tokens",
        "(EngineCore pid=2) INFO 11-29 16:03:46 [x.py:1] " + "x" * 500,
        "(EngineCore pid=2) ERROR 11-29 16:03:47 [core.py:1] EngineCore failed to start.",
    ]
    p = tmp_path / "cr.log"
    p.write_bytes("\r".join(lines).encode())
    monkeypatch.setattr(logbytes, "CHUNK", 64)
    with p.open("rb") as f:
        log = parse_log(f, file="cr.log")
    assert [e.line for e in log.of(Kind.KV_TOKENS)] == [1] and [e.line for e in log.faults] == [3]
    assert log.line_count == 3


def test_memory_is_bounded_by_the_chunk_not_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 MB of serving, a fault in the middle: the reader keeps the hit lines, never the log or a list of its lines
    access = '(APIServer pid=1) INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    fault = "(EngineCore pid=2) ERROR 11-29 16:03:47 [core.py:1] EngineCore failed to start.\n"
    p = tmp_path / "big.log"
    with p.open("w") as f:
        f.write(access * 50_000 + fault + access * 50_000)
    size = p.stat().st_size
    monkeypatch.setattr(logbytes, "CHUNK", 256 << 10)
    monkeypatch.setattr(logbytes, "WRAP_SAMPLE", 64 << 10)
    logbytes._database()  # compiled once per process: not the reader's memory
    tracemalloc.start()
    with p.open("rb") as f:
        log = parse_log(f, file="big.log")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [e.line for e in log.faults] == [50_001] and log.line_count == 100_001
    assert peak < size / 4, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB log"


@pytest.mark.parametrize("needle", NEEDLES)
def test_every_needle_of_the_table_reaches_the_classifier(needle: str) -> None:
    # the prefilter is built from the table: a line holding any needle is a candidate, with that needle
    r = reader.LogReader(f"(Worker pid=1) INFO 11-29 16:03:45 [a.py:1] x {needle} y\n".encode())
    assert [(i, needle in n) for i, n, _ in r.candidates()] == [(0, True)]


def test_a_c10_error_line_without_the_word_error_is_a_fault() -> None:
    text = "[rank1]:[E1129 16:38:40.098920893 ProcessGroup.cpp:12] [PG 0 Rank 1] the collective was aborted\n"
    log = parse_log(text, file="f")
    assert [(e.fault, e.line) for e in log.faults] == [(FaultKind.OTHER, 1)]


def test_boring_lines_are_never_candidates() -> None:
    access = '(APIServer pid=1) INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    assert list(reader.LogReader((access * 300).encode()).candidates()) == []


SPEC = (
    "SpecDecoding metrics: Mean acceptance length: 3.21, Accepted throughput: 150.22 tokens/s, Drafted throughput: "
    "350.11 tokens/s, Accepted: 1200 tokens, Drafted: 2800 tokens, Per-position acceptance rate: 0.900, 0.800, "
    "0.700, Avg Draft acceptance rate: 45.2%"
)


@pytest.mark.parametrize(
    "msg",
    [
        SPEC,
        SPEC.replace(", Avg Draft acceptance rate: 45.2%", ""),  # the rate list ends the line
        SPEC.replace("Per-position acceptance rate: ", "Per-position: "),  # no rate list
        SPEC.replace("3.21,", "3.21 ,"),  # a space before the comma: the regex decides
        SPEC.replace("0.900, 0.800", "0.900, x0.800"),  # a foreign character in the list
        SPEC.replace("3.21", "３.21"),  # a non-ASCII digit (\d takes it, the fast path leaves it to the regex)
        # 0.10.1's order
        "SpecDecoding metrics: Draft acceptance rate: 40.0%, Mean acceptance length: 2.80, Accepted: 5 tokens",
        SPEC + ", Avg again",
        SPEC.replace("0.900, 0.800, 0.700", ""),  # an empty list
        "SpecDecoding metrics: SpecDecoding metrics: Mean acceptance length: 1.5, x",
    ],
)
def test_spec_fast_path_agrees_with_the_table_regex(msg: str) -> None:
    line = f"(APIServer pid=3003) INFO 11-29 16:38:50 [metrics.py:120] {msg}"
    fast = logs_mod._spec_groups(line)
    m = logs_mod._SPEC_PATTERN.regex.search(line)
    assert fast is None or (m is not None and fast == m.groupdict())
    al = logs_mod._spec_al(line.encode())  # the bytes path every SpecDecoding line after the first takes
    assert al is None or (m is not None and al == m.group("al"))


def test_every_spec_line_counts_though_only_the_first_is_an_event() -> None:
    lines = [f"(APIServer pid=3003) INFO 11-29 16:38:{i:02d} [metrics.py:120] {SPEC.replace('3.21', f'3.{i:02d}')}"
             for i in range(5)]
    lines.insert(2, "(APIServer pid=3003) INFO 11-29 16:38:02 [metrics.py:120] "
                 + SPEC.replace("3.21,", "3.21 ,"))  # one the table decides (a space before the comma)
    log = parse_log(("\n".join(lines) + "\n").encode(), file="x")
    assert log.spec_al == ["3.00", "3.01", "3.21", "3.02", "3.03", "3.04"]
    assert log.spec_at == [0, 1, 2, 3, 4, 5]
    assert [e.line for e in log.of(Kind.SPEC_METRICS)] == [1, 3]  # the first, and the one the table read


def test_stdin_like_streams_are_read_whole() -> None:
    text = b"(EngineCore pid=2) ERROR 11-29 16:03:47 [core.py:1] EngineCore failed to start.\n"
    pipe = io.BufferedReader(io.BytesIO(text))  # no file descriptor a pread could use
    assert [e.line for e in parse_log(pipe, file="x").faults] == [1]


def test_the_collector_is_paused_only_while_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    seen = []
    monkeypatch.setattr(logs_mod, "_scan", lambda r: seen.append(gc.isenabled()) or ([], {}, []))
    assert gc.isenabled()
    parse_log(b"x\n", file="x")
    assert seen == [False] and gc.isenabled()

    def boom(r: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(logs_mod, "_scan", boom)
    with pytest.raises(RuntimeError):
        parse_log(b"x\n", file="x")
    assert gc.isenabled()  # restored after a failure too
    gc.disable()
    try:
        monkeypatch.setattr(logs_mod, "_scan", lambda r: ([], {}, []))
        parse_log(b"x\n", file="x")
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()
