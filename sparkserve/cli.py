"""The `sparkserve` command. Commands live in sparkserve/commands/*, each a thin Typer wrapper."""

from __future__ import annotations

import sys

import typer

from sparkserve.commands import core, deploy, image, measure, observe
from sparkserve.errors import SparkserveError
from sparkserve.nodes import interrupts

app = typer.Typer(
    name="sparkserve",
    help="Run a DFlash2 speculative-decoding vLLM stack across DGX Spark nodes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
core.register(app)
deploy.register(app)
observe.register(app)
measure.register(app)
image.register(app)


#: The exit code of a run ended by Ctrl-C, SIGTERM or SIGHUP (after it cleaned up what it started).
INTERRUPTED_EXIT = 3


def main() -> None:
    # SIGTERM (CI timeouts, systemd) and SIGHUP (a dropped SSH session) must clean up exactly as Ctrl-C does
    interrupts.install()
    try:
        app()
    except SparkserveError as e:  # expected failures: one line, no traceback
        print(e.line(), file=sys.stderr)
        for d in e.details:
            print(f"  {d}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # an interrupt outside Typer's own call (its KeyboardInterrupt: below)
        _interrupted()
    except SystemExit as e:
        if e.code == 130 and interrupts.signal_name():  # Typer turns a KeyboardInterrupt into a silent exit 130
            _interrupted()
        raise


def _interrupted() -> None:
    print(f"error: interrupted ({interrupts.signal_name() or 'SIGINT'})", file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT)
