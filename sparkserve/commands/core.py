"""init · validate · render · plan · drafter inspect — nothing here changes a node (validate may read the head's
model metadata, as `up` does; --offline: no node at all)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sparkserve.commands._common import AcceptNew, ConfigOpt, JsonOpt, console, emit_json, err_console
from sparkserve.config import DEFAULT_CONFIG_NAME, Config, default_yaml_text, load_config
from sparkserve.errors import BadInput, RemoteFailure

DrafterOpt = Annotated[
    Path | None,
    typer.Option("--drafter", help="drafter dir (overrides drafter.path; also SPARKSERVE_DRAFTER__PATH)"),
]
TargetOpt = Annotated[
    Path | None,
    typer.Option("--target", help="target model dir (overrides model.target; also SPARKSERVE_MODEL__TARGET)"),
]


def _abs(p: Path) -> str:
    return str(p.expanduser().absolute())


def load_with_overrides(config: Path | None, drafter: Path | None = None, target: Path | None = None, *,
                        require_file: bool = False) -> Config:
    over: dict[str, Any] = {}
    if drafter is not None:
        over["drafter"] = {"path": _abs(drafter)}
    if target is not None:
        over["model"] = {"target": _abs(target)}
    return load_config(config, overrides=over or None, require_file=require_file)


def _print_findings(report: Any) -> None:
    for w in report.warnings:
        err_console.print(f"warning: {w.where}: {w.what}", markup=False, highlight=False, soft_wrap=True)


def init(
    path: Annotated[Path, typer.Argument(help="where to write it")] = Path(DEFAULT_CONFIG_NAME),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Write the embedded production default as a commented sparkserve.yaml (fill in the hosts)."""
    if path.exists() and not force:
        raise BadInput(str(path), "exists (use --force to overwrite)")
    try:
        path.write_text(default_yaml_text())
    except OSError as e:
        raise BadInput(str(path), f"cannot write: {e.strerror}") from None
    console.print(f"wrote {path}: fill in nodes[].host, fabric_ip and user, then `sparkserve validate`",
                  markup=False, highlight=False, soft_wrap=True)


