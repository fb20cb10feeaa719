"""`sparkserve tune K | max-num-seqs | capture-sizes`: an A/B campaign over one setting's candidate values, read
as a recommendation per cell (campaign/tune.py), optionally written into the config file (`--apply`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sparkserve.commands._common import AcceptNew, ConfigOpt, JsonOpt, config_from, console, emit_json, err_console
from sparkserve.commands.measure import DesignName, ProtocolName, _say, cell_specs
from sparkserve.errors import BadInput


class Knob(StrEnum):
    K = "K"
    max_num_seqs = "max-num-seqs"
    capture_sizes = "capture-sizes"


def _values(knob: Knob, text: str | None) -> list[Any] | None:
    """``--values 3,5,7`` (capture-sizes: ladders split by ``;``, e.g. ``1,2,4,8;1,2,4,8,16``)."""
    if text is None:
        return None
    try:
        if knob is Knob.capture_sizes:
            return [[int(x) for x in part.split(",") if x.strip()] for part in text.split(";") if part.strip()]
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput("--values", f"{text!r}: whole numbers, comma-separated (capture-sizes: ladders split by "
                       "';', e.g. 1,2,4,8;1,2,4,8,16)") from None


def tune(
    knob: Annotated[Knob, typer.Argument(help="K (speculative.num_speculative_tokens) · max-num-seqs · "
                                         "capture-sizes (compilation.cudagraph_capture_sizes)")],
    values: Annotated[str | None, typer.Option(
        "--values", help="the candidates, comma-separated (default: what the drafter and the card allow, the card's "
        "first); capture-sizes: ladders split by ';'")] = None,
    cells: Annotated[str, typer.Option("--cells", help="comma-separated: smoke, c1, c16, c16-k4, mt4096")] = "c1,c16",
    size: Annotated[list[str] | None, typer.Option(
        "--size", help="CELL=PROMPTSxCONCURRENCYxTOKENS, e.g. c16=64x16x256 (default: the card's sizes)")] = None,
    rounds: Annotated[int, typer.Option("--rounds", help="boots per candidate, interleaved ABBA; the campaign looks "
                                        "for a clear leader after every pair of rounds")] = 4,
    prompts: Annotated[Path | None, typer.Option(
        "--prompts", help="your traffic, JSONL (default: bench.prompts — the card's holdout set — else the "
        "built-in set)")] = None,
    max_boots: Annotated[int | None, typer.Option("--max-boots", min=1, help="at most N boots in all")] = None,
    max_minutes: Annotated[float | None, typer.Option("--max-minutes", min=1, help="stop before a boot that would "
                                                       "pass M minutes")] = None,
    min_effect: Annotated[float, typer.Option("--min-effect", min=0, help="percent: smaller differences are read "
                                              "as noise even with an interval clear of 0 (the spread between boots "
                                              "of one candidate, when larger, raises it)")] = 1.0,
    apply: Annotated[bool, typer.Option("--apply", help="write the primary cell's choice into the config file "
                                        "(comments kept, a comment cites the campaign)")] = False,
    primary: Annotated[str | None, typer.Option("--primary", help="the cell whose choice --apply writes (default "
                                                "c16, else the first)")] = None,
    design: Annotated[DesignName, typer.Option("--design", help="sequential · crossed (replicas: N, a replica per "
                                               "candidate)")] = DesignName.sequential,
    protocol: Annotated[ProtocolName, typer.Option(
        "--protocol", help="card (the holdout client, not streamed) · forced (streamed: TPOT too)")
    ] = ProtocolName.card,
    chat_template: Annotated[Path | None, typer.Option(
        "--chat-template", help="card: the target's tokenizer dir / tokenizer_config.json / .jinja")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="order and bootstrap seed (default: random, recorded)")]
    = None,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="bootstrap resamples")] = 2000,
    config: ConfigOpt = None,
    accept_new: AcceptNew = False,
    json_out: JsonOpt = False,
) -> None:
    """Find the best value of one setting for your traffic: an A/B campaign over its candidates, a table per cell
    (AL, E2E p50, tok/s, TPOT where streamed, with 95 % intervals) and a recommendation that never claims a
    difference the interval does not support.

    Exit 0 done (also when it stopped early: said so) · 2 bad input (nothing started) · 3 a node or step failed,
    or interrupted (what served before is restored; `sparkserve ab run --resume ID` finishes the campaign)."""
    from sparkserve.campaign.tune import TuneRequest, apply_choice, run_tune
    from sparkserve.config import find_config_path
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config, accept_new=accept_new, check=True, replicas=True)
    config_file = find_config_path(config)
    if apply and config_file is None:
        raise BadInput("--apply", "no config file to write (the embedded default): `sparkserve init` writes one")
    if protocol is ProtocolName.forced and chat_template is not None:
        raise BadInput("--chat-template", "only the card protocol renders prompts client-side")
    req = TuneRequest(knob=knob.value, cells=cell_specs(cells, size), values=_values(knob, values), rounds=rounds,
                      prompts=prompts or (cfg.bench.prompts.expanduser() if cfg.bench.prompts else None), seed=seed,
                      primary=primary, bootstrap=bootstrap, protocol=protocol.value, chat_template=chat_template,
                      design=design.value, max_boots=max_boots, max_minutes=max_minutes, min_effect=min_effect / 100)
    if rounds < 2:
        raise BadInput("--rounds", "tune needs at least 2 rounds: an interval across boots needs two of each")
    say = _say(json_out)
    with open_nodes(cfg) as nodes:
        out = run_tune(cfg, nodes, req, say=say, progress=not json_out)
    applied = apply_choice(config_file, out) if apply and config_file is not None else None
    if json_out:
        emit_json({"campaign": out.campaign, "knob": out.knob, "primary": out.primary, "stopped": out.stopped,
                   "notes": out.notes, "values": out.values, "choice": out.choice, "applied": applied,
                   "restored": out.outcome.restored if out.outcome else None,
                   "table": out.table.model_dump(mode="json")})
        return
    print_table(out)
    if out.outcome is not None:
        err_console.print(f"[dim]·[/dim] {out.outcome.restored}")
    if applied:
        console.print(applied, markup=False, highlight=False)


def print_table(out: Any) -> None:
    from sparkserve.measure.tune_stats import table_rows

    for cell in out.table.cells:
        header, rows = table_rows(out.table, cell)
        t = Table(title=f"tune {out.knob} — campaign {out.campaign}, cell {cell.cell}")
        for h in header:
            t.add_column(h)
        for r in rows:
            t.add_row(*r)
        console.print(t)
    for cell in out.table.cells:
        console.print(cell.advice[:1].upper() + cell.advice[1:] + ".", markup=False, highlight=False)
        if cell.why:
            console.print(cell.why, markup=False, highlight=False, style="dim")
    for n in out.notes:
        console.print(f"note: {n}", markup=False, highlight=False)
    for e in out.outcome.report.analysis.excluded if out.outcome is not None else []:
        err_console.print(f"excluded: {e}", markup=False, highlight=False, style="yellow")
    if out.stopped:
        console.print(f"Stopped early: {out.stopped}.", markup=False, highlight=False)
    console.print(f"Full report: `sparkserve ab report {out.campaign}`", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)


__all__ = ["register", "tune"]
