"""`sparkserve bench`, `history`, `ab`: the seed-protocol cells, the journal, the A/B table of record."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from sparkserve.commands._common import ConfigOpt, JsonOpt, config_from, console, emit_json, err_console
from sparkserve.config import resolve_api_key
from sparkserve.errors import BadInput, GateFailed
from sparkserve.journal import Journal
from sparkserve.measure.bench import CELLS, BenchResult, run_cell
from sparkserve.measure.prompts import builtin_prompts, load_prompts
from sparkserve.plan.build import build_plan


class CellName(StrEnum):
    smoke = "smoke"
    c1 = "c1"
    c16 = "c16"


def bench(
    cell: Annotated[
        CellName, typer.Option("--cell", help="smoke 20×c1×512 · c1 100×c1×1024 · c16 500×c16×1024")
    ],
    prompts: Annotated[
        Path | None, typer.Option("--prompts", help='JSONL, one {"prompt": …} or {"messages": […]} per line')
    ] = None,
    json_out: JsonOpt = False,
    url: Annotated[str | None, typer.Option("--url", help="API base URL (default: the plan's head)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="default: model.served_name")] = None,
    config: ConfigOpt = None,
    deadline: Annotated[
        float | None, typer.Option("--request-timeout", help="per-request deadline, s (120 + tokens/5)")
    ] = None,
    stall: Annotated[float, typer.Option("--stall-timeout", help="silent this long = hung, s")] = 60.0,
) -> None:
    """Run one cell of the model card's bench protocol and record it in the journal."""
    cfg = config_from(config)
    plan = build_plan(cfg)
    prompt_set = load_prompts(prompts) if prompts else builtin_prompts()
    api_key = resolve_api_key(cfg)
    with Journal.open() as journal:  # open first: a broken journal fails before the run, not after
        fingerprint: str | None = None
        if url is None or config is not None:
            fingerprint = journal.latest_fingerprint_for_config(cfg.fingerprint()) or cfg.fingerprint()
        result = run_cell(
            url or plan.api_url,
            model or plan.served_name,
            CELLS[cell.value],
            prompt_set,
            node=None if url else plan.head.node,
            api_key=api_key,
            deadline_s=deadline,
            stall_timeout_s=stall,
            progress=not json_out,
        )
        raw = result.to_json()
        bench_id = journal.record_bench(fingerprint, result.cell, raw)
    if json_out:
        print(raw, end="")
    else:
        _print_result(result, bench_id)
    if result.refused:
        raise GateFailed(f"bench {result.cell}", f"refused: {result.refused[0]}", details=result.refused[1:])


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _print_result(r: BenchResult, bench_id: int) -> None:
    title = f"bench {r.cell} — {r.prompts} prompts × c{r.concurrency} × {r.max_tokens} tokens"
    t = Table(title=title, show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("server", f"{r.node + ' ' if r.node else ''}{r.url}  (boot id {_fmt(r.boot_id, '.0f')})")
    t.add_row("requests ok", f"{r.requests_ok} / {r.prompts}")
    t.add_row("stream errors", f"{r.stream_errors}" + (f"  {r.error_kinds}" if r.error_kinds else ""))
    t.add_row("incomplete", str(r.incomplete))
    t.add_row("output", f"{r.output_tokens:,} tokens in {r.duration_s:.2f} s = {r.output_tok_s:,.1f} tok/s")
    t.add_row("acceptance length", _fmt(r.acceptance_length))
    t.add_row("acceptance rate", _fmt(r.acceptance_rate))
    t.add_row("per position", "  ".join(f"{x:.3f}" for x in r.per_position_acceptance) or "n/a")
    t.add_row("drafts / draft tok / accepted", f"{r.drafts} / {r.draft_tokens} / {r.accepted_tokens}")
    t.add_row("journal", f"bench #{bench_id}")
    console.print(t)
    for e in r.errors[:5]:
        err_console.print(f"[red]request {e.request}[/red] {e.kind}: {e.detail}")
    for w in r.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}")


def history(
    json_out: JsonOpt = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="newest N records")] = 30,
) -> None:
    """What ran: deployments, gate runs, banked pools and bench results from the journal, newest first."""
    with Journal.open() as journal:
        entries = journal.history(limit)
        path = journal.path
    if json_out:
        emit_json({"journal": str(path), "entries": [e.as_dict() for e in entries]})
        return
    t = Table(title=f"journal {path}")
    for col in ("time", "kind", "id", "fingerprint", "ok", "summary"):
        t.add_column(col)
    for e in entries:
        ok = "" if e.ok is None else ("yes" if e.ok else "[red]no[/red]")
        summary = e.summary
        if e.sha256_ok is False:
            summary += "  [red](sha256 mismatch: edited after recording)[/red]"
        t.add_row(e.time[:19].replace("T", " "), e.kind, str(e.id), (e.fingerprint or "")[:12], ok, summary)
    console.print(t)


