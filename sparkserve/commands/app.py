"""The Typer app: every top-level command, imported lazily from its module (the process entry and its error
handling are :mod:`sparkserve.cli`, which imports this; nothing in commands/ imports the CLI).

Which module registers which top-level command, and its one-line help, is read from the modules' source
(:mod:`sparkserve.commands._index`, cached), so a command a module's ``register(app)`` adds appears here
without editing this file.
"""

from __future__ import annotations

import importlib
import os
from typing import Annotated, Any

import typer
from typer import _click
from typer.core import TyperCommand, TyperGroup

from sparkserve import __version__
from sparkserve.commands import _index

#: The exit code of a run ended by Ctrl-C, SIGTERM or SIGHUP (after it cleaned up what it started).
INTERRUPTED_EXIT = 3

MODULES = _index.MODULES

EXIT_CODES = ("Exit codes: 0 ok · 1 a gate or check failed · 2 bad input (config, drafter, usage) · "
              "3 a node unreachable, a remote step failed, or interrupted · 4 a swap and its rollback failed")


class _Placeholder(TyperCommand):
    """A command not imported yet: its name and one-line help, for `--help`, completion and suggestions."""

    def __init__(self, name: str, help_line: str) -> None:
        super().__init__(name=name, short_help=help_line, help=help_line)


class LazyGroup(TyperGroup):
    """A TyperGroup that imports a command module only when one of its commands is run (or its own
    `--help` is asked for). Listing (`--help`, "did you mean") uses :data:`COMMANDS` alone."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._loaded: set[str] = set()
        self._where: dict[str, str] = {}  # command → its module
        for module, (_, cmds) in _index.command_index().items():
            if cmds is None:  # its register() is not plain: import it to know
                self.load(module)
                continue
            for name, help_line in cmds:
                self._where[name] = module
                self.commands.setdefault(name, _Placeholder(name, help_line))

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(self.commands)

    def load(self, module: str) -> None:
        """Import ``sparkserve.commands.<module>`` and put its real commands in place of the placeholders."""
        if module in self._loaded:
            return
        self._loaded.add(module)
        mod = importlib.import_module(f"sparkserve.commands.{module}")
        sub = typer.Typer()
        mod.register(sub)
        group = typer.main.get_group(sub)
        for cmd in group.commands.values():
            _unwrap_help(cmd)
        self.commands.update(group.commands)

    def load_all(self) -> None:
        for m in MODULES:
            self.load(m)

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        module = self._where.get(cmd_name)
        if module is not None:
            self.load(module)
        elif cmd_name not in self.commands and not _looks_like_option(cmd_name):
            self.load_all()  # not found in the source: import every module before saying it does not exist
        cmd = self.commands.get(cmd_name)
        return None if isinstance(cmd, _Placeholder) else cmd

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        # list the commands from the table: asking get_command for each would import every module
        real_get = self.get_command
        self.get_command = lambda c, n: self.commands.get(n)  # type: ignore[method-assign]
        try:
            super().format_help(ctx, formatter)
        finally:
            self.get_command = real_get  # type: ignore[method-assign]

    def resolve_command(self, ctx: _click.Context, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not _looks_like_option(args[0]):
            self.load_all()  # a typo: suggest from every registered command, not only the table
        return super().resolve_command(ctx, args)


def _unwrap_help(cmd: _click.Command) -> None:
    """A docstring's paragraphs as one line each: `--help` then wraps them at the terminal's width, never at
    the source's (which left "… (run / now …" when rich kept the docstring's own line ends)."""
    import inspect

    if cmd.help:
        cmd.help = "\n\n".join(" ".join(par.split()) for par in inspect.cleandoc(cmd.help).split("\n\n"))
    for sub in (getattr(cmd, "commands", None) or {}).values():
        _unwrap_help(sub)


def _looks_like_option(name: str) -> bool:
    return name.startswith("-")


def _version(value: bool) -> None:
    if value:
        print(f"sparkserve {__version__}")
        raise typer.Exit(0)


app = typer.Typer(
    name="sparkserve",
    cls=LazyGroup,
    help="Run a DFlash2 speculative-decoding vLLM stack across DGX Spark nodes.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
    accept_new: Annotated[bool, typer.Option(
        "--accept-new-host-keys", help="for any command: add unknown SSH host keys to known_hosts, hashed "
                                       "(OpenSSH's accept-new; a changed key is still refused)")] = False,
) -> None:
    """Run a DFlash2 speculative-decoding vLLM stack across DGX Spark nodes."""
    if accept_new:  # every config this run loads sees it (the same as the commands' own flag)
        os.environ["SPARKSERVE_SSH__ACCEPT_NEW_HOST_KEYS"] = "true"