def validate(
    config: ConfigOpt = None,
    drafter: DrafterOpt = None,
    target: TargetOpt = None,
    parser: Annotated[str, typer.Option(
        "--parser", help="argv judge: list (the engine version's committed `vllm serve` option list, about a "
                         "second), vllm (vLLM's own parser, installed here: ~10 s), auto (vllm if importable)")
                      ] = "list",
    offline: Annotated[bool, typer.Option(
        "--offline", help="touch no node: a model that is not on this machine is not read")] = False,
    accept_new: AcceptNew = False,
    as_json: JsonOpt = False,
) -> None:
    """Config + drafter + target + every rendered `vllm serve` argv against the engine's option list.

    Each model is read where it is, as `up` reads it: on this machine when the path exists here, otherwise
    its metadata on the head node (never its weights; nothing is changed there). --offline touches no node.
    Every problem is listed (exit 2). --parser vllm asks vLLM's own parser (installed here) instead."""
    from sparkserve.config import find_config_path, no_config_error, refuse_placeholders
    from sparkserve.deploy.inputs import check_inputs, needs_head

    if parser not in ("auto", "vllm", "list"):
        raise BadInput("--parser", f"{parser!r} is not one of auto, vllm, list")
    cfg = load_with_overrides(config, drafter, target)
    if accept_new:
        cfg.ssh.accept_new_host_keys = True
    if cfg.replicas > 1:  # every replica runs the same argv on its own nodes: replica 1's stands for all
        from sparkserve.plan.replicas import replica_config

        cfg = replica_config(cfg, 1)
    if parser != "list":  # the one slow part (vLLM's import): say so before the screen goes quiet
        err_console.print("· argv: loading vLLM's own parser (about 10 s; the default, --parser list, answers from "
                          "the committed option list)", markup=False, highlight=False, soft_wrap=True)
    # --drafter/--target name directories on this machine
    local = tuple(k for k, v in (("drafter", drafter), ("target", target)) if v is not None)
    if not offline and needs_head(cfg, local=local):  # the head would be asked: a real config, real hosts
        if find_config_path(config) is None:
            raise no_config_error()
        refuse_placeholders(cfg)
    if offline or not needs_head(cfg, local=local):
        cfg = _local_hf_target(cfg)
        report, where = check_inputs(cfg, None, parser=parser, local=local)
    else:
        from sparkserve.nodes.factory import open_nodes
        from sparkserve.nodes.hf_models import resolve_target

        try:
            with open_nodes(cfg, names=[cfg.head.name]) as nodes:
                cfg = resolve_target(cfg, nodes)  # org/name[@rev] → the head's snapshot path
                report, where = check_inputs(cfg, nodes[cfg.head.name], parser=parser, local=local)
        except RemoteFailure as e:
            e.details.append(f"the {_not_here(cfg, local)} not on this machine: validate reads them on the head; "
                             "--offline checks without any node")
            raise
    if as_json:
        emit_json({**report.to_json(), "read": where.said})
        if not report.ok:
            raise typer.Exit(2)
        return
    if not report.ok:  # every problem, one line each (warnings are in --json)
        for f in report.errors:
            err_console.print(f"error: {f.where}: {f.what}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    _print_findings(report)
    d, t = report.drafter, report.target
    lines = ["config ok (config " + cfg.fingerprint()[:16] + ")"]
    if d:
        agree = "config.json, mask_embedding.pt" if d.mask.mask_token_id is not None else "config.json"
        if cfg.gates.mask_token_id is not None:
            agree += " and gates"
        lines.append(f"drafter ok: {d.architecture}, block_size {d.block_size}, K "
                     f"{cfg.speculative.num_speculative_tokens}, mask_token_id {d.mask_token_id} ({agree} agree), "
                     f"{d.taps} taps = fc input width {d.weights.fc_input_width if d.weights else '?'} "
                     f"[{where.said['drafter']}]")
        if report.drafter_identity:
            lines.append(f"drafter is {report.drafter_identity['name']} ({report.drafter_identity['evidence']})")
    else:
        lines.append(f"drafter {where.said['drafter']}")
    if t:
        lines.append(f"target ok: {t.num_hidden_layers} layers, hidden {t.hidden_size}, taps "
                     f"{d.target_layer_ids if d else '?'} inside [{where.said['target']}]")
    else:
        lines.append(f"target {where.said['target']}")
    lines.append(f"argv ok: {report.argvs_checked} `vllm serve` argv(s) accepted by {report.argv_judge}")
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _local_hf_target(cfg: Config) -> Config:
    """``--offline`` with ``model.target: org/name[@rev]``: this machine's Hugging Face cache, when it holds it."""
    import os

    from sparkserve.models.hf_cache import DEFAULT_HUB, parse_repo_id, resolve_local

    ref = parse_repo_id(str(cfg.model.target))
    if ref is None:
        return cfg
    hub = os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub")
                                              if os.environ.get("HF_HOME") else DEFAULT_HUB)
    try:
        snap = resolve_local(ref, Path(hub).expanduser())
    except BadInput:
        return cfg  # not here either: reported as not read
    new = cfg.model_copy(deep=True)
    new.model = new.model.model_copy(update={"target": snap})
    return new


def _not_here(cfg: Config, local: tuple[str, ...]) -> str:
    from sparkserve.deploy.drafter import local_drafter

    missing = []
    if "drafter" not in local and local_drafter(cfg) is None:
        missing.append("drafter")
    if "target" not in local and not (Path(cfg.model.target) / "config.json").is_file():
        missing.append("target")
    return " and ".join(missing) + (" are" if len(missing) > 1 else " is")


