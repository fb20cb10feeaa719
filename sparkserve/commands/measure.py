"""`sparkserve bench`, `history`, `ab`: the seed-protocol cells, the journal, the A/B table of record.

`ab` is a group: `ab run` (a campaign of drafters, banked in the journal), `ab report ID` (its table of
record), `ab diff RESULT…` (bench result files against the first; `ab RESULT…` still means this).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer
from rich.table import Table
from typer.core import TyperGroup

from sparkserve.commands._common import (
    AcceptNew,
    ConfigOpt,
    JsonOpt,
    config_from,
    console,
    emit_json,
    err_console,
)
from sparkserve.errors import BadInput, GateFailed
from sparkserve.journal import Journal, default_path, fallback_note
from sparkserve.measure.ab import compare_files
from sparkserve.measure.card_rows import DEFAULT_MATCH
from sparkserve.measure.records import CELLS, BenchResult, Cell
from sparkserve.measure.run import bench_and_record

if TYPE_CHECKING:
    from sparkserve.config import Config
    from sparkserve.deploy.power import PowerSampler
    from sparkserve.nodes.base import Node


class CellName(StrEnum):
    smoke = "smoke"
    c1 = "c1"
    c16 = "c16"
    c16_k4 = "c16-k4"
    mt4096 = "mt4096"


class DesignName(StrEnum):
    sequential = "sequential"
    crossed = "crossed"


class ProtocolName(StrEnum):
    card = "card"
    forced = "forced"


def _sized(cell: str, size: str | None) -> Cell:
    """The cell, or its ``--size PxCxT`` variant (the name and K kept)."""
    from sparkserve.measure.ab_records import parse_size

    base = CELLS[cell]
    if size is None:
        return base
    try:
        spec = parse_size(f"{cell}={size}")
    except BadInput as e:
        raise BadInput("--size", e.what.replace(f"{cell}=", "", 1)) from None
    return Cell(cell, prompts=spec.prompts, concurrency=spec.concurrency, max_tokens=spec.max_tokens, k=base.k)


def bench(
    cell: Annotated[
        CellName, typer.Option("--cell", help="smoke 20×c1×512 · c1 100×c1×1024 · c16 500×c16×1024 · c16-k4 "
                               "the c16 cell for a server drafting K=4 · mt4096 the deep-trace cell 500×c16×4096")
    ],
    prompts: Annotated[
        Path | None, typer.Option("--prompts", help='JSONL, one {"prompt": …} (the card\'s {"id", "prompt"} file '
                                  'works as it is) or {"messages": […]} per line')
    ] = None,
    protocol: Annotated[ProtocolName, typer.Option(
        "--protocol", help="card: the model card's holdout client (/v1/completions, prompt rendered with the "
        "target's chat template, EOS ends a request) · forced: streamed chat, output forced to max_tokens")
    ] = ProtocolName.card,
    chat_template: Annotated[Path | None, typer.Option(
        "--chat-template", help="card: the target's tokenizer dir / tokenizer_config.json / .jinja "
        "(default: model.target, when this machine has it)")] = None,
    size: Annotated[str | None, typer.Option(
        "--size", help="PROMPTSxCONCURRENCYxTOKENS instead of the cell's, e.g. 20x4x128")] = None,
    json_out: JsonOpt = False,
    url: Annotated[str | None, typer.Option("--url", help="API base URL (default: the plan's head)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="default: model.served_name")] = None,
    config: ConfigOpt = None,
    deadline: Annotated[
        float | None, typer.Option("--request-timeout", help="per-request deadline, s (forced: 120 + tokens/5; card: "
                                                 "1200, the card client's)")
    ] = None,
    stall: Annotated[float, typer.Option("--stall-timeout", help="forced: silent this long = hung, s")] = 60.0,
    replica: Annotated[int | None, typer.Option("--replica", help="replicas: N — bench replica K's own head API "
                                                "(default: through the router)")] = None,
    warmup: Annotated[int | None, typer.Option(
        "--warmup", min=0, help="unmeasured requests before the cell, at its concurrency and length (default: "
        "concurrency × 2; 0: none)")] = None,
) -> None:
    """Run one cell of the model card's bench protocol and record it in the journal."""
    the_cell = _sized(cell.value, size)
    if protocol is ProtocolName.forced and chat_template is not None:
        raise BadInput("--chat-template", "only the card protocol renders prompts client-side")
    cfg = config_from(config, nodes=False, replicas=True)  # HTTP to the API only: no SSH, no placeholder check
    _check_replica(cfg.replicas, replica, url)
    prompts = prompts or (cfg.bench.prompts.expanduser() if cfg.bench.prompts else None)  # the card's holdout
    say = (lambda _: None) if json_out else (lambda line: err_console.print(line, markup=False))
    with contextlib.ExitStack() as stack:
        window = None
        if url is None:  # the config's own stack(s): every rank alive first, or the dead one named at once
            window, chat_template = _stack_checks(cfg, stack, replica, say, protocol, chat_template)
        result, bench_id = bench_and_record(
            cfg, the_cell, prompts, url=url, model=model,
            config_given=config is not None, deadline_s=deadline, stall_timeout_s=stall, progress=not json_out,
            protocol=protocol.value, chat_template=chat_template, replica=replica, warmup=warmup, window=window,
        )
    if json_out:
        print(result.to_json(), end="")
    else:
        _print_result(result, bench_id)
    if result.refused:
        raise GateFailed(f"bench {result.cell}", f"refused: {result.refused[0]}", details=result.refused[1:])


