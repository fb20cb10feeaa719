"""`sparkserve logs` (live, or `logs analyze FILE…` offline) and `sparkserve gates`.

Exit codes: 0 ok · 1 a gate failed · 2 bad input (missing file, unknown gate, `--bank` offline) · 3 remote.
`gates --from-log NODE=FILE…` judges saved logs without touching a node: `smoke` and `identity` cannot be
observed in a log, so they are reported "not run" and fail unless `--skip smoke --skip identity`;
container liveness is not checked offline (the `faults` reason says so).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from sparkserve.commands._common import ConfigOpt, JsonOpt, config_from, console, emit_json
from sparkserve.errors import BadInput

logs_app = typer.Typer(
    help="Both nodes' engine logs (live), or `logs analyze FILE…` for saved logs.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@logs_app.callback(invoke_without_command=True)
def logs_live(
    ctx: typer.Context,
    config: ConfigOpt = None,
    node: Annotated[str | None, typer.Option("--node", help="only this node")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep streaming")] = False,
    since: Annotated[str | None, typer.Option("--since", help="e.g. 10m, 2h, or an RFC 3339 time")] = None,
) -> None:
    """Every node's engine container logs, each line prefixed with its node."""
    if ctx.invoked_subcommand is not None:
        return
    cfg = config_from(config)
    show_logs = _lazy("sparkserve.deploy.lifecycle", "show_logs", "live logs")
    show_logs(cfg, node, follow, since)


def _lazy(module: str, name: str, what: str) -> Any:
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise BadInput(what, f"not available yet ({module} is missing)") from None
    fn = getattr(mod, name, None)
    if fn is None:
        raise BadInput(what, f"not available yet ({module}.{name} is missing)")
    return fn


def _node_files(pairs: list[str], option: str) -> list[tuple[str, Path]]:
    out = []
    for item in pairs:
        node, sep, file = item.partition("=")
        if not sep:
            path = Path(item)
            out.append((path.name, path))
            continue
        if not node or not file:
            raise BadInput(option, f"{item!r} is not NAME=FILE")
        out.append((node, Path(file)))
    return out


