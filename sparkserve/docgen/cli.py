"""The CLI reference page and the exit-codes page, from the Typer app and :mod:`sparkserve.errors`."""

from __future__ import annotations

import enum
import inspect
from typing import Any

from sparkserve.docgen.base import HEADER


def _click_root() -> Any:
    import typer

    from sparkserve.commands.app import app

    group = typer.main.get_command(app)
    group.load_all()  # type: ignore[attr-defined]
    return group


def _param_row(cmd: Any, p: Any) -> str:
    from typer import _click as click

    if p.param_type_name == "argument":
        name = f"`{p.name.upper()}`"
        kind = "argument" + (" (repeatable)" if p.nargs == -1 else "")
    else:
        opts = [*p.opts, *p.secondary_opts]
        name = " / ".join(f"`{o}`" for o in opts)
        kind = "flag" if p.is_flag else p.display_type(click.Context(cmd)).strip("<>")
        if p.metavar:
            kind = p.metavar
        if getattr(p, "multiple", False):
            kind += " (repeatable)"
    default = p.default
    if default is None or default == () or callable(default) or (getattr(p, "is_flag", False) and default is False):
        shown = "required" if p.required else ""
    else:
        shown = f"`{default.value if isinstance(default, enum.Enum) else default}`"
    help_ = " ".join((getattr(p, "help", None) or "").split()).replace("|", "\\|")
    kind = kind.replace("|", " \\| ")
    return f"| {name} | {kind} | {shown} | {help_} |"


def _command_section(path: list[str], cmd: Any, out: list[str]) -> None:
    title = " ".join(path)
    out.append(f"## `{title}`\n")
    doc = inspect.cleandoc(cmd.help or "")
    if doc:
        # paragraphs as they are written (never re-wrapped mid-sentence)
        out.append("\n\n".join(" ".join(par.split()) for par in doc.split("\n\n")) + "\n")
    params = [p for p in cmd.params if not getattr(p, "hidden", False)
              and p.name not in ("install_completion", "show_completion")]
    if params:
        out.append("| option | type | default | what it does |\n|---|---|---|---|")
        out.extend(_param_row(cmd, p) for p in params)
        out.append("")
    for name in sorted(getattr(cmd, "commands", {}) or {}):
        _command_section([*path, name], cmd.commands[name], out)


def cli_page() -> str:
    from sparkserve.commands.app import EXIT_CODES

    root = _click_root()
    out = [HEADER + "# CLI reference\n",
           "Every command, its options and their defaults, as `sparkserve COMMAND --help` prints them. "
           f"{EXIT_CODES} (see [exit codes](exit-codes.md)).\n",
           "Global options (before the command): `--version`, `--accept-new-host-keys`, `--install-completion`.\n"]
    for name in sorted(root.commands):
        _command_section(["sparkserve", name], root.commands[name], out)
    return "\n".join(out).rstrip() + "\n"


def exit_codes_page() -> str:
    from sparkserve import errors
    from sparkserve.commands.app import INTERRUPTED_EXIT

    rows = ["| 0 | — | success |"]
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.SparkserveError) and c.__module__ == errors.__name__]
    for c in sorted(classes, key=lambda c: (c.exit_code, c.__name__)):
        doc = " ".join((inspect.getdoc(c) or "").split())
        rows.append(f"| {c.exit_code} | `{c.__name__}` | {doc} |")
    rows.append(f"| {INTERRUPTED_EXIT} | interrupted | Ctrl-C, SIGTERM or SIGHUP, after everything the run started "
                "was stopped and removed and the lock released |")
    return HEADER + "\n".join([
        "# Exit codes\n",
        "An expected failure prints one line, `error: <field or file>: <what is wrong>` (details indented under "
        "it), and no traceback. Each kind of failure has its exit code:\n",
        "| code | error | meaning |", "|---|---|---|", *rows,
    ]) + "\n"