def _stack_checks(cfg: Config, stack: contextlib.ExitStack, replica: int | None, say: Callable[[str], None],
                  protocol: ProtocolName, chat_template: Path | None) -> tuple[PowerSampler | None, Path | None]:
    """The config's own stack: every rank alive (or the dead one named at once), the nodes' power sampler over
    the measured window, and (card protocol, no --chat-template, the target not on this machine) the target's
    chat template read from the head. The nodes stay open in ``stack`` until the cell is done."""
    from sparkserve.deploy.chat_template_remote import head_template_dir, needs_remote_template
    from sparkserve.deploy.power import PowerSampler
    from sparkserve.deploy.stack import ranks_alive
    from sparkserve.nodes.factory import open_reachable
    from sparkserve.plan.replicas import replicas_of

    try:
        nodes, unreachable = stack.enter_context(open_reachable(cfg))
    except BadInput as e:  # nodes it cannot even try (a placeholder host): the API alone is benched
        say(f"warning: ranks' liveness not checked: {e.where}: {e.what}")
        return None, chat_template
    mine: dict[str, Node] = {}
    for r in replicas_of(cfg):
        if replica in (None, r.index):
            ranks_alive(r.cfg, {n: nodes[n] for n in r.nodes if n in nodes},
                        {n: e for n, e in unreachable.items() if n in r.nodes}, say=say)
            mine |= {n: nodes[n] for n in r.nodes if n in nodes}
    if protocol is ProtocolName.card and chat_template is None and needs_remote_template(cfg) \
            and cfg.head.name in nodes:
        chat_template = head_template_dir(cfg, nodes[cfg.head.name], say=say)
    return PowerSampler(mine), chat_template


