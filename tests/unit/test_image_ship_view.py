"""`image ship`'s progress: on a terminal a live table per target (bar, bytes sent of the total, bytes/s),
piped one plain line per target every few seconds, nothing with --json. The rendering is pure."""

from __future__ import annotations

import io

from rich.console import Console

from sparkserve.commands.image import ShipRow, ShipView, ship_line, ship_table


def _render(table) -> str:  # type: ignore[no-untyped-def]
    con = Console(file=io.StringIO(), width=100, color_system=None, record=True)
    con.print(table)
    return con.export_text()


def test_the_table_shows_every_target_with_bytes_of_total_and_rate() -> None:
    rows = {"node-b": ShipRow(12_300_000, 45_600_000, 2.0), "node-c": ShipRow(0, 45_600_000, 2.0)}
    text = _render(ship_table("node-a", rows, 2.4, "registry"))
    assert "shipping from node-a (registry) — 2s" in text
    b = next(line for line in text.splitlines() if "node-b" in line)
    assert "12.3 MB" in b and "45.6 MB" in b and "6.2 MB/s" in b
    c = next(line for line in text.splitlines() if "node-c" in line)
    assert "0.0 MB" in c and "0.0 MB/s" in c


def test_the_percentage_never_passes_100_and_an_empty_total_is_done() -> None:
    assert ShipRow(10_100, 10_000, 1.0).percent == 100.0  # tar headers on top of the layer bytes
    assert ShipRow(0, 0, 0.0).percent == 100.0 and ShipRow(0, 0, 0.0).rate == 0.0
    assert ShipRow(2_500, 10_000, 0.5).percent == 25.0


def test_the_plain_line() -> None:
    assert ship_line("node-a", "node-b", ShipRow(12_300_000, 45_600_000, 2.0)) == \
        "node-a → node-b: 12.3 MB of 45.6 MB (27%), 6.2 MB/s"
    assert ship_line("a", "b", ShipRow(2_000_000_000, 20_000_000_000, 10.0)).startswith("a → b: 2,000.0 MB of ")


def test_piped_it_prints_a_line_per_target_every_few_seconds_and_with_json_nothing() -> None:
    out = io.StringIO()
    con = Console(file=out, width=200, force_terminal=False, color_system=None)
    with ShipView("node-a", "stream", console=con, every_s=5.0) as view:
        for t in (0.5, 1.0, 4.9, 5.5, 6.0, 11.0):
            view.update("node-b", int(t * 1e6), 20_000_000, t)
        view.update("node-c", 1_000_000, 20_000_000, 6.0)
    lines = out.getvalue().splitlines()
    assert lines == ["node-a → node-b: 0.5 MB of 20.0 MB (2%), 1.0 MB/s",
                     "node-a → node-b: 5.5 MB of 20.0 MB (28%), 1.0 MB/s",
                     "node-a → node-b: 11.0 MB of 20.0 MB (55%), 1.0 MB/s",
                     "node-a → node-c: 1.0 MB of 20.0 MB (5%), 0.2 MB/s"]
    quiet = io.StringIO()
    with ShipView("node-a", "stream", enabled=False, console=Console(file=quiet)) as view:
        view.update("node-b", 1, 2, 1.0)
    assert quiet.getvalue() == ""


def test_on_a_terminal_the_live_table_stays_printed_at_the_end() -> None:
    out = io.StringIO()
    con = Console(file=out, width=120, force_terminal=True, color_system=None)
    with ShipView("node-a", "stream", console=con) as view:
        view.update("node-b", 20_000_000, 20_000_000, 2.0)
    text = out.getvalue()
    assert "node-b" in text and "20.0 MB" in text and "10.0 MB/s" in text