def _display_plan(cfg: Config) -> Any:
    from sparkserve.plan.build import build_plan
    from sparkserve.plan.container import REDACTED
    from sparkserve.plan.validate import check_config

    check_config(cfg).raise_first()
    # render/plan never read the key: a configured key shows as a redacted VLLM_API_KEY
    has_key = bool(cfg.serve.api_key_env or cfg.serve.api_key_file)
    return build_plan(cfg, api_key=REDACTED if has_key else None)


def _shell(argv: list[str]) -> str:
    from sparkserve.plan.launcher import argv_lines

    lines = argv_lines(argv)
    return " \\\n    ".join(lines)


def render(
    config: ConfigOpt = None,
    node: Annotated[str | None, typer.Option("--node", help="only this node")] = None,
    launcher: Annotated[bool, typer.Option("--launcher", help="print the launcher script instead")] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write to this file")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The exact per-node container spec (docker run) — or the launcher script. Nothing runs."""
    cfg = load_config(config)
    if launcher:
        from sparkserve.commands.replicas import refuse
        from sparkserve.plan.launcher import render_launcher

        refuse(cfg, "render --launcher")

        text = render_launcher(cfg)
        if output:
            output.write_text(text)
            output.chmod(0o755)
            err_console.print(f"wrote {output}", markup=False, highlight=False, soft_wrap=True)
        else:
            console.file.write(text)
        return
    if cfg.replicas > 1 and node is None:
        obj = _render_replicas(cfg, as_json)
        text = json.dumps(obj, indent=2) + "\n" if as_json else str(obj)
        (output.write_text(text) if output else console.file.write(text))
        return
    if cfg.replicas > 1:  # --node: the replica that holds it
        from sparkserve.plan.replicas import replicas_of

        cfg = next((r.cfg for r in replicas_of(cfg) if node in r.nodes), cfg)
    plan = _display_plan(cfg)
    specs = plan.specs
    if node is not None:
        names = [s.node for s in specs]
        if node not in names:
            raise BadInput("--node", f"{node!r} is not in the config (nodes: {', '.join(names)})")
        specs = [plan.spec_for(node)]
    if as_json:
        from sparkserve.commands.profiles import profile_view

        obj: Any = {**plan.public(), "profile": profile_view(cfg)} if node is None else specs[0].public()
        text = json.dumps(obj, indent=2) + "\n"
    else:
        out = []
        for s in specs:
            order = [x.node for x in plan.start_order()].index(s.node) + 1
            out.append(f"# {s.node} ({s.host}): rank {s.rank}, {s.role}; starts {order} of {len(plan.specs)}")
            if plan.runtime == "process":  # a host process in its own session: env + argv (secrets stay out)
                out.append(_shell(["env", *(f"{k}={v}" for k, v in s.env.items()), *plan.process_argv(s)]))
            else:
                if s.make_dirs:  # docker refuses a bind mount whose source does not exist
                    out.append(_shell(["mkdir", "-p", "--", *s.make_dirs]))
                out.append(_shell(s.docker_run_argv()))
            if s.exec_after_join:
                out.append("# then, once every Ray worker has joined:")
                out.append(_shell(["docker", "exec", s.name, *s.exec_after_join]))
            out.append("")
        text = "\n".join(out)
    if output:
        output.write_text(text)
    else:
        console.file.write(text)


def _render_replicas(cfg: Config, as_json: bool) -> Any:
    """``replicas`` > 1: every replica's ranks and the router's argv (JSON), or the same as text."""
    from sparkserve.plan.container import REDACTED
    from sparkserve.plan.replicas import render_replicas, replicas_of

    for r in replicas_of(cfg):
        _display_plan(r.cfg)  # the config rules, per replica
    has_key = bool(cfg.serve.api_key_env or cfg.serve.api_key_file)
    doc = render_replicas(cfg, api_key=REDACTED if has_key else None)
    if as_json:
        return doc
    out = []
    for r in doc["replicas"]:
        p = r["plan"]
        out.append(f"# replica {r['replica']}: {', '.join(r['nodes'])} — API {r['api_url']}")
        for s in p["specs"]:
            argv = s.get("process_argv") or s.get("docker_run") or []
            out.append(f"#   {s['node']}: rank {s['rank']}, {s['role']}")
            out.append(_shell(argv) if argv else "")
    out.append(f"# router ({doc['router']['policy']}) at {doc['router']['url']}, on this machine:")
    out.append(_shell(doc["router"]["argv"]))
    return "\n".join(out) + "\n"


def plan(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """What `sparkserve up` would do with this config, step by step. Nothing runs."""
    cfg = load_config(config)
    from sparkserve.commands.replicas import refuse

    refuse(cfg, "plan")
    p = _display_plan(cfg)
    from sparkserve.deploy.up import planned_steps

    steps = planned_steps(cfg, p)
    if as_json:
        emit_json({"fingerprint": p.fingerprint, "executor": p.executor, "steps": steps, "plan": p.public()})
        return
    console.print(f"sparkserve plan (config {p.fingerprint[:16]}; nothing is run)", markup=False,
                  highlight=False, soft_wrap=True)
    for i, s in enumerate(steps, 1):
        console.print(f"{i:2d}. {s['step']:<9} {s['detail']}", markup=False, highlight=False, soft_wrap=True)


drafter_app = typer.Typer(help="Drafter tools.", no_args_is_help=True)


@drafter_app.command("inspect")
def drafter_inspect(
    path: Annotated[Path, typer.Argument(help="drafter directory")],
    target: Annotated[Path | None, typer.Option("--target", help="also show this target's facts")] = None,
    config: ConfigOpt = None,
    hash_files: Annotated[bool, typer.Option("--hash/--no-hash", help="sha256 manifest of every file")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Block size, K, taps, mask id, selector/conv tensors, mask file, sha256 — for people or --json."""
    from sparkserve.models.drafter import inspect_drafter
    from sparkserve.models.manifest import manifest
    from sparkserve.models.target import inspect_target
    from sparkserve.plan.findings import Report
    from sparkserve.plan.model_checks import check_drafter, check_target

    cfg = load_config(config)
    d = inspect_drafter(path)
    t = inspect_target(target, where="--target") if target else None
    report = Report(drafter=d, target=t)
    check_drafter(cfg, d, report)
    if t:
        check_target(cfg, d, t, report)
    m = manifest(path) if hash_files else None
    if as_json:
        out: dict[str, Any] = {"drafter": d.to_json(),
                               "manifest": m.to_json() if m else None,
                               "target": t.to_json(cfg.serve.kv_cache_dtype, cfg.serve.tensor_parallel_size)
                               if t else None,
                               "checks": {"errors": [f.__dict__ for f in report.errors],
                                          "warnings": [f.__dict__ for f in report.warnings]}}
        emit_json(out)
        return
    console.print(drafter_table(d, cfg))
    if m:
        console.print(f"sha256 manifest {m.digest} ({len(m.files)} files, {m.total_bytes:,} bytes; cached by "
                      "size+mtime)", markup=False, highlight=False, soft_wrap=True)
        mt = Table()
        mt.add_column("file")
        mt.add_column("bytes", justify="right")
        mt.add_column("sha256")
        for rel, e in sorted(m.files.items()):
            mt.add_row(rel, f"{e.size:,}", e.sha256[:16] + "…")
        console.print(mt)
    if t:
        console.print(target_table(t, cfg))
    for f in report.errors:
        console.print(f"problem: {f.where}: {f.what}", markup=False, highlight=False, soft_wrap=True, style="red")
    for f in report.warnings:
        console.print(f"warning: {f.where}: {f.what}", markup=False, highlight=False, soft_wrap=True, style="yellow")
    if not report.errors and not report.warnings:
        console.print(f"checks: ok against {'the config' if config else 'the embedded default config'} "
                      f"(K={cfg.speculative.num_speculative_tokens}, mask {cfg.gates.mask_token_id})",
                      markup=False, highlight=False, soft_wrap=True)


def drafter_table(d: Any, cfg: Config) -> Table:
    from sparkserve.models.drafter_identity import identify

    t = Table(title=f"drafter {d.path}", title_justify="left", show_header=False)
    t.add_column("fact", style="bold")
    t.add_column("value")
    w = d.weights
    k = cfg.speculative.num_speculative_tokens
    rows = [
        ("architecture", f"{d.architecture} ({d.kind or 'unknown to vLLM 0.33'}; {d.format} format)"),
        ("hidden size", f"{d.hidden_size} (target hidden {d.target_hidden_size})"),
        ("layers", str(d.num_hidden_layers)),
        ("vocab size", str(d.vocab_size)),
        ("block size", f"{d.block_size} → K = {d.expected_k} (config K = {k})"),
        ("mask_token_id", f"{d.mask_token_id} ({d.mask_token_id_source})"),
        ("target_layer_ids", f"{d.target_layer_ids} ({d.taps} taps; vLLM aux layers {d.aux_layer_ids})"),
        ("conv", f"kernel {d.conv_kernel_size}, group {d.conv_group_size}"),
        ("selector", f"rank {d.selector_rank}, top_k {d.selector_top_k}"),
        ("the card's", "{0.name} ({0.evidence})".format(identify(d))),
    ]
    if w:
        fc_taps = d.fc_taps
        rows += [
            ("weights", f"{', '.join(w.files)}: {w.tensor_count} tensors, {w.param_count:,} parameters, {w.dtype}"),
            ("selector tensors", str(w.selector_tensors)),
            ("conv tensors", str(w.conv_tensors)),
            ("fc input width", f"{w.fc_input_width} (= {fc_taps:g} x {d.target_hidden_size})" if fc_taps else
             str(w.fc_input_width)),
        ]
    else:
        rows.append(("weights", "none"))
    mk = d.mask
    if not mk.present:
        mask = "missing"
    elif mk.error:
        mask = f"unreadable: {mk.error}"
    else:
        mask = f"{mk.form} form, mask_token_id {mk.mask_token_id}, {mk.embedding_dtype} {mk.embedding_shape}"
    rows.append(("mask_embedding.pt", mask))
    for a, b in rows:
        t.add_row(a, b)
    return t


def target_table(tf: Any, cfg: Config) -> Table:
    t = Table(title=f"target {tf.path}", title_justify="left", show_header=False)
    t.add_column("fact", style="bold")
    t.add_column("value")
    dt, tp = cfg.serve.kv_cache_dtype, cfg.serve.tensor_parallel_size
    per = tf.kv_bytes_per_token(dt, tp=tp)
    kv = cfg.serve.kv_cache_memory_bytes
    rows = [
        ("architecture", f"{', '.join(tf.architectures)} ({tf.model_type})"),
        ("layers", f"{tf.num_hidden_layers}" + (f" (+{tf.mtp_layers} MTP)" if tf.mtp_layers else "")),
        ("hidden size", str(tf.hidden_size)),
        ("attention", f"{tf.attention}: {tf.num_attention_heads} heads, {tf.num_key_value_heads} KV heads, head_dim "
                      f"{tf.head_dim}" + (f", kv_lora_rank {tf.kv_lora_rank}" if tf.kv_lora_rank else "")),
        ("vocab size", str(tf.vocab_size)),
        (f"KV bytes/token/rank ({dt}, TP {tp})", f"{per:,.0f}" if per else "unknown"),
    ]
    if per and kv:
        rows.append(("tokens in kv_cache_memory_bytes", f"~{int(kv // per):,} (upper bound; vLLM's pool is the gate)"))
    for a, b in rows:
        t.add_row(a, b)
    return t


def register(app: typer.Typer) -> None:
    app.command()(init)
    app.command()(validate)
    app.command()(render)
    app.command()(plan)
    app.add_typer(drafter_app, name="drafter")