def _check_replica(replicas: int, replica: int | None, url: str | None) -> None:
    if replica is None:
        return
    if url is not None:
        raise BadInput("--replica", "--url names the server itself: give one of them")
    if replicas < 2 or not 1 <= replica <= replicas:
        raise BadInput("--replica", f"{replica} is not a replica of this config (replicas: {replicas})")


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _print_result(r: BenchResult, bench_id: int | None) -> None:
    title = (f"bench {r.cell} — {r.prompts} prompts × c{r.concurrency} × {r.max_tokens} tokens, "
             f"{r.protocol} protocol")
    t = Table(title=title, show_header=False)
    t.add_column(style="bold")
    t.add_column()
    if r.router:  # replicas: N through the router, each replica's share counted on its own /metrics
        share = " · ".join(f"replica {p['replica']}: {p['requests'] if p['requests'] is not None else '?'}"
                           for p in r.per_replica)
        t.add_row("server", f"router {r.url} ({r.router['policy']}) → {r.router['replicas']} replicas")
        t.add_row("requests per replica", share)
    else:
        t.add_row("server", f"{f'replica {r.replica} ' if r.replica else ''}{r.node + ' ' if r.node else ''}"
                  f"{r.url}  (boot id {_fmt(r.boot_id, '.0f')})")
    t.add_row("protocol", f"{r.protocol}: {r.endpoint or ''}" + (
        f", prompts rendered with {r.chat_template}" if r.chat_template else ""))
    t.add_row("requests ok", f"{r.requests_ok} / {r.prompts}")
    t.add_row("stream errors", f"{r.stream_errors}" + (f"  {r.error_kinds}" if r.error_kinds else ""))
    if r.protocol != "card":  # the card protocol forces no length: EOS ends a request
        t.add_row("incomplete", str(r.incomplete))
    t.add_row("output", f"{r.output_tokens:,} tokens in {r.duration_s:.2f} s = {r.output_tok_s:,.1f} tok/s")
    if r.requests_per_s is not None:  # tok/s follows output length: requests/s and the length beside it
        t.add_row("requests/s · output length", f"{r.requests_per_s:,.3f} req/s · {_fmt(r.output_len_mean, ',.1f')} "
                  f"tokens mean, {_fmt(r.output_len_p50, ',.0f')} p50")
    for label, stats in _latency_rows(r):
        t.add_row(label, stats)
    if r.warmup is not None:
        w = r.warmup
        t.add_row("warm-up (not measured)", "none (--warmup 0)" if not w.requests else
                  f"{w.requests} requests at c{w.concurrency} × {w.max_tokens}: {w.output_tokens:,} tokens in "
                  f"{w.duration_s:.2f} s, {w.errors} errors")
    if r.power is not None:
        t.add_row("power", _power_text(r))
    t.add_row("acceptance length", _fmt(r.acceptance_length))
    t.add_row("acceptance rate", _fmt(r.acceptance_rate))
    t.add_row("per position", "  ".join(f"{x:.3f}" for x in r.per_position_acceptance) or "n/a")
    t.add_row("drafts / draft tok / accepted", f"{r.drafts} / {r.draft_tokens} / {r.accepted_tokens}"
              + (f"  (K={r.k})" if r.k is not None else ""))
    t.add_row("journal", f"bench #{bench_id}" if bench_id is not None else "not recorded (see the warning above)")
    console.print(t)
    for e in r.errors[:5]:
        err_console.print(f"[red]request {e.request}[/red] {e.kind}: {e.detail}")
    for w in r.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}")


def _latency_rows(r: BenchResult) -> list[tuple[str, str]]:
    """TTFT / TPOT / ITL / E2E rows (mean · median · p90 · p99 ms), vLLM's definitions."""
    lat = r.latency
    if lat is None:
        return []
    rows = []
    for name, s in (("TTFT", lat.ttft), ("TPOT", lat.tpot), ("ITL", lat.itl), ("E2E", lat.e2e)):
        if s is not None and s.n:
            rows.append((f"{name} ms mean/p50/p90/p99", " / ".join(
                _fmt(x, ",.1f" if name in ("TTFT", "E2E") else ",.2f")
                for x in (s.mean_ms, s.median_ms, s.p90_ms, s.p99_ms))))
    if lat.note:
        rows.append(("TTFT / TPOT / ITL", lat.note))
    return rows


def _power_text(r: BenchResult) -> str:
    p = r.power
    assert p is not None
    each = " · ".join(f"{n.node} {n.mean_w:,.1f} W" if n.mean_w is not None else f"{n.node}: {n.note}"
                      for n in p.nodes)
    if p.joules_per_token is None:
        return f"{each} — {p.note}" if each else str(p.note)
    return (f"{each} — {p.joules:,.0f} J over {p.window_s:.1f} s = {p.joules_per_token:.4f} J/token "
            f"({p.tokens_per_joule:,.2f} tokens/J)")


