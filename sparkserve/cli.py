"""The `sparkserve` command. Commands live in sparkserve/commands/*, each a thin Typer wrapper."""

from __future__ import annotations

import sys

import typer

from sparkserve.commands import core, deploy, image, measure, observe
from sparkserve.errors import SparkserveError

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


def main() -> None:
    try:
        app()
    except SparkserveError as e:  # expected failures: one line, no traceback
        print(e.line(), file=sys.stderr)
        for d in e.details:
            print(f"  {d}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