def _load_result(path: Path) -> BenchResult:
    try:
        return BenchResult.model_validate_json(path.read_bytes())
    except OSError as e:
        raise BadInput(str(path), f"cannot read ({e.strerror or e})") from e
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise BadInput(str(path), f"not a bench result: {loc + ': ' if loc else ''}{err['msg']}") from e


def _rel(x: float | None, base: float | None) -> float | None:
    if x is None or base is None or base == 0:
        return None
    return (x - base) / base


def ab_table(paths: list[Path]) -> dict[str, Any]:
    """Compare bench result files against the first (the baseline). Refuses unlike cells."""
    results = [(p, _load_result(p)) for p in paths]
    base_path, base = results[0]
    rows = []
    for p, r in results:
        if (r.cell, r.prompts, r.concurrency, r.max_tokens) != (base.cell, base.prompts, base.concurrency,
                                                               base.max_tokens):
            raise BadInput(
                str(p),
                f"cell {r.cell} ({r.prompts}×c{r.concurrency}×{r.max_tokens}) differs from the baseline "
                f"{base_path}'s {base.cell} ({base.prompts}×c{base.concurrency}×{base.max_tokens}): "
                "compare like with like",
            )
        n = max(len(r.per_position_acceptance), len(base.per_position_acceptance))
        pp = r.per_position_acceptance + [None] * (n - len(r.per_position_acceptance))
        bp = base.per_position_acceptance + [None] * (n - len(base.per_position_acceptance))
        rows.append({
            "file": str(p),
            "cell": r.cell,
            "ok": r.ok and not r.refused,
            "refused": r.refused,
            "stream_errors": r.stream_errors,
            "output_tok_s": r.output_tok_s,
            "output_tok_s_delta": _rel(r.output_tok_s, base.output_tok_s),
            "acceptance_length": r.acceptance_length,
            "acceptance_length_delta": _rel(r.acceptance_length, base.acceptance_length),
            "acceptance_rate": r.acceptance_rate,
            "acceptance_rate_delta": _rel(r.acceptance_rate, base.acceptance_rate),
            "per_position_acceptance": r.per_position_acceptance,
            "per_position_delta": [_rel(a, b) for a, b in zip(pp, bp, strict=True)],
            "boot_id": r.boot_id,
        })
    return {"baseline": str(base_path), "cell": base.cell, "rows": rows}


def _pct(d: float | None) -> str:
    if d is None:
        return ""
    return f" ({d * 100:+.1f}%)"


def ab(
    results: Annotated[list[Path], typer.Argument(help="bench --json result files; the first is A")],
    json_out: JsonOpt = False,
) -> None:
    """A/B table of record: output tok/s, acceptance length and per-position acceptance vs the first file."""
    table = ab_table(results)
    if json_out:
        emit_json(table)
        return
    t = Table(title=f"A/B {table['cell']} — baseline {table['baseline']}")
    for col in ("result", "tok/s", "AL", "acc. rate", "per-position acceptance", "errors", "valid"):
        t.add_column(col)
    for row in table["rows"]:
        pos = "  ".join(
            f"{x:.3f}{'' if d is None or row['file'] == table['baseline'] else f'({d * 100:+.0f}%)'}"
            for x, d in zip(row["per_position_acceptance"], row["per_position_delta"], strict=False)
        )
        base = row["file"] == table["baseline"]
        t.add_row(
            row["file"] + (" [dim](A)[/dim]" if base else ""),
            f"{row['output_tok_s']:,.1f}" + ("" if base else _pct(row["output_tok_s_delta"])),
            _fmt(row["acceptance_length"]) + ("" if base else _pct(row["acceptance_length_delta"])),
            _fmt(row["acceptance_rate"]) + ("" if base else _pct(row["acceptance_rate_delta"])),
            pos or "n/a",
            str(row["stream_errors"]),
            "yes" if row["ok"] else f"[red]REFUSED[/red]: {row['refused'][0] if row['refused'] else ''}",
        )
    console.print(t)
    for row in table["rows"]:
        if not row["ok"]:
            err_console.print(f"[yellow]warning:[/yellow] {row['file']} is a refused cell: figures not valid")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("history")(history)
    app.command("ab")(ab)


__all__ = ["register", "ab_table", "bench", "history", "ab"]