def history(
    json_out: JsonOpt = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="newest N records")] = 30,
    kind: Annotated[list[str] | None, typer.Option(
        "--kind", help="only this kind (repeatable): deployment down gates smoke pool bench campaign")] = None,
    since: Annotated[str | None, typer.Option("--since", help="only since: 30m, 2h, 7d, or an ISO date/time")
                     ] = None,
) -> None:
    """What ran: deployments, gate runs, banked pools and bench results from the journal, newest first.

    A damaged journal is one `error:` line (exit 2, as for any unusable input file) naming the fallback file
    that holds the records it could not take."""
    from sparkserve.journal import HISTORY_KINDS, since_time

    bad = [k for k in kind or [] if k not in HISTORY_KINDS]
    if bad:
        raise BadInput("--kind", f"{bad[0]!r} is not one of {', '.join(HISTORY_KINDS)}")
    try:
        since_iso = since_time(since) if since else None
    except ValueError:
        raise BadInput("--since", f"{since!r} is not a duration like 2h or an ISO date/time") from None
    path = default_path()
    try:
        with Journal.open(path) as journal:
            entries = (journal.history_where(limit, kinds=kind, since=since_iso) if kind or since_iso
                       else journal.history(limit))
    except BadInput as e:
        raise BadInput(e.where, e.what + fallback_note(path)) from None
    if json_out:
        emit_json({"journal": str(path), "entries": [e.as_dict() for e in entries]})
        return
    t = Table(title=f"journal {path}")
    for col in ("time", "kind", "id", "deployment", "ok", "summary"):
        t.add_column(col)
    for e in entries:
        ok = "" if e.ok is None else ("yes" if e.ok else "[red]no[/red]")
        summary = e.summary
        if e.sha256_ok is False:
            summary += "  [red](sha256 mismatch: edited after recording)[/red]"
        t.add_row(e.time[:19].replace("T", " "), e.kind, str(e.id), (e.fingerprint or "")[:12], ok, summary)
    console.print(t)


def _pct(d: float | None) -> str:
    if d is None:
        return ""
    return f" ({d * 100:+.1f}%)"


def ab(
    results: Annotated[list[Path], typer.Argument(help="bench --json result files; the first is A")],
    json_out: JsonOpt = False,
) -> None:
    """Bench result files against the first: output tok/s, acceptance length, per-position acceptance."""
    table = compare_files(results)
    if json_out:
        emit_json(table.model_dump(mode="json"))
        return
    t = Table(title=f"A/B {table.cell} — baseline {table.baseline}")
    for col in ("result", "tok/s", "AL", "acc. rate", "per-position acceptance", "errors", "valid"):
        t.add_column(col)
    for row in table.rows:
        base = row.file == table.baseline
        pos = "  ".join(
            f"{x:.3f}{'' if d is None or base else f'({d * 100:+.0f}%)'}"
            for x, d in zip(row.per_position_acceptance, row.per_position_delta, strict=False)
        )
        t.add_row(
            row.file + (" [dim](A)[/dim]" if base else ""),
            f"{row.output_tok_s:,.1f}" + ("" if base else _pct(row.output_tok_s_delta)),
            _fmt(row.acceptance_length) + ("" if base else _pct(row.acceptance_length_delta)),
            _fmt(row.acceptance_rate) + ("" if base else _pct(row.acceptance_rate_delta)),
            pos or "n/a",
            str(row.stream_errors),
            "yes" if row.ok else f"[red]REFUSED[/red]: {row.refused[0] if row.refused else ''}",
        )
    console.print(t)
    for row in table.rows:
        if not row.ok:
            err_console.print(f"[yellow]warning:[/yellow] {row.file} is a refused cell: figures not valid")


class _AbGroup(TyperGroup):
    """`ab RESULT…` (no subcommand named) is `ab diff RESULT…`, as it was before `ab` had subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["diff", *args]
        return super().parse_args(ctx, args)


ab_app = typer.Typer(cls=_AbGroup, no_args_is_help=True, help="A/B of drafters: run a campaign, report it, or "
                     "diff bench result files (`ab RESULT…` = `ab diff RESULT…`).")


def cell_specs(cells: str, size: list[str] | None) -> list[object]:
    """``--cells smoke,c16`` with ``--size CELL=PxCxT`` → the campaign's cells (BadInput naming the option)."""
    from sparkserve.measure.ab_records import CellSpec, parse_size

    names = [c.strip() for c in cells.split(",") if c.strip()]
    bad = [c for c in names if c not in CELLS]
    if bad:
        raise BadInput("--cells", f"{bad[0]!r} is not a cell ({', '.join(CELLS)})")
    sizes = {s.name: s for s in (parse_size(x) for x in size or [])}
    extra = sorted(set(sizes) - set(names))
    if extra:
        raise BadInput("--size", f"{extra[0]} is not one of --cells ({', '.join(names)})")
    return [sizes.get(n) or CellSpec(name=n, prompts=CELLS[n].prompts, concurrency=CELLS[n].concurrency,
                                     max_tokens=CELLS[n].max_tokens) for n in names]


