"""`sparkserve logs` (live, or `logs analyze FILE…` offline) and `sparkserve gates`.

Exit codes: 0 ok · 1 a gate failed · 2 bad input (missing file, unknown gate, `--bank` offline) · 3 remote.
`gates --from-log NODE=FILE…` judges saved logs without touching a node (sparkserve.observe.saved says what
that cannot observe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from sparkserve.commands._common import AcceptNew, ConfigOpt, JsonOpt, config_from, console, emit_json
from sparkserve.errors import BadInput
from sparkserve.observe.analyze import Analysis
from sparkserve.observe.gate_report import GATE_NAMES, GateReport
from sparkserve.observe.saved import LogFile, analyze_files, judge_files

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
    tail: Annotated[int | None, typer.Option("--tail", "-n", min=1, help="only each container's last N lines")
                    ] = None,
    accept_new: AcceptNew = False,
) -> None:
    """Every node's engine container logs, each line prefixed with its node. With -f, Ctrl-C ends the
    stream (exit 0)."""
    if ctx.invoked_subcommand is not None:
        return
    cfg = config_from(config, accept_new=accept_new)
    try:
        from sparkserve.deploy.stack import stream_logs  # the node stack (docker, paramiko) only when asked
        from sparkserve.nodes.factory import open_nodes

        with open_nodes(cfg) as nodes:
            found = stream_logs(cfg, nodes, node=node, follow=follow, since=since, tail=tail)
        if not found:
            _point_at_saved_logs()
    except KeyboardInterrupt:
        if not follow:
            raise
        # following is ended by Ctrl-C: that is how it is used, not a failure


def _point_at_saved_logs() -> None:
    """Nothing runs: say so, and where the last saved logs are (`down` saves every rank's before it stops it)."""
    from sparkserve.commands._common import err_console
    from sparkserve.deploy.stack import last_saved_logs

    last = last_saved_logs()
    where = (f"; the last saved logs are in {last}: {', '.join(sorted(p.name for p in last.glob('*.log')))} "
             f"(`sparkserve logs analyze {last}/*.log`)" if last else "; no saved logs either")
    err_console.print(f"logs: no sparkserve container runs on any node{where}", markup=False, highlight=False,
                      soft_wrap=True)


def _log_files(items: list[str], option: str) -> list[LogFile]:
    """``NAME=FILE`` (or a bare ``FILE``, named after the file) → saved logs with their node."""
    out = []
    for item in items:
        node, sep, file = item.partition("=")
        if not sep:
            out.append(LogFile(Path(item), Path(item).name, option))
            continue
        if not node or not file:
            raise BadInput(option, f"{item!r} is not NAME=FILE")
        out.append(LogFile(Path(file), node, option))
    return out


@logs_app.command("analyze")
def analyze_cmd(
    files: Annotated[
        list[Path] | None,
        typer.Argument(help="saved vLLM logs (any version 0.10 … 0.33, in any envelope: UTF-8, UTF-16 or Latin-1; "
                       "a CI, journald, compose, kubectl or log-table wrapper is learnt from the file)"),
    ] = None,
    json_out: JsonOpt = False,
    node: Annotated[
        list[str] | None,
        typer.Option("--node", help="NAME=FILE: a log and the node it came from (repeatable)"),
    ] = None,
) -> None:
    """Offline analysis of saved logs (no nodes): KV pool, graphs per rank, mask, runner, readiness, faults."""
    inputs = [LogFile(p) for p in files or []] + _log_files(list(node or []), "--node")
    if not inputs:
        raise BadInput("logs analyze", "give at least one FILE (or --node NAME=FILE)")
    result = analyze_files(inputs)
    if json_out:
        emit_json(result.to_json())
        return
    _print_analysis(result)


def _print_analysis(a: Analysis) -> None:
    j = a.to_json()
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    kv = ", ".join(f"{n:,}" for n in j["kv_cache_tokens"]) or "not found"
    t.add_row("KV cache", f"{kv} tokens" if j["kv_cache_tokens"] else kv)
    if j["failed_boot_kv_cache_tokens"]:
        failed = ", ".join(f"{n:,}" for n in j["failed_boot_kv_cache_tokens"])
        t.add_row("  failed boot", f"{failed} tokens (printed by a boot that then died)")
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
    for e in j["envelopes"]:
        if e["prefix"] or e["suffix"] or e["encoding"] != "utf-8":
            wrapper = f", wrapper {e['example']!r} taken off {e['lines']} lines" if e["prefix"] else ""
            suffix = f", suffix {e['suffix']!r}" if e["suffix"] else ""
            t.add_row("envelope", escape(f"{Path(e['file']).name}: {e['encoding']}{wrapper}{suffix}"))
    console.print(t)
    for f in j["faults"]:
        console.print(
            f"  [red]{f['kind']}[/red] {escape(f['file'])}:{f['line']}: {escape(f['text'])}", soft_wrap=True
        )
    if a.artefacts:
        console.print(f"  ({len(a.artefacts)} shutdown artefact line(s) after a deliberate stop, not faults)")
    if a.request_errors:  # requests answered with an error: the server went on (not engine faults)
        log, e = a.request_errors[0]
        console.print(f"  {len(a.request_errors)} request error(s), not faults; first {escape(log.file)}:{e.line}: "
                      f"{escape(e.text)}", soft_wrap=True)


def gates_cmd(
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    bank: Annotated[
        bool, typer.Option("--bank", help="record the observed pool for this deployment (config, image, drafter)")
    ] = False,
    from_log: Annotated[
        list[str] | None,
        typer.Option("--from-log", help="NODE=FILE (or FILE): judge saved logs offline (repeatable)"),
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option(
            "--skip", help="a gate not to judge (repeatable): pool graphs mask smoke faults runner signature "
            "identity"),
    ] = None,
    accept_new: AcceptNew = False,
) -> None:
    """The production gates on every node: the model card's five (pool, graphs, mask, smoke, faults) and
    sparkserve's three more (runner, signature, identity)."""
    skips = list(skip or [])
    bad = [s for s in skips if s not in GATE_NAMES]
    if bad:
        raise BadInput("--skip", f"unknown gate {bad[0]!r}; gates are {', '.join(GATE_NAMES)}")
    cfg = config_from(config, accept_new=accept_new, nodes=not from_log)
    if from_log:
        if bank:
            raise BadInput(
                "--bank",
                "needs the running stack (the fingerprint holds the image ID and drafter "
                "manifest); not with --from-log",
            )
        logs = _log_files(list(from_log), "--from-log")
        if len({f.node for f in logs}) != len(logs):
            raise BadInput("--from-log", "a node is named twice; use NODE=FILE with distinct names")
        report = judge_files(cfg, logs, skip=skips)
    else:
        # live gates only: `--from-log` judges files and never loads the node stack (docker, paramiko: 0.3 s)
        from sparkserve.commands.progress import Progress
        from sparkserve.deploy.gates_live import run_gates
        from sparkserve.nodes.factory import open_nodes

        with Progress(enabled=not json_out) as p, open_nodes(cfg) as nodes:
            report = run_gates(cfg, nodes, bank=bank, skip=tuple(skips), say=p.say)
    if json_out:
        emit_json(report.to_json())
    else:
        _print_report(report)
    if not report.ok:
        raise typer.Exit(1)


def _print_report(report: GateReport) -> None:
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


def bundle_cmd(
    config: ConfigOpt = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="the tar.gz to write (default: ./sparkserve-bundle-<time>.tar.gz)")] = None,
    redact_hosts: Annotated[bool, typer.Option(
        "--redact-hosts", help="also replace host names and IP addresses (host-N, ip-N)")] = False,
    accept_new: AcceptNew = False,
) -> None:
    """One tar.gz for a bug report: config (secrets redacted), plan, doctor, gates (no smoke), image facts
    and lock, drafter and target manifests, host facts, versions, journal tail, the last saved logs.

    Each part is best effort: an unreachable node or a failed part is named in the bundle's errors.json.
    Nothing on a node is changed. Exit 0 once the file is written."""
    import time

    import yaml

    from sparkserve.commands._common import err_console
    from sparkserve.commands.progress import Progress
    from sparkserve.config import find_config_path, load_config, no_config_error
    from sparkserve.nodes.factory import open_reachable
    from sparkserve.operate.bundle import collect, host_map, secret_values, write

    file = find_config_path(config)
    if file is None:
        raise no_config_error()
    cfg = load_config(file)
    if accept_new:
        cfg.ssh.accept_new_host_keys = True
    try:
        text: str | None = file.read_text()
    except OSError:
        text = None
    try:
        raw = yaml.safe_load(text or "") or {}
    except yaml.YAMLError:
        raw = {}
    secrets = secret_values(raw, cfg) | secret_values(cfg.normalized(), None)
    out = output or Path(f"sparkserve-bundle-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz")
    with Progress() as p, open_reachable(cfg) as (nodes, unreachable):
        b = collect(cfg, nodes, unreachable, config_text=text, say=p.say)
    path = write(b, out, secrets=secrets, hosts=host_map(cfg) if redact_hosts else None)
    missing = f"; {len(b.errors)} part(s) could not be collected (errors.json)" if b.errors else ""
    err_console.print(f"bundle: {len(b.files) + 2} files{missing}", markup=False, highlight=False)
    print(f"wrote {path}: attach it to the bug report (secrets redacted"
          f"{', hosts and IPs too' if redact_hosts else '; --redact-hosts also hides host names and IPs'})")


def register(app: typer.Typer) -> None:
    app.add_typer(logs_app, name="logs")
    app.command("gates")(gates_cmd)
    app.command("bundle")(bundle_cmd)