def _read(path: Path, option: str) -> bytes:
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise BadInput(option, f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(option, f"{path}: is a directory") from None
    except OSError as e:
        raise BadInput(option, f"{path}: {e.strerror or e}") from None


@logs_app.command("analyze")
def analyze_cmd(
    files: Annotated[
        list[Path] | None, typer.Argument(help="saved vLLM logs (any version 0.10 … 0.33)")
    ] = None,
    json_out: JsonOpt = False,
    node: Annotated[
        list[str] | None,
        typer.Option("--node", help="NAME=FILE: a log and the node it came from (repeatable)"),
    ] = None,
) -> None:
    """Offline analysis of saved logs (no nodes): KV pool, graphs per rank, mask, runner, readiness, faults."""
    from sparkserve.observe.analyze import analyze
    from sparkserve.observe.logs import parse_log

    inputs: list[tuple[str | None, Path]] = [(None, p) for p in files or []]
    inputs += [(n, p) for n, p in _node_files(list(node or []), "--node")]
    if not inputs:
        raise BadInput("logs analyze", "give at least one FILE (or --node NAME=FILE)")
    logs = [parse_log(_read(p, "FILE" if n is None else "--node"), file=str(p), node=n) for n, p in inputs]
    result = analyze(logs)
    if json_out:
        emit_json(result.to_json())
        return
    _print_analysis(result)


def _print_analysis(a: Any) -> None:
    j = a.to_json()
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    kv = ", ".join(f"{n:,}" for n in j["kv_cache_tokens"]) or "not found"
    t.add_row("KV cache", f"{kv} tokens" if j["kv_cache_tokens"] else kv)
    t.add_row("graphs", f"{j['graphs']} (cudagraph_mode {j['cudagraph_mode'] or 'unknown'})")
    for r, st in j["ranks"].items():
        pool = f", pool {st['kv_cache_tokens']:,}" if st["kv_cache_tokens"] is not None else ""
        t.add_row(f"  rank {r}", f"graphs {st['graphs']}{pool}")
    s = j["spec"]
    k = s["num_speculative_tokens"]
    t.add_row("speculative", f"{s['method'] or 'unknown'}, k={k if k is not None else 'unknown'}")
    mask = {True: f"loaded (mask_token_id {s['mask_token_id']})", False: "NOT loaded", None: "unknown"}
    t.add_row("mask embedding", mask[s["mask_embedding_loaded"]])
    al = s["mean_acceptance_length"]
    if al:
        t.add_row(
            "acceptance length",
            f"{len(al)} SpecDecoding lines, last {al[-1]:.2f}, mean {sum(al) / len(al):.2f}",
        )
    t.add_row("model runner", j["model_runner"] or "unknown")
    t.add_row("ready", {True: "yes", False: "no", None: "unknown"}[j["ready"]])
    t.add_row("faults", str(len(j["faults"])) if j["faults"] else "none")
    console.print(t)
    for f in j["faults"]:
        console.print(
            f"  [red]{f['kind']}[/red] {escape(f['file'])}:{f['line']}: {escape(f['text'])}", soft_wrap=True
        )
    if a.artefacts:
        console.print(f"  ({len(a.artefacts)} shutdown artefact line(s) after a deliberate stop, not faults)")


def gates_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    bank: Annotated[
        bool, typer.Option("--bank", help="record the observed pool for this config fingerprint")
    ] = False,
    from_log: Annotated[
        list[str] | None,
        typer.Option("--from-log", help="NODE=FILE (or FILE): judge saved logs offline (repeatable)"),
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option(
            "--skip", help="a gate not to judge (repeatable): pool graphs mask smoke faults runner identity"
        ),
    ] = None,
) -> None:
    """The production gates across every node: pool, graphs, mask, smoke, faults, runner, identity."""
    from sparkserve.observe.gates import GATE_NAMES, Expectations, GateReport, judge
    from sparkserve.observe.logs import parse_log

    skips = list(skip or [])
    bad = [s for s in skips if s not in GATE_NAMES]
    if bad:
        raise BadInput("--skip", f"unknown gate {bad[0]!r}; gates are {', '.join(GATE_NAMES)}")
    cfg = config_from(config)
    report: GateReport
    if from_log:
        if bank:
            raise BadInput(
                "--bank",
                "needs the running stack (the fingerprint holds the image ID and drafter "
                "manifest); not with --from-log",
            )
        pairs = _node_files(list(from_log), "--from-log")
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise BadInput("--from-log", "a node is named twice; use NODE=FILE with distinct names")
        logs = {n: parse_log(_read(p, "--from-log"), file=str(p), node=n) for n, p in pairs}
        expect = Expectations.from_config(cfg, mask_file=_mask_file(cfg.drafter.path), check_nodes=False)
        report = judge(logs, expect, skip=skips)
    else:
        run_gates = _lazy("sparkserve.deploy.gates_live", "run_gates", "gates")
        got = run_gates(cfg, bank=bank)
        report = got if isinstance(got, GateReport) else _report_from_json(got)
        if skips:
            report = report.with_skipped(skips)
    if json_out:
        emit_json(report.to_json())
    else:
        _print_report(report)
    if not report.ok:
        raise typer.Exit(1)


def _mask_file(path: Path) -> bool | None:
    """Does the drafter directory hold mask_embedding.pt? None when the directory is not on this machine."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    return (p / "mask_embedding.pt").is_file()


def _report_from_json(obj: dict[str, Any]) -> Any:
    from sparkserve.observe.gates import Evidence, GateReport, Verdict

    return GateReport(
        [
            Verdict(
                g["name"],
                bool(g["ok"]),
                g.get("expected"),
                g.get("observed"),
                g.get("reason", ""),
                [
                    Evidence(e.get("node", ""), e.get("line"), e.get("text", ""))
                    for e in g.get("evidence", [])
                ],
            )
            for g in obj.get("gates", [])
        ]
    )


def _print_report(report: Any) -> None:
    t = Table(show_header=True, header_style="bold")
    t.add_column("gate")
    t.add_column("")
    t.add_column("why")
    for g in report.gates:
        mark = "[dim]skip[/dim]" if g.skipped else ("[green]ok[/green]" if g.ok else "[red]FAIL[/red]")
        t.add_row(g.name, mark, escape(g.reason))
    console.print(t)
    for g in report.failed():
        for e in g.evidence[:8]:
            where = f"{e.node}:{e.line}" if e.line is not None else e.node
            console.print(f"  {g.name}: {escape(where)}: {escape(e.text)}", soft_wrap=True)
    console.print(
        "[green]all gates passed[/green]"
        if report.ok
        else f"[red]failed: {', '.join(g.name for g in report.failed())}[/red]"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(logs_app, name="logs")
    app.command("gates")(gates_cmd)