def _drafter_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise BadInput("--drafter", f"{text!r}: expected NAME=PATH, e.g. A=/models/dflash2-e")
    return name, Path(path)


def ab_run(
    drafter: Annotated[list[str] | None, typer.Option(
        "--drafter", help="NAME=PATH, repeated; the first is the baseline (A)")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="NAME=KEY=VALUE[,KEY=VALUE…], repeated: the config with those fields set, e.g. "
        "k5=speculative.num_speculative_tokens=5 or long=profile=long-800k (drafter=PATH: another drafter, "
        "through the swap path); after any --drafter, the first arm is the baseline")] = None,
    cells: Annotated[str, typer.Option("--cells", help="comma-separated: smoke, c16, c1, c16-k4")] = "smoke,c16,c1",
    rounds: Annotated[int, typer.Option("--rounds", help="boots per drafter, interleaved ABBA…")] = 1,
    design: Annotated[DesignName, typer.Option("--design", help="sequential: one stack boots the drafters in turn "
                      "· crossed (replicas: N): each drafter on a replica of its own at once, rotated each round "
                      "(--rounds a multiple of the drafters)")] = DesignName.sequential,
    prompts: Annotated[Path | None, typer.Option("--prompts", help="JSONL prompts (default: bench.prompts, else the "
                                                 "built-in set)")] = None,
    size: Annotated[list[str] | None, typer.Option(
        "--size", help="CELL=PROMPTSxCONCURRENCYxTOKENS, e.g. c16=32x16x256 (default: the card's sizes)")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="order and bootstrap seed (default: random, recorded)")]
    = None,
    primary: Annotated[str | None, typer.Option("--primary", help="the verdict's cell (default c16)")] = None,
    protocol: Annotated[ProtocolName, typer.Option(
        "--protocol", help="card (the model card's holdout client) or forced (streamed chat, forced length)")
    ] = ProtocolName.card,
    chat_template: Annotated[Path | None, typer.Option(
        "--chat-template", help="card: the target's tokenizer dir / tokenizer_config.json / .jinja "
        "(default: model.target, when this machine has it)")] = None,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="bootstrap resamples")] = 2000,
    resume: Annotated[int | None, typer.Option("--resume", help="finish campaign ID (its cells kept)")] = None,
    config: ConfigOpt = None,
    accept_new: AcceptNew = False,
    json_out: JsonOpt = False,
) -> None:
    """Boot each drafter or variant in turn (swap path, no rebuild; a variant restarts with its own config),
    gate it, run the cells, bank everything; verdicts.

    Exit 0 done (excluded boots are reported, not failures) · 2 bad input (nothing started) · 3 a node or
    step failed, or interrupted: the drafter that served before is restored; `--resume ID` finishes it."""
    from sparkserve.campaign.drive import (
        CampaignRequest,
        check_request,
        check_resume,
        resume_campaign,
        run_campaign,
    )
    from sparkserve.config.variants import parse_variant
    from sparkserve.nodes.factory import open_nodes

    cfg = config_from(config, accept_new=accept_new, check=True, replicas=True)
    variants = [parse_variant(v) for v in variant or []]
    if cfg.speculative.method == "mtp" and (drafter or not variants):
        raise BadInput("speculative.method", "mtp serves the target's built-in head: an A/B of drafters needs a "
                       "DFlash profile (`sparkserve profiles`), or compare settings with --variant")
    say = _say(json_out)
    if resume is not None:
        if (drafter or variant or size or seed is not None or primary is not None or prompts is not None
                or chat_template is not None or protocol is not ProtocolName.card
                or design is not DesignName.sequential):
            raise BadInput("--resume", "takes the campaign's own arms, cells, seed, prompts and protocol: give "
                           "none of --drafter, --variant, --size, --seed, --primary, --prompts, --protocol, "
                           "--chat-template, --design")
        check_resume(cfg, resume)  # before any node is touched
        with open_nodes(cfg) as nodes:
            outcome = resume_campaign(cfg, nodes, resume, say=say, progress=not json_out)
    else:
        specs = cell_specs(cells, size)
        if protocol is ProtocolName.forced and chat_template is not None:
            raise BadInput("--chat-template", "only the card protocol renders prompts client-side")
        req = CampaignRequest(drafters=[_drafter_arg(d) for d in drafter or []], variants=variants, cells=specs,
                              rounds=rounds,
                              prompts=prompts or (cfg.bench.prompts.expanduser() if cfg.bench.prompts else None),
                              seed=seed, primary=primary, bootstrap=bootstrap,
                              protocol=protocol.value, chat_template=chat_template, design=design.value)
        check_request(cfg, req)  # before any node is touched
        with open_nodes(cfg) as nodes:
            outcome = run_campaign(cfg, nodes, req, say=say, progress=not json_out)
    if json_out:
        emit_json(outcome.report.model_dump(mode="json") | {"restored": outcome.restored, "timings": outcome.timings})
        return
    _print_report(outcome.report)
    err_console.print(f"[dim]·[/dim] {outcome.restored}")


def _say(json_out: bool):  # noqa: ANN202
    def say(msg: str) -> None:
        if not json_out:
            err_console.print(f"[dim]·[/dim] {msg}", highlight=False)
    return say


def _print_report(report: object) -> None:
    from sparkserve.measure.ab_report import render_rich

    for part in render_rich(report):  # type: ignore[arg-type]
        console.print(part)


def ab_report(
    campaign: Annotated[int | None, typer.Argument(help="the campaign's id (`ab run` and `history` print it)")]
    = None,
    markdown_out: Annotated[bool, typer.Option("--markdown", help="the model-card-ready Markdown section")] = False,
    plot_file: Annotated[Path | None, typer.Option("--plot", help="also draw FILE.png (needs sparkserve[plot])")]
    = None,
    bench_files: Annotated[list[Path] | None, typer.Option(
        "--bench", help="a `bench --json` result as a row of yours (repeatable; with or instead of a campaign)")]
    = None,
    reference: Annotated[Path | None, typer.Option(
        "--reference", help="the card's banked rows (drafter/all/*.json): printed beside yours")] = None,
    match: Annotated[str, typer.Option(
        "--reference-match", help="the reference labels to show (regex; default: E, F, G and incoai, greedy)")]
    = DEFAULT_MATCH,
    hardware: Annotated[str, typer.Option("--hardware", help="what your rows ran on (labels them)")]
    = "2x DGX Spark (GB10)",
    card_rows: Annotated[Path | None, typer.Option(
        "--card-rows", help="write your rows into DIR in the card's JSON shape (one <label>.json each)")] = None,
    json_out: JsonOpt = False,
) -> None:
    """The campaign's table of record from the journal: `Cell (accept / tok/s)` × drafters, per position,
    intervals, TTFT/TPOT, verdicts, the honest read; with --reference, the card's banked rows beside yours.
    No node is touched."""
    from sparkserve.measure import card_rows as cr
    from sparkserve.measure.ab_report import markdown, plot

    if campaign is None and not bench_files:
        raise BadInput("campaign", "give a campaign id or --bench FILE (a `bench --json` result)")
    report = None
    ours = cr.bench_rows(list(bench_files or []), hardware)
    if campaign is not None:
        from sparkserve.campaign.drive import campaign_report

        report = campaign_report(campaign)
        ours = cr.rows_from_report(report, hardware) + ours
    refs = cr.read_reference(reference, match=match or None) if reference is not None else []
    pairs = cr.beside(ours, refs)
    written = cr.write_rows(ours, card_rows) if card_rows is not None else []
    if report is not None and plot_file is not None:
        plot(report, plot_file)
    if json_out:
        extra = {"ours": [cr.row_json(r) for r in ours], "beside": [p.to_json() for p in pairs],
                 "card_rows": [str(w) for w in written]}
        emit_json((report.model_dump(mode="json") if report else {}) | extra)
        return
    if report is not None and markdown_out:
        print(markdown(report), end="")
    elif report is not None:
        _print_report(report)
    for line in (cr.beside_lines(pairs, refs) if reference is not None else []):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if plot_file is not None and report is not None:
        err_console.print(f"[dim]·[/dim] plot written to {plot_file}")
    if written:
        err_console.print(f"[dim]·[/dim] {len(written)} row(s) in the card's shape written to {card_rows}")


ab_app.command("run")(ab_run)
ab_app.command("report")(ab_report)
ab_app.command("diff")(ab)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("history")(history)
    app.add_typer(ab_app, name="ab")


__all__ = ["register", "bench", "history", "ab", "ab_run", "ab_report"]
